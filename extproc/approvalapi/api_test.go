package approvalapi

import (
	"bytes"
	"context"
	"encoding/json"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/e2e/demoauth"
	"github.com/idemgate/idemgate/extproc/config"
	"github.com/idemgate/idemgate/extproc/security"
	"github.com/idemgate/idemgate/internal/testutil"
	"github.com/idemgate/idemgate/state"
	"github.com/idemgate/idemgate/state/memory"
	"github.com/idemgate/idemgate/state/postgres"
	"github.com/idemgate/idemgate/state/statetest"
)

const configYAML = `
signing: {active_key: k1, keys: {k1: {env: K1}}}
operations:
  - name: transfer
    scope: payments.transfer
    preview: {method: POST, path: /v1/transfers/preview}
    confirm: {method: POST, path: /v1/transfers/confirm}
    status: {method: POST, path: /v1/transfers/status}
    preview_tool: transfer_preview
    status_tool: transfer_status
    params: [{path: amount, type: decimal}, currency, payee.account_id]
    approval:
      rules: [{param: amount, at_least: "1000.00"}]
      approvers:
        jwt: {issuer: https://idp.example, audience: idemgate-approvals, jwks_file: /approvers.jwks}
        required: 2
`

// events records security events.
type events struct {
	mu      sync.Mutex
	reasons []string
}

func (e *events) Report(_ context.Context, ev security.Event) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.reasons = append(e.reasons, ev.Reason)
}

func (e *events) take() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := e.reasons
	e.reasons = nil
	return out
}

type fixture struct {
	srv    *httptest.Server
	key    *demoauth.ApproverKey
	other  *demoauth.ApproverKey
	store  statetest.ApprovalStore
	events *events
}

func newFixture(t *testing.T, store statetest.ApprovalStore) *fixture {
	return newFixtureWith(t, store, nil)
}

// newFixtureWith is newFixture with the handler's Transition hook.
func newFixtureWith(t *testing.T, store statetest.ApprovalStore, transition func(operation, transition string)) *fixture {
	return newFixtureOpts(t, store, func(o *Options) { o.Transition = transition })
}

// newFixtureOpts is newFixture with the handler's options edited.
func newFixtureOpts(t *testing.T, store statetest.ApprovalStore, edit func(*Options)) *fixture {
	// other claims the same kid but is not in the JWKS.
	key, err := demoauth.NewApproverKey("a1")
	require.NoError(t, err)
	other, err := demoauth.NewApproverKey("a1")
	require.NoError(t, err)
	jwks := key.JWKS()
	rt, _, err := config.Parse("test.yaml", []byte(configYAML), "", config.Options{
		LookupEnv: func(k string) (string, bool) { return "dGVzdC1rZXktazEtbm90LWEtc2VjcmV0LTMyYnl0ZXM=", k == "K1" },
		ReadFile: func(name string) ([]byte, error) {
			if name == "/approvers.jwks" {
				return jwks, nil
			}
			return nil, fs.ErrNotExist
		},
	})
	require.NoError(t, err)
	ev := &events{}
	opts := Options{Config: rt, Approvals: store, Security: ev}
	if edit != nil {
		edit(&opts)
	}
	h, err := New(opts)
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return &fixture{srv: srv, key: key, other: other, store: store, events: ev}
}

func (f *fixture) token(key *demoauth.ApproverKey, sub string, exp time.Time) string {
	// Strings and an integer: encoding the claims cannot fail.
	token, _ := key.Mint(map[string]any{"iss": "https://idp.example", "aud": "idemgate-approvals", "sub": sub, "exp": exp.Unix()})
	return token
}

func (f *fixture) call(t *testing.T, method, path, token, body string) (int, map[string]any) {
	t.Helper()
	var rd *bytes.Reader
	if body != "" {
		rd = bytes.NewReader([]byte(body))
	} else {
		rd = bytes.NewReader(nil)
	}
	req, err := http.NewRequestWithContext(t.Context(), method, f.srv.URL+path, rd)
	require.NoError(t, err)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	res, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer res.Body.Close()
	var out map[string]any
	require.NoError(t, json.NewDecoder(res.Body).Decode(&out))
	return res.StatusCode, out
}

func (f *fixture) request(t *testing.T, requester string) state.Approval {
	t.Helper()
	a, created, err := f.store.RequestApproval(t.Context(), state.ApprovalRequest{
		ID: state.NewApprovalID(), Key: statetest.NewKey(t), Operation: "transfer", Scope: "payments.transfer", SubjectTag: "tag",
		Requester: requester, ParamHash: "ph", Params: []byte(`{"amount":1500.00,"currency":"EUR","payee.account_id":"DE89"}`),
		Rules: []string{"amount >= 1000.00"}, Required: 2, DistinctFromRequester: true, ExpiresAt: time.Now().Add(time.Hour),
	})
	require.NoError(t, err)
	require.True(t, created)
	return a
}

