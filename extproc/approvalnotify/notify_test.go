package approvalnotify

import (
	"encoding/json"
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/extproc/config"
	"github.com/idemgate/idemgate/state"
	"github.com/idemgate/idemgate/state/memory"
	"github.com/idemgate/idemgate/state/statetest"
)

// The example of the Standard Webhooks specification.
func TestSignMatchesTheSpecificationExample(t *testing.T) {
	key, ok := config.DecodeWebhookSecret("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
	require.True(t, ok)
	require.Equal(t, "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=",
		Sign(key, "msg_p5jXN8AQM9LWM0D4loKWxJek", "1614265330", []byte(`{"test": 2432232314}`)))
}

func operation(t *testing.T, url string) *config.Operation {
	t.Helper()
	env := map[string]string{"K1": "dGVzdC1rZXktazEtbm90LWEtc2VjcmV0LTMyYnl0ZXM=", "HOOK_URL": url, "HOOK_SECRET": "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"}
	rt, _, err := config.Parse("test.yaml", []byte(`
signing: {active_key: k1, keys: {k1: {env: K1}}}
operations:
  - name: transfer
    scope: payments.transfer
    preview: {method: POST, path: /p}
    confirm: {method: POST, path: /c}
    status: {method: POST, path: /s}
    preview_tool: p
    status_tool: s
    params: [{path: amount, type: decimal}]
    approval:
      rules: [{param: amount, at_least: "1"}]
      approvers: {jwt: {issuer: https://idp.example, audience: a, jwks_file: /a.jwks}}
      notify: {webhook: {url_env: HOOK_URL, secret_env: HOOK_SECRET}}
`), "", config.Options{
		LookupEnv: func(k string) (string, bool) { v, ok := env[k]; return v, ok },
		ReadFile: func(name string) ([]byte, error) {
			if name == "/a.jwks" {
				return []byte(`{"keys":[{"kty":"OKP","crv":"Ed25519","x":"11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo"}]}`), nil
			}
			return nil, fs.ErrNotExist
		},
	})
	require.NoError(t, err)
	return rt.Operations[0]
}

func TestDeliversSignedOnceAfterRetries(t *testing.T) {
	var (
		mu       sync.Mutex
		attempts int
		got      []*http.Request
		bodies   [][]byte
	)
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		defer mu.Unlock()
		attempts++
		got, bodies = append(got, r), append(bodies, b)
		if attempts < 3 {
			http.Error(w, "busy", http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	defer hook.Close()
	store := memory.New(memory.Options{})
	a, _, err := store.RequestApproval(t.Context(), state.ApprovalRequest{
		ID: state.NewApprovalID(), Key: statetest.NewKey(t), Operation: "transfer", Scope: "payments.transfer", SubjectTag: "tag",
		Requester: "alice", ParamHash: "ph", Params: []byte(`{"amount":1500.00}`), Rules: []string{"amount >= 1"},
		Required: 1, DistinctFromRequester: true, ExpiresAt: time.Now().Add(time.Hour),
	})
	require.NoError(t, err)
	var results []string
	n := New(Options{Approvals: store, FirstBackoff: 10 * time.Millisecond, OnResult: func(r string) { mu.Lock(); results = append(results, r); mu.Unlock() }})
	defer n.Close()
	op := operation(t, hook.URL)
	n.Requested(a, op)

	require.Eventually(t, func() bool {
		got, _, err := store.GetApproval(t.Context(), a.ID)
		return err == nil && len(got.Events) == 2
	}, 5*time.Second, 10*time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, 3, attempts)
	require.Equal(t, []string{"sent"}, results)
	last := got[2]
	require.Equal(t, a.ID, last.Header.Get("webhook-id"), "the same id on every attempt")
	require.Equal(t, a.ID, got[0].Header.Get("webhook-id"))
	require.Equal(t, Sign(op.Approval.Notify.Key, a.ID, last.Header.Get("webhook-timestamp"), bodies[2]), last.Header.Get("webhook-signature"))
	var msg map[string]any
	require.NoError(t, json.Unmarshal(bodies[2], &msg))
	require.Equal(t, "approval.requested", msg["type"])
	ap := msg["approval"].(map[string]any)
	require.Equal(t, a.ID, ap["approval_id"])
	require.Equal(t, map[string]any{"amount": "1500.00"}, ap["params"])
	require.NotContains(t, string(bodies[2]), "fingerprint")
	ev, _, _ := store.GetApproval(t.Context(), a.ID)
	require.Equal(t, state.EventNotified, ev.Events[1].Kind)
}

func TestGivesUpWhenTheApprovalLapsesAndNeverBlocks(t *testing.T) {
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "down", http.StatusInternalServerError)
	}))
	defer hook.Close()
	store := memory.New(memory.Options{})
	var (
		mu      sync.Mutex
		results []string
	)
	n := New(Options{Approvals: store, QueueSize: 1, Workers: 1, FirstBackoff: 20 * time.Millisecond,
		OnResult: func(r string) { mu.Lock(); results = append(results, r); mu.Unlock() }})
	defer n.Close()
	op := operation(t, hook.URL)
	soon := state.Approval{ID: state.NewApprovalID(), Operation: "transfer", ExpiresAt: time.Now().Add(100 * time.Millisecond)}
	start := time.Now()
	for range 5 {
		n.Requested(soon, op)
	}
	require.Less(t, time.Since(start), 50*time.Millisecond, "Requested never waits")
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return strings.Contains(strings.Join(results, ","), "failed")
	}, 5*time.Second, 10*time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	require.Contains(t, results, "dropped", "a full queue drops, it does not block")
}
