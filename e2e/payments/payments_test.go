package payments_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/e2e/payments"
)

var fixedNow = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

func requireServer(t *testing.T, opts payments.Options) (*payments.Server, *httptest.Server) {
	t.Helper()
	if opts.Now == nil {
		opts.Now = func() time.Time { return fixedNow }
	}
	s := payments.New(opts)
	ts := httptest.NewServer(s)
	t.Cleanup(ts.Close)
	return s, ts
}

type answer struct {
	status int
	body   []byte
}

func post(t *testing.T, ctx context.Context, url, key, body string) (answer, error) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return answer{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return answer{status: resp.StatusCode, body: b}, nil
}

func requirePost(t *testing.T, url, key, body string) answer {
	t.Helper()
	a, err := post(t, t.Context(), url, key, body)
	require.NoError(t, err)
	return a
}

const validBody = `{"amount":"100.5","currency":"EUR","payee":{"account_id":"acc_bob","name":"Bob"},"memo":"rent"}`

func TestPreviewQuotesWithoutExecuting(t *testing.T) {
	s, ts := requireServer(t, payments.Options{})
	for _, tc := range []struct {
		name, body string
		status     int
		want       string
	}{
		{"string amount", validBody, 200,
			`{"quote_id":"q_9f3f7c27c4a32a42","status":"quoted","amount":"100.50","currency":"EUR","payee":{"account_id":"acc_bob","name":"Bob"},"fee":"1.01","total":"101.51","executed":false}`},
		{"number amount, minimum fee", `{"amount":12,"currency":"USD","payee":{"account_id":"a"}}`, 200, ""},
		{"missing amount", `{"currency":"EUR","payee":{"account_id":"a"}}`, 400, ""},
		{"zero amount", `{"amount":"0","currency":"EUR","payee":{"account_id":"a"}}`, 400, ""},
		{"three decimals", `{"amount":"1.001","currency":"EUR","payee":{"account_id":"a"}}`, 400, ""},
		{"exponent", `{"amount":1e3,"currency":"EUR","payee":{"account_id":"a"}}`, 400, ""},
		{"negative", `{"amount":-5,"currency":"EUR","payee":{"account_id":"a"}}`, 400, ""},
		{"bad currency", `{"amount":"5","currency":"eur","payee":{"account_id":"a"}}`, 400, ""},
		{"missing payee", `{"amount":"5","currency":"EUR"}`, 400, ""},
		{"empty account", `{"amount":"5","currency":"EUR","payee":{"account_id":" "}}`, 400, ""},
		{"not json", `amount=5`, 400, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := requirePost(t, ts.URL+"/v1/transfers/preview", "", tc.body)
			require.Equal(t, tc.status, a.status, string(a.body))
			if tc.want != "" {
				// The quote id is a hash of the normalised parameters, so it is stable.
				var got, want map[string]any
				require.NoError(t, json.Unmarshal(a.body, &got))
				require.NoError(t, json.Unmarshal([]byte(tc.want), &want))
				want["quote_id"] = got["quote_id"]
				require.Equal(t, want, got)
			}
		})
	}
	a := requirePost(t, ts.URL+"/v1/transfers/preview", "", `{"amount":12,"currency":"USD","payee":{"account_id":"a"}}`)
	require.Contains(t, string(a.body), `"fee":"0.50","total":"12.50"`)
	require.Equal(t, 0, s.Executions())
}

func TestConfirmHonoursIdempotencyKey(t *testing.T) {
	s, ts := requireServer(t, payments.Options{})
	first := requirePost(t, ts.URL+"/v1/transfers/confirm", "k-1", validBody)
	require.Equal(t, 200, first.status)
	require.JSONEq(t, `{"transfer_id":"tr_000001","status":"completed","amount":"100.50","currency":"EUR",
		"payee":{"account_id":"acc_bob","name":"Bob"},"fee":"1.01","created_at":"2026-03-01T12:00:00Z"}`, string(first.body))

	// A duplicate is not an error: the existing record comes back byte for byte.
	again := requirePost(t, ts.URL+"/v1/transfers/confirm", "k-1", validBody)
	require.Equal(t, first, again)

	other := requirePost(t, ts.URL+"/v1/transfers/confirm", "k-2", validBody)
	require.Contains(t, string(other.body), `"transfer_id":"tr_000002"`)

	st := s.Stats()
	require.Equal(t, 2, st.Executions)
	require.Equal(t, map[string]int{"k-1": 1, "k-2": 1}, st.ExecutionsByKey)
	require.Equal(t, 1, st.Replays)
	require.Equal(t, 3, st.Confirms)

	rec, ok := s.RecordForKey("k-1")
	require.True(t, ok)
	require.Equal(t, "tr_000001", rec.TransferID)

	resp, err := http.Get(ts.URL + "/v1/transfers/by-key/k-1")
	require.NoError(t, err)
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	require.Equal(t, 200, resp.StatusCode)
	require.Equal(t, first.body, body)

	resp, err = http.Get(ts.URL + "/v1/transfers/by-key/unknown")
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	require.Equal(t, 404, resp.StatusCode)
}

