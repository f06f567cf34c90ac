// Package extprocdriver plays Envoy's side of the ext_proc protocol: it
// drives any ExternalProcessor server, over a gRPC connection or in-process,
// the way Envoy's HTTP ext_proc filter does as envoy/envoy.yaml configures
// it (headers SEND, both bodies BUFFERED, trailers SKIP, allow_mode_override,
// message_timeout 1s). The extproc tests, the ext_proc-level load benchmark
// (e2e/loadgen) and anything else that speaks the protocol in-process share
// it; it imports nothing of idemgate.
//
// One simulated HTTP request is one Process stream: request_headers (with
// protocol_config) → reply → request_body (the whole buffered body,
// end_of_stream true) → reply → [the upstream] → response_headers → reply →
// response_body → reply, metadata_context on every message, each message
// sent only after the previous reply arrived. What the server answers is
// honoured the way Envoy honours it (as its ext_proc filter does in 1.40): an ImmediateResponse ends
// the request with its status; a mode_override in a headers reply changes
// the phases still to come; CONTINUE_AND_REPLACE ends that direction's body;
// a body replacement whose content-length does not match is a 500; a reply
// of the wrong kind is a 500; no reply within the message timeout is a 504;
// the server closing the stream with OK lets the request continue
// unmodified. The stream is then closed as Envoy closes it: half-close,
// immediately followed by a reset (cancel).
//
// Do reports only an Outcome (cheap enough for a load generator); Trace also
// applies every mutation and reports what the upstream and the client saw
// (a View), calling an Upstream in between.
//
// Deliberately not modelled (our configuration never produces them): trailers,
// STREAMED chunking (any non-NONE body mode sends the whole body in one
// message, which is what Envoy does when the body is complete before the
// headers reply), observability mode, request attributes, dynamic_metadata,
// route-cache clearing and the header-mutation checker's bans.
package extprocdriver

import (
	"context"
	"errors"
	"io"
	"strconv"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
)

// Filter is the emulated ext_proc filter configuration.
type Filter struct {
	// Mode is the filter-level processing_mode.
	Mode *filterv3.ProcessingMode
	// AllowModeOverride is allow_mode_override.
	AllowModeOverride bool
	// MessageTimeout is message_timeout: how long Envoy waits for each reply.
	MessageTimeout time.Duration
	// ResponseCode is response_attributes: [response.code]: the upstream's
	// status rides on the first response message as an attribute.
	ResponseCode bool
}

// EnvoyFilter is the filter as envoy/envoy.yaml configures it for idemgate.
func EnvoyFilter() Filter {
	return Filter{
		Mode: &filterv3.ProcessingMode{
			RequestHeaderMode:   filterv3.ProcessingMode_SEND,
			ResponseHeaderMode:  filterv3.ProcessingMode_SEND,
			RequestBodyMode:     filterv3.ProcessingMode_BUFFERED,
			ResponseBodyMode:    filterv3.ProcessingMode_BUFFERED,
			RequestTrailerMode:  filterv3.ProcessingMode_SKIP,
			ResponseTrailerMode: filterv3.ProcessingMode_SKIP,
		},
		AllowModeOverride: true,
		MessageTimeout:    time.Second,
	}
}

// Request is one simulated HTTP request and the upstream's answer to it.
// A Request is read-only while in use and may be shared by streams.
type Request struct {
	// Headers are the request headers as Envoy hands them over: lower-case
	// keys, pseudo-headers included, values in raw_value.
	Headers []*corev3.HeaderValue
	// Body is the whole request body (buffered); empty means the headers end
	// the request.
	Body []byte
	// UpstreamStatus is the upstream's HTTP status; ResponseHeaders must
	// carry the same value as :status.
	UpstreamStatus  int
	ResponseHeaders []*corev3.HeaderValue
	ResponseBody    []byte
	// Metadata is the metadata_context sent on every message; nil sends an
	// empty Metadata, as Envoy does when no forwarded namespace exists.
	Metadata *corev3.Metadata
}

