// Package batch groups calls that arrive together so that they share one
// round trip to a backend: the PostgreSQL store sends them as one pipelined
// transaction, the Redis store as one pipeline.
//
// A Queue collects submitted calls and hands them to a send function in
// batches:
//
//   - Nothing waits when no batch is in flight: a call is sent at once, so a
//     lone request pays nothing. While a batch is in flight, newcomers gather
//     for at most MaxWait or until MaxItems, and while InFlight batches are
//     in flight they gather until one returns.
//   - Each caller's context is honoured: Do returns as soon as it ends, and a
//     call whose context ended before its batch was sent is not sent. (One
//     already sent may still take effect, exactly like a single request
//     whose reply was lost.) The send function gets a context of its own
//     (Context), so one caller leaving never cuts the batch short for the
//     others.
//   - Close stops taking calls, fails the queued ones with ErrClosed and
//     waits for the batches in flight.
package batch

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"
)

// ErrClosed is the answer to calls made or queued while the queue closes.
var ErrClosed = errors.New("batch queue closed")

// Options tune a Queue. Zero fields take the defaults.
type Options struct {
	// MaxItems caps the calls of one batch (default 64).
	MaxItems int
	// MaxWait bounds how long a call waits for others while a batch is in
	// flight (default 1ms).
	MaxWait time.Duration
	// InFlight is how many batches may be in flight at once (default 2).
	InFlight int
	// Grace is how long a batch may run past its latest caller's deadline
	// before its own context ends (default 1s).
	Grace time.Duration
	// Patient makes the queue wait for MaxItems or MaxWait even when nothing
	// is in flight (tests use it to know which calls share a batch).
	Patient bool
}

// Defaults.
const (
	DefaultMaxItems = 64
	DefaultMaxWait  = time.Millisecond
	DefaultInFlight = 2
	DefaultGrace    = time.Second
)

// Call is one submitted call and, once finished, its answer.
type Call[In, Out any] struct {
	Ctx context.Context
	In  In

	out  Out
	err  error
	done chan struct{}
}

// NewCall prepares a call (for Enqueue).
func NewCall[In, Out any](ctx context.Context, in In) *Call[In, Out] {
	return &Call[In, Out]{Ctx: ctx, In: in, done: make(chan struct{})}
}

// Finish hands the call its answer. Every call given to the send function
// must be finished exactly once.
func (c *Call[In, Out]) Finish(out Out, err error) {
	c.out, c.err = out, err
	close(c.done)
}

// Wait blocks until the call is finished and returns its answer (tests use
// it for calls they enqueued themselves).
func (c *Call[In, Out]) Wait() (Out, error) {
	<-c.done
	return c.out, c.err
}

// Stats count what a queue sent.
type Stats struct {
	Batches uint64 // batches sent
	Calls   uint64 // calls sent in them
}

// Queue batches calls; see the package doc.
type Queue[In, Out any] struct {
	opts Options
	send func(ctx context.Context, calls []*Call[In, Out])

	queue chan *Call[In, Out]
	slots chan struct{} // one token per batch in flight
	stop  chan struct{} // closed when closing starts
	// closed is closed once closing is over: nothing queued after that is
	// ever sent.
	closed chan struct{}
	wg     sync.WaitGroup
	once   sync.Once

	batches, calls atomic.Uint64
}

// New starts a queue. send runs on a goroutine of its own, once per batch,
// with the batch's context (see Context); it must finish every call. The
// calls it gets are live (their callers' contexts had not ended).
func New[In, Out any](opts Options, send func(ctx context.Context, calls []*Call[In, Out])) *Queue[In, Out] {
	if opts.MaxItems <= 0 {
		opts.MaxItems = DefaultMaxItems
	}
	if opts.MaxWait <= 0 {
		opts.MaxWait = DefaultMaxWait
	}
	if opts.InFlight <= 0 {
		opts.InFlight = DefaultInFlight
	}
	if opts.Grace <= 0 {
		opts.Grace = DefaultGrace
	}
	q := &Queue[In, Out]{
		opts: opts, send: send,
		queue:  make(chan *Call[In, Out], 4*opts.MaxItems),
		slots:  make(chan struct{}, opts.InFlight),
		stop:   make(chan struct{}),
		closed: make(chan struct{}),
	}
	q.wg.Add(1)
	go q.run()
	return q
}

// Stats reports what the queue sent.
func (q *Queue[In, Out]) Stats() Stats {
	return Stats{Batches: q.batches.Load(), Calls: q.calls.Load()}
}

