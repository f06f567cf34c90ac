package extproc

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/state"
	"github.com/idemgate/idemgate/state/memory"
)

func newMemoryStore(clk *clock) state.Store { return memory.New(memory.Options{Now: clk.Now}) }

// If the reply that lets the request through cannot be sent, the upstream
// was never contacted: the fresh claim is abandoned (deleted), so the next
// confirm acquires afresh, even for a downstream that ignores keys (EndLease
// would make that one needs_reconciliation, MarkUnknown likewise).
func TestAcquiredReplyNotSentIsAbandoned(t *testing.T) {
	for _, tc := range []struct{ name, preview, confirm, body, scope string }{
		{"honours keys", "/v1/transfers/preview", "/v1/transfers/confirm", `{"amount":1,"currency":"EUR","payee":{"account_id":"x"}`, "payments.transfer"},
		{"ignores keys", "/v1/accounts/a/payouts/preview", "/v1/accounts/a/payouts/confirm", `{"amount":1`, "payments.payout"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, nil, nil)
			d := fakeDialer{srv: e.srv}
			res := do(t, d, post(tc.preview, "alice", []byte(tc.body+"}")), previewOK)
			fp := res.json(t)["fingerprint"].(string)
			confirmBody := []byte(tc.body + fmt.Sprintf(`,"fingerprint":%q}`, fp))
			c := d.openFake(t)
			resp := exchangeOne(t, c, reqHeaders(confirmHeaders(tc.confirm, "alice"), false))
			require.NotNil(t, resp.GetRequestHeaders())
			broken := errors.New("transport is closing")
			c.FailSends(broken)
			require.NoError(t, c.Send(reqBody(confirmBody)))
			require.ErrorIs(t, c.wait(t), broken)
			require.Equal(t, 1, e.store.Calls(state.OpAbandonUnsent))
			require.Equal(t, 0, e.store.Calls(state.OpEndLease))
			require.Equal(t, 0, e.store.Calls(state.OpMarkUnknown))
			nonce := e.claimsOf(t, fp, "alice", tc.scope).Nonce
			_, found := e.record(t, nonce)
			require.False(t, found, "the claim that never reached the upstream is gone")
			require.Equal(t, float64(1), metricValue(t, e.metrics.settlements.WithLabelValues(opName(tc.scope), "abandoned")))

			// The retry runs the call: it was never executed.
			p := newPayments()
			res = do(t, d, post(tc.confirm, "alice", confirmBody), p.handle)
			require.Nil(t, res.immediate, "not needs_reconciliation, not in_progress: %s", res.body)
			require.Equal(t, 201, res.status)
			require.Equal(t, 1, p.Executions())
			rec, found := e.record(t, nonce)
			require.True(t, found)
			require.Equal(t, state.Done, rec.State)
			require.Equal(t, int64(1), rec.Fence)
		})
	}
}

func opName(scope string) string {
	if scope == "payments.payout" {
		return "payout"
	}
	return "transfer"
}

// A claim made by a takeover whose reply was not sent keeps its record: the
// earlier attempt may have executed. Only the lease ends, and the retry
// takes over again and re-sends the same key.
func TestUnsentReplyAfterTakeoverEndsTheLease(t *testing.T) {
	e := newEnv(t, nil, nil)
	d := fakeDialer{srv: e.srv}
	fp := preview(t, d, "alice", `5`)
	c := e.claimsOf(t, fp, "alice", "payments.transfer")
	e.holdRecord(t, c, "payments.transfer", 2*time.Minute)
	e.clock.Advance(2*time.Minute + time.Second)

	s := d.openFake(t)
	resp := exchangeOne(t, s, reqHeaders(confirmHeaders("/v1/transfers/confirm", "alice"), false))
	require.NotNil(t, resp.GetRequestHeaders())
	broken := errors.New("transport is closing")
	s.FailSends(broken)
	require.NoError(t, s.Send(reqBody(transferBody(`5`, "EUR", "DE89", fp))))
	require.ErrorIs(t, s.wait(t), broken)
	require.Equal(t, 1, e.store.Calls(state.OpTakeover))
	require.Equal(t, 1, e.store.Calls(state.OpAbandonUnsent))
	rec, found := e.record(t, c.Nonce)
	require.True(t, found, "a taken-over record is kept")
	require.Equal(t, int64(2), rec.Fence)
	require.True(t, rec.LeaseExpired)

	p := newPayments()
	res := do(t, d, post("/v1/transfers/confirm", "alice", transferBody(`5`, "EUR", "DE89", fp)), p.handle)
	require.Equal(t, 201, res.status)
	require.Equal(t, c.Nonce, res.upstreamHdrs["idempotency-key"])
	rec, _ = e.record(t, c.Nonce)
	require.Equal(t, state.Done, rec.State)
	require.Equal(t, int64(3), rec.Fence)
}

