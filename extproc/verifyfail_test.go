package extproc

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/state"
)

// vanishingStore gives a claim back (as a concurrent AbandonUnsent would)
// right after a Get has read it, so the next call finds nothing.
type vanishingStore struct {
	state.Store
	claim state.Claim
}

func (v *vanishingStore) Get(ctx context.Context, key string) (state.Record, bool, error) {
	rec, found, err := v.Store.Get(ctx, key)
	if err == nil && found {
		if _, aerr := v.Store.AbandonUnsent(ctx, v.claim); aerr != nil {
			return state.Record{}, false, aerr
		}
	}
	return rec, found, err
}

// An expired fingerprint never acquires: whatever its record says and
// whatever happens to it meanwhile, the request is not let through
// ("refused from exp + 1s"). Each case here let it through before.
func TestExpiredFingerprintNeverAcquires(t *testing.T) {
	const alice = "alice"
	const ttlFingerprint = 15 * time.Minute

	t.Run("an abandoned claim whose lease ran out is not taken over", func(t *testing.T) {
		e := newEnv(t, nil, nil)
		d := fakeDialer{srv: e.srv}
		fp := preview(t, d, alice, `7`)
		c := e.claimsOf(t, fp, alice, "payments.transfer")
		e.holdRecord(t, c, "payments.transfer", time.Minute)
		e.clock.Advance(ttlFingerprint + time.Second)

		res := do(t, d, post("/v1/transfers/confirm", alice, transferBody(`7`, "EUR", "DE89", fp)), neverCalled(t))
		requireEnvelope(t, res, 409, "needs_reconciliation", false)
		require.Zero(t, e.store.Calls(state.OpTakeover))
		require.Zero(t, e.store.Calls(state.OpAcquire))
		rec, found := e.record(t, c.Nonce)
		require.True(t, found)
		require.Equal(t, state.Unknown, rec.State, "the claim no one can re-send waits for a person")
	})

	t.Run("a claim that vanishes while it is read is not acquired again", func(t *testing.T) {
		e := newEnv(t, nil, nil)
		d := fakeDialer{srv: e.srv}
		res := do(t, d, post("/v1/accounts/a/payouts/preview", alice, []byte(`{"amount":8}`)), previewOK)
		require.Nil(t, res.immediate, string(res.body))
		fp := res.json(t)["fingerprint"].(string)
		c := e.claimsOf(t, fp, alice, "payments.payout")
		held := e.holdRecord(t, c, "payments.payout", time.Minute)
		e.useStore(t, &vanishingStore{Store: e.store.Store, claim: state.Claim{Key: c.Nonce, Owner: held.Record.Owner, Fence: 1}})
		d = fakeDialer{srv: e.srv}
		e.clock.Advance(ttlFingerprint + time.Second)

		res = do(t, d, post("/v1/accounts/a/payouts/confirm", alice, []byte(`{"amount":8,"fingerprint":"`+fp+`"}`)), neverCalled(t))
		requireEnvelope(t, res, 410, "fingerprint_expired", false)
		require.Zero(t, e.store.Calls(state.OpAcquire))
		_, found := e.record(t, c.Nonce)
		require.False(t, found, "nothing was claimed for the expired token")
	})
}
