package extproc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/idemgate/idemgate/extproc/config"
	"github.com/idemgate/idemgate/extproc/envelope"
	"github.com/idemgate/idemgate/fingerprint"
	"github.com/idemgate/idemgate/state"
)

// exchange is the state of one stream (one HTTP request). It is used by one
// goroutine only.
type exchange struct {
	srv *Server
	ctx context.Context
	log *slog.Logger

	op      *config.Operation
	kind    config.Kind
	vars    map[string]string
	traceID string
	// proc handles the stream's messages after its request headers
	// (processor.go); passThrough until they chose another.
	proc processor
	// busy is the time spent handling this stream's messages so far
	// (idemgate_stream_processing_seconds).
	busy time.Duration

	// Body modes from protocol_config (sent on the first message only).
	sawProtocol      bool
	requestBodyMode  filterv3.ProcessingMode_BodySendMode
	responseBodyMode filterv3.ProcessingMode_BodySendMode

	subject           string
	headerFingerprint string
	// contentType and contentEncoding of the request, checked before its
	// body is read (bodyEncodingRefused).
	contentType     string
	contentEncoding string
	// requestDone is set once the request phase has been decided (so a body
	// message after a headers-only decision is not processed twice).
	requestDone bool

	// Preview: the params hashed from the request.
	params fingerprint.Params

	// Confirm: the record this stream claimed, and how far along that
	// claim is (claim.go).
	claim      state.Claim
	claimPhase claimPhase
	// waitedAbandon: this stream already waited once for a background
	// abandon of the claim it found (see waitForAbandon).
	waitedAbandon bool
	// lent, lentMore: pooled buffers the reply being sent is built in (a
	// reply needs one; the slice is for any beyond that).
	lent     *[]byte
	lentMore []*[]byte
	// previewBodyOnly: a preview whose fingerprint lives in the body alone
	// (preview.fingerprint_header: false); its response headers are
	// skipped (mode_override) and the status read from response.code.
	previewBodyOnly bool
	// The upstream response, once its headers arrived (a body-only
	// preview: its response.code attribute, 0 when absent).
	respStatus  int
	respHeaders []state.Header
	respClass   outcomeClass

	// mcp is set on streams to an MCP endpoint (docs/design.md §9).
	mcp *mcpExchange

	tr streamTrace

	// method and path are the request line as received (and forwarded);
	// attestation is the one signed for this request (attestation.go).
	method, path, attestation string
}

// handle dispatches one message. end says the stream is finished after the
// reply (an ImmediateResponse, a pass-through, or nothing more to do).
func (ex *exchange) handle(req *extprocv3.ProcessingRequest) (*extprocv3.ProcessingResponse, bool) {
	if pc := req.GetProtocolConfig(); pc != nil && !ex.sawProtocol {
		ex.sawProtocol = true
		ex.requestBodyMode = pc.GetRequestBodyMode()
		ex.responseBodyMode = pc.GetResponseBodyMode()
	}
	switch r := req.Request.(type) {
	case *extprocv3.ProcessingRequest_RequestHeaders:
		return ex.onRequestHeaders(req, r.RequestHeaders)
	case *extprocv3.ProcessingRequest_RequestBody:
		return ex.onRequestBody(r.RequestBody)
	case *extprocv3.ProcessingRequest_ResponseHeaders:
		return ex.onResponseHeaders(r.ResponseHeaders)
	case *extprocv3.ProcessingRequest_ResponseBody:
		if ex.previewBodyOnly {
			// Its response headers were skipped: the status came as an
			// attribute of this, the first response message.
			ex.respStatus = responseCodeAttribute(req)
		}
		return ex.onResponseBody(r.ResponseBody)
	case *extprocv3.ProcessingRequest_RequestTrailers:
		// Never asked for; answer so Envoy is not left waiting.
		return requestTrailersReply(), false
	case *extprocv3.ProcessingRequest_ResponseTrailers:
		return responseTrailersReply(), false
	default:
		ex.logger().Error("unknown ext_proc message; refusing the request", "type", fmt.Sprintf("%T", req.Request))
		return ex.envelope(envelope.InternalError, 0, envelope.Extra{}), true
	}
}

