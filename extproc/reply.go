package extproc

import (
	"strconv"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"

	"github.com/idemgate/idemgate/extproc/envelope"
)

// Header names idemgate reads or writes. Envoy hands header keys over in
// lower case; values travel in raw_value only (never the value field, which
// Envoy ignores and a reply would blank the header with).
const (
	hdrMethod        = ":method"
	hdrPath          = ":path"
	hdrStatus        = ":status"
	hdrRequestID     = "x-request-id"
	hdrContentType   = "content-type"
	hdrContentLength = "content-length"
	hdrFingerprint   = "idempotency-fingerprint"
	hdrIdemKey       = "idempotency-key"
	hdrReplayed      = "idempotent-replayed"
	hdrRetryAfter    = "retry-after"
)

// Static header values and mutations, built once and shared (only ever
// marshalled).
var (
	rawJSON = []byte("application/json")
	rawTrue = []byte("true")

	contentTypeJSON = setHeader(hdrContentType, rawJSON)
	replayedTrue    = setHeader(hdrReplayed, rawTrue)
)

// storedResponseHeaders is the allow-list of upstream response headers kept
// with a terminal record and replayed by `replay: raw`: the ones that
// describe the body or the created resource. Hop-by-hop, per-request
// (date, x-request-id, server timing) and cookie headers are not kept.
var storedResponseHeaders = map[string]bool{
	"content-type":     true,
	"content-encoding": true,
	"content-language": true,
	"location":         true,
	"etag":             true,
	"last-modified":    true,
	"cache-control":    true,
	"link":             true,
}

// headerValue returns the value of the first header named name (lower case).
// It reads raw_value, falling back to value for senders that fill that.
func headerValue(hm *corev3.HeaderMap, name string) (string, bool) {
	for _, h := range hm.GetHeaders() {
		if h.GetKey() == name {
			if len(h.RawValue) > 0 {
				return string(h.RawValue), true
			}
			return h.GetValue(), true
		}
	}
	return "", false
}

// setHeader is a header mutation that overwrites (append unset) name with value.
func setHeader(name string, value []byte) *corev3.HeaderValueOption {
	return &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: name, RawValue: value}}
}

// passThroughMode turns off every later phase of this request: Envoy honours
// mode_override only in a reply to headers (and only with allow_mode_override);
// header and trailer modes must be explicit because DEFAULT would keep the
// filter-level setting, and omitted body modes mean NONE.
var passThroughMode = &filterv3.ProcessingMode{
	ResponseHeaderMode:  filterv3.ProcessingMode_SKIP,
	RequestBodyMode:     filterv3.ProcessingMode_NONE,
	ResponseBodyMode:    filterv3.ProcessingMode_NONE,
	RequestTrailerMode:  filterv3.ProcessingMode_SKIP,
	ResponseTrailerMode: filterv3.ProcessingMode_SKIP,
}

// noResponseBodyMode stops response body processing (non-2xx preview,
// ambiguous confirm outcome).
var noResponseBodyMode = &filterv3.ProcessingMode{
	ResponseBodyMode:    filterv3.ProcessingMode_NONE,
	ResponseTrailerMode: filterv3.ProcessingMode_SKIP,
}

// previewBodyOnlyMode is a body-only preview's request (preview
// fingerprint_header: false): everything the filter asks for except the
// response headers. Body modes are explicit (omitted means NONE); the
// request body stays BUFFERED as at filter level.
var previewBodyOnlyMode = &filterv3.ProcessingMode{
	ResponseHeaderMode:  filterv3.ProcessingMode_SKIP,
	RequestBodyMode:     filterv3.ProcessingMode_BUFFERED,
	ResponseBodyMode:    filterv3.ProcessingMode_BUFFERED,
	RequestTrailerMode:  filterv3.ProcessingMode_SKIP,
	ResponseTrailerMode: filterv3.ProcessingMode_SKIP,
}

// extProcAttributes is the key Envoy files attributes under (fixed, not
// the filter's name); attrResponseCode the response_attributes entry a
// body-only preview reads its status from.
const (
	extProcAttributes = "envoy.filters.http.ext_proc"
	attrResponseCode  = "response.code"
)

func common(mut *extprocv3.HeaderMutation, body []byte, replaceBody bool) *extprocv3.CommonResponse {
	c := &extprocv3.CommonResponse{Status: extprocv3.CommonResponse_CONTINUE, HeaderMutation: mut}
	if replaceBody {
		c.BodyMutation = &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_Body{Body: body}}
	}
	return c
}

