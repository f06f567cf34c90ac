package extproc

import (
	"strconv"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/idemgate/idemgate/extproc/bodyreply"
	"github.com/idemgate/idemgate/extproc/envelope"
	"github.com/idemgate/idemgate/fingerprint"
	"github.com/idemgate/idemgate/internal/jsonx"
)

// previewRequest checks the preview request (size, JSON, subject) and keeps
// the hashed params on the stream for the response. No store is touched.
func (ex *exchange) previewRequest(body []byte, headersOnly bool) (*extprocv3.ProcessingResponse, bool) {
	pb, refused := ex.parseRequestBody(body)
	if refused != nil {
		return refused, true
	}
	if ex.subject == "" {
		return ex.envelope(envelope.SubjectRequired, 0, envelope.Extra{}), true
	}
	params, err := ex.op.Selector.Select(pb.doc, ex.vars)
	if err != nil {
		return ex.invalidParams(err, fingerprint.Claims{}), true
	}
	ex.params = params
	if headersOnly {
		if ex.previewBodyOnly {
			return requestHeadersReply(nil, previewBodyOnlyMode), false
		}
		return requestHeadersReply(nil, nil), false
	}
	return requestBodyReply(nil), false
}

// responseStatus reads :status (0 when missing or malformed).
func responseStatus(h *extprocv3.HttpHeaders) int {
	v, _ := headerValue(h.GetHeaders(), hdrStatus)
	n, err := strconv.Atoi(strings.TrimSpace(v))
	if err != nil {
		return 0
	}
	return n
}

func (ex *exchange) previewResponseHeaders(h *extprocv3.HttpHeaders) (*extprocv3.ProcessingResponse, bool) {
	st := responseStatus(h)
	if st < 200 || st > 299 {
		// Non-2xx: pass through untouched and do not ask for the body.
		ex.decision("passed_through")
		return responseHeadersReply(nil, noResponseBodyMode), true
	}
	if !h.GetEndOfStream() {
		return responseHeadersReply(nil, nil), false
	}
	// A bodiless 2xx: the header alone carries the fingerprint.
	token, _, err := ex.sign()
	if err != nil {
		ex.logger().Error("failed to sign a fingerprint; preview passed through without one", "error", err)
		ex.decision("sign_failed")
		return responseHeadersReply(nil, nil), true
	}
	ex.decision("signed_header_only")
	return responseHeadersReply(&extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{setHeader(hdrFingerprint, []byte(token))}}, nil), true
}

// previewResponseBody signs the fingerprint and injects it, with its expiry,
// into the JSON object body, sets Idempotency-Fingerprint and the new
// content-length in the same reply (BUFFERED with headers SEND: Envoy
// compares content-length with the mutated body).
func (ex *exchange) previewResponseBody(body []byte) (*extprocv3.ProcessingResponse, bool) {
	if ex.previewBodyOnly {
		return ex.previewBodyOnlyResponse(body)
	}
	token, expiresAt, err := ex.sign()
	if err != nil {
		ex.logger().Error("failed to sign a fingerprint; preview passed through without one", "error", err)
		ex.decision("sign_failed")
		return responseBodyReply(nil, nil, false), true
	}
	r := &bodyreply.Reply{}
	r.SetHeader(hdrFingerprint, []byte(token))
	expires := expiresAt.Format(time.RFC3339)
	buf := ex.buffer()
	out, err := jsonx.Splice(*buf, body, ex.previewFields(token, expires)...)
	if err != nil {
		ex.logger().Warn("preview response body is not a JSON object, or not strict JSON; the fingerprint is sent in the Idempotency-Fingerprint header only",
			"content_length", len(body), "error", err)
		ex.decision("signed_header_only")
		return r.Message(nil, false), true
	}
	keep(buf, out)
	r.SetContentLength(len(out))
	ex.decision("signed")
	return r.Message(out, true), true
}