// Error says why a request failed on the ext_proc side.
type Error uint8

// The failures Envoy turns into local replies, plus the run being stopped.
const (
	ErrNone Error = iota
	// ErrGRPC: the stream could not be opened or ended with a non-OK status
	// (Envoy: 500, fail-closed).
	ErrGRPC
	// ErrTimeout: no reply within the message timeout (Envoy: 504).
	ErrTimeout
	// ErrSpurious: a reply of the wrong kind or with no oneof (Envoy: 500).
	ErrSpurious
	// ErrMutation: a header mutation Envoy refuses (value and raw_value both
	// set) (Envoy: 500).
	ErrMutation
	// ErrContentLength: a body replacement whose length differs from the
	// content-length the held headers carry (Envoy: 500).
	ErrContentLength
	// ErrCanceled: the run was stopped while the request was in flight.
	ErrCanceled
)

var errorNames = [...]string{
	ErrNone:          "",
	ErrGRPC:          "grpc error",
	ErrTimeout:       "message timeout",
	ErrSpurious:      "spurious reply",
	ErrMutation:      "rejected mutation",
	ErrContentLength: "content-length mismatch",
	ErrCanceled:      "canceled",
}

func (e Error) String() string {
	if int(e) < len(errorNames) {
		return errorNames[e]
	}
	return "error " + strconv.Itoa(int(e))
}

// Marks record what the server did to a request (a bit set).
type Marks uint16

// The observations.
const (
	// MarkRequestHeaders: a request header mutation was applied.
	MarkRequestHeaders Marks = 1 << iota
	// MarkIdempotencyKey: the server set idempotency-key on the upstream request.
	MarkIdempotencyKey
	// MarkRequestBody: the request body was replaced.
	MarkRequestBody
	// MarkResponseHeaders: a response header mutation was applied.
	MarkResponseHeaders
	// MarkResponseBody: the response body was replaced.
	MarkResponseBody
	// MarkModeOverride: a mode_override was honoured.
	MarkModeOverride
	// MarkClosedEarly: the server closed the stream with OK while a reply
	// was outstanding; Envoy continued the request without it.
	MarkClosedEarly
	// MarkValueField: a header was set through value instead of raw_value
	// (Envoy's ext_proc reads raw_value; the header arrives empty).
	MarkValueField
	// MarkIgnoredOverride: a body reply carried a mode_override, which Envoy
	// ignores.
	MarkIgnoredOverride
	// MarkDroppedHeaderMutation: a response body reply carried a header
	// mutation although the response headers were not sent (SKIP); Envoy
	// holds no headers then and drops it (envoy/envoytest
	// TestFewerMessagesOneMessagePerDirection).
	MarkDroppedHeaderMutation
)

// Outcome is what one request ended with. It is comparable, so runs count
// outcomes in a map.
type Outcome struct {
	// Status is the HTTP status the client receives.
	Status int
	// Local: the status is a local reply (an ImmediateResponse, or Envoy's
	// own reply to an ext_proc failure), not the upstream's.
	Local bool
	Error Error
	// Code is the gRPC code for ErrGRPC.
	Code  codes.Code
	Marks Marks
}

// String renders the outcome for reports, e.g. "200", "local 409",
// "500 grpc error Unavailable".
func (o Outcome) String() string {
	s := strconv.Itoa(o.Status)
	switch {
	case o.Error == ErrGRPC:
		return s + " " + o.Error.String() + " " + o.Code.String()
	case o.Error != ErrNone:
		return s + " " + o.Error.String()
	case o.Local:
		return "local " + s
	}
	return s
}

// Client is the ExternalProcessor client one stream is opened on: a gRPC
// connection's (extprocv3.NewExternalProcessorClient) or InProcess's.
type Client = extprocv3.ExternalProcessorClient

// Hold, when given to Do, is called once the request phase is complete (the
// upstream would now be called) and before the response phase; the stream
// stays open until it returns. A non-nil error abandons the request.
type Hold func(ctx context.Context) error