// lateStore writes like its backend but, when armed with an operation name,
// answers the next call of that operation only after the caller's deadline
// has passed: a backend that committed the claim while the caller gave up
// on it.
type lateStore struct {
	state.Store
	armed atomic.Value // state.OpAcquire or state.OpTakeover
}

func (l *lateStore) late(ctx context.Context, op string, a state.Answer, err error) (state.Answer, error) {
	if err != nil || !l.armed.CompareAndSwap(op, "") {
		return a, err
	}
	<-ctx.Done()
	return state.Answer{}, state.Unavailable(op, ctx.Err())
}

func newLateStore(s state.Store) *lateStore {
	l := &lateStore{Store: s}
	l.armed.Store("")
	return l
}

func (l *lateStore) Acquire(ctx context.Context, req state.AcquireRequest) (state.Answer, error) {
	a, err := l.Store.Acquire(context.WithoutCancel(ctx), req)
	return l.late(ctx, state.OpAcquire, a, err)
}

func (l *lateStore) Takeover(ctx context.Context, req state.TakeoverRequest) (state.Answer, error) {
	a, err := l.Store.Takeover(context.WithoutCancel(ctx), req)
	return l.late(ctx, state.OpTakeover, a, err)
}

// An Acquire that times out after the backend committed the claim answers
// temporarily_unavailable ("nothing executed, retry"), and the retry the
// agent makes at once is ACQUIRED, not in_progress for the whole lease.
func TestAcquireTimeoutAfterCommitDoesNotBlockTheRetry(t *testing.T) {
	clk := newClock()
	late := newLateStore(newMemoryStore(clk))
	e := newEnv(t, late, clk)
	e.srv.storeTimeout = 50 * time.Millisecond
	d := fakeDialer{srv: e.srv}
	fp := preview(t, d, "alice", `6`)
	nonce := e.claimsOf(t, fp, "alice", "payments.transfer").Nonce
	body := transferBody(`6`, "EUR", "DE89", fp)

	late.armed.Store(state.OpAcquire)
	res := do(t, d, post("/v1/transfers/confirm", "alice", body), neverCalled(t))
	requireEnvelope(t, res, 503, "temporarily_unavailable", true)

	p := newPayments()
	res = do(t, d, post("/v1/transfers/confirm", "alice", body), p.handle)
	require.Nil(t, res.immediate, "the retry must not be told to wait: %s", res.body)
	require.Equal(t, 201, res.status)
	require.Equal(t, nonce, res.upstreamHdrs["idempotency-key"])
	require.Equal(t, 1, p.Executions())
	rec, _ := e.record(t, nonce)
	require.Equal(t, state.Done, rec.State)
	require.Equal(t, int64(1), rec.Fence, "the orphaned claim was deleted, the retry acquired afresh")
	require.Equal(t, float64(1), metricValue(t, e.metrics.backgroundAbandons.WithLabelValues("transfer", abandonResultAbandoned)))
}