// sign issues a fingerprint for the stream's subject and params and says
// when it expires (UTC).
func (ex *exchange) sign() (string, time.Time, error) {
	nonce, err := fingerprint.NewNonce()
	if err != nil {
		return "", time.Time{}, err
	}
	return ex.srv.cfg.Keys.SignToken(fingerprint.SignRequest{
		Subject: ex.subject,
		Scope:   ex.op.Scope,
		Params:  ex.params,
		Nonce:   nonce,
		Expiry:  ex.srv.now().Add(ex.fingerprintTTL()),
	})
}

// approvalRequired reports whether the previewed params fire an at_least
// rule of the operation's approval (docs/design.md §10): the fingerprint
// then lives approval.ttl, and the preview says approval_required.
func (ex *exchange) approvalRequired() bool {
	return ex.op.Approval != nil && len(ex.firedRules(ex.params)) > 0
}

// fingerprintTTL is ttl.fingerprint, or approval.ttl for a preview that
// will need approval.
func (ex *exchange) fingerprintTTL() time.Duration {
	if ex.approvalRequired() {
		return ex.op.Approval.TTL
	}
	return ex.srv.cfg.TTL.Fingerprint
}

// previewFields are the members a preview's JSON object gets.
func (ex *exchange) previewFields(token, expires string) []jsonx.Set {
	fs := []jsonx.Set{{Key: ex.op.FingerprintField, Text: token}, {Key: ex.op.ExpiresAtField, Text: expires}}
	if ex.approvalRequired() {
		fs = append(fs, jsonx.Set{Key: "approval_required", Raw: []byte("true")})
	}
	return fs
}

// previewBodyOnlyResponse signs a preview whose response headers Envoy did
// not send (preview.fingerprint_header: false). Those headers are already
// on their way to the client, so a header set now would be dropped: the
// fingerprint goes into the JSON body or nowhere. Without a 2xx
// response.code nothing is signed (a missing attribute means the filter
// lacks response_attributes: [response.code], and no fingerprint is the
// safe side: no confirm can follow).
func (ex *exchange) previewBodyOnlyResponse(body []byte) (*extprocv3.ProcessingResponse, bool) {
	if !ex.attributeStatusSignable("fingerprint_header: false") {
		return responseBodyReply(nil, nil, false), true
	}
	token, expiresAt, err := ex.sign()
	if err != nil {
		ex.logger().Error("failed to sign a fingerprint; preview passed through without one", "error", err)
		ex.decision("sign_failed")
		return responseBodyReply(nil, nil, false), true
	}
	buf := ex.buffer()
	out, err := jsonx.Splice(*buf, body, ex.previewFields(token, expiresAt.Format(time.RFC3339))...)
	if err != nil {
		ex.logger().Warn("preview response body is not a JSON object, or not strict JSON, and fingerprint_header is false; preview passed through without a fingerprint",
			"content_length", len(body), "error", err)
		ex.decision("unsigned_not_json")
		return responseBodyReply(nil, nil, false), true
	}
	keep(buf, out)
	ex.decision("signed")
	return responseBodyReply(nil, out, true), true
}

// attributeStatusSignable reports whether a preview whose response headers
// were skipped (setting names the config that skipped them) may be signed:
// only with a 2xx response.code. Otherwise the decision says why, and a
// missing attribute, an attachment's mistake, is logged.
func (ex *exchange) attributeStatusSignable(setting string) bool {
	switch st := ex.respStatus; {
	case st == 0:
		ex.logger().Error("the response.code attribute is missing: Envoy's ext_proc filter must list response_attributes: [response.code] (idemgate envoy-config does) for a preview with " + setting + "; preview passed through without a fingerprint")
		ex.decision("status_unknown")
		return false
	case st < 200 || st > 299:
		ex.decision("passed_through")
		return false
	}
	return true
}

// responseCodeAttribute is the response.code attribute Envoy sends on the
// first response message when response_attributes lists it (0 when absent
// or not a status).
func responseCodeAttribute(req *extprocv3.ProcessingRequest) int {
	v := req.GetAttributes()[extProcAttributes].GetFields()[attrResponseCode]
	n, ok := v.GetKind().(*structpb.Value_NumberValue)
	if !ok || n.NumberValue < 100 || n.NumberValue > 599 || n.NumberValue != float64(int(n.NumberValue)) {
		return 0
	}
	return int(n.NumberValue)
}
