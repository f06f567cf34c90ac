package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/e2e/demoauth"
	"github.com/idemgate/idemgate/e2e/internal/stack"
	"github.com/idemgate/idemgate/e2e/payments"
	"github.com/idemgate/idemgate/internal/testutil"
)

// approvalStack starts a stack whose transfers of 1000.00 or more need one
// approver other than the requester, with the approvers' API on a port of
// its own, and returns it with decide: an approval by sub (a bearer JWT of
// the approvers' key), answering the HTTP status.
func approvalStack(t *testing.T) (*stack.Stack, func(id, sub string) int) {
	t.Helper()
	key, err := demoauth.NewApproverKey("")
	require.NoError(t, err)
	jwks := filepath.Join(t.TempDir(), "approvers.jwks")
	require.NoError(t, os.WriteFile(jwks, key.JWKS(), 0o600))
	approvalAddr := fmt.Sprintf("127.0.0.1:%d", testutil.FreePort(t))
	s := startStack(t, stack.Options{
		Approval: map[string]any{
			"rules":     []any{map[string]any{"param": "amount", "at_least": "1000.00"}},
			"approvers": map[string]any{"jwt": map[string]any{"issuer": "https://idp.example", "audience": "idemgate-approvals", "jwks_file": jwks}},
		},
		IdemgateConfig: map[string]any{"approval_listen": approvalAddr},
	})
	approve := approverClient(t, approvalAddr)
	decide := func(id, sub string) int {
		token, err := key.Mint(map[string]any{"iss": "https://idp.example", "aud": "idemgate-approvals", "sub": sub, "exp": time.Now().Add(time.Minute).Unix()})
		require.NoError(t, err)
		return approve(id, token)
	}
	return s, decide
}

// TestApprovalThroughRealEnvoy (docs/design.md §10): a transfer above the
// threshold is answered 202 approval_pending through Envoy and not
// executed; another person approves it on approval_listen with a bearer
// JWT; the confirm then executes once, with its approval consumed, and
// its retry replays.
func TestApprovalThroughRealEnvoy(t *testing.T) {
	s, decide := approvalStack(t)
	alice := s.Agent("alice")

	small := preview(t, alice, transfer("999.99", "acct_bob", "rent"))
	requireExecuted(t, confirm(t, alice, small.ConfirmBody()))

	p := preview(t, alice, transfer("1500.00", "acct_bob", "deposit"))
	var quote map[string]any
	require.NoError(t, json.Unmarshal(p.Response.Body, &quote))
	require.Equal(t, true, quote["approval_required"])
	r := confirm(t, alice, p.ConfirmBody())
	requireEnvelope(t, s, r, http.StatusAccepted, "approval_pending", retryable)
	var pending struct {
		ApprovalID string `json:"approval_id"`
	}
	require.NoError(t, json.Unmarshal(r.Body, &pending))
	require.NotEmpty(t, pending.ApprovalID)
	require.NotEmpty(t, r.Header.Get("Retry-After"))
	require.Equal(t, 1, s.Payments.Executions(), "nothing ran")
	require.Equal(t, "approval_pending", statusOf(t, s, alice, p.Fingerprint))

	require.Equal(t, http.StatusForbidden, decide(pending.ApprovalID, "alice"), "four eyes")
	require.Equal(t, http.StatusOK, decide(pending.ApprovalID, "bob"))
	require.Equal(t, "approval_granted", statusOf(t, s, alice, p.Fingerprint))

	done := confirm(t, alice, p.ConfirmBody())
	requireExecuted(t, done)
	require.Equal(t, 2, s.Payments.Executions())
	requireRow(t, s, p.Nonce, "DONE")
	requireReplay(t, s, confirm(t, alice, p.ConfirmBody()), p.Nonce, done.Body)
	require.Equal(t, 2, s.Payments.Executions())
}

// TestApprovalMCPThroughRealEnvoy: the same over MCP with the official Go
// SDK client: the pending confirm is a tool result with isError, the
// approved one runs once, its retry replays.
func TestApprovalMCPThroughRealEnvoy(t *testing.T) {
	s, decide := approvalStack(t)
	cs := mcpSession(t, s, "alice", "")
	ctx := t.Context()

	args := transferArgs("1500.00")
	pv, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: payments.MCPPreviewTool, Arguments: args})
	require.NoError(t, err)
	require.False(t, pv.IsError)
	require.Equal(t, true, structured(t, pv)["approval_required"])
	args["fingerprint"] = structured(t, pv)["fingerprint"]

	r, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: payments.MCPConfirmTool, Arguments: args})
	require.NoError(t, err)
	require.True(t, r.IsError, "approval_pending is not a result the agent may report")
	sc := structured(t, r)
	require.Equal(t, "approval_pending", sc["status"])
	id, _ := sc["approval_id"].(string)
	require.NotEmpty(t, id)
	require.Zero(t, s.Payments.Executions())

	require.Equal(t, http.StatusOK, decide(id, "bob"))
	done, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: payments.MCPConfirmTool, Arguments: args})
	require.NoError(t, err)
	require.False(t, done.IsError, "%+v", done.Content)
	require.NotEmpty(t, structured(t, done)["transfer_id"])
	require.Equal(t, 1, s.Payments.Executions())

	again, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: payments.MCPConfirmTool, Arguments: args})
	require.NoError(t, err)
	require.Equal(t, "already_completed", structured(t, again)["status"])
	require.Equal(t, 1, s.Payments.Executions())
}
