package extproc

import (
	"strconv"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	"github.com/idemgate/idemgate/extproc/config"
	"github.com/idemgate/idemgate/extproc/envelope"
	"github.com/idemgate/idemgate/extproc/mcp"
	"github.com/idemgate/idemgate/state"
)

// mcpResponseHeaders decides from the upstream's status and content type
// whether the response body is needed: for tools/list and a successful
// preview to rewrite it, for an acquired confirm to classify and record it.
func (ex *exchange) mcpResponseHeaders(h *extprocv3.HttpHeaders) (*extprocv3.ProcessingResponse, bool) {
	m := ex.mcp
	if m.kind == mcpPass || (m.kind == mcpTool && ex.kind == config.KindConfirm && ex.claimPhase != claimLetThrough) {
		return responseHeadersReply(nil, noResponseBodyMode), true
	}
	m.status, m.sawResponseHeaders = responseStatus(h), true
	ct, _ := headerValue(h.GetHeaders(), hdrContentType)
	m.sse = strings.HasPrefix(strings.ToLower(strings.TrimSpace(ct)), "text/event-stream")
	_, m.hasLength = headerValue(h.GetHeaders(), hdrContentLength)
	ok2xx := m.status >= 200 && m.status <= 299

	if m.kind == mcpTool && ex.kind == config.KindConfirm {
		ex.respStatus = m.status
		ex.respHeaders = []state.Header{{Name: hdrContentType, Value: "application/json"}}
		if !ok2xx {
			ex.respClass = ex.op.Outcomes.Classify(m.status)
			if ex.respClass == classAmbiguous {
				ex.settle(true, nil, "upstream answered "+strconv.Itoa(m.status))
				return responseHeadersReply(nil, noResponseBodyMode), true
			}
			if h.GetEndOfStream() {
				ex.settle(true, nil, "")
				return responseHeadersReply(nil, nil), true
			}
			return responseHeadersReply(nil, nil), false
		}
		if h.GetEndOfStream() {
			// 202 or an empty 200: no JSON-RPC response at all.
			ex.respClass = classAmbiguous
			ex.settle(true, nil, "the upstream answered without a JSON-RPC response")
			return responseHeadersReply(nil, nil), true
		}
		return responseHeadersReply(nil, nil), false
	}
	// tools/list and preview: only a successful response body is rewritten.
	if !ok2xx || h.GetEndOfStream() {
		ex.decision("passed_through")
		return responseHeadersReply(nil, noResponseBodyMode), true
	}
	return responseHeadersReply(nil, nil), false
}

// mcpResponseBody handles the buffered response body.
func (ex *exchange) mcpResponseBody(body []byte) (*extprocv3.ProcessingResponse, bool) {
	m := ex.mcp
	switch {
	case m.kind == mcpTool && ex.kind == config.KindConfirm:
		if ex.claimPhase == claimLetThrough {
			ex.mcpRecordConfirm(body)
		}
		// The upstream's answer reaches the client unchanged.
		return responseBodyReply(nil, nil, false), true
	case m.kind == mcpTool && ex.kind == config.KindPreview:
		if ex.previewBodyOnly && !m.sawResponseHeaders {
			if pass := ex.mcpPreviewWithoutHeaders(body); pass != nil {
				return pass, true
			}
		}
		return ex.mcpRewrite(body, ex.mcpInjectPreview), true
	case m.kind == mcpList:
		return ex.mcpRewrite(body, ex.mcpAugmentList), true
	}
	return responseBodyReply(nil, nil, false), true
}

// mcpPreviewWithoutHeaders prepares the rewrite of a preview whose response
// headers Envoy did not send (mcp.preview_response_headers: false): they
// are on their way to the client, so Envoy drops any header set now and
// sends the new body chunked. Without a 2xx response.code the answer passes
// unsigned (attributeStatusSignable: no fingerprint is the safe side, no
// confirm can follow). The framing comes from the body
// (mcp.SniffEventStream). It returns the pass-through reply, or nil when
// the body is to be rewritten.
func (ex *exchange) mcpPreviewWithoutHeaders(body []byte) *extprocv3.ProcessingResponse {
	if !ex.attributeStatusSignable("mcp.preview_response_headers: false") {
		return responseBodyReply(nil, nil, false)
	}
	ex.mcp.sse, ex.mcp.hasLength = mcp.SniffEventStream(body), false
	return nil
}

// mcpRewrite replaces the final response in body by what edit makes of it,
// fixing content-length when the upstream sent one (Envoy compares it with
// the new body; a chunked event stream has none).
func (ex *exchange) mcpRewrite(body []byte, edit func(msg mcp.Message) ([]byte, bool)) *extprocv3.ProcessingResponse {
	m := ex.mcp
	msg, ev, found := mcp.Final(body, m.sse, m.id)
	if !found {
		ex.logger().Warn("no JSON-RPC response with the request's id in the upstream's answer; passed through unchanged", "sse", m.sse)
		ex.decision("passed_through")
		return responseBodyReply(nil, nil, false)
	}
	newMsg, changed := edit(msg)
	if !changed {
		return responseBodyReply(nil, nil, false)
	}
	out := mcp.Replace(body, ev, newMsg)
	var mut *extprocv3.HeaderMutation
	if m.hasLength {
		mut = &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{setHeader(hdrContentLength, strconv.AppendInt(nil, int64(len(out)), 10))}}
	}
	return responseBodyReply(mut, out, true)
}

