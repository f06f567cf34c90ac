package approvalapi

import (
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/e2e/demoauth"
	"github.com/idemgate/idemgate/extproc/config"
	"github.com/idemgate/idemgate/state"
	"github.com/idemgate/idemgate/state/memory"
	"github.com/idemgate/idemgate/state/statetest"
)

// Two gated operations whose approvers hold tokens of different audiences:
// transfer lets its requester approve with step-up, payout keeps four eyes.
const stepUpYAML = `
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
        jwt: {issuer: https://idp.example, audience: transfers, jwks_file: /approvers.jwks}
        requester_step_up: {acr: ["urn:example:sca"], amr: [hwk], max_auth_age: 5m}
  - name: payout
    scope: payments.payout
    preview: {method: POST, path: /v1/payouts/preview}
    confirm: {method: POST, path: /v1/payouts/confirm}
    status: {method: POST, path: /v1/payouts/status}
    preview_tool: payout_preview
    status_tool: payout_status
    params: [{path: amount, type: decimal}, currency]
    approval:
      rules: [{param: amount, at_least: "1000.00"}]
      approvers:
        jwt: {issuer: https://idp.example, audience: payouts, jwks_file: /approvers.jwks}
`

type stepUpFixture struct {
	srv    *httptest.Server
	key    *demoauth.ApproverKey
	store  *memory.Store
	events *events
	now    time.Time
}

func newStepUpFixture(t *testing.T) *stepUpFixture {
	key, err := demoauth.NewApproverKey("a1")
	require.NoError(t, err)
	rt, _, err := config.Parse("stepup.yaml", []byte(stepUpYAML), "", config.Options{
		LookupEnv: func(k string) (string, bool) { return "dGVzdC1rZXktazEtbm90LWEtc2VjcmV0LTMyYnl0ZXM=", k == "K1" },
		ReadFile: func(name string) ([]byte, error) {
			if name == "/approvers.jwks" {
				return key.JWKS(), nil
			}
			return nil, fs.ErrNotExist
		},
	})
	require.NoError(t, err)
	f := &stepUpFixture{key: key, store: memory.New(memory.Options{}), events: &events{}, now: time.Now()}
	h, err := New(Options{Config: rt, Approvals: f.store, Security: f.events, Now: func() time.Time { return f.now }})
	require.NoError(t, err)
	f.srv = httptest.NewServer(h)
	t.Cleanup(f.srv.Close)
	return f
}

// token mints a token of audience aud for sub with extra claims.
func (f *stepUpFixture) token(t *testing.T, aud, sub string, extra map[string]any) string {
	t.Helper()
	c := map[string]any{"iss": "https://idp.example", "aud": aud, "sub": sub, "exp": f.now.Add(5 * time.Minute).Unix()}
	for k, v := range extra {
		c[k] = v
	}
	tok, err := f.key.Mint(c)
	require.NoError(t, err)
	return tok
}

func (f *stepUpFixture) request(t *testing.T, operation, requester string) state.Approval {
	t.Helper()
	a, created, err := f.store.RequestApproval(t.Context(), state.ApprovalRequest{
		ID: state.NewApprovalID(), Key: statetest.NewKey(t), Operation: operation, Scope: "payments." + operation, SubjectTag: "tag",
		Requester: requester, ParamHash: "ph", Params: []byte(`{"amount":"1500.00","currency":"EUR","payee.account_id":"DE89"}`),
		Rules: []string{"amount >= 1000.00"}, Required: 1, DistinctFromRequester: true, ExpiresAt: f.now.Add(time.Hour),
	})
	require.NoError(t, err)
	require.True(t, created)
	return a
}

// do sends a request and returns the status, the WWW-Authenticate header
// and the body.
func (f *stepUpFixture) do(t *testing.T, method, path, token, ctype, body string) (int, string, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, f.srv.URL+path, strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+token)
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	res, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	require.NoError(t, err)
	return res.StatusCode, res.Header.Get("WWW-Authenticate"), string(b)
}

