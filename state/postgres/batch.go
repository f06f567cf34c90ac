package postgres

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemgate/idemgate/state"
)

// Batching: confirms that arrive together share one PostgreSQL round trip
// and one commit.
//
// Every Acquire is an INSERT and every Complete an UPDATE, each its own
// transaction, so each pays a network round trip and a commit (a WAL flush)
// of its own, and PostgreSQL — on the same few cores as everything else —
// spends most of its time on per-statement and per-transaction overhead.
// The batcher queues these statements and sends the ones waiting together as
// one pgx Batch: one pipeline of the unchanged statements, ended by a single
// Sync, which PostgreSQL runs as one implicit transaction with one commit.
//
//   - Waiting is bounded and only happens under load: when no batch is in
//     flight a statement is sent at once (a lone confirm pays nothing); while
//     one is, newcomers gather for at most MaxWait (about a millisecond) or
//     until MaxItems, and while every allowed batch is in flight they gather
//     until one returns.
//   - Each caller's context is honoured: a caller whose context ends stops
//     waiting at once, and a statement whose caller is gone before its batch
//     is sent is not sent. (One already sent may still commit, exactly like
//     a single statement whose reply was lost.) The batch itself runs on a
//     context of its own, so one caller giving up never breaks the
//     connection under the others.
//   - Answers are handed out only after the commit succeeded: a result read
//     from an uncommitted batch could claim a record that was rolled back.
//   - One failing statement aborts the implicit transaction, so nothing of
//     the batch was committed; every caller then runs its statement alone.
//     A failure that leaves the commit unknown (the connection broke) is an
//     error for every caller, as it would be for a single statement.
//   - Statements are sent in key order. Two batches in flight therefore take
//     their row locks in the same order and cannot deadlock; two statements
//     for one key in one batch see each other (the second insert finds the
//     first one's row: exactly one ACQUIRED).

// BatchOptions tune the batcher (see Options.Batch).
type BatchOptions struct {
	// Disabled sends every statement on its own.
	Disabled bool
	// MaxItems caps the statements of one batch (default 64).
	MaxItems int
	// MaxWait bounds how long a statement waits for others while a batch
	// is already in flight (default 1ms).
	MaxWait time.Duration
	// Conns is how many batches may be in flight at once, each on its own
	// connection (default 2).
	Conns int
}

// Batch defaults.
const (
	DefaultBatchMaxItems = 64
	DefaultBatchMaxWait  = time.Millisecond
	DefaultBatchConns    = 2
)

// Bounds of a batch's own context: callers' deadlines plus batchGrace (so
// that a batch running a little late does not break its connection), at
// most maxBatchTime.
const (
	batchGrace   = time.Second
	maxBatchTime = 10 * time.Second
)

// errRunAlone tells a caller that its batch was rolled back without a
// commit (another statement in it failed): nothing was written, run the
// statement on its own.
var errRunAlone = errors.New("batch rolled back; run the statement alone")

// errBatcherClosed is returned once the store is closing.
var errBatcherClosed = errors.New("postgres store closed")

// BatchStats count what the batcher did (for diagnostics and tests).
type BatchStats struct {
	Batches    uint64 // batches sent
	Statements uint64 // statements sent in them
	RolledBack uint64 // batches rolled back whose statements then ran alone
}

// pending is one queued statement and, once done is closed, its answer.
type pending struct {
	ctx  context.Context
	key  string
	sql  string
	args []any
	// lead: the statement returns an "inserted" column before recordCols.
	lead bool
	done chan struct{}

	inserted bool
	rec      state.Record
	err      error
}

type batcher struct {
	pool *pgxpool.Pool
	opts BatchOptions
	// sendWhenIdle: with no batch in flight, send at once instead of
	// waiting for more (false only in tests that need full batches).
	sendWhenIdle bool

	queue chan *pending
	slots chan struct{} // one token per batch in flight
	stop  chan struct{} // closed when closing starts
	// closed is closed once closing is over: nothing queued after that is
	// ever sent.
	closed chan struct{}
	wg     sync.WaitGroup
	once   sync.Once

	batches, statements, rolledBack atomic.Uint64
}

func newBatcher(pool *pgxpool.Pool, opts BatchOptions, sendWhenIdle bool) *batcher {
	if opts.MaxItems <= 0 {
		opts.MaxItems = DefaultBatchMaxItems
	}
	if opts.MaxWait <= 0 {
		opts.MaxWait = DefaultBatchMaxWait
	}
	if opts.Conns <= 0 {
		opts.Conns = DefaultBatchConns
	}
	b := &batcher{
		pool: pool, opts: opts, sendWhenIdle: sendWhenIdle,
		queue:  make(chan *pending, 4*opts.MaxItems),
		slots:  make(chan struct{}, opts.Conns),
		stop:   make(chan struct{}),
		closed: make(chan struct{}),
	}
	b.wg.Add(1)
	go b.run()
	return b
}

func (b *batcher) stats() BatchStats {
	return BatchStats{Batches: b.batches.Load(), Statements: b.statements.Load(), RolledBack: b.rolledBack.Load()}
}

// close stops taking statements, fails the queued ones and waits for the
// batches in flight.
func (b *batcher) close() {
	b.once.Do(func() {
		close(b.stop)
		b.wg.Wait()
		for drained := false; !drained; {
			select {
			case p := <-b.queue:
				b.finish(p, errBatcherClosed)
			default:
				drained = true
			}
		}
		close(b.closed)
	})
}