func TestConfirmWithoutKeyIsRefusedWhenHonouring(t *testing.T) {
	s, ts := requireServer(t, payments.Options{})
	a := requirePost(t, ts.URL+"/v1/transfers/confirm", "", validBody)
	require.Equal(t, 400, a.status)
	require.Contains(t, string(a.body), "idempotency_key_required")
	require.Equal(t, 0, s.Executions())
}

func TestConcurrentDuplicatesExecuteOnce(t *testing.T) {
	s, ts := requireServer(t, payments.Options{})
	// Slow executions make the duplicates overlap with the owner.
	s.SetFaults(payments.Faults{DelayBeforeExecute: 50 * time.Millisecond})
	var wg sync.WaitGroup
	answers := make([]answer, 20)
	for i := range answers {
		wg.Go(func() { answers[i] = requirePost(t, ts.URL+"/v1/transfers/confirm", "same", validBody) })
	}
	wg.Wait()
	for _, a := range answers {
		require.Equal(t, answers[0], a)
	}
	require.Equal(t, 1, s.Executions())
	require.Equal(t, 19, s.Stats().Replays)
}

func TestIgnoringKeysExecutesEveryTime(t *testing.T) {
	s, ts := requireServer(t, payments.Options{IgnoreIdempotencyKeys: true})
	a := requirePost(t, ts.URL+"/v1/transfers/confirm", "k", validBody)
	b := requirePost(t, ts.URL+"/v1/transfers/confirm", "k", validBody)
	c := requirePost(t, ts.URL+"/v1/transfers/confirm", "", validBody)
	require.Equal(t, 200, a.status)
	require.NotEqual(t, a.body, b.body)
	require.Equal(t, 200, c.status)
	require.Equal(t, 3, s.Executions())
	require.Equal(t, 2, s.ExecutionsForKey("k"))

	resp, err := http.Get(ts.URL + "/v1/transfers/by-key/k")
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	require.Equal(t, 404, resp.StatusCode)

	s.SetIgnoreIdempotencyKeys(false)
	d := requirePost(t, ts.URL+"/v1/transfers/confirm", "k", validBody)
	e := requirePost(t, ts.URL+"/v1/transfers/confirm", "k", validBody)
	require.Equal(t, d, e)
	require.Equal(t, 4, s.Executions())
}

func TestFaultFailStatusDoesNotExecuteAndCountsDown(t *testing.T) {
	s, ts := requireServer(t, payments.Options{})
	s.SetFaults(payments.Faults{FailStatus: 503, Times: 2})
	for range 2 {
		a := requirePost(t, ts.URL+"/v1/transfers/confirm", "k", validBody)
		require.Equal(t, 503, a.status)
	}
	require.Equal(t, 0, s.Executions())
	a := requirePost(t, ts.URL+"/v1/transfers/confirm", "k", validBody)
	require.Equal(t, 200, a.status)
	require.Equal(t, 1, s.Executions())
	require.Equal(t, payments.Faults{}, s.CurrentFaults())
	require.Equal(t, 2, s.Stats().InjectedFailures)
}

func TestFaultDelayAfterExecuteMovesMoneyBeforeTheClientGivesUp(t *testing.T) {
	s, ts := requireServer(t, payments.Options{})
	s.SetFaults(payments.Faults{DelayAfterExecute: 300 * time.Millisecond, Times: 1})
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	_, err := post(t, ctx, ts.URL+"/v1/transfers/confirm", "k", validBody)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.Eventually(t, func() bool { return s.Executions() == 1 }, 2*time.Second, 5*time.Millisecond)

	// The retry with the same key gets the transfer that already happened.
	a := requirePost(t, ts.URL+"/v1/transfers/confirm", "k", validBody)
	require.Equal(t, 200, a.status)
	require.Contains(t, string(a.body), "tr_000001")
	require.Equal(t, 1, s.Executions())
}

