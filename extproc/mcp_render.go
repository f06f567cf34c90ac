package extproc

import (
	"bytes"
	"encoding/json"
	"strconv"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	"github.com/idemgate/idemgate/extproc/envelope"
)

// mcpReplayedKey marks a replayed tool result in its _meta.
const mcpReplayedKey = "io.idemgate/replayed"

// mcpEnvelope renders envelope m as what an MCP client shows its model: a
// JSON-RPC result (never an error: clients turn errors into exceptions the
// model never sees) with the request's id byte for byte, structuredContent
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
	var origResult []byte
	if x.HasResult {
		stored := x.Result
		origResult = memberOf(stored, "result")
		switch {
		case origResult != nil:
			x.Result = memberOf(origResult, "structuredContent")
		case memberOf(stored, "error") != nil:
			x.Result = editObject([]byte("{}"), nil, rawSet{"error", memberOf(stored, "error")})
		}
		if replay {
			if rt, _ := jsonString(memberOf(origResult, "resultType")); rt == "task" {
				spec, _ := envelope.SpecOf(msg)
				ex.decision(spec.Status)
				return ex.mcpResult(editObject(origResult, nil, rawSet{"_meta", replayedMeta(memberOf(origResult, "_meta"))}), spec.Status, extra)
			}
		}
	}
	r := set.RenderTo(nil, msg, ex.traceID, originalStatus, x)
	ex.decision(r.Status)
	var text struct {
		Meaning     string `json:"meaning"`
		Instruction string `json:"instruction"`
	}
	_ = json.Unmarshal(r.Body, &text)

	content := [][]byte{appendTextBlock(nil, text.Meaning+"\n\n"+text.Instruction)}
	// approval_pending (202) is not a result either: the operation did not
	// run (DESIGN section 10: isError for every approval answer but granted).
	isError := r.HTTPStatus >= 400 || msg == envelope.ApprovalPending
	if replay {
		isError = msg == envelope.AlreadyFailed
		if blocks, ok := arrayElements(memberOf(origResult, "content")); ok {
			content = append(content, blocks...)
		}
	}
	b := make([]byte, 0, len(r.Body)*2+256)
	b = append(b, '{')
	if ex.mcp.version >= mcpHeaderVersion {
		b = append(b, `"resultType":"complete",`...)
	}
	b = append(b, `"content":`...)
	b = append(b, appendElements(nil, content...)...)
	b = append(b, `,"structuredContent":`...)
	b = append(b, r.Body...)
	b = append(b, `,"isError":`...)
	b = strconv.AppendBool(b, isError)
	if replay {
		b = append(b, `,"_meta":`...)
		b = append(b, replayedMeta(nil)...)
	}
	b = append(b, '}')
	return ex.mcpResult(b, r.Status, extra)
}

// replayedMeta is a result's _meta with the replayed mark added.
func replayedMeta(meta []byte) []byte {
	if _, ok := objectMembers(meta); !ok {
		meta = []byte("{}")
	}
	return editObject(meta, nil, rawSet{mcpReplayedKey, []byte("true")})
}

// appendTextBlock appends a text content block.
func appendTextBlock(b []byte, text string) []byte {
	b = append(b, `{"type":"text","text":`...)
	b = envelope.AppendString(b, text)
	return append(b, '}')
}

// mcpResult answers the client with a JSON-RPC response carrying result.
func (ex *exchange) mcpResult(result []byte, status string, extra []*corev3.HeaderValueOption) *extprocv3.ProcessingResponse {
	b := make([]byte, 0, len(result)+64)
	b = append(b, `{"jsonrpc":"2.0","id":`...)
	b = append(b, ex.mcpID()...)
	b = append(b, `,"result":`...)
	b = append(b, result...)
	b = append(b, '}')
	headers := append([]*corev3.HeaderValueOption{contentTypeJSON}, extra...)
	return immediate(200, headers, b, "idemgate_"+status)
}

// mcpID is the request's id as the client sent it, or null before it is
// known.
func (ex *exchange) mcpID() []byte {
	if id := bytes.TrimSpace(ex.mcp.id); len(id) > 0 {
		return id
	}
	return []byte("null")
}

// mcpProtocolError answers a protocol fault no model decides (unparseable
// JSON-RPC, a batch with a guarded call, headers that disagree with the
// body) with a JSON-RPC error.
func (ex *exchange) mcpProtocolError(httpStatus, code int, message string) *extprocv3.ProcessingResponse {
	b := []byte(`{"jsonrpc":"2.0","id":`)
	b = append(b, ex.mcpID()...)
	b = append(b, `,"error":{"code":`...)
	b = strconv.AppendInt(b, int64(code), 10)
	b = append(b, `,"message":`...)
	b = envelope.AppendString(b, message)
	b = append(b, `}}`...)
	ex.decision("mcp_error_" + strconv.Itoa(-code))
	return immediate(httpStatus, []*corev3.HeaderValueOption{contentTypeJSON}, b, "idemgate_mcp_error")
}
