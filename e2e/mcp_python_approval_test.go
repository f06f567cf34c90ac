package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/e2e/demoauth"
	"github.com/idemgate/idemgate/e2e/internal/stack"
	"github.com/idemgate/idemgate/e2e/payments"
	"github.com/idemgate/idemgate/internal/testutil"
	"github.com/idemgate/idemgate/state"
	"github.com/idemgate/idemgate/state/postgres"
)

// The step-up the approval stack asks of a requester approving their own
// transfer (docs/design.md §13).
const stepUpACR = "urn:idemgate:demo:sca"

// upstreamBodies records the bodies of the MCP calls the upstream received.
type upstreamBodies struct {
	mu     sync.Mutex
	bodies []string
}

func (u *upstreamBodies) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == payments.MCPPath && r.Method == http.MethodPost {
			b, err := io.ReadAll(r.Body)
			if err != nil {
				http.Error(w, "read", http.StatusBadRequest)
				return
			}
			u.mu.Lock()
			u.bodies = append(u.bodies, string(b))
			u.mu.Unlock()
			r.Body = io.NopCloser(bytes.NewReader(b))
		}
		next.ServeHTTP(w, r)
	})
}

func (u *upstreamBodies) confirms() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	var out []string
	for _, b := range u.bodies {
		if strings.Contains(b, `"`+payments.MCPConfirmTool+`"`) {
			out = append(out, b)
		}
	}
	return out
}

// stepUpStack is a stack whose MCP and HTTP transfers of 1000.00 or more
// need an approval that the requester may give with step-up, with the
// approvers' page at approval.public_url.
type stepUpStack struct {
	*stack.Stack
	key      *demoauth.ApproverKey
	page     string
	upstream *upstreamBodies
}

func startStepUpStack(t *testing.T) *stepUpStack {
	t.Helper()
	key, err := demoauth.NewApproverKey("")
	require.NoError(t, err)
	jwks := filepath.Join(t.TempDir(), "approvers.jwks")
	require.NoError(t, os.WriteFile(jwks, key.JWKS(), 0o600))
	addr := fmt.Sprintf("127.0.0.1:%d", testutil.FreePort(t))
	up := &upstreamBodies{}
	s := startStack(t, stack.Options{
		Approval: map[string]any{
			"rules":      []any{map[string]any{"param": "amount", "at_least": "1000.00"}},
			"public_url": "http://" + addr,
			"approvers": map[string]any{
				"jwt":               map[string]any{"issuer": "https://idp.example", "audience": "idemgate-approvals", "jwks_file": jwks},
				"requester_step_up": map[string]any{"acr": []any{stepUpACR}, "max_auth_age": "5m"},
			},
		},
		IdemgateConfig: map[string]any{"approval_listen": addr},
		WrapUpstream:   up.wrap,
	})
	return &stepUpStack{Stack: s, key: key, page: "http://" + addr, upstream: up}
}

// personToken is the person's approver token: strong carries the listed
// acr and an auth_time a minute ago, weak neither.
func (s *stepUpStack) personToken(t *testing.T, sub string, strong bool) string {
	t.Helper()
	now := time.Now()
	c := map[string]any{"iss": "https://idp.example", "aud": "idemgate-approvals", "sub": sub, "exp": now.Add(5 * time.Minute).Unix()}
	if strong {
		c["acr"], c["amr"], c["auth_time"] = stepUpACR, []string{"hwk"}, now.Add(-time.Minute).Unix()
	}
	tok, err := s.key.Mint(c)
	require.NoError(t, err)
	return tok
}

// pyApproval is what the scenario script printed.
type pyApproval struct {
	Elicitations []struct{ Mode, URL, Message string }
	Page         []struct {
		Step            string
		Status          int
		WWWAuthenticate string `json:"www_authenticate"`
		Location        string
		HTML            string
	}
	Fingerprint           string
	Confirm, Retry        pyOutcome
	FirstResultType       string    `json:"first_result_type"`
	Tampered              pyOutcome `json:"tampered"`
	TamperedAfterApproval pyOutcome `json:"tampered_after_approval"`
}

type pyOutcome struct {
	Result     *pySeen
	ResultType string `json:"result_type"`
	Error      *struct {
		Type, Message string
		Code          *int
	}
}

