package extproc

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/fingerprint"
)

// A replay of a record this replica has read terminal is answered from its
// memory (limits.terminal_cache_bytes): the same answer the store gives,
// without the store call. Anything that does not match what the store
// would check goes to the store.
func TestRepeatedReplaysAreAnsweredFromMemory(t *testing.T) {
	const alice = "alice"
	confirm := func(amount, fp string) httpRequest {
		return post("/v1/transfers/confirm", alice, transferBody(amount, "EUR", "DE89", fp))
	}
	executed := func(t *testing.T, e *env, d dialer, amount string) string {
		fp := preview(t, d, alice, amount)
		res := do(t, d, confirm(amount, fp), newPayments().handle)
		require.Equal(t, 201, res.status)
		return fp
	}

	t.Run("the store is asked once, then every replay is the same answer", func(t *testing.T) {
		e := newEnv(t, nil, nil)
		d := fakeDialer{srv: e.srv}
		fp := executed(t, e, d, `1`)
		first := do(t, d, confirm(`1`, fp), neverCalled(t))
		requireEnvelope(t, first, 201, "already_completed", false)
		acquires := e.store.Calls("acquire")
		for range 3 {
			again := do(t, d, confirm(`1`, fp), neverCalled(t))
			require.Equal(t, string(first.body), string(again.body))
			require.Equal(t, first.headers, again.headers)
		}
		require.Equal(t, acquires, e.store.Calls("acquire"), "a replay of a record read terminal asked the store again")
		require.Equal(t, float64(3), metricValue(t, e.metrics.terminalCache.WithLabelValues("hit")))
		require.Equal(t, float64(1), metricValue(t, e.metrics.terminalCache.WithLabelValues("kept")))
	})

	t.Run("with the store down a known replay is answered and a new confirm is not", func(t *testing.T) {
		e := newEnv(t, nil, nil)
		d := fakeDialer{srv: e.srv}
		fp := executed(t, e, d, `2`)
		requireEnvelope(t, do(t, d, confirm(`2`, fp), neverCalled(t)), 201, "already_completed", false)
		other := preview(t, d, alice, `3`)
		e.store.fail.Store(true)
		requireEnvelope(t, do(t, d, confirm(`2`, fp), neverCalled(t)), 201, "already_completed", false)
		requireEnvelope(t, do(t, d, confirm(`3`, other), neverCalled(t)), 503, "temporarily_unavailable", true)
	})

	t.Run("a token for the same nonce under other params goes to the store and is refused", func(t *testing.T) {
		e := newEnv(t, nil, nil)
		d := fakeDialer{srv: e.srv}
		fp := executed(t, e, d, `4`)
		requireEnvelope(t, do(t, d, confirm(`4`, fp), neverCalled(t)), 201, "already_completed", false)
		c := e.claimsOf(t, fp, alice, "payments.transfer")

		// A token whose MAC verifies for the same nonce but other params (a
		// leaked key, or a bug): the memory must not answer it as a replay.
		paramsOf := func(amount string) fingerprint.Params {
			doc, err := fingerprint.ParseJSON(transferBody(amount, "EUR", "DE89", ""), 32)
			require.NoError(t, err)
			params, err := e.cfg.Operations[0].Selector.Select(doc, nil)
			require.NoError(t, err)
			return params
		}
		forged, _, err := e.cfg.Keys.Sign(fingerprint.SignRequest{Subject: alice, Scope: "payments.transfer", Params: paramsOf(`4000`), Nonce: c.Nonce, Expiry: e.clock.Now().Add(time.Minute)})
		require.NoError(t, err)
		acquires := e.store.Calls("acquire")
		res := do(t, d, confirm(`4000`, forged), neverCalled(t))
		requireEnvelope(t, res, 422, "params_changed", false)
		require.Equal(t, acquires+1, e.store.Calls("acquire"))
		require.Contains(t, e.logs.String(), "event=security_alert reason=store_param_mismatch")

		// The same for another subject: its tag differs, so the memory does
		// not answer and the store decides, as it would with no memory.
		forged, _, err = e.cfg.Keys.Sign(fingerprint.SignRequest{Subject: "bob", Scope: "payments.transfer", Params: paramsOf(`4`), Nonce: c.Nonce, Expiry: e.clock.Now().Add(time.Minute)})
		require.NoError(t, err)
		hits := metricValue(t, e.metrics.terminalCache.WithLabelValues("hit"))
		do(t, d, post("/v1/transfers/confirm", "bob", transferBody(`4`, "EUR", "DE89", forged)), neverCalled(t))
		require.Equal(t, acquires+2, e.store.Calls("acquire"))
		require.Equal(t, hits, metricValue(t, e.metrics.terminalCache.WithLabelValues("hit")))
	})

	// Memory checks once whether a stored body is strict JSON; a replay from
	// it embeds the body exactly as a replay from the store does: JSON as a
	// value, anything else (here a duplicate name, which parsers read two
	// ways) as a string.
	t.Run("a result is embedded as the store's replay embeds it", func(t *testing.T) {
		for _, body := range []string{`{"id":"tr_6","amount":"6"}`, `{"id":"tr_6","id":"tr_7"}`, `accepted`} {
			e := newEnv(t, nil, nil)
			d := fakeDialer{srv: e.srv}
			fp := preview(t, d, alice, `6`)
			upstream := func(map[string]string, []byte) upstreamReply {
				return upstreamReply{status: 201, body: []byte(body)}
			}
			require.Equal(t, 201, do(t, d, confirm(`6`, fp), upstream).status)
			fromStore := do(t, d, confirm(`6`, fp), neverCalled(t))
			fromMemory := do(t, d, confirm(`6`, fp), neverCalled(t))
			require.Equal(t, float64(1), metricValue(t, e.metrics.terminalCache.WithLabelValues("hit")), body)
			require.Equal(t, string(fromStore.body), string(fromMemory.body))
			got := requireEnvelope(t, fromMemory, 201, "already_completed", false)["result"]
			if body == `accepted` || strings.Count(body, `"id"`) > 1 {
				require.Equal(t, body, got)
			} else {
				require.Equal(t, map[string]any{"id": "tr_6", "amount": "6"}, got)
			}
		}
	})

	t.Run("terminal_cache_bytes: 0 asks the store every time", func(t *testing.T) {
		e := newEnv(t, nil, nil)
		e.cfg = testConfig(t, strings.Replace(testConfigYAML, "limits: {max_body_bytes: 4096}", "limits: {max_body_bytes: 4096, terminal_cache_bytes: 0}", 1))
		e.useStore(t, e.store.Store)
		d := fakeDialer{srv: e.srv}
		fp := executed(t, e, d, `5`)
		acquires := e.store.Calls("acquire")
		for range 3 {
			requireEnvelope(t, do(t, d, confirm(`5`, fp), neverCalled(t)), 201, "already_completed", false)
		}
		require.Equal(t, acquires+3, e.store.Calls("acquire"))
	})
}
