package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/e2e/demoauth"
	"github.com/idemgate/idemgate/e2e/internal/stack"
)

// bindingRequests numbers the raw requests of this file, so a real Envoy's
// access log line can be found for each (stack.Response.UserAgent).
var bindingRequests atomic.Int64

// postRaw sends body byte for byte (the agent client re-encodes maps, which
// sorts keys and would reorder the attacks) with user's JWT.
func postRaw(t *testing.T, s *stack.Stack, user, path, body string) *stack.Response {
	t.Helper()
	token, err := demoauth.Mint(user, time.Hour, time.Now())
	require.NoError(t, err)
	req, err := http.NewRequest(http.MethodPost, s.URL()+path, strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+token)
	ua := fmt.Sprintf("idemgate-e2e-binding/%d", bindingRequests.Add(1))
	req.Header.Set("User-Agent", ua)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	out := &stack.Response{StatusCode: resp.StatusCode, Header: resp.Header, ContentLength: resp.ContentLength, Body: b, UserAgent: ua}
	var probe map[string]json.RawMessage
	if json.Unmarshal(b, &probe) == nil && probe["status"] != nil && probe["instruction"] != nil && probe["trace_id"] != nil {
		var e stack.Envelope
		require.NoError(t, json.Unmarshal(b, &e))
		out.Envelope = &e
	}
	return out
}

// detailOf reads the envelope's detail field.
func detailOf(t *testing.T, r *stack.Response) string {
	t.Helper()
	var d struct {
		Detail string `json:"detail"`
	}
	require.NoError(t, json.Unmarshal(r.Body, &d))
	return d.Detail
}

// executedTo reads what the upstream executed from its answer.
func executedTo(t *testing.T, r *stack.Response) (amount, account string) {
	t.Helper()
	requireExecuted(t, r)
	var tr struct {
		Amount string `json:"amount"`
		Payee  struct {
			AccountID string `json:"account_id"`
		} `json:"payee"`
	}
	require.NoError(t, json.Unmarshal(r.Body, &tr))
	return tr.Amount, tr.Payee.AccountID
}

// TestBindingRule (docs/design.md §2): each body that once confirmed
// a different operation than the one previewed — a case twin of a bound
// key, of a key inside the bound path, of the intermediate object, and an
// NFD spelling of the account id — is refused through the full stack
// (Envoy, idemgate, the demo payments API, which decodes with
// encoding/json), nothing is executed, a security_alert is logged, and the
// exact previewed body then confirms.
func TestBindingRule(t *testing.T) {
	s := startStack(t, stack.Options{})
	const user = "alice"
	quote := func(params string) *stack.Preview {
		r := postRaw(t, s, user, "/v1/transfers/preview", params)
		require.Equal(t, http.StatusOK, r.StatusCode, "preview: %s", r)
		var q struct {
			Fingerprint string `json:"fingerprint"`
		}
		require.NoError(t, json.Unmarshal(r.Body, &q))
		payload, err := stack.DecodeFingerprint(q.Fingerprint)
		require.NoError(t, err)
		return &stack.Preview{Fingerprint: q.Fingerprint, Nonce: payload.Nonce}
	}
	withFP := func(p *stack.Preview, members string) string {
		return fmt.Sprintf(`{"fingerprint":%q,%s}`, p.Fingerprint, members)
	}

	const plain = `"amount":"250.00","currency":"EUR","payee":{"account_id":"acc_7731","name":"Bob Example"}`
	const cafe = `"amount":"250.00","currency":"EUR","payee":{"account_id":"acc_caf\u00e9","name":"Bob Example"}`
	p := quote("{" + plain + "}")
	pCafe := quote("{" + cafe + "}")

	attacks := []struct {
		name    string
		preview *stack.Preview
		members string
		// reason is the security event; keys are named in detail.
		reason string
		keys   []string
	}{
		{"AMOUNT after amount", p, `"amount":"250.00","AMOUNT":"2500.00","currency":"EUR","payee":{"account_id":"acc_7731","name":"Bob Example"}`,
			"ambiguous_key", []string{`$["AMOUNT"]`, `$["amount"]`}},
		{"Account_Id inside payee", p, `"amount":"250.00","currency":"EUR","payee":{"account_id":"acc_7731","Account_Id":"acc_EVIL","name":"Bob Example"}`,
			"ambiguous_key", []string{`$["payee"]["Account_Id"]`, `$["payee"]["account_id"]`}},
		{"PAYEE after payee", p, `"amount":"250.00","currency":"EUR","payee":{"account_id":"acc_7731","name":"Bob Example"},"PAYEE":{"account_id":"acc_EVIL2"}`,
			"ambiguous_key", []string{`$["PAYEE"]`, `$["payee"]`}},
		// Byte for byte, NFD is another account id: the fingerprint does not
		// bind it (params_changed), as it does not to the upstream.
		{"NFD account id", pCafe, `"amount":"250.00","currency":"EUR","payee":{"account_id":"acc_cafe\u0301","name":"Bob Example"}`,
			"params_changed", nil},
	}
	for _, a := range attacks {
		t.Run(a.name, func(t *testing.T) {
			r := postRaw(t, s, user, "/v1/transfers/confirm", withFP(a.preview, a.members))
			if a.reason == "params_changed" {
				e := requireEnvelope(t, s, r, http.StatusUnprocessableEntity, "params_changed", notRetryable)
				require.Equal(t, []string{"payee.account_id"}, e.ChangedFields)
				requireSecurityAlert(t, s, a.reason, e.TraceID)
				return
			}
			e := requireEnvelope(t, s, r, http.StatusBadRequest, "invalid_params", notRetryable)
			detail := detailOf(t, r)
			for _, k := range a.keys {
				require.Contains(t, detail, k)
			}
			requireSecurityAlert(t, s, a.reason, e.TraceID)
			line := s.Idemgate.LogLines("event=security_alert", "reason="+a.reason, "trace_id="+e.TraceID)[0]
			require.Contains(t, line, "nonce="+a.preview.Nonce, "the MAC verified: the event names the fingerprint")

			// The preview of the same body is refused too.
			r = postRaw(t, s, user, "/v1/transfers/preview", "{"+a.members+"}")
			e = requireEnvelope(t, s, r, http.StatusBadRequest, "invalid_params", notRetryable)
			requireSecurityAlert(t, s, a.reason, e.TraceID)
		})
	}
	require.Zero(t, s.Payments.Executions(), "no attack executed")
	require.Empty(t, s.Upstream.Confirms(), "no attack reached the upstream's confirm")
	requireRowCounts(t, s, map[string]int{})
	require.Equal(t, float64(6), metric(t, s, `idemgate_security_events_total{reason="ambiguous_key"}`))

	// Nothing was consumed: the exact previewed bodies confirm, once each,
	// to the previewed accounts.
	amount, account := executedTo(t, postRaw(t, s, user, "/v1/transfers/confirm", withFP(p, plain)))
	require.Equal(t, "250.00", amount)
	require.Equal(t, "acc_7731", account)
	amount, account = executedTo(t, postRaw(t, s, user, "/v1/transfers/confirm", withFP(pCafe, cafe)))
	require.Equal(t, "250.00", amount)
	require.Equal(t, "acc_caf\u00e9", account)
	require.Equal(t, 2, s.Payments.Executions())
}