func (ex *exchange) onRequestHeaders(req *extprocv3.ProcessingRequest, h *extprocv3.HttpHeaders) (*extprocv3.ProcessingResponse, bool) {
	hm := h.GetHeaders()
	method, _ := headerValue(hm, hdrMethod)
	path, _ := headerValue(hm, hdrPath)
	ex.method, ex.path = method, path // what an attestation binds
	ex.traceID, _ = headerValue(hm, hdrRequestID)
	if reply, refused := ex.spellingRefused(req, h, method, path); refused {
		return reply, true
	}
	if ep := ex.srv.cfg.MCPEndpoint(method, path); ep != nil {
		if reply, refused := ex.retryHeadersRefused(req, h, method, path); refused {
			return reply, true
		}
		ex.proc = mcpProcessor
		return ex.mcpRequestHeaders(req, h, ep)
	}
	target, vars, ok := ex.srv.cfg.Routes.Match(method, path)
	if !ok {
		ex.srv.metrics.passthrough.Inc()
		return requestHeadersReply(nil, passThroughMode), true
	}
	if target.Kind == config.KindConfirm {
		if reply, refused := ex.retryHeadersRefused(req, h, method, path); refused {
			return reply, true
		}
	}
	ex.op, ex.kind, ex.vars = target.Op, target.Kind, vars
	ex.proc = processorFor(ex.kind)
	ex.traceStart(hm)

	if !ex.bodyModesUsable() {
		ex.logger().Error("Envoy must send this route's bodies BUFFERED (processing_mode request_body_mode and response_body_mode); refusing the request",
			"request_body_mode", ex.requestBodyMode.String(), "response_body_mode", ex.responseBodyMode.String())
		return ex.envelope(envelope.InternalError, 0, envelope.Extra{}), true
	}
	ex.subject = ex.resolveSubject(hm, req.GetMetadataContext())
	ex.headerFingerprint, _ = headerValue(hm, hdrFingerprint)
	ex.contentType, _ = headerValue(hm, hdrContentType)
	ex.contentEncoding, _ = headerValue(hm, hdrContentEncoding)

	// A declared length over the limit is refused before Envoy buffers it.
	if cl, ok := headerValue(hm, hdrContentLength); ok {
		if n, err := strconv.ParseInt(strings.TrimSpace(cl), 10, 64); err == nil && n > ex.srv.cfg.Limits.MaxBodyBytes {
			return ex.envelope(envelope.RequestTooLarge, 0, envelope.Extra{}), true
		}
	}
	if ex.proc == previewProcessor && !ex.op.PreviewFingerprintHeader {
		ex.previewBodyOnly = true
	}
	if !h.GetEndOfStream() {
		// The body follows (BUFFERED: one message with all of it).
		if ex.previewBodyOnly {
			return requestHeadersReply(nil, previewBodyOnlyMode), false
		}
		return requestHeadersReply(nil, nil), false
	}
	// No body will come: decide now, from the headers alone.
	ex.requestDone = true
	return ex.proc.request(ex, nil, true)
}

// bodyModesUsable reports whether Envoy sends what this route needs. Without
// protocol_config (older Envoy, some harnesses) BUFFERED is assumed.
func (ex *exchange) bodyModesUsable() bool {
	if !ex.sawProtocol {
		return true
	}
	if ex.requestBodyMode != filterv3.ProcessingMode_BUFFERED {
		return false
	}
	if ex.kind == config.KindStatus {
		return true
	}
	return ex.responseBodyMode == filterv3.ProcessingMode_BUFFERED
}

func (ex *exchange) onRequestBody(b *extprocv3.HttpBody) (*extprocv3.ProcessingResponse, bool) {
	if ex.requestDone {
		return requestBodyReply(nil), false
	}
	ex.requestDone = true
	// BUFFERED sends the whole body in one message; end_of_stream is false
	// when trailers follow, which changes nothing here.
	return ex.proc.request(ex, b.GetBody(), false)
}

func (ex *exchange) onResponseHeaders(h *extprocv3.HttpHeaders) (*extprocv3.ProcessingResponse, bool) {
	return ex.proc.responseHeaders(ex, h)
}

func (ex *exchange) onResponseBody(b *extprocv3.HttpBody) (*extprocv3.ProcessingResponse, bool) {
	return ex.proc.responseBody(ex, b.GetBody())
}

// parsedBody is a request body after the size and syntax checks.
type parsedBody struct {
	doc     fingerprint.Document // the zero Document without a body
	present bool
}