// Without a retry waiting, the orphaned claim is given back in the
// background all the same: a retry that comes later (another replica, the
// agent after Retry-After) finds nothing to wait for.
func TestOrphanedClaimIsAbandonedInTheBackground(t *testing.T) {
	clk := newClock()
	late := newLateStore(newMemoryStore(clk))
	e := newEnv(t, late, clk)
	e.srv.storeTimeout = 50 * time.Millisecond
	d := fakeDialer{srv: e.srv}
	fp := preview(t, d, "alice", `7`)
	nonce := e.claimsOf(t, fp, "alice", "payments.transfer").Nonce

	late.armed.Store(state.OpAcquire)
	res := do(t, d, post("/v1/transfers/confirm", "alice", transferBody(`7`, "EUR", "DE89", fp)), neverCalled(t))
	requireEnvelope(t, res, 503, "temporarily_unavailable", true)
	require.Eventually(t, func() bool {
		_, found := e.recordNow(nonce)
		return !found
	}, 5*time.Second, 5*time.Millisecond)
	require.Eventually(t, func() bool {
		return metricNow(e.metrics.backgroundAbandons.WithLabelValues("transfer", abandonResultAbandoned)) == 1
	}, 5*time.Second, 5*time.Millisecond)
}

// A takeover that times out after it landed: its lease is ended again in
// the background (the record stays: the first attempt may have executed),
// and the retry takes over once more, re-sending the same key.
func TestTakeoverTimeoutAfterCommit(t *testing.T) {
	clk := newClock()
	late := newLateStore(newMemoryStore(clk))
	e := newEnv(t, late, clk)
	e.srv.storeTimeout = 50 * time.Millisecond
	d := fakeDialer{srv: e.srv}
	fp := preview(t, d, "alice", `8`)
	c := e.claimsOf(t, fp, "alice", "payments.transfer")
	e.holdRecord(t, c, "payments.transfer", 2*time.Minute)
	e.clock.Advance(2*time.Minute + time.Second)
	body := transferBody(`8`, "EUR", "DE89", fp)

	late.armed.Store(state.OpTakeover)
	res := do(t, d, post("/v1/transfers/confirm", "alice", body), neverCalled(t))
	requireEnvelope(t, res, 503, "temporarily_unavailable", true)
	require.Equal(t, 1, e.store.Calls(state.OpTakeover))

	p := newPayments()
	res = do(t, d, post("/v1/transfers/confirm", "alice", body), p.handle)
	require.Equal(t, 201, res.status, "%s", res.body)
	require.Equal(t, c.Nonce, res.upstreamHdrs["idempotency-key"])
	rec, _ := e.record(t, c.Nonce)
	require.Equal(t, state.Done, rec.State)
	require.Equal(t, int64(3), rec.Fence, "the landed takeover (2) was ended, the retry took over again (3)")
}

// A failure before anything was written is recognised as such: the
// background pursuit stops once the store answers, and touches no claim
// made since.
func TestFailedAcquireThatWroteNothing(t *testing.T) {
	e := newEnv(t, nil, nil)
	d := fakeDialer{srv: e.srv}
	fp := preview(t, d, "alice", `9`)
	body := transferBody(`9`, "EUR", "DE89", fp)
	e.store.fail.Store(true)
	res := do(t, d, post("/v1/transfers/confirm", "alice", body), neverCalled(t))
	e.store.fail.Store(false)
	requireEnvelope(t, res, 503, "temporarily_unavailable", true)
	p := newPayments()
	res = do(t, d, post("/v1/transfers/confirm", "alice", body), p.handle)
	require.Equal(t, 201, res.status)
	require.Eventually(t, func() bool {
		return metricNow(e.metrics.backgroundAbandons.WithLabelValues("transfer", abandonResultNothing)) == 1
	}, 5*time.Second, 10*time.Millisecond)
	rec, _ := e.record(t, e.claimsOf(t, fp, "alice", "payments.transfer").Nonce)
	require.Equal(t, state.Done, rec.State, "the retry's record is left alone")
}
