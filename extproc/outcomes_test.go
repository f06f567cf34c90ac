package extproc

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/state"
	"github.com/idemgate/idemgate/state/memory"
)

// 408, 409, 425 and 429 say nothing about whether an earlier attempt ran (409
// is many payment APIs' "this key is still being processed"): they are
// ambiguous, so a downstream that honours keys gets the retry with the same
// key, and one that ignores keys leaves the record for reconciliation. Were
// they definite failures, the retry would be told "already_failed" about a
// payment that may be executing.
func TestAmbiguousClientErrorsAreNotFailures(t *testing.T) {
	const alice = "user-alice"
	for _, status := range []int{408, 409, 425, 429} {
		t.Run(strconv.Itoa(status), func(t *testing.T) {
			e := newEnv(t, nil, nil)
			d := fakeDialer{srv: e.srv}

			t.Run("downstream honours keys: released, the retry re-sends the key", func(t *testing.T) {
				fp := preview(t, d, alice, `5`)
				nonce := e.claimsOf(t, fp, alice, "payments.transfer").Nonce
				var keys []string
				upstream := func(h map[string]string, _ []byte) upstreamReply {
					keys = append(keys, h["idempotency-key"])
					if len(keys) == 1 {
						return upstreamReply{status: status, headers: []header{{"content-type", "application/json"}}, body: []byte(`{"error":"try later"}`)}
					}
					return upstreamReply{status: 201, body: []byte(`{"transfer_id":"tr_1"}`)}
				}
				body := transferBody(`5`, "EUR", "DE89", fp)
				res := do(t, d, post("/v1/transfers/confirm", alice, body), upstream)
				require.Equal(t, status, res.status, "the upstream's answer reaches the client")
				require.Nil(t, res.immediate)
				rec, found := e.record(t, nonce)
				require.True(t, found)
				require.Equal(t, state.InFlight, rec.State, "not FAILED: nothing says the attempt did not run")
				require.True(t, rec.LeaseExpired, "released at once for the retry")

				res = do(t, d, post("/v1/transfers/confirm", alice, body), upstream)
				require.Equal(t, 201, res.status)
				require.Equal(t, []string{nonce, nonce}, keys, "the retry reached the upstream with the same key")
				require.Eventually(t, func() bool { r, _ := e.recordNow(nonce); return r.State == state.Done }, 5*time.Second, 10*time.Millisecond)
			})

			t.Run("downstream ignores keys: needs reconciliation", func(t *testing.T) {
				res := do(t, d, post("/v1/accounts/acc-1/payouts/preview", alice, []byte(`{"amount":3}`)), previewOK)
				fp := res.json(t)["fingerprint"].(string)
				nonce := e.claimsOf(t, fp, alice, "payments.payout").Nonce
				body := []byte(fmt.Sprintf(`{"amount":3,"fingerprint":%q}`, fp))
				res = do(t, d, post("/v1/accounts/acc-1/payouts/confirm", alice, body), func(map[string]string, []byte) upstreamReply {
					return upstreamReply{status: status, body: []byte(`{"error":"try later"}`)}
				})
				require.Equal(t, status, res.status)
				require.Eventually(t, func() bool { r, _ := e.recordNow(nonce); return r.State == state.Unknown }, 5*time.Second, 10*time.Millisecond)
				res = do(t, d, post("/v1/accounts/acc-1/payouts/confirm", alice, body), neverCalled(t))
				requireEnvelope(t, res, 409, "needs_reconciliation", false)
			})
		})
	}
}

// An operation whose upstream answers 409 only for a definite conflict says
// so with `outcomes`, and the 409 is then recorded and replayed like any
// definite refusal.
func TestConfiguredOutcomeOverridesTheDefault(t *testing.T) {
	const alice = "user-alice"
	e := newEnv(t, nil, nil)
	yaml := strings.Replace(testConfigYAML, "    result_ref: transfer_id\n", "    result_ref: transfer_id\n    outcomes: {409: failed, \"5xx\": ambiguous}\n", 1)
	require.NotEqual(t, testConfigYAML, yaml)
	e.cfg = testConfig(t, yaml)
	e.useStore(t, memory.New(memory.Options{Now: e.clock.Now}))
	d := fakeDialer{srv: e.srv}

	fp := preview(t, d, alice, `6`)
	nonce := e.claimsOf(t, fp, alice, "payments.transfer").Nonce
	body := transferBody(`6`, "EUR", "DE89", fp)
	res := do(t, d, post("/v1/transfers/confirm", alice, body), func(map[string]string, []byte) upstreamReply {
		return upstreamReply{status: 409, headers: []header{{"content-type", "application/json"}}, body: []byte(`{"error":"duplicate payment"}`)}
	})
	require.Equal(t, 409, res.status)
	require.Eventually(t, func() bool { r, _ := e.recordNow(nonce); return r.State == state.Failed }, 5*time.Second, 10*time.Millisecond)
	res = do(t, d, post("/v1/transfers/confirm", alice, body), neverCalled(t))
	b := requireEnvelope(t, res, 409, "already_failed", false)
	require.Equal(t, map[string]any{"error": "duplicate payment"}, b["result"])
}