// Do submits in and waits for its answer, or for ctx to end (then it returns
// ctx's error at once).
func (q *Queue[In, Out]) Do(ctx context.Context, in In) (Out, error) {
	var zero Out
	if err := ctx.Err(); err != nil {
		return zero, err
	}
	c := NewCall[In, Out](ctx, in)
	if err := q.Enqueue(c); err != nil {
		return zero, err
	}
	select {
	case <-c.done:
		return c.out, c.err
	case <-ctx.Done():
		return zero, ctx.Err()
	case <-q.closed:
		// Queued while the queue was closing: either answered in the
		// meantime, or never sent.
		select {
		case <-c.done:
			return c.out, c.err
		default:
			return zero, ErrClosed
		}
	}
}

// Enqueue submits c without waiting for its answer.
func (q *Queue[In, Out]) Enqueue(c *Call[In, Out]) error {
	select {
	case <-q.stop:
		return ErrClosed
	default:
	}
	select {
	case q.queue <- c:
		return nil
	case <-c.Ctx.Done():
		return c.Ctx.Err()
	case <-q.stop:
		return ErrClosed
	}
}

// Close stops taking calls, fails the queued ones and waits for the batches
// in flight.
func (q *Queue[In, Out]) Close() {
	q.once.Do(func() {
		close(q.stop)
		q.wg.Wait()
		for drained := false; !drained; {
			select {
			case c := <-q.queue:
				var zero Out
				c.Finish(zero, ErrClosed)
			default:
				drained = true
			}
		}
		close(q.closed)
	})
}

func (q *Queue[In, Out]) run() {
	defer q.wg.Done()
	for {
		var batch []*Call[In, Out]
		select {
		case c := <-q.queue:
			batch = append(make([]*Call[In, Out], 0, q.opts.MaxItems), c)
		case <-q.stop:
			return
		}
		batch = q.drain(batch)
		if len(batch) < q.opts.MaxItems && (len(q.slots) > 0 || q.opts.Patient) {
			batch = q.gather(batch)
		}
		// Wait for a slot, taking in newcomers meanwhile.
		for sent := false; !sent; {
			queue := q.queue
			if len(batch) >= q.opts.MaxItems {
				queue = nil
			}
			select {
			case q.slots <- struct{}{}:
				sent = true
				q.wg.Add(1)
				go q.flush(batch)
			case c := <-queue:
				batch = append(batch, c)
			case <-q.stop:
				var zero Out
				for _, c := range batch {
					c.Finish(zero, ErrClosed)
				}
				return
			}
		}
	}
}

// drain adds what is queued already, without waiting.
func (q *Queue[In, Out]) drain(batch []*Call[In, Out]) []*Call[In, Out] {
	for len(batch) < q.opts.MaxItems {
		select {
		case c := <-q.queue:
			batch = append(batch, c)
		default:
			return batch
		}
	}
	return batch
}

// gather waits up to MaxWait for the batch to fill.
func (q *Queue[In, Out]) gather(batch []*Call[In, Out]) []*Call[In, Out] {
	t := time.NewTimer(q.opts.MaxWait)
	defer t.Stop()
	for len(batch) < q.opts.MaxItems {
		select {
		case c := <-q.queue:
			batch = append(batch, c)
		case <-t.C:
			return batch
		case <-q.stop:
			return batch
		}
	}
	return batch
}

func (q *Queue[In, Out]) flush(batch []*Call[In, Out]) {
	defer q.wg.Done()
	defer func() { <-q.slots }()
	live := batch[:0]
	var zero Out
	for _, c := range batch {
		if err := c.Ctx.Err(); err != nil {
			c.Finish(zero, err) // gone before sending: not sent
			continue
		}
		live = append(live, c)
	}
	if len(live) == 0 {
		return
	}
	q.batches.Add(1)
	q.calls.Add(uint64(len(live)))
	ctx, cancel := Context(live, q.opts.Grace, maxBatchTime)
	defer cancel()
	q.send(ctx, live)
}

// maxBatchTime bounds a batch's context when a caller has no deadline.
const maxBatchTime = 10 * time.Second

// Context is a batch's own context: none of the callers' cancellation, a
// deadline grace after the latest caller's (so that a batch running a
// little late is not cut off, which would also break its connection), and
// at most limit away.
func Context[In, Out any](calls []*Call[In, Out], grace, limit time.Duration) (context.Context, context.CancelFunc) {
	now := time.Now()
	max := now.Add(limit)
	var latest time.Time
	for _, c := range calls {
		d, ok := c.Ctx.Deadline()
		if !ok {
			latest = max
			break
		}
		if d.After(latest) {
			latest = d
		}
	}
	deadline := latest.Add(grace)
	if deadline.After(max) {
		deadline = max
	}
	return context.WithDeadline(context.Background(), deadline)
}
