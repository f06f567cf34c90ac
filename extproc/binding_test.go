package extproc

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/extproc/security"
	"github.com/idemgate/idemgate/state/memory"
)

// webhookSink records the security webhook's deliveries.
type webhookSink struct {
	mu     sync.Mutex
	bodies []map[string]any
}

func (w *webhookSink) ServeHTTP(rw http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	var m map[string]any
	_ = json.Unmarshal(b, &m)
	w.mu.Lock()
	w.bodies = append(w.bodies, m)
	w.mu.Unlock()
}

func (w *webhookSink) reasons() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []string
	for _, b := range w.bodies {
		out = append(out, fmt.Sprint(b["reason"]))
	}
	return out
}

// bindingEnv is a server whose security reporter posts to a webhook.
func bindingEnv(t *testing.T) (*env, *webhookSink) {
	e := newEnv(t, nil, nil)
	sink := &webhookSink{}
	ts := httptest.NewServer(sink)
	t.Cleanup(ts.Close)
	rep := security.New(e.logger, e.metrics.SecurityCounters(), security.WebhookOptions{URL: ts.URL, Timeout: time.Second})
	t.Cleanup(rep.Close)
	backend := memory.New(memory.Options{Now: e.clock.Now})
	e.store = newCountingStore(backend)
	srv, err := NewServer(Options{Config: e.cfg, Store: e.store, Logger: e.logger, Metrics: e.metrics, Security: rep, Now: e.clock.Now})
	require.NoError(t, err)
	e.srv = srv
	return e, sink
}

// The binding rule at the server: the four smuggling bodies of
// docs/design.md §2 (case twins of a bound key, of a key inside the
// bound path and of the intermediate object, an NFD account id; and escaped
// and fingerprint-field variants) are refused at preview and confirm with
// invalid_params naming the keys, a security event in the log, the counter
// and the webhook, nothing acquired; the exact previewed body then confirms.
func TestBindingRefusal(t *testing.T) {
	e, sink := bindingEnv(t)
	d := fakeDialer{srv: e.srv}
	const alice = "user-alice"
	good := `{"amount":"250.00","currency":"EUR","payee":{"account_id":"acc_7731","name":"Alice"}`
	res := do(t, d, post("/v1/transfers/preview", alice, []byte(good+`}`)), previewOK)
	require.Nil(t, res.immediate, string(res.body))
	fp := res.json(t)["fingerprint"].(string)
	nonce := e.claimsOf(t, fp, alice, "payments.transfer").Nonce
	withFP := func(body string) []byte { return []byte(body + fmt.Sprintf(`,"fingerprint":%q}`, fp)) }

	attacks := []struct {
		name, body string
		keys       []string
	}{
		{"AMOUNT twin", `{"amount":"250.00","AMOUNT":"2500.00","currency":"EUR","payee":{"account_id":"acc_7731"}`,
			[]string{`$["AMOUNT"]`, `$["amount"]`}},
		{"Account_Id twin", `{"amount":"250.00","currency":"EUR","payee":{"account_id":"acc_7731","Account_Id":"acc_EVIL"}`,
			[]string{`$["payee"]["Account_Id"]`, `$["payee"]["account_id"]`}},
		{"PAYEE twin", `{"amount":"250.00","currency":"EUR","payee":{"account_id":"acc_7731"},"PAYEE":{"account_id":"acc_EVIL2"}`,
			[]string{`$["PAYEE"]`, `$["payee"]`}},
		{"escaped twin", `{"amount":"250.00","\u0041MOUNT":"2500.00","currency":"EUR","payee":{"account_id":"acc_7731"}`,
			[]string{`$["AMOUNT"]`, `$["amount"]`}},
	}
	for _, a := range attacks {
		t.Run("confirm/"+a.name, func(t *testing.T) {
			before := e.store.Total()
			res := do(t, d, post("/v1/transfers/confirm", alice, withFP(a.body)), neverCalled(t))
			body := requireEnvelope(t, res, 400, "invalid_params", false)
			detail := body["detail"].(string)
			for _, k := range a.keys {
				require.Contains(t, detail, k)
			}
			require.Equal(t, before, e.store.Total(), "nothing acquired")
			line := securityLine(t, e, "reason=ambiguous_key", nonce)
			require.Contains(t, line, "keys=")
		})
		t.Run("preview/"+a.name, func(t *testing.T) {
			res := do(t, d, post("/v1/transfers/preview", alice, []byte(a.body+`}`)), neverCalled(t))
			body := requireEnvelope(t, res, 400, "invalid_params", false)
			require.Contains(t, body["detail"], a.keys[0])
		})
	}

	t.Run("a fingerprint twin on confirm and status", func(t *testing.T) {
		twin := []byte(fmt.Sprintf(`{"amount":"250.00","currency":"EUR","payee":{"account_id":"acc_7731"},"fingerprint":%q,"Fingerprint":"x"}`, fp))
		res := do(t, d, post("/v1/transfers/confirm", alice, twin), neverCalled(t))
		body := requireEnvelope(t, res, 400, "invalid_params", false)
		require.Contains(t, body["detail"], `$["Fingerprint"]`)
		res = do(t, d, post("/v1/transfers/status", alice, []byte(fmt.Sprintf(`{"fingerprint":%q,"FINGERPRINT":"x"}`, fp))), neverCalled(t))
		requireEnvelope(t, res, 400, "invalid_params", false)
	})

	t.Run("ambiguous bound values", func(t *testing.T) {
		for _, amount := range []string{`-0`, `1E400`, `9007199254740993.0`} {
			res := do(t, d, post("/v1/transfers/preview", alice, []byte(`{"amount":`+amount+`,"currency":"EUR","payee":{"account_id":"acc_7731"}}`)), neverCalled(t))
			body := requireEnvelope(t, res, 400, "invalid_params", false)
			require.Contains(t, body["detail"], "ambiguous value", amount)
		}
		res := do(t, d, post("/v1/transfers/preview", alice, []byte(`{"amount":"1","currency":"EUR","payee":{"account_id":"acc\u0000x"}}`)), neverCalled(t))
		requireEnvelope(t, res, 400, "invalid_params", false)
		require.Contains(t, e.logs.String(), "reason=ambiguous_value")
	})

	t.Run("counter and webhook", func(t *testing.T) {
		require.GreaterOrEqual(t, metricValue(t, e.metrics.securityEvents.WithLabelValues(security.ReasonAmbiguousKey)), float64(len(attacks)*2+2))
		require.Eventually(t, func() bool {
			n := 0
			for _, r := range sink.reasons() {
				if r == security.ReasonAmbiguousKey {
					n++
				}
			}
			return n >= len(attacks)*2+2
		}, 5*time.Second, 10*time.Millisecond)
	})

	t.Run("the exact body still confirms, once", func(t *testing.T) {
		p := newPayments()
		res := do(t, d, post("/v1/transfers/confirm", alice, withFP(good)), p.handle)
		require.Nil(t, res.immediate, string(res.body))
		require.Equal(t, 201, res.status)
		require.Equal(t, 1, p.Executions())
	})
}