// Response is an upstream's answer.
type Response struct {
	Status int
	// Headers are the response headers as Envoy hands them to ext_proc
	// (:status included).
	Headers []*corev3.HeaderValue
	Body    []byte
	// Reset: the upstream timed out or reset the stream. Envoy answers the
	// client itself (504) and tears the ext_proc stream down; Envoy's local
	// reply never reaches ext_proc.
	Reset bool
}

// Upstream, when given to Trace, is the upstream: it is called once the
// request phase is complete, with the request headers (lower-case keys,
// pseudo-headers included) and body as the server's mutations left them, and
// its answer replaces the Request's.
type Upstream func(headers map[string]string, body []byte) Response

// View is what Trace saw: what reached the upstream and what the client
// received, every mutation applied the way Envoy applies it (removes first,
// then sets; append joins with a comma).
type View struct {
	// Immediate is the ImmediateResponse that ended the request, if any.
	Immediate *extprocv3.ImmediateResponse
	// UpstreamCalled: the request reached the upstream, with UpstreamHeaders
	// and UpstreamBody (when it did not, they are the request as the
	// server's mutations had left it).
	UpstreamCalled  bool
	UpstreamHeaders map[string]string
	UpstreamBody    []byte
	// Status, Headers and Body are what the client received (Headers
	// includes :status unless the reply was local).
	Status  int
	Headers map[string]string
	Body    []byte
	// Replies counts the server's replies (override_message_timeout ones
	// not included).
	Replies int
}

var errMessageTimeout = errors.New("ext_proc message timeout")

// Do runs one HTTP request through the server on its own stream and reports
// only its outcome.
func (f Filter) Do(ctx context.Context, c Client, req *Request, hold Hold) Outcome {
	return f.exchange(ctx, c, req, hold, nil, nil)
}

// Trace runs one HTTP request through the server on its own stream, calling
// up (nil: the Request's fixed response) for the upstream's answer, and
// reports what the upstream and the client saw.
func (f Filter) Trace(ctx context.Context, c Client, req *Request, up Upstream) (Outcome, *View) {
	v := &View{}
	out := f.exchange(ctx, c, req, nil, up, v)
	if v.Immediate == nil {
		v.Status = out.Status
	}
	return out, v
}

func (f Filter) exchange(ctx context.Context, c Client, req *Request, hold Hold, up Upstream, v *View) Outcome {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	timeout := f.MessageTimeout
	if timeout <= 0 {
		timeout = time.Second
	}
	timer := time.AfterFunc(timeout, func() { cancel(errMessageTimeout) })
	timer.Stop()
	defer timer.Stop()

	stream, err := c.Process(ctx)
	if err != nil {
		return failed(ctx, err)
	}
	// Envoy closes its side and resets the stream right away (the server
	// usually sees Canceled, not EOF).
	defer func() {
		_ = stream.CloseSend()
		cancel(nil)
	}()

	md := req.Metadata
	if md == nil {
		md = emptyMetadata
	}
	ex := exchange{
		stream:   stream,
		ctx:      ctx,
		timer:    timer,
		timeout:  timeout,
		md:       md,
		filter:   &f,
		reqBody:  f.Mode.GetRequestBodyMode(),
		respHead: f.Mode.GetResponseHeaderMode(),
		respBody: f.Mode.GetResponseBodyMode(),
		reqLen:   headerValue(req.Headers, "content-length"),
		req:      req,
		view:     v,
		resp:     Response{Status: req.UpstreamStatus, Headers: req.ResponseHeaders, Body: req.ResponseBody},
	}
	if v != nil {
		v.UpstreamHeaders = headerMap(req.Headers)
		v.UpstreamBody = req.Body
	}
	return ex.run(hold, up)
}

var emptyMetadata = &corev3.Metadata{}

// direction is the request or the response path.
type direction uint8

const (
	dirRequest direction = iota
	dirResponse
)