// runPyApproval runs the scenario script for alice; between, when set,
// runs after its first printed line (tamper) before the script goes on.
func (s *stepUpStack) runPyApproval(t *testing.T, handler string, amount string, between func(first pyApproval)) pyApproval {
	t.Helper()
	py := mcpPython(t)
	agentToken, err := demoauth.Mint("alice", time.Hour, time.Now())
	require.NoError(t, err)
	cfg, err := json.Marshal(map[string]any{
		"url": s.URL() + payments.MCPPath, "agent_token": agentToken, "handler": handler,
		"preview_tool": payments.MCPPreviewTool, "confirm_tool": payments.MCPConfirmTool, "args": transferArgs(amount),
		"weak_token": s.personToken(t, "alice", false), "strong_token": s.personToken(t, "alice", true),
	})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, py, filepath.Join("testdata", "mcp_python_approval.py"))
	stderr := &stack.LogBuffer{}
	cmd.Stderr = stderr
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	defer func() {
		if t.Failed() {
			t.Logf("python stderr:\n%s", stderr.String())
		}
	}()
	_, err = stdin.Write(append(cfg, '\n'))
	require.NoError(t, err)
	sc := bufio.NewScanner(stdout)
	sc.Buffer(make([]byte, 0, 1<<20), 16<<20)
	var out pyApproval
	require.True(t, sc.Scan(), "no output: %s", stderr.String())
	require.NoError(t, json.Unmarshal(sc.Bytes(), &out), sc.Text())
	if between != nil {
		between(out)
		_, err = stdin.Write([]byte("go\n"))
		require.NoError(t, err)
		require.True(t, sc.Scan(), "no second output: %s", stderr.String())
		out = pyApproval{}
		require.NoError(t, json.Unmarshal(sc.Bytes(), &out), sc.Text())
	}
	_ = stdin.Close()
	require.NoError(t, cmd.Wait(), stderr.String())
	return out
}

func (s *stepUpStack) approvalOf(t *testing.T, nonce string) state.Approval {
	t.Helper()
	pg, err := postgres.New(t.Context(), postgres.Options{DSN: s.DSN})
	require.NoError(t, err)
	defer func() { _ = pg.Close() }()
	a, found, err := pg.ApprovalByKey(t.Context(), nonce)
	require.NoError(t, err)
	require.True(t, found, "an approval of %s in PostgreSQL", nonce)
	return a
}

// requireUpstreamNeverSawInput: no call the upstream received carries
// idemgate's input response or state.
func (s *stepUpStack) requireUpstreamNeverSawInput(t *testing.T) {
	t.Helper()
	for _, b := range s.upstream.confirms() {
		require.NotContains(t, b, "requestState", b)
		require.NotContains(t, b, "inputResponses", b)
		require.NotContains(t, b, "io.idemgate/approval", b)
	}
}

