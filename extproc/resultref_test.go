package extproc

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/state"
)

// result_ref is read from the upstream body once, when the result is
// recorded, and replays name the result by the recorded value without
// parsing the body again. A result settled by a person carries no recorded
// ref: it is read from the body when answered, as before.
func TestResultRefIsRecordedAtCompletion(t *testing.T) {
	e := newEnv(t, nil, nil)
	d := fakeDialer{srv: e.srv}
	fp := preview(t, d, "alice", `21`)
	nonce := e.claimsOf(t, fp, "alice", "payments.transfer").Nonce
	body := transferBody(`21`, "EUR", "DE89", fp)
	res := do(t, d, post("/v1/transfers/confirm", "alice", body), newPayments().handle)
	require.Equal(t, 201, res.status)
	rec, _ := e.record(t, nonce)
	require.Equal(t, "tr_1", rec.Result.Ref)

	replay := do(t, d, post("/v1/transfers/confirm", "alice", body), neverCalled(t))
	require.Equal(t, "tr_1", requireEnvelope(t, replay, 201, "already_completed", false)["result_ref"])

	// A person settles another record (no ref recorded): read from the body.
	fp2 := preview(t, d, "alice", `22`)
	c := e.claimsOf(t, fp2, "alice", "payments.transfer")
	e.holdRecord(t, c, "payments.transfer", 2*time.Minute)
	r, err := e.store.Store.Resolve(t.Context(), c.Nonce, state.Completion{State: state.Done, Retention: time.Hour,
		Result: state.Result{Status: 200, Body: []byte(`{"transfer_id":"tr_manual"}`)}})
	require.NoError(t, err)
	require.Equal(t, state.OutcomeOK, r.Outcome)
	replay = do(t, d, post("/v1/transfers/confirm", "alice", transferBody(`22`, "EUR", "DE89", fp2)), neverCalled(t))
	require.Equal(t, "tr_manual", requireEnvelope(t, replay, 200, "already_completed", false)["result_ref"])

	// An operation without result_ref records nothing and answers the nonce.
	res = do(t, d, post("/v1/accounts/a/payouts/preview", "alice", []byte(`{"amount":23}`)), previewOK)
	fp3 := res.json(t)["fingerprint"].(string)
	c3 := e.claimsOf(t, fp3, "alice", "payments.payout")
	res = do(t, d, post("/v1/accounts/a/payouts/confirm", "alice", []byte(`{"amount":23,"fingerprint":"`+fp3+`"}`)), newPayments().handle)
	require.Equal(t, 201, res.status)
	rec, _ = e.record(t, c3.Nonce)
	require.Empty(t, rec.Result.Ref)
}