// part is the part of a direction a message carries: its headers or its
// body.
type part uint8

const (
	partHeaders part = iota
	partBody
)

// exchange is the state of one stream.
type exchange struct {
	stream  extprocv3.ExternalProcessor_ProcessClient
	ctx     context.Context
	timer   *time.Timer
	timeout time.Duration
	md      *corev3.Metadata
	filter  *Filter
	req     *Request
	resp    Response // the upstream's answer
	sent    bool     // a message went out (protocol_config only on the first)
	gone    bool     // the server closed the stream with OK

	// Effective modes (after any mode_override). Request headers are always
	// sent in our configuration.
	reqBody, respBody filterv3.ProcessingMode_BodySendMode
	respHead          filterv3.ProcessingMode_HeaderSendMode

	// content-length of the held headers of each direction, as mutated so
	// far; empty when the message has none (chunked: Envoy checks nothing).
	reqLen, respLen string

	marks Marks
	view  *View // nil: Do, nothing recorded
}

func (ex *exchange) run(hold Hold, up Upstream) Outcome {
	req := ex.req
	reqEOS := len(req.Body) == 0
	if out, done := ex.step(dirRequest, partHeaders, &extprocv3.ProcessingRequest{
		Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
			Headers:     &corev3.HeaderMap{Headers: req.Headers},
			EndOfStream: reqEOS,
		}},
	}); done {
		return out
	}
	if !reqEOS && ex.reqBody != filterv3.ProcessingMode_NONE {
		if out, done := ex.step(dirRequest, partBody, &extprocv3.ProcessingRequest{
			Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{
				Body: req.Body, EndOfStream: true,
			}},
		}); done {
			return out
		}
	}
	// The request is released to the upstream here.
	if hold != nil {
		if err := hold(ex.ctx); err != nil {
			return Outcome{Status: 500, Local: true, Error: ErrCanceled, Marks: ex.marks}
		}
	}
	if v := ex.view; v != nil {
		v.UpstreamCalled = true
		if up != nil {
			ex.resp = up(v.UpstreamHeaders, v.UpstreamBody)
		}
		if ex.resp.Reset {
			return Outcome{Status: 504, Local: true, Marks: ex.marks}
		}
		v.Headers = headerMap(ex.resp.Headers)
		v.Body = ex.resp.Body
	}
	ex.respLen = headerValue(ex.resp.Headers, "content-length")
	if ex.respHead == filterv3.ProcessingMode_SKIP {
		// BUFFERED with the headers skipped: Envoy strips content-length
		// and checks nothing against a replaced body.
		ex.respLen = ""
	}
	respEOS := len(ex.resp.Body) == 0
	// The attributes ride on the first response message, whichever it is.
	var attrs map[string]*structpb.Struct
	if ex.filter.ResponseCode {
		attrs = map[string]*structpb.Struct{"envoy.filters.http.ext_proc": {Fields: map[string]*structpb.Value{
			"response.code": structpb.NewNumberValue(float64(ex.resp.Status)),
		}}}
	}
	if ex.respHead != filterv3.ProcessingMode_SKIP {
		if out, done := ex.step(dirResponse, partHeaders, &extprocv3.ProcessingRequest{
			Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{
				Headers:     &corev3.HeaderMap{Headers: ex.resp.Headers},
				EndOfStream: respEOS,
			}},
			Attributes: attrs,
		}); done {
			return out
		}
		attrs = nil
	}
	if !respEOS && ex.respBody != filterv3.ProcessingMode_NONE {
		if out, done := ex.step(dirResponse, partBody, &extprocv3.ProcessingRequest{
			Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{
				Body: ex.resp.Body, EndOfStream: true,
			}},
			Attributes: attrs,
		}); done {
			return out
		}
	}
	return ex.upstream()
}

// upstream is the outcome of a request that reached the upstream and whose
// response went to the client.
func (ex *exchange) upstream() Outcome {
	return Outcome{Status: ex.resp.Status, Marks: ex.marks}
}

