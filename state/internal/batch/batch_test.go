package batch

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// recorder is a send function that answers each call with its input
// doubled and remembers the batches.
type recorder struct {
	mu      sync.Mutex
	batches [][]int
	hold    chan struct{} // if set, each send waits on it
	active  atomic.Int32
	peak    atomic.Int32
	ctxs    []context.Context
}

func (r *recorder) send(ctx context.Context, calls []*Call[int, int]) {
	n := r.active.Add(1)
	for {
		p := r.peak.Load()
		if n <= p || r.peak.CompareAndSwap(p, n) {
			break
		}
	}
	if r.hold != nil {
		<-r.hold
	}
	var ins []int
	for _, c := range calls {
		ins = append(ins, c.In)
	}
	r.mu.Lock()
	r.batches = append(r.batches, ins)
	r.ctxs = append(r.ctxs, ctx)
	r.mu.Unlock()
	r.active.Add(-1)
	for _, c := range calls {
		c.Finish(2*c.In, nil)
	}
}

func (r *recorder) sizes() []int {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []int
	for _, b := range r.batches {
		out = append(out, len(b))
	}
	return out
}

func TestLoneCallIsSentAtOnce(t *testing.T) {
	r := &recorder{}
	q := New(Options{MaxWait: time.Second}, r.send)
	defer q.Close()
	start := time.Now()
	out, err := q.Do(t.Context(), 21)
	require.NoError(t, err)
	require.Equal(t, 42, out)
	require.Less(t, time.Since(start), 500*time.Millisecond, "nothing in flight: no waiting")
	require.Equal(t, Stats{Batches: 1, Calls: 1}, q.Stats())
}

func TestCallsArrivingTogetherShareABatch(t *testing.T) {
	r := &recorder{}
	q := New(Options{MaxItems: 10, MaxWait: 10 * time.Second, Patient: true}, r.send)
	defer q.Close()
	var wg sync.WaitGroup
	for i := 0; i < 25; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out, err := q.Do(t.Context(), i)
			assert.NoError(t, err)
			assert.Equal(t, 2*i, out, "each caller gets its own answer")
		}()
	}
	// 25 calls, batches of at most 10: the last 5 wait for MaxWait unless
	// more arrive; close the gap by sending 5 more.
	for i := 25; i < 30; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := q.Do(t.Context(), i)
			assert.NoError(t, err)
		}()
	}
	wg.Wait()
	require.Equal(t, []int{10, 10, 10}, r.sizes())
}

func TestInFlightBatchesAreBounded(t *testing.T) {
	r := &recorder{hold: make(chan struct{})}
	q := New(Options{MaxItems: 4, InFlight: 2, MaxWait: time.Millisecond}, r.send)
	defer q.Close()
	var wg sync.WaitGroup
	for i := 0; i < 40; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := q.Do(t.Context(), i)
			assert.NoError(t, err)
		}()
	}
	require.Eventually(t, func() bool { return r.active.Load() == 2 }, 5*time.Second, time.Millisecond)
	time.Sleep(20 * time.Millisecond)
	require.Equal(t, int32(2), r.active.Load(), "no third batch while two are in flight")
	close(r.hold)
	wg.Wait()
	require.Equal(t, int32(2), r.peak.Load())
	for _, n := range r.sizes() {
		require.LessOrEqual(t, n, 4)
	}
	require.Equal(t, uint64(40), q.Stats().Calls)
}

// A caller whose context ends gets its error at once, and its call is not
// sent if its batch had not been.
func TestCallerLeavingIsNotSent(t *testing.T) {
	r := &recorder{}
	q := New(Options{MaxItems: 2, MaxWait: 300 * time.Millisecond, Patient: true}, r.send)
	defer q.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := q.Do(ctx, 1)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.Less(t, time.Since(start), 250*time.Millisecond)
	out, err := q.Do(t.Context(), 2)
	require.NoError(t, err)
	require.Equal(t, 4, out)
	require.Equal(t, [][]int{{2}}, r.batches, "the call whose caller left was not sent")

	_, err = q.Do(ctx, 3)
	require.ErrorIs(t, err, context.DeadlineExceeded, "an ended context is refused before queueing")
}

// The batch's context carries no caller's cancellation and ends after the
// latest caller's deadline.
func TestBatchContext(t *testing.T) {
	cancelled, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
	early, cancelEarly := context.WithTimeout(t.Context(), time.Second)
	defer cancelEarly()
	late, cancelLate := context.WithTimeout(t.Context(), 2*time.Second)
	defer cancelLate()
	calls := []*Call[int, int]{NewCall[int, int](cancelled, 1), NewCall[int, int](early, 2), NewCall[int, int](late, 3)}
	cancel()
	ctx, stop := Context(calls, 100*time.Millisecond, time.Minute)
	defer stop()
	require.NoError(t, ctx.Err())
	d, ok := ctx.Deadline()
	require.True(t, ok)
	lateD, _ := late.Deadline()
	require.Equal(t, lateD.Add(100*time.Millisecond), d)

	noDeadline := []*Call[int, int]{NewCall[int, int](context.Background(), 1)}
	ctx2, stop2 := Context(noDeadline, time.Second, time.Minute)
	defer stop2()
	d, ok = ctx2.Deadline()
	require.True(t, ok)
	require.WithinDuration(t, time.Now().Add(time.Minute), d, time.Second, "capped by the limit")
}

func TestCloseFailsQueuedCallsAndRefusesNewOnes(t *testing.T) {
	r := &recorder{hold: make(chan struct{})}
	q := New(Options{MaxItems: 1, InFlight: 1}, r.send)
	results := make(chan error, 3)
	for i := 0; i < 3; i++ {
		go func() {
			_, err := q.Do(t.Context(), i)
			results <- err
		}()
	}
	require.Eventually(t, func() bool { return r.active.Load() == 1 }, 5*time.Second, time.Millisecond)
	closed := make(chan struct{})
	go func() {
		q.Close()
		close(closed)
	}()
	time.Sleep(20 * time.Millisecond)
	close(r.hold) // the batch in flight finishes
	<-closed
	var ok, refused int
	for i := 0; i < 3; i++ {
		if err := <-results; err == nil {
			ok++
		} else {
			require.ErrorIs(t, err, ErrClosed)
			refused++
		}
	}
	require.Equal(t, 1, ok, "the batch in flight was answered")
	require.Equal(t, 2, refused)
	_, err := q.Do(t.Context(), 9)
	require.ErrorIs(t, err, ErrClosed)
}
