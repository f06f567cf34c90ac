package extproc

import (
	"bytes"
	"strconv"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	"github.com/idemgate/idemgate/attest/verify"
	"github.com/idemgate/idemgate/extproc/config"
	"github.com/idemgate/idemgate/extproc/envelope"
	"github.com/idemgate/idemgate/extproc/mcp"
	"github.com/idemgate/idemgate/extproc/requeststate"
	"github.com/idemgate/idemgate/extproc/security"
	"github.com/idemgate/idemgate/fingerprint"
	"github.com/idemgate/idemgate/internal/jsonx"
)

// mcpKind is what an MCP message is to idemgate.
type mcpKind uint8

const (
	mcpPass mcpKind = iota // not ours: passes untouched
	mcpList                // tools/list: the response is augmented
	mcpTool                // a guarded tools/call (ex.op and ex.kind say which)
)

// mcpExchange is the MCP state of a stream to an MCP endpoint.
type mcpExchange struct {
	ep   *config.MCPEndpoint
	kind mcpKind
	// version is the request's MCP-Protocol-Version header.
	version string
	// headerMethod and headerName are the 2026-07-28 mirrored headers
	// (decoded), for the check against the body.
	headerMethod, headerName       string
	hasHeaderMethod, hasHeaderName bool
	// id is the request's JSON-RPC id, raw (nil until the body is read, and
	// for notifications).
	id []byte
	// input is what the call said of input requests (a guarded confirm's);
	// state is idemgate's requestState it carried, opened (nil: none).
	input mcp.InputRound
	state *requeststate.State
	// The upstream response. sawResponseHeaders: they were sent (always,
	// but for a preview whose response headers were switched off, see
	// previewStatusFromAttribute).
	status             int
	sse                bool
	hasLength          bool
	sawResponseHeaders bool
}

// mcpRequestHeaders starts a stream to an MCP endpoint. The body decides what
// a request is, and a body that disagrees with the 2026-07-28 mirrored
// headers is refused here (mcpRequestBody), whatever the upstream checks.
// Only on an endpoint whose operations trust the upstream to check them
// (mcp.trust_upstream_headers) do the headers decide at once: tools/list
// and guarded tools/call are buffered, everything else is let through with
// every later phase off.
func (ex *exchange) mcpRequestHeaders(req *extprocv3.ProcessingRequest, h *extprocv3.HttpHeaders, ep *config.MCPEndpoint) (*extprocv3.ProcessingResponse, bool) {
	hm := h.GetHeaders()
	m := &mcpExchange{ep: ep}
	ex.mcp = m
	m.version, _ = headerValue(hm, mcp.HeaderProtocol)
	m.headerMethod, m.hasHeaderMethod = headerValue(hm, mcp.HeaderMethod)
	if raw, ok := headerValue(hm, mcp.HeaderName); ok {
		name, valid := mcp.DecodeNameHeader(raw)
		if !valid {
			return ex.mcpProtocolError(400, mcp.HeaderMismatch, "Header mismatch: the Mcp-Name header is not a valid header value"), true
		}
		m.headerName, m.hasHeaderName = name, true
	}
	if h.GetEndOfStream() {
		return ex.mcpPassThrough()
	}
	if ep.TrustUpstreamHeaders && m.version >= mcp.HeaderVersion && m.hasHeaderMethod {
		switch m.headerMethod {
		case "tools/list":
		case "tools/call":
			// Without Mcp-Name the body decides (and a guarded call is refused
			// for the missing header there).
			if _, guarded := ep.Tools[m.headerName]; m.hasHeaderName && !guarded {
				return ex.mcpPassThrough()
			}
		default:
			return ex.mcpPassThrough()
		}
	}
	if ex.sawProtocol && (ex.requestBodyMode != filterv3.ProcessingMode_BUFFERED || ex.responseBodyMode != filterv3.ProcessingMode_BUFFERED) {
		ex.logger().Error("Envoy must send the MCP endpoint's bodies BUFFERED (processing_mode request_body_mode and response_body_mode); refusing the request",
			"request_body_mode", ex.requestBodyMode.String(), "response_body_mode", ex.responseBodyMode.String())
		return ex.mcpProtocolError(500, mcp.InternalError, "idemgate is misconfigured: the MCP endpoint's bodies must be BUFFERED"), true
	}
	ex.subject = ex.resolveSubject(hm, req.GetMetadataContext())
	ex.headerFingerprint, _ = headerValue(hm, hdrFingerprint)
	// The arguments are checked like an HTTP body (bodyEncodingRefused).
	ex.contentType, _ = headerValue(hm, hdrContentType)
	ex.contentEncoding, _ = headerValue(hm, hdrContentEncoding)
	if cl, ok := headerValue(hm, hdrContentLength); ok {
		if n, err := strconv.ParseInt(strings.TrimSpace(cl), 10, 64); err == nil && n > ex.srv.cfg.Limits.MaxBodyBytes {
			return ex.mcpProtocolError(413, mcp.InvalidRequest, "request too large: at most "+strconv.FormatInt(ex.srv.cfg.Limits.MaxBodyBytes, 10)+" bytes"), true
		}
	}
	if m.previewStatusFromAttribute() {
		ex.previewBodyOnly = true
		return requestHeadersReply(nil, previewBodyOnlyMode), false
	}
	return requestHeadersReply(nil, nil), false
}

