package state_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/state"
	"github.com/idemgate/idemgate/state/memory"
	"github.com/idemgate/idemgate/state/statetest"
)

type call struct {
	backend, op string
	err         error
}

type recorder struct {
	mu    sync.Mutex
	calls []call
}

func (r *recorder) ObserveStoreCall(backend, op string, took time.Duration, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls = append(r.calls, call{backend, op, err})
}

func TestInstrumentReportsEveryCall(t *testing.T) {
	rec := &recorder{}
	s := state.Instrument(memory.New(memory.Options{}), "memory", rec)
	ctx := t.Context()
	key := statetest.NewKey(t)
	claim := state.Claim{Key: key, Owner: "o", Fence: 1}
	_, _ = s.Acquire(ctx, statetest.AcquireRequest(key, "o"))
	_, _ = s.EndLease(ctx, claim)
	_, _ = s.AbandonUnsent(ctx, claim)
	_, _ = s.Takeover(ctx, state.TakeoverRequest{Key: key, NewOwner: "p", Fence: 1, Lease: time.Minute})
	_, _ = s.MarkUnknown(ctx, claim)
	_, _ = s.Complete(ctx, claim, statetest.Done())
	_, _, _ = s.Get(ctx, key)
	_, _ = s.Resolve(ctx, key, statetest.Done())
	_, _ = s.Sweep(ctx, 10)
	_ = s.Ping(ctx)
	_, _, badErr := s.Get(ctx, "bad")

	var ops []string
	for _, c := range rec.calls {
		require.Equal(t, "memory", c.backend)
		ops = append(ops, c.op)
	}
	require.Equal(t, []string{
		state.OpAcquire, state.OpEndLease, state.OpAbandonUnsent, state.OpTakeover, state.OpMarkUnknown, state.OpComplete,
		state.OpGet, state.OpResolve, state.OpSweep, state.OpPing, state.OpGet,
	}, ops)
	require.ErrorIs(t, badErr, state.ErrInvalidArgument)
	require.ErrorIs(t, rec.calls[len(rec.calls)-1].err, state.ErrInvalidArgument)
	require.NoError(t, s.Close())
}

func TestUnavailableWrapsBoth(t *testing.T) {
	err := state.Unavailable("acquire", context.DeadlineExceeded)
	require.ErrorIs(t, err, state.ErrUnavailable)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.Equal(t, "failed to acquire: store unavailable: context deadline exceeded", err.Error())
	require.NoError(t, state.Unavailable("x", nil))
	require.False(t, errors.Is(state.Unavailable("x", errors.New("boom")), context.Canceled))
}

func TestValidKey(t *testing.T) {
	for _, tc := range []struct {
		key string
		ok  bool
	}{
		{"0123456789abcdef0123456789abcdef", true},
		{"0123456789ABCDEF0123456789abcdef", false},
		{"0123456789abcdef0123456789abcde", false},
		{"0123456789abcdef0123456789abcdef0", false},
		{"0123456789abcdef0123456789abcdeg", false},
		{"", false},
	} {
		t.Run(tc.key, func(t *testing.T) {
			err := state.ValidKey(tc.key)
			if tc.ok {
				require.NoError(t, err)
			} else {
				require.ErrorIs(t, err, state.ErrInvalidArgument)
			}
		})
	}
}

func TestDurationMicrosRoundsUp(t *testing.T) {
	require.Equal(t, int64(1), state.DurationMicros(time.Nanosecond))
	require.Equal(t, int64(1500), state.DurationMicros(1500*time.Microsecond))
	require.Equal(t, int64(0), state.DurationMicros(0))
}