func TestFaultDelayBeforeExecuteIsAbandonedWhenTheClientLeaves(t *testing.T) {
	s, ts := requireServer(t, payments.Options{})
	s.SetFaults(payments.Faults{DelayBeforeExecute: 300 * time.Millisecond, Times: 1})
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	_, err := post(t, ctx, ts.URL+"/v1/transfers/confirm", "k", validBody)
	require.Error(t, err)
	require.Eventually(t, func() bool { return s.Stats().AbandonedBeforeExecute == 1 }, 2*time.Second, 5*time.Millisecond)
	require.Equal(t, 0, s.Executions())
	// The key was released, so the retry executes.
	a := requirePost(t, ts.URL+"/v1/transfers/confirm", "k", validBody)
	require.Equal(t, 200, a.status)
	require.Equal(t, 1, s.Executions())
}

func TestFaultResetAfterExecute(t *testing.T) {
	s, ts := requireServer(t, payments.Options{})
	s.SetFaults(payments.Faults{ResetAfterExecute: true, Times: 1})
	_, err := post(t, t.Context(), ts.URL+"/v1/transfers/confirm", "k", validBody)
	require.Error(t, err)
	require.Equal(t, 1, s.Executions())
	require.Equal(t, 1, s.Stats().InjectedResets)
	a := requirePost(t, ts.URL+"/v1/transfers/confirm", "k", validBody)
	require.Equal(t, 200, a.status)
	require.Contains(t, string(a.body), "tr_000001")
	require.Equal(t, 1, s.Executions())
}

func TestFaultsApplyUntilClearedWhenTimesIsZero(t *testing.T) {
	s, ts := requireServer(t, payments.Options{})
	s.SetFaults(payments.Faults{FailStatus: 500})
	for i := range 3 {
		a := requirePost(t, ts.URL+"/v1/transfers/confirm", "k"+string(rune('a'+i)), validBody)
		require.Equal(t, 500, a.status)
	}
	s.ClearFaults()
	require.Equal(t, 200, requirePost(t, ts.URL+"/v1/transfers/confirm", "kz", validBody).status)
}

func TestAdminEndpoints(t *testing.T) {
	s, ts := requireServer(t, payments.Options{})
	a := requirePost(t, ts.URL+"/_admin/faults", "", `{"delay_after_execute_ms":20,"fail_status":0,"reset_after_execute":false,"times":1}`)
	require.Equal(t, 200, a.status)
	require.Equal(t, payments.Faults{DelayAfterExecute: 20 * time.Millisecond, Times: 1}, s.CurrentFaults())

	resp, err := http.Get(ts.URL + "/_admin/faults")
	require.NoError(t, err)
	var fj payments.FaultsJSON
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&fj))
	require.NoError(t, resp.Body.Close())
	require.Equal(t, payments.FaultsJSON{DelayAfterExecuteMS: 20, Times: 1}, fj)

	for _, bad := range []string{`{"fail_status":200}`, `{"times":-1}`, `{"unknown":1}`, `nope`} {
		require.Equal(t, 400, requirePost(t, ts.URL+"/_admin/faults", "", bad).status, bad)
	}

	require.Equal(t, 200, requirePost(t, ts.URL+"/v1/transfers/confirm", "k", validBody).status)
	require.Equal(t, 200, requirePost(t, ts.URL+"/_admin/mode", "", `{"ignore_idempotency_keys":true}`).status)
	require.Equal(t, 400, requirePost(t, ts.URL+"/_admin/mode", "", `{}`).status)
	for _, bad := range []string{`{"ignore_idempotency_keys":true,"x":1}`, `{"ignore_idempotency_keys":null}`, `{"ignore_idempotency_keys":"yes"}`, `[]`} {
		require.Equal(t, 400, requirePost(t, ts.URL+"/_admin/mode", "", bad).status, bad)
	}
	require.Equal(t, 200, requirePost(t, ts.URL+"/_admin/mcp", "", `{"sse":false}`).status)
	require.Equal(t, 400, requirePost(t, ts.URL+"/_admin/mcp", "", `{"SSE":true}`).status)
	require.Equal(t, 200, requirePost(t, ts.URL+"/v1/transfers/confirm", "k", validBody).status)

	resp, err = http.Get(ts.URL + "/_admin/stats")
	require.NoError(t, err)
	var st payments.Stats
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&st))
	require.NoError(t, resp.Body.Close())
	require.Equal(t, 2, st.Executions)
	require.Equal(t, map[string]int{"k": 2}, st.ExecutionsByKey)
	require.True(t, st.IgnoreIdempotencyKeys)

	require.Equal(t, 200, requirePost(t, ts.URL+"/_admin/reset", "", ``).status)
	require.Equal(t, 0, s.Executions())
	require.Equal(t, 200, requirePost(t, ts.URL+"/v1/transfers/confirm", "k", validBody).status)
	require.Contains(t, string(requirePost(t, ts.URL+"/v1/transfers/confirm", "", validBody).body), "tr_000002")
}