// step sends one message, waits for its reply and applies it. done reports
// that the request ended (out says how).
func (ex *exchange) step(dir direction, p part, msg *extprocv3.ProcessingRequest) (out Outcome, done bool) {
	if ex.gone {
		return Outcome{}, false
	}
	msg.MetadataContext = ex.md
	if !ex.sent {
		msg.ProtocolConfig = protocolConfig(ex.reqBody, ex.respBody)
		ex.sent = true
	}
	ex.timer.Reset(ex.timeout)
	resp, err := ex.roundTrip(msg)
	ex.timer.Stop()
	if err != nil {
		if errors.Is(err, io.EOF) {
			// Stream closed with OK: Envoy proceeds without the server.
			ex.marks |= MarkClosedEarly
			ex.gone = true
			if ex.view == nil {
				return ex.upstream(), true
			}
			return Outcome{}, false
		}
		return failed(ex.ctx, err), true
	}
	if ex.view != nil {
		ex.view.Replies++
	}
	return ex.apply(dir, p, resp)
}

// roundTrip sends msg and receives the reply, skipping replies Envoy
// ignores (override_message_timeout with max_message_timeout unset).
func (ex *exchange) roundTrip(msg *extprocv3.ProcessingRequest) (*extprocv3.ProcessingResponse, error) {
	if err := ex.stream.Send(msg); err != nil {
		if !errors.Is(err, io.EOF) {
			return nil, err
		}
		// The stream is gone; Recv tells with which status.
	}
	for {
		resp, err := ex.stream.Recv()
		if err != nil {
			return nil, err
		}
		if resp.GetOverrideMessageTimeout() != nil {
			continue
		}
		return resp, nil
	}
}

// failed maps a stream error to the reply Envoy sends the client.
func failed(ctx context.Context, err error) Outcome {
	if errors.Is(context.Cause(ctx), errMessageTimeout) {
		return Outcome{Status: 504, Local: true, Error: ErrTimeout}
	}
	if ctx.Err() != nil {
		return Outcome{Status: 500, Local: true, Error: ErrCanceled}
	}
	return Outcome{Status: 500, Local: true, Error: ErrGRPC, Code: status.Code(err)}
}

