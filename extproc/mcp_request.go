package extproc

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"strconv"
	"strings"
	"unicode/utf8"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	"github.com/idemgate/idemgate/attest/verify"
	"github.com/idemgate/idemgate/extproc/config"
	"github.com/idemgate/idemgate/extproc/envelope"
	"github.com/idemgate/idemgate/extproc/security"
	"github.com/idemgate/idemgate/fingerprint"
)

// MCP request headers (lower case, as Envoy hands them over). Protocol
// 2026-07-28 mirrors method and params.name into Mcp-Method and Mcp-Name
// (basic/transports/streamable-http, "Request Metadata").
const (
	hdrMCPProtocol = "mcp-protocol-version"
	hdrMCPMethod   = "mcp-method"
	hdrMCPName     = "mcp-name"
)

// mcpHeaderVersion is the first protocol version that sends Mcp-Method and
// Mcp-Name and requires servers to check them against the body. Versions
// are dates, so they compare as strings.
const mcpHeaderVersion = "2026-07-28"

// JSON-RPC error codes idemgate answers protocol faults with.
const (
	rpcParseError     = -32700
	rpcInvalidRequest = -32600
	rpcHeaderMismatch = -32020 // MCP 2026-07-28 HeaderMismatch
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
	// The upstream response.
	status    int
	sse       bool
	hasLength bool
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
	m.version, _ = headerValue(hm, hdrMCPProtocol)
	m.headerMethod, m.hasHeaderMethod = headerValue(hm, hdrMCPMethod)
	if raw, ok := headerValue(hm, hdrMCPName); ok {
		name, valid := decodeMCPHeader(raw)
		if !valid {
			return ex.mcpProtocolError(400, rpcHeaderMismatch, "Header mismatch: the Mcp-Name header is not a valid header value"), true
		}
		m.headerName, m.hasHeaderName = name, true
	}
	if h.GetEndOfStream() {
		return ex.mcpPassThrough()
	}
	if ep.TrustUpstreamHeaders && m.version >= mcpHeaderVersion && m.hasHeaderMethod {
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
		return ex.mcpProtocolError(500, -32603, "idemgate is misconfigured: the MCP endpoint's bodies must be BUFFERED"), true
	}
	ex.subject = ex.resolveSubject(hm, req.GetMetadataContext())
	ex.headerFingerprint, _ = headerValue(hm, hdrFingerprint)
	// The arguments are checked like an HTTP body (bodyEncodingRefused).
	ex.contentType, _ = headerValue(hm, hdrContentType)
	ex.contentEncoding, _ = headerValue(hm, hdrContentEncoding)
	if cl, ok := headerValue(hm, hdrContentLength); ok {
		if n, err := strconv.ParseInt(strings.TrimSpace(cl), 10, 64); err == nil && n > ex.srv.cfg.Limits.MaxBodyBytes {
			return ex.mcpProtocolError(413, rpcInvalidRequest, "request too large: at most "+strconv.FormatInt(ex.srv.cfg.Limits.MaxBodyBytes, 10)+" bytes"), true
		}
	}
	return requestHeadersReply(nil, nil), false
}

// mcpPassThrough lets a message the idempotency gate has no business with go
// through: no body is buffered, no later phase is sent.
func (ex *exchange) mcpPassThrough() (*extprocv3.ProcessingResponse, bool) {
	ex.mcp.kind = mcpPass
	ex.srv.metrics.passthrough.Inc()
	return requestHeadersReply(nil, passThroughMode), true
}

// decodeMCPHeader decodes a Mcp-Name value: plain visible ASCII, or the
// "=?base64?…?=" sentinel form for anything else (streamable-http, "Value
// Encoding").
func decodeMCPHeader(v string) (string, bool) {
	if s, ok := strings.CutPrefix(v, "=?base64?"); ok {
		s, ok = strings.CutSuffix(s, "?=")
		if !ok {
			return "", false
		}
		b, err := base64.StdEncoding.DecodeString(s)
		if err != nil || !utf8.Valid(b) {
			return "", false
		}
		return string(b), true
	}
	for i := 0; i < len(v); i++ {
		if c := v[i]; (c < 0x20 && c != '\t') || c > 0x7e {
			return "", false
		}
	}
	return v, true
}