// parseRequestBody applies the first two checks of docs/design.md §8: size,
// then JSON syntax (depth bounded). A reply is returned when the request is
// refused.
func (ex *exchange) parseRequestBody(body []byte) (parsedBody, *extprocv3.ProcessingResponse) {
	if int64(len(body)) > ex.srv.cfg.Limits.MaxBodyBytes {
		return parsedBody{}, ex.envelope(envelope.RequestTooLarge, 0, envelope.Extra{})
	}
	if len(bytes.TrimSpace(body)) == 0 {
		return parsedBody{}, nil
	}
	if why := ex.bodyEncodingRefused(); why != "" {
		return parsedBody{}, ex.envelope(envelope.InvalidJSON, 0, envelope.Extra{Detail: why})
	}
	doc, err := fingerprint.ParseJSON(body, ex.srv.cfg.Limits.MaxJSONDepth)
	if err != nil {
		var de *fingerprint.DuplicateKeyError
		if errors.As(err, &de) && ex.op != nil {
			// A bound field given twice: the upstream reads one of the two
			// (Go and most binders the last, some the first). The binding
			// rule's answer, with its security event.
			if path, bound := ex.op.Selector.DuplicateOnBoundPath(de); bound {
				return parsedBody{}, ex.invalidParams(&fingerprint.AmbiguousKeyError{Paths: []string{path}}, fingerprint.Claims{})
			}
		}
		return parsedBody{}, ex.envelope(envelope.InvalidJSON, 0, envelope.Extra{Detail: err.Error()})
	}
	if _, isObject := doc.Value().(map[string]any); !isObject {
		// Params are read from an object; any other top-level value would
		// bind nothing while the upstream reads whatever it makes of it.
		return parsedBody{}, ex.envelope(envelope.InvalidJSON, 0, envelope.Extra{Detail: "the body must be a JSON object"})
	}
	return parsedBody{doc: doc, present: true}, nil
}

// resolveSubject reads the subject from the configured header or from the
// dynamic metadata namespace and path.
func (ex *exchange) resolveSubject(hm *corev3.HeaderMap, md *corev3.Metadata) string {
	src := ex.srv.cfg.Subject
	if src.Header != "" {
		v, _ := headerValue(hm, src.Header)
		return strings.TrimSpace(v)
	}
	st := md.GetFilterMetadata()[src.MetadataNamespace]
	if st == nil {
		return ""
	}
	var v *structpb.Value
	fields := st.GetFields()
	for i, seg := range src.MetadataPath {
		v = fields[seg]
		if v == nil {
			return ""
		}
		if i < len(src.MetadataPath)-1 {
			fields = v.GetStructValue().GetFields()
		}
	}
	switch k := v.GetKind().(type) {
	case *structpb.Value_StringValue:
		return strings.TrimSpace(k.StringValue)
	case *structpb.Value_NumberValue:
		return strconv.FormatFloat(k.NumberValue, 'f', -1, 64)
	}
	return ""
}

// fingerprintRequest runs the checks confirm and status start with, in the
// order of docs/design.md §8: body size and JSON syntax, subject, then a
// fingerprint present (answered with missing when there is none).
func (ex *exchange) fingerprintRequest(body []byte, missing envelope.Message) (pb parsedBody, token string, refused *extprocv3.ProcessingResponse) {
	pb, refused = ex.parseRequestBody(body)
	if refused != nil {
		return pb, "", refused
	}
	if ex.subject == "" {
		return pb, "", ex.envelope(envelope.SubjectRequired, 0, envelope.Extra{})
	}
	// The fingerprint field is read by idemgate alone, but a FINGERPRINT
	// twin would still be one body read two ways.
	if err := fingerprint.CheckKey(pb.doc, ex.op.FingerprintField); err != nil {
		return pb, "", ex.invalidParams(err, fingerprint.Claims{})
	}
	token, found := ex.fingerprintFrom(pb)
	if !found {
		return pb, "", ex.envelope(missing, 0, envelope.Extra{})
	}
	return pb, token, nil
}

// fingerprintFrom returns the fingerprint of a confirm or status request:
// the body field when present (a non-string value is returned as found=true
// with an empty token so it is rejected as malformed), else the
// Idempotency-Fingerprint header.
func (ex *exchange) fingerprintFrom(pb parsedBody) (token string, found bool) {
	if obj, ok := pb.doc.Value().(map[string]any); ok {
		if v, ok := obj[ex.op.FingerprintField]; ok && v != nil {
			s, isString := v.(string)
			if !isString {
				return "", true
			}
			if s != "" {
				return s, true
			}
		}
	}
	if ex.headerFingerprint != "" {
		return strings.TrimSpace(ex.headerFingerprint), true
	}
	return "", false
}

// envelope renders message m of the stream's operation (or the defaults
// before one is known) as an ImmediateResponse, and counts the decision.
func (ex *exchange) envelope(m envelope.Message, originalStatus int, x envelope.Extra, extra ...*corev3.HeaderValueOption) *extprocv3.ProcessingResponse {
	if ex.mcp != nil {
		// An MCP client reads every answer as a tool result.
		return ex.mcpEnvelope(m, originalStatus, x, extra...)
	}
	set := ex.srv.cfg.Envelopes
	if ex.op != nil && ex.op.Envelopes != nil {
		set = ex.op.Envelopes
	}
	buf := ex.buffer()
	r := set.RenderTo(*buf, m, ex.traceID, originalStatus, x)
	keep(buf, r.Body)
	ex.decision(r.Status)
	return envelopeReply(r, extra...)
}