// apply honours one reply. done reports that the request ended.
func (ex *exchange) apply(dir direction, p part, resp *extprocv3.ProcessingResponse) (Outcome, bool) {
	var common *extprocv3.CommonResponse
	switch r := resp.GetResponse().(type) {
	case *extprocv3.ProcessingResponse_ImmediateResponse:
		code := int(r.ImmediateResponse.GetStatus().GetCode())
		if code < 200 {
			code = 200
		}
		// Envoy only logs a failed header mutation of a local reply; the
		// reply goes out regardless.
		ex.checkValueFields(r.ImmediateResponse.GetHeaders())
		if v := ex.view; v != nil {
			v.Immediate = r.ImmediateResponse
			v.Status = code
			v.Headers = map[string]string{}
			applyHeaders(v.Headers, r.ImmediateResponse.GetHeaders())
			v.Body = r.ImmediateResponse.GetBody()
		}
		return Outcome{Status: code, Local: true, Marks: ex.marks}, true
	case *extprocv3.ProcessingResponse_RequestHeaders:
		if dir != dirRequest || p != partHeaders {
			return spurious(ex.marks), true
		}
		common = r.RequestHeaders.GetResponse()
	case *extprocv3.ProcessingResponse_RequestBody:
		if dir != dirRequest || p != partBody {
			return spurious(ex.marks), true
		}
		common = r.RequestBody.GetResponse()
	case *extprocv3.ProcessingResponse_ResponseHeaders:
		if dir != dirResponse || p != partHeaders {
			return spurious(ex.marks), true
		}
		common = r.ResponseHeaders.GetResponse()
	case *extprocv3.ProcessingResponse_ResponseBody:
		if dir != dirResponse || p != partBody {
			return spurious(ex.marks), true
		}
		common = r.ResponseBody.GetResponse()
	default:
		return spurious(ex.marks), true
	}

	if dir == dirResponse && p == partBody && ex.respHead == filterv3.ProcessingMode_SKIP {
		if hm := common.GetHeaderMutation(); len(hm.GetSetHeaders()) > 0 || len(hm.GetRemoveHeaders()) > 0 {
			ex.marks |= MarkDroppedHeaderMutation
		}
		common = &extprocv3.CommonResponse{Status: common.GetStatus(), BodyMutation: common.GetBodyMutation()}
	}
	if err := ex.mutateHeaders(dir, common.GetHeaderMutation()); err != ErrNone {
		return Outcome{Status: 500, Local: true, Error: err, Marks: ex.marks}, true
	}
	if p == partHeaders {
		if common.GetStatus() == extprocv3.CommonResponse_CONTINUE_AND_REPLACE {
			// The body (replaced or not) is no longer sent to the server.
			ex.setBodyMode(dir, filterv3.ProcessingMode_NONE)
			if bm := common.GetBodyMutation(); bm != nil {
				ex.mark(dir, MarkRequestBody, MarkResponseBody)
				ex.setBody(dir, bm.GetBody())
			}
		}
		if mo := resp.GetModeOverride(); mo != nil && ex.filter.AllowModeOverride {
			ex.override(mo)
		}
		return Outcome{}, false
	}
	if resp.GetModeOverride() != nil {
		ex.marks |= MarkIgnoredOverride
	}
	if bm := common.GetBodyMutation(); bm != nil {
		n := 0
		switch m := bm.GetMutation().(type) {
		case *extprocv3.BodyMutation_Body:
			n = len(m.Body)
		case *extprocv3.BodyMutation_ClearBody:
		default:
			// streamed_response outside FULL_DUPLEX_STREAMED.
			return spurious(ex.marks), true
		}
		ex.mark(dir, MarkRequestBody, MarkResponseBody)
		ex.setBody(dir, bm.GetBody())
		if cl := ex.contentLength(dir); cl != "" && cl != strconv.Itoa(n) {
			return Outcome{Status: 500, Local: true, Error: ErrContentLength, Marks: ex.marks}, true
		}
	}
	return Outcome{}, false
}

func spurious(m Marks) Outcome {
	return Outcome{Status: 500, Local: true, Error: ErrSpurious, Marks: m}
}

func (ex *exchange) mark(dir direction, req, resp Marks) {
	if dir == dirRequest {
		ex.marks |= req
	} else {
		ex.marks |= resp
	}
}

func (ex *exchange) setBodyMode(dir direction, m filterv3.ProcessingMode_BodySendMode) {
	if dir == dirRequest {
		ex.reqBody = m
	} else {
		ex.respBody = m
	}
}

// setBody records a body replacement in the view.
func (ex *exchange) setBody(dir direction, b []byte) {
	if ex.view == nil {
		return
	}
	if dir == dirRequest {
		ex.view.UpstreamBody = b
	} else {
		ex.view.Body = b
	}
}

func (ex *exchange) contentLength(dir direction) string {
	if dir == dirRequest {
		return ex.reqLen
	}
	return ex.respLen
}

// mutateHeaders applies the parts of a header mutation that matter here:
// content-length (checked against body replacements) and idempotency-key.
func (ex *exchange) mutateHeaders(dir direction, hm *extprocv3.HeaderMutation) Error {
	if hm == nil {
		return ErrNone
	}
	if checkSetHeaders(hm) {
		return ErrMutation
	}
	if len(hm.GetSetHeaders()) == 0 && len(hm.GetRemoveHeaders()) == 0 {
		return ErrNone
	}
	ex.mark(dir, MarkRequestHeaders, MarkResponseHeaders)
	ex.checkValueFields(hm)
	if v := ex.view; v != nil {
		if dir == dirRequest {
			applyHeaders(v.UpstreamHeaders, hm)
		} else {
			applyHeaders(v.Headers, hm)
		}
	}
	cl := &ex.reqLen
	if dir == dirResponse {
		cl = &ex.respLen
	}
	for _, name := range hm.GetRemoveHeaders() {
		if name == "content-length" {
			*cl = ""
		}
	}
	for _, o := range hm.GetSetHeaders() {
		h := o.GetHeader()
		if h == nil {
			continue
		}
		switch h.GetKey() {
		case "content-length":
			// In BUFFERED with headers SEND Envoy keeps content-length and
			// lets the server set it.
			*cl = string(h.GetRawValue())
		case "idempotency-key":
			if dir == dirRequest {
				ex.marks |= MarkIdempotencyKey
			}
		}
	}
	return ErrNone
}