// mcpRequestBody reads the JSON-RPC message and decides what it is. The
// headers alone never decide one (mcpRequestHeaders lets a bodiless
// request through), so headersOnly is never set.
func (ex *exchange) mcpRequestBody(body []byte, _ bool) (*extprocv3.ProcessingResponse, bool) {
	m := ex.mcp
	if int64(len(body)) > ex.srv.cfg.Limits.MaxBodyBytes {
		return ex.mcpProtocolError(413, rpcInvalidRequest, "request too large: at most "+strconv.FormatInt(ex.srv.cfg.Limits.MaxBodyBytes, 10)+" bytes"), true
	}
	trimmed := bytes.TrimSpace(body)
	if len(trimmed) > 0 && trimmed[0] == '[' {
		return ex.mcpBatch(trimmed)
	}
	members, ok := objectMembers(trimmed)
	if !ok {
		return ex.mcpProtocolError(400, rpcParseError, "Parse error: the body is not one JSON object"), true
	}
	m.id = member(members, "id")
	method, _ := jsonString(member(members, "method"))
	params := member(members, "params")
	pm, _ := objectMembers(params)
	name, hasName := jsonString(member(pm, "name"))
	if ambiguousKey(members, "id", "method", "params") || ambiguousKey(pm, "name", "arguments", "_meta") {
		// Two readers could disagree on which member counts: idemgate would
		// route by one, the upstream execute the other.
		return ex.mcpProtocolError(400, rpcInvalidRequest, "Invalid Request: a member appears twice, or in two spellings that differ only in case"), true
	}

	if m.hasHeaderMethod && method != m.headerMethod {
		return ex.mcpProtocolError(400, rpcHeaderMismatch, "Header mismatch: Mcp-Method header value '"+m.headerMethod+"' does not match body value '"+method+"'"), true
	}
	if method == "tools/call" && m.hasHeaderName && (!hasName || name != m.headerName) {
		return ex.mcpProtocolError(400, rpcHeaderMismatch, "Header mismatch: Mcp-Name header value '"+m.headerName+"' does not match body value '"+name+"'"), true
	}

	if _, guarded := m.ep.Tools[name]; method == "tools/call" && guarded && m.id == nil {
		// A notification gets no answer, so no decision could reach the
		// agent; and an upstream that ran it would run it unguarded.
		return ex.mcpProtocolError(400, rpcInvalidRequest, "Invalid Request: "+name+" must be called as a request with an id"), true
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
		if m.version >= mcpHeaderVersion && !m.hasHeaderName {
			return ex.mcpProtocolError(400, rpcHeaderMismatch, "Header mismatch: the Mcp-Name header is required for tools/call"), true
		}
		m.kind = mcpTool
		ex.op, ex.kind = target.Op, target.Kind
		return ex.mcpToolCall(trimmed, params, member(pm, "arguments"))
	}
	// Any other message: let it through and do not buffer the response.
	m.kind = mcpPass
	return requestBodyReply(nil), false
}

// ambiguousKey reports whether members hold one of keys twice, or a key
// equal to one of them only under case folding (Go's encoding/json matches
// member names that way, last one winning).
func ambiguousKey(members []rawMember, keys ...string) bool {
	seen := make(map[string]bool, len(keys))
	for _, mb := range members {
		for _, k := range keys {
			switch {
			case mb.key == k && seen[k]:
				return true
			case mb.key == k:
				seen[k] = true
			case strings.EqualFold(mb.key, k):
				return true
			}
		}
	}
	return false
}