// securityLine returns the log line of the security event with reason and nonce.
func securityLine(t *testing.T, e *env, reason, nonce string) string {
	t.Helper()
	var found string
	for _, l := range strings.Split(e.logs.String(), "\n") {
		if strings.Contains(l, "event=security_alert") && strings.Contains(l, reason) && strings.Contains(l, "nonce="+nonce) {
			found = l
		}
	}
	require.NotEmpty(t, found, "no %s security_alert line for nonce %s", reason, nonce)
	return found
}

// Bodies two parsers would read differently are refused before anything
// else reads them: not JSON by Content-Type or Content-Encoding, a top-level
// value that is not an object, trailing data, a BOM, comments, NaN, lone
// surrogates and invalid UTF-8.
func TestBindingRefusesOtherParserDifferences(t *testing.T) {
	e := newEnv(t, nil, nil)
	d := fakeDialer{srv: e.srv}
	const alice = "user-alice"
	good := `{"amount":"1","currency":"EUR","payee":{"account_id":"acc_7731"}}`
	for _, tc := range []struct {
		name, body string
		extra      []header
		detail     string
	}{
		{"form content type", good, []header{{"content-type", "application/x-www-form-urlencoded"}}, "is not JSON"},
		{"text/plain", good, []header{{"content-type", "text/plain"}}, "is not JSON"},
		{"latin-1 charset", good, []header{{"content-type", "application/json; charset=iso-8859-1"}}, "charset"},
		{"gzip", good, []header{{"content-encoding", "gzip"}}, "Content-Encoding"},
		{"top-level array", `[` + good + `]`, nil, "must be a JSON object"},
		{"top-level string", `"x"`, nil, "must be a JSON object"},
		{"trailing data", good + `{"amount":"9999"}`, nil, "after the JSON value"},
		{"BOM", "\ufeff" + good, nil, "invalid JSON"},
		{"comment", `{"amount":"1" /* x */}`, nil, "invalid JSON"},
		{"NaN", `{"amount":NaN}`, nil, "invalid JSON"},
		{"lone surrogate", `{"amount":"1","currency":"EUR","payee":{"account_id":"acc\ud800"}}`, nil, "surrogate"},
		{"invalid UTF-8", "{\"amount\":\"1\",\"payee\":{\"account_id\":\"acc\xff\"}}", nil, "UTF-8"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := post("/v1/transfers/preview", alice, []byte(tc.body))
			for _, h := range tc.extra {
				for i := range req.headers {
					if req.headers[i].k == h.k {
						req.headers = append(req.headers[:i], req.headers[i+1:]...)
						break
					}
				}
				req.headers = append(req.headers, h)
			}
			res := do(t, d, req, neverCalled(t))
			body := requireEnvelope(t, res, 400, "invalid_json", false)
			require.Contains(t, body["detail"], tc.detail)
		})
	}
	for _, ct := range []string{"application/json", "application/json; charset=utf-8", "application/merchant+json", ""} {
		req := post("/v1/transfers/preview", alice, []byte(good))
		req.headers = req.headers[:1] // x-request-id only
		req.headers = append(req.headers, header{"x-idemgate-subject", alice})
		if ct != "" {
			req.headers = append(req.headers, header{"content-type", ct})
		}
		res := do(t, d, req, previewOK)
		require.Nil(t, res.immediate, "%q: %s", ct, res.body)
	}
}