// checkSetHeaders reports a mutation Envoy refuses: value and raw_value both
// set on one header.
func checkSetHeaders(hm *extprocv3.HeaderMutation) bool {
	for _, o := range hm.GetSetHeaders() {
		if h := o.GetHeader(); h != nil && h.GetValue() != "" && len(h.GetRawValue()) > 0 {
			return true
		}
	}
	return false
}

// checkValueFields marks a header set through value instead of raw_value.
func (ex *exchange) checkValueFields(hm *extprocv3.HeaderMutation) {
	for _, o := range hm.GetSetHeaders() {
		if o.GetHeader().GetValue() != "" {
			ex.marks |= MarkValueField
		}
	}
}

// applyHeaders applies a header mutation to hs as Envoy does: removes
// first, then sets, raw_value only, append unset = overwrite.
func applyHeaders(hs map[string]string, hm *extprocv3.HeaderMutation) {
	for _, r := range hm.GetRemoveHeaders() {
		delete(hs, r)
	}
	for _, o := range hm.GetSetHeaders() {
		k := o.GetHeader().GetKey()
		v := string(o.GetHeader().GetRawValue())
		//lint:ignore SA1019 the append flag is what idemgate sets (extproc's replies)
		if o.GetAppend().GetValue() && hs[k] != "" {
			hs[k] = hs[k] + "," + v
			continue
		}
		hs[k] = v
	}
}

// headerMap is hs as a map (raw values).
func headerMap(hs []*corev3.HeaderValue) map[string]string {
	m := make(map[string]string, len(hs))
	for _, h := range hs {
		m[h.GetKey()] = string(h.GetRawValue())
	}
	return m
}

// override applies a mode_override as Envoy merges it (since 1.34): header
// and trailer modes left DEFAULT keep the filter-level setting, body modes
// are taken literally (an omitted body mode means NONE).
func (ex *exchange) override(mo *filterv3.ProcessingMode) {
	ex.marks |= MarkModeOverride
	if m := mo.GetResponseHeaderMode(); m != filterv3.ProcessingMode_DEFAULT {
		ex.respHead = m
	} else {
		ex.respHead = ex.filter.Mode.GetResponseHeaderMode()
	}
	ex.reqBody = mo.GetRequestBodyMode()
	ex.respBody = mo.GetResponseBodyMode()
}

// protocolConfig is the protocol_config of the first message; the few
// distinct values are shared (messages are only read once built).
func protocolConfig(req, resp filterv3.ProcessingMode_BodySendMode) *extprocv3.ProtocolConfiguration {
	if req == filterv3.ProcessingMode_BUFFERED && resp == filterv3.ProcessingMode_BUFFERED {
		return bufferedBoth
	}
	return &extprocv3.ProtocolConfiguration{RequestBodyMode: req, ResponseBodyMode: resp}
}

var bufferedBoth = &extprocv3.ProtocolConfiguration{
	RequestBodyMode:  filterv3.ProcessingMode_BUFFERED,
	ResponseBodyMode: filterv3.ProcessingMode_BUFFERED,
}

func headerValue(hs []*corev3.HeaderValue, key string) string {
	for _, h := range hs {
		if h.GetKey() == key {
			return string(h.GetRawValue())
		}
	}
	return ""
}