// query runs one statement through a batch and returns its row. It returns
// the caller's context error as soon as that context ends, and errRunAlone
// when the statement must be sent on its own.
func (b *batcher) query(ctx context.Context, key, sql string, lead bool, args ...any) (inserted bool, rec state.Record, err error) {
	if err := ctx.Err(); err != nil {
		return false, state.Record{}, err
	}
	select {
	case <-b.stop:
		return false, state.Record{}, errBatcherClosed
	default:
	}
	p := &pending{ctx: ctx, key: key, sql: sql, args: args, lead: lead, done: make(chan struct{})}
	select {
	case b.queue <- p:
	case <-ctx.Done():
		return false, state.Record{}, ctx.Err()
	case <-b.stop:
		return false, state.Record{}, errBatcherClosed
	}
	select {
	case <-p.done:
		return p.inserted, p.rec, p.err
	case <-ctx.Done():
		return false, state.Record{}, ctx.Err()
	case <-b.closed:
		// Queued while the store was closing: either answered in the
		// meantime, or never sent.
		select {
		case <-p.done:
			return p.inserted, p.rec, p.err
		default:
			return false, state.Record{}, errBatcherClosed
		}
	}
}

func (b *batcher) finish(p *pending, err error) {
	p.err = err
	close(p.done)
}

// run collects statements into batches; see the comment at the top.
func (b *batcher) run() {
	defer b.wg.Done()
	for {
		var batch []*pending
		select {
		case p := <-b.queue:
			batch = append(make([]*pending, 0, b.opts.MaxItems), p)
		case <-b.stop:
			return
		}
		batch = b.drain(batch)
		if len(batch) < b.opts.MaxItems && (len(b.slots) > 0 || !b.sendWhenIdle) {
			batch = b.gather(batch)
		}
		// Wait for a connection to send on, taking in newcomers meanwhile.
		for sent := false; !sent; {
			queue := b.queue
			if len(batch) >= b.opts.MaxItems {
				queue = nil
			}
			select {
			case b.slots <- struct{}{}:
				sent = true
				b.wg.Add(1)
				go b.flush(batch)
			case p := <-queue:
				batch = append(batch, p)
			case <-b.stop:
				for _, p := range batch {
					b.finish(p, errBatcherClosed)
				}
				return
			}
		}
	}
}

// drain adds what is queued already, without waiting.
func (b *batcher) drain(batch []*pending) []*pending {
	for len(batch) < b.opts.MaxItems {
		select {
		case p := <-b.queue:
			batch = append(batch, p)
		default:
			return batch
		}
	}
	return batch
}

// gather waits up to MaxWait for the batch to fill.
func (b *batcher) gather(batch []*pending) []*pending {
	t := time.NewTimer(b.opts.MaxWait)
	defer t.Stop()
	for len(batch) < b.opts.MaxItems {
		select {
		case p := <-b.queue:
			batch = append(batch, p)
		case <-t.C:
			return batch
		case <-b.stop:
			return batch
		}
	}
	return batch
}

// flush sends one batch and hands out the answers.
func (b *batcher) flush(batch []*pending) {
	defer b.wg.Done()
	defer func() { <-b.slots }()

	// Callers already gone are not written for.
	live := batch[:0]
	for _, p := range batch {
		if err := p.ctx.Err(); err != nil {
			b.finish(p, err)
			continue
		}
		live = append(live, p)
	}
	if len(live) == 0 {
		return
	}
	slices.SortStableFunc(live, func(x, y *pending) int { return strings.Compare(x.key, y.key) })

	ctx, cancel := batchContext(live)
	defer cancel()
	pb := &pgx.Batch{}
	for _, p := range live {
		pb.Queue(p.sql, p.args...)
	}
	b.batches.Add(1)
	b.statements.Add(uint64(len(live)))
	br := b.pool.SendBatch(ctx, pb)
	var (
		inserted   = make([]bool, len(live))
		recs       = make([]state.Record, len(live))
		errs       = make([]error, len(live))
		rolledBack bool
	)
	for i, p := range live {
		var lead []any
		if p.lead {
			lead = []any{&inserted[i]}
		}
		recs[i], errs[i] = scanRecord(br.QueryRow(), lead...)
		var pgErr *pgconn.PgError
		if errors.As(errs[i], &pgErr) {
			rolledBack = true
		}
	}
	closeErr := br.Close()
	var pgErr *pgconn.PgError
	if closeErr != nil && errors.As(closeErr, &pgErr) {
		rolledBack = true
	}
	switch {
	case rolledBack:
		// A statement failed: PostgreSQL rolled the whole batch back at its
		// Sync, so nothing was written. Each caller runs its own statement.
		b.rolledBack.Add(1)
		for _, p := range live {
			b.finish(p, errRunAlone)
		}
	case closeErr != nil:
		// The commit's fate is unknown: an error for everyone.
		for _, p := range live {
			b.finish(p, closeErr)
		}
	default:
		for i, p := range live {
			p.inserted, p.rec = inserted[i], recs[i]
			b.finish(p, errs[i])
		}
	}
}

// batchContext is the batch's own context: no caller's cancellation, a
// deadline a little after the latest caller's, at most maxBatchTime away.
func batchContext(live []*pending) (context.Context, context.CancelFunc) {
	now := time.Now()
	limit := now.Add(maxBatchTime)
	var latest time.Time
	for _, p := range live {
		d, ok := p.ctx.Deadline()
		if !ok {
			latest = limit
			break
		}
		if d.After(latest) {
			latest = d
		}
	}
	deadline := latest.Add(batchGrace)
	if deadline.After(limit) {
		deadline = limit
	}
	return context.WithDeadline(context.Background(), deadline)
}