// TestMCPPythonApproval (docs/design.md §13) runs the official Python SDK
// (`mcp` 2.3.0, 2026-07-28) through the pinned Envoy against idemgate with
// PostgreSQL. The SDK's elicitation handler plays the person: it opens the
// approval page, is asked to step up (RFC 9470), authenticates again and
// approves; the SDK's own retry executes the transfer once and the second
// call replays; the approval is CONSUMED with the step-up recorded; the
// upstream never sees idemgate's input response or state.
func TestMCPPythonApproval(t *testing.T) {
	if testing.Short() {
		t.Skip("e2e: needs services and the MCP Python SDK; skipped with -short")
	}
	mcpPython(t)
	s := startStepUpStack(t)

	t.Run("approved with step-up, executed once", func(t *testing.T) {
		out := s.runPyApproval(t, "approve", "1500.00", nil)
		require.Len(t, out.Elicitations, 1, "one round")
		el := out.Elicitations[0]
		require.Equal(t, "url", el.Mode)
		require.True(t, strings.HasPrefix(el.URL, s.page+"/approvals/apr_"), el.URL)
		require.Contains(t, el.Message, "1500")
		require.Contains(t, el.Message, "acct_leo")

		require.Len(t, out.Page, 4)
		require.Equal(t, http.StatusUnauthorized, out.Page[0].Status)
		require.Contains(t, out.Page[0].WWWAuthenticate, `error="insufficient_user_authentication"`)
		require.Contains(t, out.Page[0].WWWAuthenticate, `acr_values="`+stepUpACR+`"`)
		require.Contains(t, out.Page[0].WWWAuthenticate, "max_age=300")
		require.Equal(t, http.StatusOK, out.Page[1].Status)
		for _, shown := range []string{"1500", "EUR", "acct_leo", "amount &gt;= 1000.00", "alice"} {
			require.Contains(t, out.Page[1].HTML, shown, "the page shows what is approved")
		}
		require.NotContains(t, out.Page[1].HTML, "rent", "unbound fields are not shown")
		require.Equal(t, http.StatusSeeOther, out.Page[2].Status)
		require.Contains(t, out.Page[3].HTML, "Return to your agent")

		require.NotNil(t, out.Confirm.Result, "%+v", out.Confirm.Error)
		require.False(t, out.Confirm.Result.IsError, "%+v", out.Confirm.Result)
		transferID := out.Confirm.Result.Structured["transfer_id"]
		require.NotEmpty(t, transferID)
		require.NotNil(t, out.Retry.Result, "%+v", out.Retry.Error)
		require.Equal(t, "already_completed", out.Retry.Result.Structured["status"])
		require.Equal(t, transferID, out.Retry.Result.Structured["result_ref"])
		require.Equal(t, 1, s.Payments.Executions(), "executed once")

		nonce := nonceOf(t, out.Fingerprint)
		requireRow(t, s.Stack, nonce, "DONE")
		a := s.approvalOf(t, nonce)
		require.Equal(t, state.ApprovalConsumed, a.State)
		var approved *state.ApprovalEvent
		for i := range a.Events {
			if a.Events[i].Kind == state.EventApproved {
				approved = &a.Events[i]
			}
		}
		require.NotNil(t, approved)
		require.Equal(t, "alice", approved.Actor, "the requester approved, stepped up")
		require.Equal(t, stepUpACR, approved.ACR)
		require.Equal(t, []string{"hwk"}, approved.AMR)
		require.WithinDuration(t, time.Now().Add(-time.Minute), approved.AuthTime, 30*time.Second)
		s.requireUpstreamNeverSawInput(t)
	})

	t.Run("declined, nothing executed", func(t *testing.T) {
		before := s.Payments.Executions()
		out := s.runPyApproval(t, "decline", "2500.00", nil)
		require.Len(t, out.Elicitations, 2, "one round per call (confirm, then the second call), never more")
		for _, o := range []pyOutcome{out.Confirm, out.Retry} {
			require.NotNil(t, o.Result, "%+v", o.Error)
			require.True(t, o.Result.IsError)
			require.Equal(t, "approval_pending", o.Result.Structured["status"])
		}
		require.Equal(t, before, s.Payments.Executions())
		require.Equal(t, state.ApprovalPending, s.approvalOf(t, nonceOf(t, out.Fingerprint)).State)
	})

	t.Run("no URL elicitation: the tool result with approval_url", func(t *testing.T) {
		before := s.Payments.Executions()
		out := s.runPyApproval(t, "none", "3500.00", nil)
		require.Empty(t, out.Elicitations)
		require.NotNil(t, out.Confirm.Result, "%+v", out.Confirm.Error)
		sc := out.Confirm.Result.Structured
		require.Equal(t, "approval_pending", sc["status"])
		require.Equal(t, s.page+"/approvals/"+sc["approval_id"].(string), sc["approval_url"])
		require.Equal(t, before, s.Payments.Executions())
	})

	t.Run("tampered requestState, nothing executed", func(t *testing.T) {
		before := s.Payments.Executions()
		out := s.runPyApproval(t, "tamper", "4500.00", func(first pyApproval) {
			require.Equal(t, "input_required", first.FirstResultType)
			require.NotNil(t, first.Tampered.Error, "%+v", first.Tampered)
			require.NotNil(t, first.Tampered.Error.Code)
			require.Equal(t, -32602, *first.Tampered.Error.Code, first.Tampered.Error.Message)
			// Even once approved, the tampered state runs nothing.
			a := s.approvalOf(t, nonceOf(t, first.Fingerprint))
			req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, s.page+"/v1/approvals/"+a.ID+"/approve", strings.NewReader(`{"reason":"ok"}`))
			require.NoError(t, err)
			req.Header.Set("Authorization", "Bearer "+s.personToken(t, "bob", false))
			req.Header.Set("Content-Type", "application/json")
			resp, err := http.DefaultClient.Do(req)
			require.NoError(t, err)
			resp.Body.Close()
			require.Equal(t, http.StatusOK, resp.StatusCode)
		})
		require.NotNil(t, out.TamperedAfterApproval.Error, "%+v", out.TamperedAfterApproval)
		require.Equal(t, -32602, *out.TamperedAfterApproval.Error.Code)
		require.Equal(t, before, s.Payments.Executions())
		require.Equal(t, state.ApprovalApproved, s.approvalOf(t, nonceOf(t, out.Fingerprint)).State, "nothing consumed")
		s.requireUpstreamNeverSawInput(t)
	})
}
