package extproc

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/state"
)

// failingCompletes fails the next n Completes (a store cut or restart right
// after the upstream executed).
type failingCompletes struct {
	state.Store
	n atomic.Int32
}

func (f *failingCompletes) Complete(ctx context.Context, claim state.Claim, c state.Completion) (state.Answer, error) {
	if f.n.Add(-1) >= 0 {
		return state.Answer{}, state.Unavailable(state.OpComplete, context.DeadlineExceeded)
	}
	return f.Store.Complete(ctx, claim, c)
}

// TestFailedCompleteIsRetriedInTheBackground: the client got the upstream's
// answer and will not come back; the record still becomes DONE with that
// answer once the store answers again, instead of staying IN_FLIGHT.
func TestFailedCompleteIsRetriedInTheBackground(t *testing.T) {
	clk := newClock()
	store := &failingCompletes{Store: newMemoryStore(clk)}
	e := newEnv(t, store, clk)
	d := fakeDialer{srv: e.srv}
	fp := preview(t, d, "alice", `8`)
	nonce := e.claimsOf(t, fp, "alice", "payments.transfer").Nonce
	store.n.Store(3)
	p := newPayments()
	res := do(t, d, post("/v1/transfers/confirm", "alice", transferBody(`8`, "EUR", "DE89", fp)), p.handle)
	require.Equal(t, 201, res.status, "the client gets the upstream's answer whatever the store says")
	require.Eventually(t, func() bool {
		rec, found := e.recordNow(nonce)
		return found && rec.State == state.Done && rec.Result.Status == 201
	}, 10*time.Second, 20*time.Millisecond, "the completion landed in the background")
	require.Eventually(t, func() bool {
		return metricNow(e.metrics.settlements.WithLabelValues("transfer", "done")) == 1
	}, 5*time.Second, 10*time.Millisecond)
	// A replay answers from the record, the upstream runs once.
	res = do(t, d, post("/v1/transfers/confirm", "alice", transferBody(`8`, "EUR", "DE89", fp)), neverCalled(t))
	require.Equal(t, "true", res.headers["idempotent-replayed"])
	require.Equal(t, 1, p.Executions())
}

// takeoverDuringComplete is a store on which A's Complete is lost in the air
// (unavailable) while A's lease ends and B takes the record over: what a
// store cut longer than ttl.in_flight looks like from A. endLease ends A's
// lease: the fake clock moved past it (memory store), or EndLease for the
// real stores, whose clocks the test does not own.
type takeoverDuringComplete struct {
	state.Store
	endLease func(ctx context.Context, claim state.Claim) error
	lease    time.Duration
	fired    atomic.Bool
	// claimB is B's claim once the takeover happened.
	claimB atomic.Pointer[state.Claim]
}

func (s *takeoverDuringComplete) Complete(ctx context.Context, claim state.Claim, c state.Completion) (state.Answer, error) {
	if s.fired.CompareAndSwap(false, true) {
		if err := s.endLease(ctx, claim); err != nil {
			return state.Answer{}, fmt.Errorf("the test could not end A's lease: %w", err)
		}
		ans, err := s.Store.Takeover(ctx, state.TakeoverRequest{Key: claim.Key, NewOwner: "replica-b", Fence: claim.Fence, Lease: s.lease})
		if err != nil || ans.Outcome != state.OutcomeAcquired {
			return state.Answer{}, fmt.Errorf("the test's takeover by B failed: %v %v", ans.Outcome, err)
		}
		s.claimB.Store(&state.Claim{Key: claim.Key, Owner: ans.Record.Owner, Fence: ans.Record.Fence})
		return state.Answer{}, state.Unavailable(state.OpComplete, context.DeadlineExceeded)
	}
	return s.Store.Complete(ctx, claim, c)
}

// TestLateBackgroundCompleteAfterTakeoverIsNotOwner: A acquires and calls
// the upstream, its Complete fails, B takes the record over (A's lease
// ended), then A's background complete-later retry runs. It must be refused
// as NOT_OWNER and leave the record B's: IN_FLIGHT, B's owner and fence, no
// result. A retry that adopted the current holder's owner and fence would
// write A's answer over B's claim (B's execution then replays A's result);
// this test is what fails then. On the memory store and on the production
// one (Redis in front of PostgreSQL).
func TestLateBackgroundCompleteAfterTakeoverIsNotOwner(t *testing.T) {
	const lease = 2 * time.Minute
	t.Run("memory", func(t *testing.T) {
		clk := newClock()
		store := &takeoverDuringComplete{Store: newMemoryStore(clk), lease: lease,
			endLease: func(context.Context, state.Claim) error { clk.Advance(lease + time.Second); return nil }}
		lateCompleteAfterTakeover(t, newEnv(t, store, clk), store)
	})
	t.Run("tiered", func(t *testing.T) {
		if testing.Short() {
			t.Skip("needs Redis and PostgreSQL")
		}
		backend := tieredStore(t, nil)
		store := &takeoverDuringComplete{Store: backend, lease: lease,
			endLease: func(ctx context.Context, claim state.Claim) error {
				ans, err := backend.EndLease(ctx, claim)
				if err == nil && ans.Outcome != state.OutcomeOK {
					err = fmt.Errorf("EndLease answered %s", ans.Outcome)
				}
				return err
			}}
		lateCompleteAfterTakeover(t, newEnv(t, store, nil), store)
	})
}

func lateCompleteAfterTakeover(t *testing.T, e *env, store *takeoverDuringComplete) {
	d := fakeDialer{srv: e.srv}
	fp := preview(t, d, "alice", `9`)
	nonce := e.claimsOf(t, fp, "alice", "payments.transfer").Nonce
	p := newPayments()
	res := do(t, d, post("/v1/transfers/confirm", "alice", transferBody(`9`, "EUR", "DE89", fp)), p.handle)
	require.Equal(t, 201, res.status, "A's client gets the upstream's answer")
	require.True(t, store.fired.Load(), "A's Complete went to the store")
	claimB := store.claimB.Load()
	require.NotNil(t, claimB)

	// The background retry ends NOT_OWNER...
	require.Eventually(t, func() bool {
		return metricNow(e.metrics.settlements.WithLabelValues("transfer", "not_owner")) == 1
	}, 10*time.Second, 10*time.Millisecond, "A's late complete was refused")
	require.Equal(t, float64(0), metricNow(e.metrics.settlements.WithLabelValues("transfer", "done")))
	// ...and the record is still B's, untouched.
	rec, found := e.record(t, nonce)
	require.True(t, found)
	require.Equal(t, state.InFlight, rec.State, "A's answer was not written over B's claim")
	require.Equal(t, "replica-b", rec.Owner)
	require.Equal(t, claimB.Fence, rec.Fence)
	require.Equal(t, int64(2), rec.Fence)
	require.Nil(t, rec.Result, "no result recorded for B's attempt")
	// B can still settle its own attempt.
	ans, err := store.Store.Complete(t.Context(), *claimB, state.Completion{
		State: state.Done, Result: state.Result{Status: 201, Body: []byte(`{"id":"b"}`)}, Retention: time.Hour,
	})
	require.NoError(t, err)
	require.Equal(t, state.OutcomeOK, ans.Outcome)
	require.Equal(t, 1, p.Executions())
}
