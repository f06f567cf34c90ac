// Package driver runs the ext_proc driver (internal/extprocdriver) as a
// closed-loop load generator: workers each send one request after another
// over a fixed set of connections, measured over a window.
package driver

import (
	"context"
	"errors"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemgate/idemgate/e2e/loadgen/hist"
	"github.com/idemgate/idemgate/internal/extprocdriver"
)

// Source hands out the requests of a run. It is called concurrently.
type Source interface {
	// Next returns the request for the next stream of worker w, or nil when
	// the source is exhausted (the run then ends early).
	Next(w int) *extprocdriver.Request
}

// Run is one closed-loop measurement: Concurrency workers each run one
// request after another, spread over the connections.
type Run struct {
	Conns       *extprocdriver.Conns
	Filter      extprocdriver.Filter
	Source      Source
	Concurrency int
	// Warmup runs before the measured window; nothing in it is recorded.
	Warmup   time.Duration
	Duration time.Duration
	// Expect says whether an outcome is what the scenario should produce;
	// everything else is counted as unexpected. Nil expects a pass-through
	// 200 with no error.
	Expect func(extprocdriver.Outcome) bool
	// WindowStarted, if set, is called when the measured window opens.
	WindowStarted func()
}

// Result is what a Run measured: requests that completed inside the window.
type Result struct {
	Concurrency int
	Conns       int
	Requests    uint64
	// Elapsed is the length of the measured window (shorter than Duration
	// when the source ran out).
	Elapsed time.Duration
	Latency *hist.Histogram
	// Outcomes counts every recorded request by outcome.
	Outcomes   map[extprocdriver.Outcome]uint64
	Unexpected uint64
	// Exhausted: the source ran out inside the window.
	Exhausted bool
}

// RPS is completed requests per second over the window.
func (r *Result) RPS() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.Requests) / r.Elapsed.Seconds()
}

// ErrExhaustedInWarmup means the source ran out before the window opened.
var ErrExhaustedInWarmup = errors.New("the request source ran out during the warm-up")

// PassThrough200 is the default expectation: the request reached the
// upstream and its 200 went to the client.
func PassThrough200(o extprocdriver.Outcome) bool {
	return o.Status == 200 && !o.Local && o.Error == extprocdriver.ErrNone
}

type worker struct {
	latency  *hist.Histogram
	outcomes map[extprocdriver.Outcome]uint64
	last     time.Time // completion of the last recorded request
}

// Execute runs the measurement. It returns when the window has closed and
// every in-flight request has finished (each is bounded by the message
// timeout per phase), or when ctx is cancelled.
func (r Run) Execute(ctx context.Context) (*Result, error) {
	if r.Concurrency < 1 || r.Duration <= 0 || r.Conns == nil || r.Source == nil {
		return nil, errors.New("run needs concurrency >= 1, a duration, connections and a source")
	}
	expect := r.Expect
	if expect == nil {
		expect = PassThrough200
	}
	start := time.Now()
	windowStart := start.Add(r.Warmup)
	windowEnd := windowStart.Add(r.Duration)
	var (
		stop      atomic.Bool
		exhausted atomic.Bool
		// exhaustedAt is when a worker first found the source empty (unix ns).
		exhaustedAt atomic.Int64
		wg          sync.WaitGroup
	)
	workers := make([]*worker, r.Concurrency)
	for i := range workers {
		w := &worker{latency: hist.New(), outcomes: map[extprocdriver.Outcome]uint64{}}
		workers[i] = w
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() && ctx.Err() == nil {
				req := r.Source.Next(i)
				if req == nil {
					if exhausted.CompareAndSwap(false, true) {
						exhaustedAt.Store(time.Now().UnixNano())
					}
					return
				}
				t0 := time.Now()
				out := r.Filter.Do(ctx, r.Conns.Next(), req, nil)
				t1 := time.Now()
				if out.Error == extprocdriver.ErrCanceled && ctx.Err() != nil {
					return
				}
				if !t1.Before(windowEnd) {
					stop.Store(true)
					return
				}
				if t1.Before(windowStart) {
					continue
				}
				w.latency.Record(t1.Sub(t0))
				w.outcomes[out]++
				w.last = t1
			}
		}()
	}
	if r.WindowStarted != nil {
		go func() {
			t := time.NewTimer(time.Until(windowStart))
			defer t.Stop()
			select {
			case <-t.C:
				if !exhausted.Load() {
					r.WindowStarted()
				}
			case <-ctx.Done():
			}
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	t := time.NewTimer(time.Until(windowEnd))
	select {
	case <-t.C:
		stop.Store(true)
		<-done
	case <-done:
		t.Stop()
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}

	res := &Result{
		Concurrency: r.Concurrency,
		Conns:       r.Conns.Len(),
		Latency:     hist.New(),
		Outcomes:    map[extprocdriver.Outcome]uint64{},
		Elapsed:     r.Duration,
	}
	var last time.Time
	for _, w := range workers {
		res.Latency.Merge(w.latency)
		for o, n := range w.outcomes {
			res.Outcomes[o] += n
			res.Requests += n
			if !expect(o) {
				res.Unexpected += n
			}
		}
		if w.last.After(last) {
			last = w.last
		}
	}
	if exhausted.Load() {
		at := time.Unix(0, exhaustedAt.Load())
		if !at.After(windowStart) {
			return nil, ErrExhaustedInWarmup
		}
		if at.Before(windowEnd) {
			res.Exhausted = true
			// The window ends with the last request that completed in it.
			res.Elapsed = time.Duration(math.Max(float64(last.Sub(windowStart)), float64(time.Millisecond)))
		}
	}
	return res, nil
}
