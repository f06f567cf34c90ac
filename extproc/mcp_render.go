package extproc

import (
	"strconv"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	"github.com/idemgate/idemgate/extproc/envelope"
	"github.com/idemgate/idemgate/extproc/mcp"
)

// mcpEnvelope renders envelope m as what an MCP client shows its model
// (mcp.ToolResult) with the request's id byte for byte: structuredContent
// = the envelope, content = one text block with its meaning and
// instruction, isError true for refusals. HTTP 200, application/json.
//
// A replay (already_completed / already_failed) keeps isError as recorded,
// puts the original structuredContent in the envelope's result and appends
// the original content blocks after the envelope's text; a recorded task
// handle is returned as it is, so every retry polls the one task. Status
// answers carry the original structuredContent as their result.
func (ex *exchange) mcpEnvelope(msg envelope.Message, originalStatus int, x envelope.Extra, extra ...*corev3.HeaderValueOption) *extprocv3.ProcessingResponse {
	set := ex.srv.cfg.Envelopes
	if ex.op != nil && ex.op.Envelopes != nil {
		set = ex.op.Envelopes
	}
	replay := (msg == envelope.AlreadyCompleted || msg == envelope.AlreadyFailed) && x.HasResult
	var stored mcp.Stored
	if x.HasResult {
		stored = mcp.StoredOf(x.Result)
		x.Result = stored.EnvelopeResult()
		if replay {
			if task, ok := stored.Task(); ok {
				spec, _ := envelope.SpecOf(msg)
				ex.decision(spec.Status)
				return ex.mcpResult(task, spec.Status, extra)
			}
		}
	}
	r := set.RenderTo(nil, msg, ex.traceID, originalStatus, x)
	ex.decision(r.Status)
	text := set.Text(msg)
	// approval_pending (202) is not a result either: the operation did not
	// run (docs/design.md §10: isError for every approval answer but granted).
	isError := r.HTTPStatus >= 400 || msg == envelope.ApprovalPending
	var more [][]byte
	if replay {
		isError = msg == envelope.AlreadyFailed
		more = stored.Content()
	}
	return ex.mcpResult(mcp.ToolResult(ex.mcp.version, r.Body, text.Meaning+"\n\n"+text.Instruction, isError, replay, more), r.Status, extra)
}

// mcpResult answers the client with a JSON-RPC response carrying result.
func (ex *exchange) mcpResult(result []byte, status string, extra []*corev3.HeaderValueOption) *extprocv3.ProcessingResponse {
	headers := append([]*corev3.HeaderValueOption{contentTypeJSON}, extra...)
	return immediate(200, headers, mcp.Result(ex.mcp.id, result), "idemgate_"+status)
}

// mcpProtocolError answers a protocol fault no model decides (unparseable
// JSON-RPC, a batch with a guarded call, headers that disagree with the
// body) with a JSON-RPC error.
func (ex *exchange) mcpProtocolError(httpStatus, code int, message string) *extprocv3.ProcessingResponse {
	ex.decision("mcp_error_" + strconv.Itoa(-code))
	return immediate(httpStatus, []*corev3.HeaderValueOption{contentTypeJSON}, mcp.Error(ex.mcp.id, code, message), "idemgate_mcp_error")
}

// mcpFault answers a fault the mcp package found.
func (ex *exchange) mcpFault(f *mcp.Fault) *extprocv3.ProcessingResponse {
	return ex.mcpProtocolError(f.HTTPStatus, f.Code, f.Message)
}
