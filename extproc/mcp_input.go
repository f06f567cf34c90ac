package extproc

import (
	"strings"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	"github.com/idemgate/idemgate/extproc/mcp"
	"github.com/idemgate/idemgate/extproc/requeststate"
	"github.com/idemgate/idemgate/extproc/security"
	"github.com/idemgate/idemgate/fingerprint"
	"github.com/idemgate/idemgate/internal/jsonx"
	"github.com/idemgate/idemgate/state"
)

// Approval where the agent runs (docs/design.md §13). A guarded confirm
// that waits for people, from a 2026-07-28 client that declared URL-mode
// elicitation, is answered input_required: one elicitation whose URL is
// the approval page, and a requestState idemgate seals (requeststate).
// The client shows the page, then retries the same call with
// inputResponses and that requestState. On the retry:
//
//	requestState          answer
//	not idemgate's, bad   JSON-RPC error -32602, security event, nothing runs
//	mac, expired
//	another nonce,        the same
//	subject or approval
//	idemgate's            by the approval (§10): granted executes once (the
//	                      upstream gets the call without inputResponses and
//	                      requestState), pending is the approval_pending
//	                      tool result (never another input_required, so a
//	                      client's round limit is not spent), denied and
//	                      expired as §10 says
//
// inputResponses beside idemgate's state must hold only idemgate's key,
// and idemgate's key never comes without its state: another server's
// answers cannot ride along to the upstream, nor idemgate's be replayed
// without the state that binds them.

// mcpReadInput reads the input-request members of a guarded confirm and
// opens a requestState. It answers (non-nil) when the call is refused.
func (ex *exchange) mcpReadInput(req mcp.Request) *extprocv3.ProcessingResponse {
	m := ex.mcp
	in, fault := req.Input()
	if fault != nil {
		return ex.mcpFault(fault)
	}
	m.input = in
	if !in.HasState {
		if in.HasApprovalResponse() {
			return ex.mcpStateRefused("inputResponses carries idemgate's approval response without its requestState", fingerprint.Claims{})
		}
		return nil
	}
	if ex.op.Approval == nil || ex.srv.approvals == nil {
		return ex.mcpStateRefused("this operation asks for no input", fingerprint.Claims{})
	}
	st, err := ex.srv.states.Open(in.State, ex.srv.now())
	if err != nil {
		return ex.mcpStateRefused(err.Error(), fingerprint.Claims{})
	}
	if !in.OnlyApprovalResponse() {
		return ex.mcpStateRefused("inputResponses holds answers to requests idemgate did not make", fingerprint.Claims{})
	}
	m.state = &st
	return nil
}

// mcpCheckState checks an opened requestState against the verified
// confirm and the nonce's approval (a, when found).
func (ex *exchange) mcpCheckState(claims fingerprint.Claims, a state.Approval, found bool) *extprocv3.ProcessingResponse {
	if ex.mcp == nil || ex.mcp.state == nil {
		return nil
	}
	st := ex.mcp.state
	switch {
	case st.Nonce != claims.Nonce:
		return ex.mcpStateRefused("requestState was issued for another fingerprint", claims)
	case st.SubjectTag != claims.SubjectTag:
		return ex.mcpStateRefused("requestState was issued to another subject", claims)
	case !found || st.ApprovalID != a.ID:
		return ex.mcpStateRefused("requestState names another approval", claims)
	}
	return nil
}

// mcpStateRefused answers a requestState or inputResponses idemgate does
// not accept: a JSON-RPC error (a protocol fault no model can fix by
// retrying differently), with a security event.
func (ex *exchange) mcpStateRefused(why string, claims fingerprint.Claims) *extprocv3.ProcessingResponse {
	ex.logger().Warn("MCP requestState refused", "why", why)
	ex.report(security.Event{Reason: security.ReasonRequestState, Request: why}, claims)
	return ex.mcpProtocolError(400, mcp.InvalidParams, "Invalid or expired requestState: "+why+"; call the tool again without requestState and inputResponses")
}

// mcpInputRequest is the input_required answer to a pending approval, or
// nil when the call gets the §10 tool result: not MCP, a retry that
// already carried idemgate's state, a client without URL elicitation or
// before 2026-07-28, or no approval.public_url.
func (ex *exchange) mcpInputRequest(a state.Approval, claims fingerprint.Claims) *extprocv3.ProcessingResponse {
	m := ex.mcp
	if m == nil || m.state != nil || !m.input.URLElicitation || m.version < mcp.HeaderVersion {
		return nil
	}
	url := ex.op.Approval.ApprovalURL(a.ID)
	if url == "" {
		return nil
	}
	sealed, err := ex.srv.states.Seal(requeststate.State{Nonce: a.Key, ApprovalID: a.ID, SubjectTag: claims.SubjectTag, Expires: a.ExpiresAt})
	if err != nil {
		ex.logger().Error("failed to seal a requestState; answering approval_pending", "approval_id", a.ID, "error", err)
		return nil
	}
	ex.decision("approval_input_required")
	return ex.mcpResult(mcp.InputRequired(url, approvalMessage(ex.srv.cfg.Language, ex.op.Name, a.Params), sealed), "approval_input_required", nil)
}

// approvalMessage says what the person is asked to approve: the operation
// and the bound params exactly as the approval holds them.
func approvalMessage(language, operation string, canonical []byte) string {
	var parts []string
	ms, _ := jsonx.Members(canonical)
	for _, mb := range ms {
		v, ok := jsonx.String(mb.Value)
		if !ok {
			v = string(mb.Value)
		}
		parts = append(parts, string(mb.Name)+" "+v)
	}
	if language == "zh" {
		return "请批准 " + operation + "：" + strings.Join(parts, "，") + "。请打开页面做出决定，然后回到这里：调用会自动继续。"
	}
	return "Approve " + operation + ": " + strings.Join(parts, ", ") + ". Open the page and decide there, then come back here: the call continues by itself."
}
