package state

import (
	"context"
	"time"
)

// Observer receives the duration and error of every store call made through
// Instrument. It lets the server export store latency by backend and
// operation without this package depending on a metrics library.
type Observer interface {
	ObserveStoreCall(backend, op string, took time.Duration, err error)
}

// ObserverFunc adapts a function to Observer.
type ObserverFunc func(backend, op string, took time.Duration, err error)

// ObserveStoreCall calls f.
func (f ObserverFunc) ObserveStoreCall(backend, op string, took time.Duration, err error) {
	f(backend, op, took, err)
}

// Operation names reported to an Observer (and used as span names by
// Trace). EndLease and AbandonUnsent keep the names "release" and "abandon"
// they were reported under before they were renamed, so dashboards and
// alerts on them keep working.
const (
	OpAcquire       = "acquire"
	OpComplete      = "complete"
	OpEndLease      = "release"
	OpAbandonUnsent = "abandon"
	OpMarkUnknown   = "mark_unknown"
	OpTakeover      = "takeover"
	OpGet           = "get"
	OpResolve       = "resolve"
	OpSweep         = "sweep"
	OpPing          = "ping"
)

// Instrument wraps s so that every call except Close is reported to obs
// under backend. The wrapper adds one clock read on each side of the call
// and nothing else.
func Instrument(s Store, backend string, obs Observer) Store {
	return &instrumented{s: s, backend: backend, obs: obs}
}

type instrumented struct {
	s       Store
	backend string
	obs     Observer
}

var _ Store = (*instrumented)(nil)

func (i *instrumented) observe(op string, start time.Time, err error) {
	i.obs.ObserveStoreCall(i.backend, op, time.Since(start), err)
}

func (i *instrumented) Acquire(ctx context.Context, req AcquireRequest) (Answer, error) {
	start := time.Now()
	a, err := i.s.Acquire(ctx, req)
	i.observe(OpAcquire, start, err)
	return a, err
}

func (i *instrumented) Complete(ctx context.Context, claim Claim, c Completion) (Answer, error) {
	start := time.Now()
	a, err := i.s.Complete(ctx, claim, c)
	i.observe(OpComplete, start, err)
	return a, err
}

func (i *instrumented) EndLease(ctx context.Context, claim Claim) (Answer, error) {
	start := time.Now()
	a, err := i.s.EndLease(ctx, claim)
	i.observe(OpEndLease, start, err)
	return a, err
}

func (i *instrumented) AbandonUnsent(ctx context.Context, claim Claim) (Answer, error) {
	start := time.Now()
	a, err := i.s.AbandonUnsent(ctx, claim)
	i.observe(OpAbandonUnsent, start, err)
	return a, err
}

func (i *instrumented) MarkUnknown(ctx context.Context, claim Claim) (Answer, error) {
	start := time.Now()
	a, err := i.s.MarkUnknown(ctx, claim)
	i.observe(OpMarkUnknown, start, err)
	return a, err
}

func (i *instrumented) Takeover(ctx context.Context, req TakeoverRequest) (Answer, error) {
	start := time.Now()
	a, err := i.s.Takeover(ctx, req)
	i.observe(OpTakeover, start, err)
	return a, err
}

func (i *instrumented) Get(ctx context.Context, key string) (Record, bool, error) {
	start := time.Now()
	rec, found, err := i.s.Get(ctx, key)
	i.observe(OpGet, start, err)
	return rec, found, err
}

func (i *instrumented) Resolve(ctx context.Context, key string, c Completion) (Answer, error) {
	start := time.Now()
	a, err := i.s.Resolve(ctx, key, c)
	i.observe(OpResolve, start, err)
	return a, err
}

func (i *instrumented) Sweep(ctx context.Context, limit int) (int, error) {
	start := time.Now()
	n, err := i.s.Sweep(ctx, limit)
	i.observe(OpSweep, start, err)
	return n, err
}

func (i *instrumented) Ping(ctx context.Context) error {
	start := time.Now()
	err := i.s.Ping(ctx)
	i.observe(OpPing, start, err)
	return err
}

func (i *instrumented) Close() error { return i.s.Close() }
