package memory_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/state"
	"github.com/idemgate/idemgate/state/memory"
	"github.com/idemgate/idemgate/state/statetest"
)

// fakeClock is a clock tests move by hand.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

func TestConformanceRealClock(t *testing.T) {
	statetest.Run(t, func(t *testing.T) state.Store {
		s := memory.New(memory.Options{})
		t.Cleanup(func() { _ = s.Close() })
		return s
	})
}

func TestConformanceFakeClock(t *testing.T) {
	clock := &fakeClock{now: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
	statetest.RunWith(t, func(t *testing.T) state.Store {
		s := memory.New(memory.Options{Now: clock.Now})
		t.Cleanup(func() { _ = s.Close() })
		return s
	}, statetest.Options{Wait: clock.Advance})
}

func TestExpiredRecordsVanishAndAreSwept(t *testing.T) {
	clock := &fakeClock{now: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
	s := memory.New(memory.Options{Now: clock.Now})
	ctx := t.Context()
	var keys []string
	for i := 0; i < 5; i++ {
		key := statetest.NewKey(t)
		req := statetest.AcquireRequest(key, "o")
		req.Lease = time.Second
		req.Retention = time.Minute
		a, err := s.Acquire(ctx, req)
		statetest.RequireOutcome(t, state.OutcomeAcquired, a, err)
		keys = append(keys, key)
	}
	require.Equal(t, 5, s.Len())

	clock.Advance(2 * time.Minute)
	// Reading an expired record treats it as absent and deletes it.
	_, found, err := s.Get(ctx, keys[0])
	require.NoError(t, err)
	require.False(t, found)
	require.Equal(t, 4, s.Len())

	// Sweep works in bounded batches.
	n, err := s.Sweep(ctx, 3)
	require.NoError(t, err)
	require.Equal(t, 3, n)
	n, err = s.Sweep(ctx, 3)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Zero(t, s.Len())
}

func TestRetentionNeverShorterThanLease(t *testing.T) {
	clock := &fakeClock{now: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
	s := memory.New(memory.Options{Now: clock.Now})
	key := statetest.NewKey(t)
	req := statetest.AcquireRequest(key, "o")
	req.Lease = time.Hour
	req.Retention = time.Minute
	a, err := s.Acquire(t.Context(), req)
	statetest.RequireOutcome(t, state.OutcomeAcquired, a, err)
	clock.Advance(30 * time.Minute)
	b, err := s.Acquire(t.Context(), statetest.AcquireRequest(key, "p"))
	statetest.RequireOutcome(t, state.OutcomeInFlight, b, err)
}

func TestStoredResultCannotBeChangedByCaller(t *testing.T) {
	s := memory.New(memory.Options{})
	ctx := t.Context()
	key := statetest.NewKey(t)
	_, err := s.Acquire(ctx, statetest.AcquireRequest(key, "o"))
	require.NoError(t, err)
	c := statetest.Done()
	_, err = s.Complete(ctx, state.Claim{Key: key, Owner: "o", Fence: 1}, c)
	require.NoError(t, err)
	c.Result.Body[0] = 'X'
	c.Result.Headers[0].Value = "changed"
	rec, _, err := s.Get(ctx, key)
	require.NoError(t, err)
	statetest.RequireSameResult(t, statetest.SampleResult(), rec.Result)
	rec.Result.Body[0] = 'Y'
	again, _, err := s.Get(ctx, key)
	require.NoError(t, err)
	statetest.RequireSameResult(t, statetest.SampleResult(), again.Result)
}

func TestClosedStoreFails(t *testing.T) {
	s := memory.New(memory.Options{})
	require.NoError(t, s.Close())
	_, err := s.Acquire(context.Background(), statetest.AcquireRequest(statetest.NewKey(t), "o"))
	require.ErrorIs(t, err, state.ErrUnavailable)
	require.ErrorIs(t, err, memory.ErrClosed)
}

func TestApprovalConformance(t *testing.T) {
	statetest.RunApprovals(t, func(t *testing.T) statetest.ApprovalStore {
		s := memory.New(memory.Options{})
		t.Cleanup(func() { _ = s.Close() })
		return s
	}, statetest.ApprovalOptions{})
}

func TestApprovalConformanceFakeClock(t *testing.T) {
	clock := &fakeClock{now: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
	statetest.RunApprovals(t, func(t *testing.T) statetest.ApprovalStore {
		s := memory.New(memory.Options{Now: clock.Now})
		t.Cleanup(func() { _ = s.Close() })
		return s
	}, statetest.ApprovalOptions{Now: clock.Now, Wait: clock.Advance})
}
