package extproc

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/fingerprint"
	"github.com/idemgate/idemgate/state"
)

// A confirm with an expired fingerprint reads the record (an agent that
// comes back late must learn what its earlier confirm did). Every branch of
// that read is held here: the record decides, a record held under other
// params is a security event, and a store that cannot answer is never
// "expired, nothing was executed".
func TestExpiredFingerprintConsultsTheRecord(t *testing.T) {
	const alice = "alice"
	const ttlFingerprint = 15 * time.Minute
	body := func(amount, fp string) []byte { return transferBody(amount, "EUR", "DE89", fp) }
	confirm := func(b []byte) httpRequest { return post("/v1/transfers/confirm", alice, b) }

	t.Run("a record held under other params: params_changed and a security event", func(t *testing.T) {
		e := newEnv(t, nil, nil)
		d := fakeDialer{srv: e.srv}
		fp := preview(t, d, alice, `1`)
		c := e.claimsOf(t, fp, alice, "payments.transfer")
		res := do(t, d, confirm(body(`1`, fp)), newPayments().handle)
		require.Equal(t, 201, res.status)

		// A token whose MAC verifies, for the same nonce but other params:
		// a leaked key or a bug. Expired, so only the record can refuse it.
		doc, err := fingerprint.ParseJSON(body(`1000`, ""), 32)
		require.NoError(t, err)
		params, err := e.cfg.Operations[0].Selector.Select(doc, nil)
		require.NoError(t, err)
		forged, _, err := e.cfg.Keys.Sign(fingerprint.SignRequest{Subject: alice, Scope: "payments.transfer", Params: params, Nonce: c.Nonce, Expiry: e.clock.Now().Add(time.Minute)})
		require.NoError(t, err)
		e.clock.Advance(time.Minute + time.Second)

		res = do(t, d, confirm(body(`1000`, forged)), neverCalled(t))
		requireEnvelope(t, res, 422, "params_changed", false)
		require.Contains(t, e.logs.String(), "event=security_alert reason=store_param_mismatch operation=transfer nonce="+c.Nonce)
		require.Equal(t, float64(1), metricValue(t, e.metrics.securityEvents.WithLabelValues("store_param_mismatch")))
	})

	t.Run("drifted params on an expired fingerprint: params_changed and a security event", func(t *testing.T) {
		e := newEnv(t, nil, nil)
		d := fakeDialer{srv: e.srv}
		fp := preview(t, d, alice, `2`)
		e.clock.Advance(ttlFingerprint + time.Second)
		res := do(t, d, confirm(body(`2000`, fp)), neverCalled(t))
		b := requireEnvelope(t, res, 422, "params_changed", false)
		require.Equal(t, []any{"amount"}, b["changed_fields"])
		require.Contains(t, e.logs.String(), "event=security_alert reason=params_changed operation=transfer")
		require.Zero(t, e.store.Calls("get"), "a drifted body is refused before the store")
	})

	t.Run("a store that cannot answer: temporarily_unavailable, not expired", func(t *testing.T) {
		e := newEnv(t, nil, nil)
		d := fakeDialer{srv: e.srv}
		fp := preview(t, d, alice, `3`)
		res := do(t, d, confirm(body(`3`, fp)), newPayments().handle)
		require.Equal(t, 201, res.status)
		e.clock.Advance(ttlFingerprint + time.Second)
		e.store.fail.Store(true)
		res = do(t, d, confirm(body(`3`, fp)), neverCalled(t))
		requireEnvelope(t, res, 503, "temporarily_unavailable", true)
		e.store.fail.Store(false)
		res = do(t, d, confirm(body(`3`, fp)), neverCalled(t))
		requireEnvelope(t, res, 201, "already_completed", false)
	})

	t.Run("in flight and unknown records are answered as such", func(t *testing.T) {
		e := newEnv(t, nil, nil)
		d := fakeDialer{srv: e.srv}
		fp := preview(t, d, alice, `4`)
		c := e.claimsOf(t, fp, alice, "payments.transfer")
		held := e.holdRecord(t, c, "payments.transfer", time.Hour)
		e.clock.Advance(ttlFingerprint + time.Second)
		res := do(t, d, confirm(body(`4`, fp)), neverCalled(t))
		requireEnvelope(t, res, 409, "in_progress", false)

		a, err := e.store.Store.MarkUnknown(t.Context(), state.Claim{Key: c.Nonce, Owner: held.Record.Owner, Fence: held.Record.Fence})
		require.NoError(t, err)
		require.Equal(t, state.OutcomeOK, a.Outcome)
		res = do(t, d, confirm(body(`4`, fp)), neverCalled(t))
		requireEnvelope(t, res, 409, "needs_reconciliation", false)
	})

	// The replica's memory of terminal records answers an expired token's
	// replay as it answers an unexpired one: the store is read once, then
	// not again; and a record remembered before the expiry is not read at
	// all. Same answer every time.
	t.Run("a replay after the expiry is answered from memory once read", func(t *testing.T) {
		e := newEnv(t, nil, nil)
		d := fakeDialer{srv: e.srv}
		fp := preview(t, d, alice, `6`)
		require.Equal(t, 201, do(t, d, confirm(body(`6`, fp)), newPayments().handle).status)
		e.clock.Advance(ttlFingerprint + time.Second)
		first := do(t, d, confirm(body(`6`, fp)), neverCalled(t))
		requireEnvelope(t, first, 201, "already_completed", false)
		require.Equal(t, 1, e.store.Calls("get"))
		for range 2 {
			again := do(t, d, confirm(body(`6`, fp)), neverCalled(t))
			require.Equal(t, string(first.body), string(again.body))
		}
		require.Equal(t, 1, e.store.Calls("get"), "an expired replay read the store again")
		require.Equal(t, float64(2), metricValue(t, e.metrics.terminalCache.WithLabelValues("hit")))

		fp = preview(t, d, alice, `7`)
		require.Equal(t, 201, do(t, d, confirm(body(`7`, fp)), newPayments().handle).status)
		requireEnvelope(t, do(t, d, confirm(body(`7`, fp)), neverCalled(t)), 201, "already_completed", false)
		e.clock.Advance(ttlFingerprint + time.Second)
		requireEnvelope(t, do(t, d, confirm(body(`7`, fp)), neverCalled(t)), 201, "already_completed", false)
		require.Equal(t, 1, e.store.Calls("get"), "a record remembered before the expiry was read again")
	})

	t.Run("nothing ever acquired: fingerprint_expired", func(t *testing.T) {
		e := newEnv(t, nil, nil)
		d := fakeDialer{srv: e.srv}
		fp := preview(t, d, alice, `5`)
		e.clock.Advance(ttlFingerprint + time.Second)
		res := do(t, d, confirm(body(`5`, fp)), neverCalled(t))
		requireEnvelope(t, res, 410, "fingerprint_expired", false)
		require.Equal(t, 1, e.store.Calls("get"), "the record was read before answering expired")
	})
}
