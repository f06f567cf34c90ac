package mainlib

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/e2e/demoauth"
	"github.com/idemgate/idemgate/internal/testutil"
)

// TestServeApprovals: serve gates a transfer above the threshold, serves
// the approvers' API on approval_listen, and lets the confirm through once
// another person approved it (memory store).
func TestServeApprovals(t *testing.T) {
	key, err := demoauth.NewApproverKey("")
	require.NoError(t, err)
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "approvers.jwks"), key.JWKS(), 0o600))
	approvalAddr := fmt.Sprintf("127.0.0.1:%d", testutil.FreePort(t))
	hooked := make(chan http.Header, 1)
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case hooked <- r.Header.Clone():
		default:
		}
	}))
	defer hook.Close()
	t.Setenv("IDEMGATE_TEST_HOOK_URL", hook.URL)
	t.Setenv("IDEMGATE_TEST_HOOK_SECRET", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
	t.Setenv("IDEMGATE_KEY_K1", testKey)
	path := filepath.Join(dir, "idemgate.yaml")
	require.NoError(t, os.WriteFile(path, []byte(`signing: {active_key: k1, keys: {k1: {env: IDEMGATE_KEY_K1}}}
drain: {period: 100ms, timeout: 2s}
approval_listen: "`+approvalAddr+`"
operations:
  - name: transfer
    scope: payments.transfer
    preview: {method: POST, path: /v1/transfers/preview}
    confirm: {method: POST, path: /v1/transfers/confirm}
    status:  {method: POST, path: /v1/transfers/status}
    preview_tool: transfer_preview
    status_tool: transfer_status
    params: [{path: amount, type: decimal}]
    approval:
      rules: [{param: amount, at_least: "1000"}]
      approvers: {jwt: {issuer: https://idp.example, audience: idemgate-approvals, jwks_file: approvers.jwks}}
      notify: {webhook: {url_env: IDEMGATE_TEST_HOOK_URL, secret_env: IDEMGATE_TEST_HOOK_SECRET}}
`), 0o600))
	s := startServe(t, path)
	conn := s.conn(t)

	replies := stream(t, conn, reqHeaders("/v1/transfers/preview"), reqBody(`{"amount":"1500.00"}`), respHeaders("200"), respBody(`{"quote":1}`))
	require.Len(t, replies, 4)
	var pv map[string]any
	require.NoError(t, json.Unmarshal(replies[3].GetResponseBody().GetResponse().GetBodyMutation().GetBody(), &pv))
	require.Equal(t, true, pv["approval_required"])
	fp := pv["fingerprint"].(string)

	confirmBody := fmt.Sprintf(`{"amount":"1500.00","fingerprint":%q}`, fp)
	replies = stream(t, conn, reqHeaders("/v1/transfers/confirm"), reqBody(confirmBody))
	imm := replies[1].GetImmediateResponse()
	require.NotNil(t, imm)
	require.EqualValues(t, 202, imm.GetStatus().GetCode())
	var env map[string]any
	require.NoError(t, json.Unmarshal(imm.GetBody(), &env))
	require.Equal(t, "approval_pending", env["status"])
	id := env["approval_id"].(string)
	select {
	case h := <-hooked:
		require.Equal(t, id, h.Get("webhook-id"))
		require.True(t, strings.HasPrefix(h.Get("webhook-signature"), "v1,"))
	case <-time.After(5 * time.Second):
		t.Fatal("the approval webhook was not called")
	}

	token := func(sub string) string {
		token, err := key.Mint(map[string]any{"iss": "https://idp.example", "aud": "idemgate-approvals", "sub": sub, "exp": time.Now().Add(time.Minute).Unix()})
		require.NoError(t, err)
		return token
	}
	decide := func(sub string) int {
		req, err := http.NewRequestWithContext(t.Context(), "POST", "http://"+approvalAddr+"/v1/approvals/"+id+"/approve", strings.NewReader(`{"reason":"payee verified"}`))
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+token(sub))
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		return resp.StatusCode
	}
	require.Equal(t, 403, decide("alice"), "the requester may not approve")
	require.Contains(t, s.stderr.String(), "reason=self_approval")
	require.Equal(t, 200, decide("bob"))

	replies = stream(t, conn, reqHeaders("/v1/transfers/confirm"), reqBody(confirmBody))
	require.Len(t, replies, 2)
	require.Nil(t, replies[1].GetImmediateResponse(), "the approved confirm goes through")
	_, metrics := s.get(t, "/metrics")
	require.Contains(t, metrics, `idemgate_approval_transitions_total{operation="transfer",transition="consumed"} 1`)
}