// mcpRecordConfirm classifies the upstream's answer to an acquired confirm
// (docs/design.md §9) and settles the record: a result whose isError is not
// true, or a task handle, is DONE; isError true and the definite JSON-RPC
// errors -32602 (invalid params) and -32601 (no such method) are FAILED;
// any other error, an answer asking for input (MRTR: the call is not
// finished), or a stream that ended before the final response (under
// 2026-07-28 a closed stream cancels the request, so the server may have
// half-acted) is ambiguous. The stored result is the whole JSON-RPC
// response, so a replay can show what the upstream said.
func (ex *exchange) mcpRecordConfirm(body []byte) {
	if ex.respClass == classFailed {
		// A definite HTTP refusal (4xx): recorded with its body.
		ex.settle(true, body, "")
		return
	}
	msg, _, found := mcp.Final(body, ex.mcp.sse, ex.mcp.id)
	if !found {
		ex.respClass = classAmbiguous
		ex.settle(true, nil, "the response ended before the final JSON-RPC response")
		return
	}
	class, why := mcpOutcome(msg)
	ex.respClass = class
	if class == classAmbiguous {
		ex.settle(true, nil, why)
		return
	}
	ex.settle(true, append([]byte(nil), msg.Raw...), "")
}

// mcpOutcome is the outcome class of a JSON-RPC response to tools/call.
func mcpOutcome(msg mcp.Message) (outcomeClass, string) {
	switch o, why := mcp.OutcomeOf(msg); o {
	case mcp.Done:
		return classDone, ""
	case mcp.Failed:
		return classFailed, ""
	default:
		return classAmbiguous, why
	}
}

// mcpInjectPreview signs a fingerprint into a successful preview result:
// fingerprint and its expiry in structuredContent (when that is an object
// or absent), and one text block that carries the token, because many
// clients give the model only content. No storage write.
func (ex *exchange) mcpInjectPreview(msg mcp.Message) ([]byte, bool) {
	res, ok := mcp.PreviewOf(msg)
	if !ok {
		ex.decision("passed_through")
		return nil, false
	}
	token, expiresAt, err := ex.sign()
	if err != nil {
		ex.logger().Error("failed to sign a fingerprint; preview passed through without one", "error", err)
		ex.decision("sign_failed")
		return nil, false
	}
	expires := expiresAt.Format(time.RFC3339)
	blockBuf, buf := ex.buffer(), ex.buffer()
	block := keep(blockBuf, ex.mcpPreviewBlock().AppendFilled(*blockBuf, token, expires))
	ex.decision("signed")
	return keep(buf, res.AppendInjected(*buf, ex.previewFields(token, expires), block)), true
}

// mcpPreviewBlock returns the preview text block of the stream's
// operation.
func (ex *exchange) mcpPreviewBlock() mcp.PreviewBlock {
	if b, ok := ex.srv.mcpPreviewBlocks[ex.op]; ok {
		return b
	}
	return mcp.NewPreviewBlock(textsOf(ex.op, ex.srv.cfg.Language).PreviewBlock)
}

// mcpPreviewBlocksByOperation renders the preview text block of every MCP
// operation once: it depends on the configuration only, and a preview
// needs it on every call.
func mcpPreviewBlocksByOperation(cfg *config.Runtime) map[*config.Operation]mcp.PreviewBlock {
	blocks := map[*config.Operation]mcp.PreviewBlock{}
	for _, ep := range cfg.MCPEndpoints {
		for _, op := range ep.Ops {
			blocks[op] = mcp.NewPreviewBlock(textsOf(op, cfg.Language).PreviewBlock)
		}
	}
	return blocks
}

// mcpAugmentList rewrites a tools/list result: every confirm tool of the
// endpoint gains the required fingerprint argument (and loses its
// outputSchema: idemgate's replays and refusals carry the envelope as
// structuredContent, which a client validating against the upstream's
// schema would reject), a preview tool's outputSchema gains the injected
// fields, and on the last page (no nextCursor) the status tools are
// appended. Cursors and every other tool pass unchanged.
func (ex *exchange) mcpAugmentList(msg mcp.Message) ([]byte, bool) {
	m := ex.mcp
	list, ok := mcp.ToolListOf(msg)
	if !ok {
		return nil, false
	}
	language := ex.srv.cfg.Language
	out := make([][]byte, 0, len(list.Tools)+len(m.ep.Ops))
	for _, t := range list.Tools {
		name := mcp.ToolName(t)
		target, guarded := m.ep.Tools[name]
		switch {
		case !guarded:
			out = append(out, t)
		case target.Kind == config.KindConfirm:
			out = append(out, mcp.WithFingerprintArgument(t, target.Op.FingerprintField, textsOf(target.Op, language).FingerprintArgument))
		case target.Kind == config.KindPreview:
			out = append(out, mcp.WithPreviewOutput(t, target.Op.FingerprintField, target.Op.ExpiresAtField))
		default:
			// The upstream has a tool of the status tool's name; idemgate
			// answers that name itself, so only its own definition is listed.
			ex.logger().Warn("the upstream lists a tool named like a status tool; idemgate answers that name and lists its own definition", "tool", name)
		}
	}
	if list.LastPage {
		for _, op := range m.ep.Ops {
			texts := textsOf(op, language)
			out = append(out, mcp.StatusTool(op.MCP.StatusTool, texts.StatusTool, op.FingerprintField, texts.StatusFingerprintArgument))
		}
	}
	ex.decision("tools_listed")
	return list.With(out), true
}

func textsOf(op *config.Operation, language string) envelope.MCPText {
	return envelope.MCPTexts(language, envelope.MCPTool{
		PreviewTool: op.MCP.PreviewTool, ConfirmTool: op.MCP.ConfirmTool, StatusTool: op.MCP.StatusTool, Field: op.FingerprintField,
	})
}