// Replies that carry nothing of the request (CONTINUE, perhaps with one of
// the fixed mode overrides) are built once and shared by every stream: a
// reply is only ever marshalled, never changed after it is returned, and
// protobuf messages may be marshalled concurrently.
var (
	continueRequestHeaders        = newRequestHeadersReply(nil, nil)
	passThroughRequestHeaders     = newRequestHeadersReply(nil, passThroughMode)
	previewBodyOnlyRequestHeaders = newRequestHeadersReply(nil, previewBodyOnlyMode)
	continueRequestBody           = newRequestBodyReply(nil)
	continueResponseHeaders       = newResponseHeadersReply(nil, nil)
	noBodyResponseHeaders         = newResponseHeadersReply(nil, noResponseBodyMode)
	continueResponseBody          = newResponseBodyReply(nil, nil, false)
	continueRequestTrailers       = &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestTrailers{RequestTrailers: &extprocv3.TrailersResponse{}}}
	continueResponseTrailers      = &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseTrailers{ResponseTrailers: &extprocv3.TrailersResponse{}}}
)

func requestHeadersReply(mut *extprocv3.HeaderMutation, mode *filterv3.ProcessingMode) *extprocv3.ProcessingResponse {
	if mut == nil {
		switch mode {
		case nil:
			return continueRequestHeaders
		case passThroughMode:
			return passThroughRequestHeaders
		case previewBodyOnlyMode:
			return previewBodyOnlyRequestHeaders
		}
	}
	return newRequestHeadersReply(mut, mode)
}

func newRequestHeadersReply(mut *extprocv3.HeaderMutation, mode *filterv3.ProcessingMode) *extprocv3.ProcessingResponse {
	return &extprocv3.ProcessingResponse{
		Response:     &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{Response: common(mut, nil, false)}},
		ModeOverride: mode,
	}
}

func requestBodyReply(mut *extprocv3.HeaderMutation) *extprocv3.ProcessingResponse {
	if mut == nil {
		return continueRequestBody
	}
	return newRequestBodyReply(mut)
}

func newRequestBodyReply(mut *extprocv3.HeaderMutation) *extprocv3.ProcessingResponse {
	return &extprocv3.ProcessingResponse{
		Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{Response: common(mut, nil, false)}},
	}
}

func responseHeadersReply(mut *extprocv3.HeaderMutation, mode *filterv3.ProcessingMode) *extprocv3.ProcessingResponse {
	if mut == nil {
		switch mode {
		case nil:
			return continueResponseHeaders
		case noResponseBodyMode:
			return noBodyResponseHeaders
		}
	}
	return newResponseHeadersReply(mut, mode)
}

func newResponseHeadersReply(mut *extprocv3.HeaderMutation, mode *filterv3.ProcessingMode) *extprocv3.ProcessingResponse {
	return &extprocv3.ProcessingResponse{
		Response:     &extprocv3.ProcessingResponse_ResponseHeaders{ResponseHeaders: &extprocv3.HeadersResponse{Response: common(mut, nil, false)}},
		ModeOverride: mode,
	}
}

func responseBodyReply(mut *extprocv3.HeaderMutation, body []byte, replace bool) *extprocv3.ProcessingResponse {
	if mut == nil && !replace {
		return continueResponseBody
	}
	return newResponseBodyReply(mut, body, replace)
}

func newResponseBodyReply(mut *extprocv3.HeaderMutation, body []byte, replace bool) *extprocv3.ProcessingResponse {
	return &extprocv3.ProcessingResponse{
		Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: &extprocv3.BodyResponse{Response: common(mut, body, replace)}},
	}
}

func requestTrailersReply() *extprocv3.ProcessingResponse { return continueRequestTrailers }

func responseTrailersReply() *extprocv3.ProcessingResponse { return continueResponseTrailers }

// immediate answers the client directly: Envoy stops processing, the upstream
// is not contacted (in request phases), and the stream ends.
func immediate(status int, headers []*corev3.HeaderValueOption, body []byte, details string) *extprocv3.ProcessingResponse {
	return &extprocv3.ProcessingResponse{
		Response: &extprocv3.ProcessingResponse_ImmediateResponse{ImmediateResponse: &extprocv3.ImmediateResponse{
			Status:  &typev3.HttpStatus{Code: typev3.StatusCode(status)},
			Headers: &extprocv3.HeaderMutation{SetHeaders: headers},
			Body:    body,
			Details: details,
		}},
	}
}

// envelopeReply turns a rendered envelope into an ImmediateResponse with
// content-type application/json, Retry-After when the envelope has one, and
// any extra headers.
func envelopeReply(r envelope.Rendered, extra ...*corev3.HeaderValueOption) *extprocv3.ProcessingResponse {
	headers := make([]*corev3.HeaderValueOption, 0, 2+len(extra))
	headers = append(headers, contentTypeJSON)
	if r.RetryAfterSeconds > 0 {
		headers = append(headers, setHeader(hdrRetryAfter, strconv.AppendInt(nil, r.RetryAfterSeconds, 10)))
	}
	headers = append(headers, extra...)
	return immediate(r.HTTPStatus, headers, r.Body, "idemgate_"+r.Status)
}
