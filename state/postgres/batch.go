package postgres

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemgate/idemgate/state"
	"github.com/idemgate/idemgate/state/internal/batch"
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
//   - Waiting is bounded and only happens under load, and each caller's
//     context is honoured (state/internal/batch): a lone statement is sent
//     at once; a caller whose context ends stops waiting at once and is not
//     written for if its batch had not been sent. (One already sent may
//     still commit, exactly like a single statement whose reply was lost.)
//     The batch runs on a context of its own, so one caller giving up never
//     breaks the connection under the others.
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

// DefaultBatchConns is how many batches may be in flight at once.
const DefaultBatchConns = batch.DefaultInFlight

// errRunAlone tells a caller that its batch was rolled back without a
// commit (another statement in it failed): nothing was written, run the
// statement on its own.
var errRunAlone = errors.New("batch rolled back; run the statement alone")

// BatchStats count what the batcher did (for diagnostics and tests).
type BatchStats struct {
	Batches    uint64 // batches sent
	Statements uint64 // statements sent in them
	RolledBack uint64 // batches rolled back whose statements then ran alone
}

// stmt is one queued statement: the key orders it within its batch; with
// lead it returns an "inserted" column before recordCols.
type stmt struct {
	key  string
	sql  string
	args []any
	// lead: the row starts with an "inserted" column before recordCols.
	lead bool
	// batchable: the statement may share a batch with others (when
	// batching is on); otherwise it is always sent on its own.
	batchable bool
}

// row is a statement's answer.
type row struct {
	inserted bool
	rec      state.Record
}

type batcher struct {
	pool       *pgxpool.Pool
	q          *batch.Queue[stmt, row]
	rolledBack atomic.Uint64
}

// newBatcher starts a batcher whose queue works by opts (queueOptions).
func newBatcher(pool *pgxpool.Pool, opts batch.Options) *batcher {
	b := &batcher{pool: pool}
	b.q = batch.New(opts, b.send)
	return b
}

// queueOptions are the batch queue's options for a store's BatchOptions.
// Tests may make them Patient, to wait for full batches.
func queueOptions(opts BatchOptions) batch.Options {
	return batch.Options{MaxItems: opts.MaxItems, MaxWait: opts.MaxWait, InFlight: opts.Conns}
}

func (b *batcher) stats() BatchStats {
	s := b.q.Stats()
	return BatchStats{Batches: s.Batches, Statements: s.Calls, RolledBack: b.rolledBack.Load()}
}

// close stops taking statements, fails the queued ones and waits for the
// batches in flight.
func (b *batcher) close() { b.q.Close() }

// query runs one statement through a batch and returns its row. It returns
// the caller's context error as soon as that context ends, and errRunAlone
// when the statement must be sent on its own.
func (b *batcher) query(ctx context.Context, st stmt) (inserted bool, rec state.Record, err error) {
	r, err := b.q.Do(ctx, st)
	return r.inserted, r.rec, err
}

// send runs one batch as one pipelined implicit transaction and hands out
// the answers; see the comment at the top.
func (b *batcher) send(ctx context.Context, calls []*batch.Call[stmt, row]) {
	slices.SortStableFunc(calls, func(x, y *batch.Call[stmt, row]) int { return strings.Compare(x.In.key, y.In.key) })
	pb := &pgx.Batch{}
	for _, c := range calls {
		pb.Queue(c.In.sql, c.In.args...)
	}
	br := b.pool.SendBatch(ctx, pb)
	var (
		rows       = make([]row, len(calls))
		errs       = make([]error, len(calls))
		rolledBack bool
	)
	for i, c := range calls {
		var lead []any
		if c.In.lead {
			lead = []any{&rows[i].inserted}
		}
		rows[i].rec, errs[i] = scanRecord(br.QueryRow(), lead...)
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
		for _, c := range calls {
			c.Finish(row{}, errRunAlone)
		}
	case closeErr != nil:
		// The commit's fate is unknown: an error for everyone.
		for _, c := range calls {
			c.Finish(row{}, closeErr)
		}
	default:
		for i, c := range calls {
			c.Finish(rows[i], errs[i])
		}
	}
}