// previewStatusFromAttribute reports whether the headers name the preview
// tool of an operation whose preview reads its status from response.code
// (mcp.preview_response_headers: false): its response headers can then be
// switched off before the body is read. The body decides as always: one
// that is not that call is refused for disagreeing with the headers, or is
// the call of an older client (no Mcp-Name), which keeps all four messages.
func (m *mcpExchange) previewStatusFromAttribute() bool {
	if m.version < mcp.HeaderVersion || !m.hasHeaderMethod || m.headerMethod != "tools/call" || !m.hasHeaderName {
		return false
	}
	t, guarded := m.ep.Tools[m.headerName]
	return guarded && t.Kind == config.KindPreview && t.Op.MCP.PreviewStatusFromAttribute
}

// mcpPassThrough lets a message the idempotency gate has no business with go
// through: no body is buffered, no later phase is sent.
func (ex *exchange) mcpPassThrough() (*extprocv3.ProcessingResponse, bool) {
	ex.mcp.kind = mcpPass
	ex.srv.metrics.passthrough.Inc()
	return requestHeadersReply(nil, passThroughMode), true
}

// mcpRequestBody reads the JSON-RPC message and decides what it is. The
// headers alone never decide one (mcpRequestHeaders lets a bodiless
// request through), so headersOnly is never set.
func (ex *exchange) mcpRequestBody(body []byte, _ bool) (*extprocv3.ProcessingResponse, bool) {
	m := ex.mcp
	if int64(len(body)) > ex.srv.cfg.Limits.MaxBodyBytes {
		return ex.mcpProtocolError(413, mcp.InvalidRequest, "request too large: at most "+strconv.FormatInt(ex.srv.cfg.Limits.MaxBodyBytes, 10)+" bytes"), true
	}
	guarded := func(name string) bool { _, ok := m.ep.Tools[name]; return ok }
	if trimmed := bytes.TrimSpace(body); len(trimmed) > 0 && trimmed[0] == '[' {
		if f := mcp.CheckBatch(trimmed, guarded); f != nil {
			return ex.mcpFault(f), true
		}
		m.kind = mcpPass
		return requestBodyReply(nil), false
	}
	depth := ex.srv.cfg.Limits.MaxJSONDepth
	if depth <= 0 {
		depth = fingerprint.DefaultMaxDepth // as ParseJSON reads a zero limit
	}
	req, fault := mcp.ParseRequest(body, guarded, depth)
	m.id = req.ID
	if fault != nil {
		return ex.mcpFault(fault), true
	}
	method, name, hasName := req.Method, req.Name, req.HasName

	if m.hasHeaderMethod && method != m.headerMethod {
		return ex.mcpProtocolError(400, mcp.HeaderMismatch, "Header mismatch: Mcp-Method header value '"+m.headerMethod+"' does not match body value '"+method+"'"), true
	}
	if method == "tools/call" && m.hasHeaderName && (!hasName || name != m.headerName) {
		return ex.mcpProtocolError(400, mcp.HeaderMismatch, "Header mismatch: Mcp-Name header value '"+m.headerName+"' does not match body value '"+name+"'"), true
	}

	if _, guarded := m.ep.Tools[name]; method == "tools/call" && guarded && m.id == nil {
		// A notification gets no answer, so no decision could reach the
		// agent; and an upstream that ran it would run it unguarded.
		return ex.mcpProtocolError(400, mcp.InvalidRequest, "Invalid Request: "+name+" must be called as a request with an id"), true
	}
	switch {
	case method == "tools/list" && m.id != nil:
		m.kind = mcpList
		return requestBodyReply(nil), false
	case method == "tools/call" && m.id != nil && hasName:
		target, guarded := m.ep.Tools[name]
		if !guarded {
			break
		}
		if m.version >= mcp.HeaderVersion && !m.hasHeaderName {
			return ex.mcpProtocolError(400, mcp.HeaderMismatch, "Header mismatch: the Mcp-Name header is required for tools/call"), true
		}
		m.kind = mcpTool
		ex.op, ex.kind = target.Op, target.Kind
		return ex.mcpToolCall(req)
	}
	// Any other message: let it through and do not buffer the response.
	m.kind = mcpPass
	return requestBodyReply(nil), false
}