func (f *stepUpFixture) state(t *testing.T, id string) state.Approval {
	t.Helper()
	a, found, err := f.store.GetApproval(t.Context(), id)
	require.NoError(t, err)
	require.True(t, found)
	return a
}

const wantChallenge = `Bearer error="insufficient_user_authentication", error_description="approving your own operation needs a stronger or more recent authentication", acr_values="urn:example:sca", max_age=300`

// TestRequesterStepUp (docs/design.md §13): the requester's own approval is
// refused with the RFC 9470 challenge (401) on the API and the page until
// their token is strong (acr or amr listed) and fresh (auth_time within
// max_auth_age); then it counts and records how they authenticated. The
// requester may always deny.
func TestRequesterStepUp(t *testing.T) {
	f := newStepUpFixture(t)
	a := f.request(t, "transfer", "alice")
	approve := "/v1/approvals/" + a.ID + "/approve"
	fresh := f.now.Add(-time.Minute).Unix()
	weak := map[string]map[string]any{
		"no acr":           {"auth_time": fresh},
		"unlisted acr":     {"acr": "urn:example:password", "auth_time": fresh},
		"unlisted amr":     {"amr": []string{"pwd"}, "auth_time": fresh},
		"no auth_time":     {"acr": "urn:example:sca"},
		"stale auth_time":  {"acr": "urn:example:sca", "auth_time": f.now.Add(-6 * time.Minute).Unix()},
		"future auth_time": {"acr": "urn:example:sca", "auth_time": f.now.Add(10 * time.Minute).Unix()},
	}
	for name, claims := range weak {
		tok := f.token(t, "transfers", "alice", claims)
		code, challenge, body := f.do(t, "POST", approve, tok, "application/json", `{"reason":"mine"}`)
		require.Equal(t, http.StatusUnauthorized, code, name)
		require.Equal(t, wantChallenge, challenge, name)
		require.Contains(t, body, "insufficient_user_authentication", name)
		// The page: a 401 with the challenge and no form to post.
		code, challenge, page := f.do(t, "GET", "/approvals/"+a.ID, tok, "", "")
		require.Equal(t, http.StatusUnauthorized, code, name)
		require.Equal(t, wantChallenge, challenge, name)
		require.NotContains(t, page, `id="approve"`, name)
		require.Contains(t, page, "1500.00", "the page still shows what was asked")
	}
	require.Equal(t, state.ApprovalPending, f.state(t, a.ID).State, "nothing decided")
	reasons := f.events.take()
	require.Len(t, reasons, len(weak))
	for _, r := range reasons {
		require.Equal(t, ReasonStepUpRequired, r)
	}

	// Stepped up (a listed amr, authenticated a minute ago): the page
	// offers the form and the decision counts.
	authTime := f.now.Add(-time.Minute).Truncate(time.Second)
	strong := f.token(t, "transfers", "alice", map[string]any{"acr": "urn:example:other", "amr": []string{"pwd", "hwk"}, "auth_time": authTime.Unix()})
	code, challenge, page := f.do(t, "GET", "/approvals/"+a.ID, strong, "", "")
	require.Equal(t, http.StatusOK, code)
	require.Empty(t, challenge)
	csrf := regexp.MustCompile(`name="csrf" value="([0-9a-f]+)"`).FindStringSubmatch(page)
	require.Len(t, csrf, 2, page)
	form := url.Values{"csrf": {csrf[1]}, "decision": {"approve"}, "reason": {"my own rent, authenticated with my key"}}.Encode()
	req, err := http.NewRequestWithContext(t.Context(), "POST", f.srv.URL+"/approvals/"+a.ID, strings.NewReader(form))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+strong)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	res, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	after, err := io.ReadAll(res.Body)
	res.Body.Close()
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, res.StatusCode, "redirected to the page")
	require.Contains(t, string(after), `id="return"`, "the page sends the person back to their agent")
	got := f.state(t, a.ID)
	require.Equal(t, state.ApprovalApproved, got.State)
	last := got.Events[len(got.Events)-1]
	require.Equal(t, "alice", last.Actor)
	require.Equal(t, "urn:example:other", last.ACR)
	require.Equal(t, []string{"pwd", "hwk"}, last.AMR)
	require.True(t, authTime.Equal(last.AuthTime))
	_, _, shown := f.do(t, "GET", "/v1/approvals/"+a.ID, strong, "", "")
	require.Contains(t, shown, `"acr":"urn:example:other"`)
	require.Contains(t, shown, `"auth_time":"`+authTime.UTC().Format(time.RFC3339)+`"`)

	// The requester cancels another one with a plain token.
	b := f.request(t, "transfer", "alice")
	code, _, _ = f.do(t, "POST", "/v1/approvals/"+b.ID+"/deny", f.token(t, "transfers", "alice", nil), "application/json", `{"reason":"changed my mind"}`)
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, state.ApprovalDenied, f.state(t, b.ID).State)

	// The API path approves with acr listed too.
	c := f.request(t, "transfer", "alice")
	code, _, _ = f.do(t, "POST", "/v1/approvals/"+c.ID+"/approve", f.token(t, "transfers", "alice", map[string]any{"acr": "urn:example:sca", "auth_time": fresh}), "application/json", `{"reason":"mine"}`)
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, state.ApprovalApproved, f.state(t, c.ID).State)

	// Another approver needs no step-up.
	d := f.request(t, "transfer", "alice")
	code, challenge, _ = f.do(t, "POST", "/v1/approvals/"+d.ID+"/approve", f.token(t, "transfers", "bob", nil), "application/json", `{"reason":"checked"}`)
	require.Equal(t, http.StatusOK, code)
	require.Empty(t, challenge)
	require.Equal(t, state.ApprovalApproved, f.state(t, d.ID).State)
}