func TestApproversAPIMemory(t *testing.T) {
	runAPI(t, memory.New(memory.Options{}))
}

func TestApproversAPIPostgres(t *testing.T) {
	if testing.Short() {
		t.Skip("needs PostgreSQL")
	}
	dsn := testutil.CreateDatabase(t)
	require.NoError(t, postgres.Migrate(t.Context(), dsn))
	pg, err := postgres.New(t.Context(), postgres.Options{DSN: dsn})
	require.NoError(t, err)
	t.Cleanup(func() { _ = pg.Close() })
	runAPI(t, pg)
}

func runAPI(t *testing.T, store statetest.ApprovalStore) {
	f := newFixture(t, store)
	soon := time.Now().Add(5 * time.Minute)
	alice, bob, carol := f.token(f.key, "alice", soon), f.token(f.key, "bob", soon), f.token(f.key, "carol", soon)
	requester := f.token(f.key, "agent-user", soon)
	a := f.request(t, "agent-user")
	path := "/v1/approvals/" + a.ID

	t.Run("no valid token, no answer", func(t *testing.T) {
		for _, tok := range []string{"", "garbage", f.token(f.other, "alice", soon), f.token(f.key, "alice", time.Now().Add(-2*time.Minute))} {
			code, body := f.call(t, "GET", path, tok, "")
			require.Equal(t, 401, code)
			require.Equal(t, "unauthorized", body["error"])
			code, _ = f.call(t, "POST", path+"/approve", tok, `{"reason":"ok"}`)
			require.Equal(t, 401, code)
		}
		require.Equal(t, []string{ReasonApproverToken, ReasonApproverToken, ReasonApproverToken, ReasonApproverToken, ReasonApproverToken, ReasonApproverToken, ReasonApproverToken, ReasonApproverToken}, f.events.take())
		got, _, err := store.GetApproval(t.Context(), a.ID)
		require.NoError(t, err)
		require.Equal(t, state.ApprovalPending, got.State)
	})

	t.Run("show and list", func(t *testing.T) {
		code, body := f.call(t, "GET", path, alice, "")
		require.Equal(t, 200, code)
		require.Equal(t, a.ID, body["approval_id"])
		require.Equal(t, "pending", body["state"])
		require.Equal(t, "agent-user", body["requester"])
		require.Equal(t, map[string]any{"amount": "1500.00", "currency": "EUR", "payee": map[string]any{"account_id": "DE89"}}, body["params"])
		require.Equal(t, []any{"amount >= 1000.00"}, body["rules"])
		require.NotContains(t, body, "fingerprint")
		code, body = f.call(t, "GET", "/v1/approvals?state=pending", alice, "")
		require.Equal(t, 200, code)
		ids := []string{}
		for _, x := range body["approvals"].([]any) {
			ids = append(ids, x.(map[string]any)["approval_id"].(string))
		}
		require.Contains(t, ids, a.ID)
		code, _ = f.call(t, "GET", "/v1/approvals?state=bogus", alice, "")
		require.Equal(t, 400, code)
	})

	t.Run("the requester may not approve", func(t *testing.T) {
		code, body := f.call(t, "POST", path+"/approve", requester, `{"reason":"mine"}`)
		require.Equal(t, 403, code)
		require.Equal(t, "approval_forbidden", body["error"])
		require.Equal(t, []string{ReasonSelfApproval}, f.events.take())
	})

	t.Run("a decision is JSON only (a cross-site text/plain form cannot post one)", func(t *testing.T) {
		req, err := http.NewRequestWithContext(t.Context(), "POST", f.srv.URL+path+"/approve", strings.NewReader(`{"reason":"x="}`))
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+alice)
		req.Header.Set("Content-Type", "text/plain")
		res, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		res.Body.Close()
		require.Equal(t, http.StatusUnsupportedMediaType, res.StatusCode)
		require.Equal(t, []string{ReasonForgedForm}, f.events.take())
		got, _, err := store.GetApproval(t.Context(), a.ID)
		require.NoError(t, err)
		require.Len(t, got.Events, 1, "nothing decided")
	})

	t.Run("a reason is required", func(t *testing.T) {
		code, body := f.call(t, "POST", path+"/approve", alice, `{"reason":"  "}`)
		require.Equal(t, 400, code)
		require.Equal(t, "reason_required", body["error"])
		code, _ = f.call(t, "POST", path+"/approve", alice, `{"reason":"ok","as":"bob"}`)
		require.Equal(t, 400, code, "nothing in the body names an approver")
	})

	t.Run("two distinct approvers; each counts once", func(t *testing.T) {
		code, body := f.call(t, "POST", path+"/approve", alice, `{"reason":"payee verified by phone"}`)
		require.Equal(t, 200, code)
		require.Equal(t, "pending", body["state"])
		code, body = f.call(t, "POST", path+"/approve", alice, `{"reason":"again"}`)
		require.Equal(t, 200, code)
		require.Equal(t, "pending", body["state"])
		require.Len(t, body["decisions"], 1)
		code, body = f.call(t, "POST", path+"/approve", bob, `{"reason":"within budget"}`)
		require.Equal(t, 200, code)
		require.Equal(t, "approved", body["state"])
		decisions := body["decisions"].([]any)
		require.Len(t, decisions, 2)
		d0 := decisions[0].(map[string]any)
		require.Equal(t, "alice", d0["approver"])
		require.Equal(t, "approve", d0["decision"])
		require.Equal(t, "payee verified by phone", d0["reason"])
		code, body = f.call(t, "POST", path+"/deny", carol, `{"reason":"too late"}`)
		require.Equal(t, 409, code)
		require.Equal(t, "not_pending", body["error"])
	})

	t.Run("one deny decides; the requester may deny", func(t *testing.T) {
		b := f.request(t, "agent-user")
		code, body := f.call(t, "POST", "/v1/approvals/"+b.ID+"/deny", requester, `{"reason":"cancel"}`)
		require.Equal(t, 200, code)
		require.Equal(t, "denied", body["state"])
		code, _ = f.call(t, "POST", "/v1/approvals/"+b.ID+"/approve", alice, `{"reason":"ok"}`)
		require.Equal(t, 409, code)
	})

	t.Run("unknown approval", func(t *testing.T) {
		code, _ := f.call(t, "POST", "/v1/approvals/"+state.NewApprovalID()+"/approve", alice, `{"reason":"ok"}`)
		require.Equal(t, 404, code)
		require.Equal(t, []string{ReasonUnknownApproval}, f.events.take())
		code, _ = f.call(t, "GET", "/v1/approvals/"+state.NewApprovalID(), alice, "")
		require.Equal(t, 404, code)
	})

	t.Run("method and path", func(t *testing.T) {
		code, _ := f.call(t, "GET", path+"/approve", alice, "")
		require.Equal(t, 405, code)
		code, _ = f.call(t, "GET", "/v1/other", alice, "")
		require.Equal(t, 404, code)
	})

	t.Run("a lapsed approval is not decided", func(t *testing.T) {
		c, _, err := store.RequestApproval(t.Context(), state.ApprovalRequest{
			ID: state.NewApprovalID(), Key: statetest.NewKey(t), Operation: "transfer", Scope: "payments.transfer", SubjectTag: "tag",
			Requester: "agent-user", ParamHash: "ph", Params: []byte(`{}`), Required: 1, DistinctFromRequester: true,
			ExpiresAt: time.Now().Add(100 * time.Millisecond),
		})
		require.NoError(t, err)
		time.Sleep(200 * time.Millisecond)
		code, body := f.call(t, "POST", "/v1/approvals/"+c.ID+"/approve", alice, `{"reason":"ok"}`)
		require.Equal(t, 409, code)
		require.Equal(t, "expired", body["approval"].(map[string]any)["state"])
		require.Equal(t, []string{ReasonLapsedApproval}, f.events.take())
	})
}