// mcpBatch refuses a JSON-RPC batch that holds a guarded call: one HTTP
// request would carry several decisions, and the answer to a guarded call
// must be a tool result of its own. A batch without one passes.
func (ex *exchange) mcpBatch(body []byte) (*extprocv3.ProcessingResponse, bool) {
	elems, ok := arrayElements(body)
	if !ok {
		return ex.mcpProtocolError(400, rpcParseError, "Parse error: the body is not valid JSON"), true
	}
	for _, e := range elems {
		em, _ := objectMembers(e)
		pm, _ := objectMembers(member(em, "params"))
		if ambiguousKey(em, "method", "params") || ambiguousKey(pm, "name") {
			return ex.mcpProtocolError(400, rpcInvalidRequest, "Invalid Request: a batch element has a member twice, or in two spellings that differ only in case"), true
		}
		method, _ := jsonString(member(em, "method"))
		name, _ := jsonString(member(pm, "name"))
		if _, guarded := ex.mcp.ep.Tools[name]; method == "tools/call" && guarded {
			return ex.mcpProtocolError(400, rpcInvalidRequest, "Invalid Request: "+name+" cannot be called in a JSON-RPC batch; send it as a request of its own"), true
		}
	}
	ex.mcp.kind = mcpPass
	return requestBodyReply(nil), false
}

// mcpToolCall runs the preview, confirm or status checks on the call's
// arguments, which play the part of the HTTP body: the same parsing, the
// same param selection and hashing, the same binding rule.
func (ex *exchange) mcpToolCall(body, params, args []byte) (*extprocv3.ProcessingResponse, bool) {
	if _, err := fingerprint.ParseJSON(body, ex.srv.cfg.Limits.MaxJSONDepth); err != nil {
		if !json.Valid(body) {
			return ex.mcpProtocolError(400, rpcParseError, "Parse error: "+err.Error()), true
		}
		// Valid to encoding/json but refused by idemgate's parser: a
		// duplicate key (which upstream parsers resolve differently) or
		// invalid UTF-8. Nothing is consumed.
		ex.report(security.Event{Reason: security.ReasonAmbiguousKey}, fingerprint.Claims{})
		return ex.envelope(envelope.InvalidParams, 0, envelope.Extra{Detail: err.Error()}), true
	}
	if len(bytes.TrimSpace(args)) == 0 || string(bytes.TrimSpace(args)) == "null" {
		args = []byte("{}")
	}
	if _, isObject := objectMembers(args); !isObject {
		return ex.envelope(envelope.InvalidParams, 0, envelope.Extra{Detail: "params.arguments must be an object"}), true
	}
	switch ex.kind {
	case config.KindPreview:
		return ex.previewRequest(args, false)
	case config.KindStatus:
		return ex.statusRequest(args, false)
	}
	resp, end := ex.confirmRequest(args, false)
	if ex.claimPhase != claimPending {
		return resp, end
	}
	return ex.mcpForwardConfirm(resp, body, params, args), end
}

// mcpForwardConfirm rewrites an acquired confirm for the upstream: the
// fingerprint leaves the arguments (a strict upstream schema would refuse
// the unknown argument) and, when the downstream honours keys, the nonce
// goes into params._meta beside the Idempotency-Key header the confirm
// reply already sets. content-length follows the new body in the same reply
// (BUFFERED: Envoy compares them).
func (ex *exchange) mcpForwardConfirm(resp *extprocv3.ProcessingResponse, body, params, args []byte) *extprocv3.ProcessingResponse {
	newArgs := editObject(args, []string{ex.op.FingerprintField})
	set := []rawSet{{"arguments", newArgs}}
	var metaSet []rawSet
	if ex.op.HonoursKeys() {
		metaSet = append(metaSet, rawSet{config.MCPIdempotencyMetaKey, envelope.AppendString(nil, ex.claim.Key)})
	}
	if ex.attestation != "" {
		metaSet = append(metaSet, rawSet{verify.MCPMetaKey, envelope.AppendString(nil, ex.attestation)})
	}
	if len(metaSet) > 0 {
		meta := memberOf(params, "_meta")
		if _, ok := objectMembers(meta); !ok {
			meta = []byte("{}")
		}
		set = append(set, rawSet{"_meta", editObject(meta, nil, metaSet...)})
	}
	newBody := editObject(body, nil, rawSet{"params", editObject(params, nil, set...)})
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