// TestStepUpLeavesFourEyesElsewhere: an operation without
// requester_step_up keeps distinct_from_requester: a strong token of the
// requester is still 403, never the step-up challenge.
func TestStepUpLeavesFourEyesElsewhere(t *testing.T) {
	f := newStepUpFixture(t)
	a := f.request(t, "payout", "alice")
	tok := f.token(t, "payouts", "alice", map[string]any{"acr": "urn:example:sca", "amr": []string{"hwk"}, "auth_time": f.now.Unix()})
	code, challenge, body := f.do(t, "POST", "/v1/approvals/"+a.ID+"/approve", tok, "application/json", `{"reason":"mine"}`)
	require.Equal(t, http.StatusForbidden, code, body)
	require.Empty(t, challenge)
	require.Contains(t, body, "approval_forbidden")
	require.Equal(t, state.ApprovalPending, f.state(t, a.ID).State)
	require.Equal(t, []string{ReasonSelfApproval}, f.events.take())
}

// TestApproverOfAnotherOperation: a valid approver token for payouts does
// not see or decide a transfer's approval: 404 as for an unknown id (the
// approval's existence is not revealed), a security event, nothing
// decided.
func TestApproverOfAnotherOperation(t *testing.T) {
	f := newStepUpFixture(t)
	a := f.request(t, "transfer", "alice")
	bob := f.token(t, "payouts", "bob", nil)
	for _, c := range []struct{ method, path, body string }{
		{"GET", "/v1/approvals/" + a.ID, ""},
		{"POST", "/v1/approvals/" + a.ID + "/approve", `{"reason":"looks fine"}`},
		{"POST", "/v1/approvals/" + a.ID + "/deny", `{"reason":"no"}`},
		{"GET", "/approvals/" + a.ID, ""},
	} {
		ctype := ""
		if c.body != "" {
			ctype = "application/json"
		}
		code, _, body := f.do(t, c.method, c.path, bob, ctype, c.body)
		require.Equal(t, http.StatusNotFound, code, c.path)
		require.Contains(t, body, "not_found", c.path)
	}
	require.Equal(t, []string{ReasonUnknownApproval, ReasonUnknownApproval}, f.events.take(), "each decision attempt is reported")
	require.Equal(t, state.ApprovalPending, f.state(t, a.ID).State)
	_, _, list := f.do(t, "GET", "/v1/approvals?state=pending", bob, "", "")
	require.NotContains(t, list, a.ID)
}
