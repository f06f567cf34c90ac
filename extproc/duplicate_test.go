package extproc

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/extproc/security"
)

// A bound field given twice is the oldest smuggling body: encoding/json keeps
// the last value, some binders the first. docs/design.md §2 answers it like a
// case twin — invalid_params naming the key, a security event, nothing
// consumed — while a duplicate outside the bound paths is only malformed
// JSON (invalid_json, no event: a sloppy client, not an attack on the hash).
func TestDuplicateKeysOnBoundPaths(t *testing.T) {
	e, _ := bindingEnv(t)
	d := fakeDialer{srv: e.srv}
	const alice = "user-alice"
	good := `{"amount":"250.00","currency":"EUR","payee":{"account_id":"acc_7731","name":"Alice"},"memo":"rent"`
	res := do(t, d, post("/v1/transfers/preview", alice, []byte(good+`}`)), previewOK)
	require.Nil(t, res.immediate, string(res.body))
	fp := res.json(t)["fingerprint"].(string)
	withFP := func(body string) []byte { return []byte(body + fmt.Sprintf(`,"fingerprint":%q}`, fp)) }
	events := func() float64 {
		return metricValue(t, e.metrics.securityEvents.WithLabelValues(security.ReasonAmbiguousKey))
	}

	for _, tc := range []struct {
		name, body, path string
	}{
		{"a bound key", `{"amount":"250.00","amount":"2500.00","currency":"EUR","payee":{"account_id":"acc_7731"}`, `$["amount"]`},
		{"a bound key, escaped", `{"amount":"250.00","\u0061mount":"2500.00","currency":"EUR","payee":{"account_id":"acc_7731"}`, `$["amount"]`},
		{"a key inside the bound path", `{"amount":"250.00","currency":"EUR","payee":{"account_id":"acc_7731","account_id":"acc_EVIL"}`, `$["payee"]["account_id"]`},
		{"the intermediate object", `{"amount":"250.00","currency":"EUR","payee":{"account_id":"acc_7731"},"payee":{"account_id":"acc_EVIL"}`, `$["payee"]`},
	} {
		t.Run("refused as ambiguous: "+tc.name, func(t *testing.T) {
			before, stored := events(), e.store.Total()
			for _, route := range []string{"preview", "confirm"} {
				res := do(t, d, post("/v1/transfers/"+route, alice, withFP(tc.body)), neverCalled(t))
				body := requireEnvelope(t, res, 400, "invalid_params", false)
				require.Contains(t, body["detail"], tc.path, route)
			}
			require.Equal(t, before+2, events(), "a security event each time")
			require.Equal(t, stored, e.store.Total(), "nothing acquired")
		})
	}

	for _, tc := range []struct{ name, body string }{
		{"a free-text key", `{"amount":"250.00","currency":"EUR","payee":{"account_id":"acc_7731"},"memo":"a","memo":"b"`},
		{"an unbound key of a bound path's object", `{"amount":"250.00","currency":"EUR","payee":{"account_id":"acc_7731","name":"A","name":"B"}`},
	} {
		t.Run("malformed, not ambiguous: "+tc.name, func(t *testing.T) {
			before := events()
			res := do(t, d, post("/v1/transfers/confirm", alice, withFP(tc.body)), neverCalled(t))
			body := requireEnvelope(t, res, 400, "invalid_json", false)
			require.Contains(t, body["detail"], "duplicate object key")
			require.Equal(t, before, events(), "no security event")
		})
	}

	// Nothing was consumed: the previewed body confirms.
	res = do(t, d, post("/v1/transfers/confirm", alice, withFP(good)), newPayments().handle)
	require.Equal(t, 201, res.status, string(res.body))
	require.True(t, strings.Contains(e.logs.String(), "reason=ambiguous_key"))
}