// mcpToolCall runs the preview, confirm or status checks on the call's
// arguments, which play the part of the HTTP body: the same parsing, the
// same param selection and hashing, the same binding rule.
func (ex *exchange) mcpToolCall(req mcp.Request) (*extprocv3.ProcessingResponse, bool) {
	if req.Refused != nil {
		// Well-formed to a lax parser but refused by idemgate's: a
		// duplicate key (which upstream parsers resolve differently),
		// invalid UTF-8 or a lone surrogate, or nesting past the limit.
		// Nothing is consumed.
		ex.report(security.Event{Reason: security.ReasonAmbiguousKey}, fingerprint.Claims{})
		return ex.envelope(envelope.InvalidParams, 0, envelope.Extra{Detail: req.Refused.Error()}), true
	}
	args := req.Arguments
	switch {
	case jsonx.IsNull(args):
		args = []byte("{}")
	case !req.ArgumentsObject():
		return ex.envelope(envelope.InvalidParams, 0, envelope.Extra{Detail: "params.arguments must be an object"}), true
	}
	switch ex.kind {
	case config.KindPreview:
		return ex.previewRequest(args, false)
	case config.KindStatus:
		return ex.statusRequest(args, false)
	}
	if refused := ex.mcpReadInput(req); refused != nil {
		return refused, true
	}
	resp, end := ex.confirmRequest(args, false)
	if ex.claimPhase != claimPending {
		return resp, end
	}
	return ex.mcpForwardConfirm(resp, req, args), end
}

// mcpForwardConfirm rewrites an acquired confirm for the upstream: the
// fingerprint leaves the arguments (a strict upstream schema would refuse
// the unknown argument) and, when the downstream honours keys, the nonce
// goes into params._meta beside the Idempotency-Key header the confirm
// reply already sets. content-length follows the new body in the same reply
// (BUFFERED: Envoy compares them).
func (ex *exchange) mcpForwardConfirm(resp *extprocv3.ProcessingResponse, req mcp.Request, args []byte) *extprocv3.ProcessingResponse {
	var meta []jsonx.Set
	if ex.op.HonoursKeys() {
		meta = append(meta, jsonx.Set{Key: config.MCPIdempotencyMetaKey, Text: ex.claim.Key})
	}
	if ex.attestation != "" {
		meta = append(meta, jsonx.Set{Key: verify.MCPMetaKey, Text: ex.attestation})
	}
	newBody := mcp.ForwardBody(req, args, ex.op.FingerprintField, ex.mcp.state != nil, meta...)
	var headers []*corev3.HeaderValueOption
	if mut := resp.GetRequestBody().GetResponse().GetHeaderMutation(); mut != nil {
		headers = append(headers, mut.GetSetHeaders()...)
	}
	headers = append(headers, setHeader(hdrContentLength, strconv.AppendInt(nil, int64(len(newBody)), 10)))
	return &extprocv3.ProcessingResponse{
		Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{
			Response: common(&extprocv3.HeaderMutation{SetHeaders: headers}, newBody, true),
		}},
	}
}