// TestApproversAPIRemoteJWKS: keys from jwks_url; while the IdP is down
// and nothing is cached the API answers 503 (no verdict on the token),
// then the fetched keys verify.
func TestApproversAPIRemoteJWKS(t *testing.T) {
	key, err := demoauth.NewApproverKey("a1")
	require.NoError(t, err)
	var (
		mu sync.Mutex
		up bool
	)
	idp := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		if !up {
			http.Error(w, "down", http.StatusServiceUnavailable)
			return
		}
		w.Write(key.JWKS())
	}))
	defer idp.Close()
	yaml := strings.Replace(configYAML, "jwks_file: /approvers.jwks", "jwks_url: \""+idp.URL+"/jwks\"", 1)
	rt, _, err := config.Parse("test.yaml", []byte(yaml), "", config.Options{
		LookupEnv: func(k string) (string, bool) { return "dGVzdC1rZXktazEtbm90LWEtc2VjcmV0LTMyYnl0ZXM=", k == "K1" },
	})
	require.NoError(t, err)
	rt.Operations[0].Approval.Verifier.Remote.MinRefresh = time.Nanosecond
	store := memory.New(memory.Options{})
	ev := &events{}
	h, err := New(Options{Config: rt, Approvals: store, Security: ev})
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	defer srv.Close()
	f := &fixture{srv: srv, key: key, store: store, events: ev}
	tok := f.token(key, "alice", time.Now().Add(time.Minute))

	code, body := f.call(t, "GET", "/v1/approvals", tok, "")
	require.Equal(t, 503, code)
	require.Equal(t, "keys_unavailable", body["error"])
	require.Empty(t, ev.take(), "an IdP outage is not a security event")

	mu.Lock()
	up = true
	mu.Unlock()
	code, _ = f.call(t, "GET", "/v1/approvals", tok, "")
	require.Equal(t, 200, code)
	code, _ = f.call(t, "GET", "/v1/approvals", f.token(f.key, "alice", time.Now().Add(-time.Hour)), "")
	require.Equal(t, 401, code)
}
