package envoysim

import (
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"
	"unicode"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
)

// attributesKey is the fixed key of ProcessingRequest.attributes.
const attributesKey = "envoy.filters.http.ext_proc"

type direction int

const (
	dirRequest direction = iota
	dirResponse
)

func (d direction) String() string {
	if d == dirRequest {
		return "request"
	}
	return "response"
}

// callbackState is ProcessorState::CallbackState.
type callbackState int

const (
	cbIdle callbackState = iota
	cbHeaders
	cbBufferedBody
	cbStreamedBody
	cbTrailers
)

type filterStatus int

const (
	fContinue filterStatus = iota
	fStop
)

// dataStatus is Http::FilterDataStatus.
type dataStatus int

const (
	dContinue dataStatus = iota
	dStopAndBuffer
	dStopAndWatermark
	dStopNoBuffer
)

type queuedChunk struct {
	length int
	eos    bool
}

// procState is ProcessorState: the per-direction state machine.
type procState struct {
	f   *extProcFilter
	dir direction
	fm  *fmDir

	sendHeaders  bool
	sendTrailers bool
	bodyMode     BodySendMode
	cb           callbackState
	paused       bool

	noBody                bool
	completeBodyAvailable bool
	bodyReplaced          bool
	bodyReceived          bool
	attributesSent        bool

	// headers are the held headers while a reply may still mutate them.
	headers *headerMap

	queue     []queuedChunk
	queueData []byte

	timerGen           uint64
	timerEnabled       bool
	timer              *time.Timer
	newTimeoutReceived bool
}

// evMessageTimeout fires when a direction's message timer expires.
type evMessageTimeout struct {
	dir direction
	gen uint64
}

func (s *procState) setProcessingMode(m ProcessingMode) {
	if s.dir == dirRequest {
		s.sendHeaders = m.RequestHeaderMode != HeaderSkip
		s.sendTrailers = m.RequestTrailerMode == HeaderSend
		s.bodyMode = m.RequestBodyMode
	} else {
		s.sendHeaders = m.ResponseHeaderMode != HeaderSkip
		s.sendTrailers = m.ResponseTrailerMode == HeaderSend
		s.bodyMode = m.ResponseBodyMode
	}
}

func (s *procState) noExternalProcess() bool {
	return !s.sendHeaders && !s.sendTrailers && s.bodyMode == BodyNone
}

// shouldRemoveContentLength: STREAMED, BUFFERED_PARTIAL, FULL_DUPLEX_STREAMED,
// or BUFFERED with headers SKIP.
func (s *procState) shouldRemoveContentLength() bool {
	switch s.bodyMode {
	case BodyStreamed, BodyBufferedPartial, BodyFullDuplexStreamed:
		return true
	case BodyBuffered:
		return !s.sendHeaders
	}
	return false
}

func (s *procState) onStartProcessorCall(cb callbackState, timeout time.Duration) {
	s.cb = cb
	s.startTimer(timeout)
	s.newTimeoutReceived = false
}

func (s *procState) onFinishProcessorCall(next callbackState) {
	s.stopTimer()
	s.cb = next
	s.newTimeoutReceived = false
}

func (s *procState) startTimer(d time.Duration) {
	s.stopTimer()
	s.timerGen++
	s.timerEnabled = true
	gen, dir, post := s.timerGen, s.dir, s.f.ex.post
	s.timer = time.AfterFunc(d, func() { post(evMessageTimeout{dir: dir, gen: gen}) })
}

func (s *procState) stopTimer() {
	if s.timer != nil {
		s.timer.Stop()
	}
	s.timerEnabled = false
}

func (s *procState) restartMessageTimer(d time.Duration) bool {
	if !s.timerEnabled || s.newTimeoutReceived {
		return false
	}
	s.startTimer(d)
	s.newTimeoutReceived = true
	return true
}

func (s *procState) bufferedData() ([]byte, bool) { return s.fm.buf, s.fm.hasBuf }

func (s *procState) addBufferedData(d []byte) {
	s.fm.buf = append(s.fm.buf, d...)
	s.fm.hasBuf = true
}

func (s *procState) continueIfNecessary() {
	if s.paused {
		s.paused = false
		s.fm.continueIteration()
	}
}

func (s *procState) enqueue(d []byte, eos bool) {
	s.queue = append(s.queue, queuedChunk{length: len(d), eos: eos})
	s.queueData = append(s.queueData, d...)
}

func (s *procState) dequeue() (queuedChunk, []byte) {
	c := s.queue[0]
	s.queue = s.queue[1:]
	d := slices.Clone(s.queueData[:c.length])
	s.queueData = s.queueData[c.length:]
	return c, d
}

// extProcFilter is one ext_proc filter instance (one per HTTP request).
type extProcFilter struct {
	ex  *exchange
	cfg *extProcConfig

	dec, enc *procState

	processingComplete    bool
	stream                *procStream
	streamEverOpened      bool
	protocolConfigEncoded bool
	failureModeAllow      bool
	routeMerged           bool

	grpcCluster  string
	initialMeta  []HeaderKV
	forwardingNS []string
	receivingNS  []string
}

func newExtProcFilter(ex *exchange, cfg *extProcConfig) *extProcFilter {
	f := &extProcFilter{
		ex:               ex,
		cfg:              cfg,
		failureModeAllow: cfg.FailureModeAllow,
		grpcCluster:      cfg.GRPCService.ClusterName,
		initialMeta:      cfg.GRPCService.InitialMetadata,
		forwardingNS:     cfg.MetadataOptions.ForwardingNamespaces,
		receivingNS:      cfg.MetadataOptions.ReceivingNamespaces,
	}
	f.dec = &procState{f: f, dir: dirRequest, fm: &ex.dec}
	f.enc = &procState{f: f, dir: dirResponse, fm: &ex.enc}
	f.dec.setProcessingMode(cfg.ProcessingMode)
	f.enc.setProcessingMode(cfg.ProcessingMode)
	return f
}

func (f *extProcFilter) state(d direction) *procState {
	if d == dirRequest {
		return f.dec
	}
	return f.enc
}

func (f *extProcFilter) limits() mutationLimits {
	return mutationLimits{maxCount: f.ex.rt.maxHeaders, maxKB: f.ex.rt.maxHeadersKB}
}

func (f *extProcFilter) rejectedMutation() { f.ex.p.stats.rejectedHeaderMutations.Add(1) }

// mergePerRouteConfig applies the route's merged ExtProcPerRoute once.
func (f *extProcFilter) mergePerRouteConfig() {
	if f.routeMerged {
		return
	}
	f.routeMerged = true
	if f.ex.route == nil || f.ex.route.extProcPerRoute == nil {
		return
	}
	pr := f.ex.route.extProcPerRoute
	if pr.Disabled {
		off := ProcessingMode{RequestHeaderMode: HeaderSkip, ResponseHeaderMode: HeaderSkip}
		f.dec.setProcessingMode(off)
		f.enc.setProcessingMode(off)
		return
	}
	if pr.ProcessingMode != nil {
		f.dec.setProcessingMode(*pr.ProcessingMode)
		f.enc.setProcessingMode(*pr.ProcessingMode)
	}
	if pr.GRPCService != nil {
		f.grpcCluster = pr.GRPCService.ClusterName
		f.initialMeta = pr.GRPCService.InitialMetadata
	}
	if len(pr.GRPCInitialMetadata) > 0 {
		f.initialMeta = mergeMetadata(f.initialMeta, pr.GRPCInitialMetadata)
	}
	if pr.ForwardingNamespaces != nil {
		f.forwardingNS = pr.ForwardingNamespaces
	}
	if pr.ReceivingNamespaces != nil {
		f.receivingNS = pr.ReceivingNamespaces
	}
	if pr.FailureModeAllow != nil {
		f.failureModeAllow = *pr.FailureModeAllow
	}
}

type openState int

const (
	openOK openState = iota
	openIgnoreError
)

// openStream opens the gRPC stream lazily, at the first message to send.
func (f *extProcFilter) openStream() openState {
	if f.processingComplete {
		return openIgnoreError
	}
	if f.stream == nil {
		md := metadata.MD{}
		for _, kv := range f.initialMeta {
			md.Append(kv.Key, kv.Value)
		}
		f.stream = startProcStream(f.ex.p.grpcConn(f.grpcCluster), md, f.ex.post)
		f.streamEverOpened = true
		f.ex.p.stats.streamsOpened.Add(1)
		f.ex.p.logger.Debug("envoysim: ext_proc stream opened", "request_id", f.ex.requestID)
	}
	return openOK
}

func (f *extProcFilter) closeStream() {
	if f.stream != nil {
		f.stream.close()
		f.stream = nil
		f.ex.p.stats.streamsClosed.Add(1)
	}
}

func (f *extProcFilter) closeStreamMaybeGraceful() {
	f.processingComplete = true
	f.closeStream()
}

func (f *extProcFilter) onDestroy() {
	f.processingComplete = true
	f.dec.stopTimer()
	f.enc.stopTimer()
	f.closeStream()
}

func (f *extProcFilter) sendRequest(req *extprocv3.ProcessingRequest) {
	f.stream.send(req)
	f.ex.p.stats.messagesSent.Add(1)
}

// --- decode / encode callbacks ---

func (f *extProcFilter) decodeHeaders(h *headerMap, eos bool) filterStatus {
	f.mergePerRouteConfig()
	if eos {
		f.dec.completeBodyAvailable = true
	}
	st := fContinue
	if f.dec.sendHeaders {
		st = f.onHeaders(f.dec, h, eos)
	}
	if !f.processingComplete && f.dec.shouldRemoveContentLength() {
		h.remove("content-length")
	}
	return st
}

func (f *extProcFilter) encodeHeaders(h *headerMap, eos bool) filterStatus {
	f.mergePerRouteConfig()
	if eos {
		f.enc.completeBodyAvailable = true
	}
	st := fContinue
	if !f.processingComplete && f.enc.sendHeaders {
		st = f.onHeaders(f.enc, h, eos)
	}
	if !f.processingComplete && f.enc.shouldRemoveContentLength() {
		h.remove("content-length")
	}
	if f.enc.noExternalProcess() {
		f.closeStreamMaybeGraceful()
	}
	return st
}

func (f *extProcFilter) onHeaders(s *procState, h *headerMap, eos bool) filterStatus {
	if f.openStream() == openIgnoreError {
		return fContinue
	}
	s.headers = h
	s.noBody = eos
	req := &extprocv3.ProcessingRequest{}
	f.addAttributes(s, req)
	f.addDynamicMetadata(req)
	hh := &extprocv3.HttpHeaders{Headers: h.toProto(f.cfg.forwardAllowed), EndOfStream: eos}
	if s.dir == dirRequest {
		req.Request = &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: hh}
	} else {
		req.Request = &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: hh}
	}
	f.encodeProtocolConfig(req)
	s.onStartProcessorCall(cbHeaders, f.cfg.messageTimeout)
	f.sendRequest(req)
	s.paused = true
	return fStop
}

func (f *extProcFilter) onData(s *procState, data *[]byte, eos bool) dataStatus {
	s.bodyReceived = true
	if eos {
		s.completeBodyAvailable = true
	}
	if s.bodyReplaced {
		*data = nil
		return dContinue
	}
	if f.processingComplete {
		return dContinue
	}
	if s.cb == cbHeaders {
		// Header processing still in progress: hold the data. BUFFERED
		// counts against the buffer limit (413 / 500); other modes only
		// raise a watermark.
		s.paused = true
		if s.bodyMode == BodyBuffered {
			return dStopAndBuffer
		}
		return dStopAndWatermark
	}
	switch s.bodyMode {
	case BodyBuffered:
		if eos {
			if f.openStream() == openIgnoreError {
				return dContinue
			}
			s.addBufferedData(*data)
			*data = nil
			buf, _ := s.bufferedData()
			f.sendBodyChunk(s, cbBufferedBody, f.setupBodyChunk(s, buf, true))
			s.paused = true
			return dStopNoBuffer
		}
		s.paused = true
		return dStopAndBuffer
	case BodyStreamed:
		if f.openStream() == openIgnoreError {
			return dContinue
		}
		req := f.setupBodyChunk(s, *data, eos)
		s.enqueue(*data, eos)
		*data = nil
		if s.cb == cbHeaders {
			f.sendBodyChunk(s, cbHeaders, req)
		} else {
			f.sendBodyChunk(s, cbStreamedBody, req)
		}
		if eos || s.cb == cbHeaders {
			s.paused = true
			return dStopNoBuffer
		}
		return dContinue
	}
	return dContinue
}

func (f *extProcFilter) setupBodyChunk(s *procState, data []byte, eos bool) *extprocv3.ProcessingRequest {
	req := &extprocv3.ProcessingRequest{}
	f.addAttributes(s, req)
	f.addDynamicMetadata(req)
	body := &extprocv3.HttpBody{Body: slices.Clone(data), EndOfStream: eos}
	if body.Body == nil {
		body.Body = []byte{}
	}
	if s.dir == dirRequest {
		req.Request = &extprocv3.ProcessingRequest_RequestBody{RequestBody: body}
	} else {
		req.Request = &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: body}
	}
	f.encodeProtocolConfig(req)
	return req
}

func (f *extProcFilter) sendBodyChunk(s *procState, cb callbackState, req *extprocv3.ProcessingRequest) {
	s.onStartProcessorCall(cb, f.cfg.messageTimeout)
	f.sendRequest(req)
}

// encodeProtocolConfig sets protocol_config on the first message only.
func (f *extProcFilter) encodeProtocolConfig(req *extprocv3.ProcessingRequest) {
	if f.protocolConfigEncoded {
		return
	}
	req.ProtocolConfig = &extprocv3.ProtocolConfiguration{
		RequestBodyMode:                         f.dec.bodyMode,
		ResponseBodyMode:                        f.enc.bodyMode,
		SendBodyWithoutWaitingForHeaderResponse: f.cfg.SendBodyWithoutWaitingForHeaderResponse,
	}
	f.protocolConfigEncoded = true
}

// addDynamicMetadata sets metadata_context on every message, with the
// forwarding namespaces present in the stream's dynamic metadata right now.
func (f *extProcFilter) addDynamicMetadata(req *extprocv3.ProcessingRequest) {
	md := &corev3.Metadata{}
	for _, ns := range f.forwardingNS {
		if st, ok := f.ex.dynMeta[ns]; ok {
			if md.FilterMetadata == nil {
				md.FilterMetadata = map[string]*structpb.Struct{}
			}
			md.FilterMetadata[ns] = proto.Clone(st).(*structpb.Struct)
		}
	}
	req.MetadataContext = md
}

func (f *extProcFilter) addAttributes(s *procState, req *extprocv3.ProcessingRequest) {
	exprs := f.cfg.RequestAttributes
	if s.dir == dirResponse {
		exprs = f.cfg.ResponseAttributes
	}
	if s.attributesSent || len(exprs) == 0 {
		return
	}
	s.attributesSent = true
	req.Attributes = map[string]*structpb.Struct{attributesKey: f.ex.evaluateAttributes(exprs)}
}

// --- replies ---

// errSpurious marks FailedPrecondition statuses (spurious messages).
type errSpurious struct{ msg string }

func (e *errSpurious) Error() string { return e.msg }

func spurious(msg string) error { return &errSpurious{msg: msg} }

func (f *extProcFilter) inHeaderProcessState() bool {
	return f.dec.cb == cbHeaders || f.enc.cb == cbHeaders
}

func (f *extProcFilter) onReceiveMessage(resp *extprocv3.ProcessingResponse) {
	if f.processingComplete || f.stream == nil {
		return
	}
	if resp.GetOverrideMessageTimeout() != nil {
		f.onNewTimeout(resp.GetOverrideMessageTimeout().AsDuration())
		return
	}
	if f.cfg.AllowModeOverride && !f.cfg.SendBodyWithoutWaitingForHeaderResponse &&
		f.cfg.ProcessingMode.RequestBodyMode != BodyFullDuplexStreamed &&
		f.cfg.ProcessingMode.ResponseBodyMode != BodyFullDuplexStreamed &&
		f.inHeaderProcessState() && resp.GetModeOverride() != nil {
		mo := effectiveModeOverride(processingModeFromProto(resp.GetModeOverride()), f.cfg.ProcessingMode)
		allowed := len(f.cfg.AllowedOverrideModes) == 0 || slices.ContainsFunc(f.cfg.AllowedOverrideModes, func(o ProcessingMode) bool {
			return mo.RequestBodyMode == o.RequestBodyMode && mo.RequestTrailerMode == o.RequestTrailerMode &&
				mo.ResponseHeaderMode == o.ResponseHeaderMode && mo.ResponseBodyMode == o.ResponseBodyMode &&
				mo.ResponseTrailerMode == o.ResponseTrailerMode
		})
		if allowed {
			if err := checkModeModelled("mode_override", mo); err != nil {
				// Envoy would honour BUFFERED_PARTIAL / FULL_DUPLEX_STREAMED
				// here; the harness cannot, so it fails loudly.
				f.handleErrorResponse(&mutationError{"envoysim_unsupported_mode_override"})
				return
			}
			f.dec.setProcessingMode(mo)
			f.enc.setProcessingMode(mo)
		}
	}

	var err error
	isLastBody := false
	switch r := resp.GetResponse().(type) {
	case *extprocv3.ProcessingResponse_RequestHeaders:
		f.setDynamicMetadata(resp)
		err = f.handleHeadersResponse(f.dec, r.RequestHeaders)
	case *extprocv3.ProcessingResponse_ResponseHeaders:
		f.setDynamicMetadata(resp)
		err = f.handleHeadersResponse(f.enc, r.ResponseHeaders)
	case *extprocv3.ProcessingResponse_RequestBody:
		isLastBody = isLastBodyResponse(f.dec)
		f.setDynamicMetadata(resp)
		err = f.handleBodyResponse(f.dec, r.RequestBody)
	case *extprocv3.ProcessingResponse_ResponseBody:
		isLastBody = isLastBodyResponse(f.enc)
		f.setDynamicMetadata(resp)
		err = f.handleBodyResponse(f.enc, r.ResponseBody)
	case *extprocv3.ProcessingResponse_RequestTrailers:
		f.setDynamicMetadata(resp)
		err = f.handleTrailersResponse(f.dec)
	case *extprocv3.ProcessingResponse_ResponseTrailers:
		f.setDynamicMetadata(resp)
		err = f.handleTrailersResponse(f.enc)
	case *extprocv3.ProcessingResponse_ImmediateResponse:
		if f.cfg.DisableImmediateResponse {
			err = spurious("unhandled immediate response due to config disabled it")
			break
		}
		f.setDynamicMetadata(resp)
		f.processingComplete = true
		f.onFinishProcessorCalls()
		f.closeStreamMaybeGraceful()
		f.sendImmediateResponse(r.ImmediateResponse)
	default:
		// No oneof (or one this baseline does not know, such as
		// streamed_immediate_response): spurious.
		err = spurious("unhandled message")
	}

	var sp *errSpurious
	switch {
	case err == nil:
		f.ex.p.stats.messagesReceived.Add(1)
	case errors.As(err, &sp):
		f.ex.p.stats.spuriousMessages.Add(1)
		f.ex.p.logger.Warn("envoysim: spurious ext_proc message", "request_id", f.ex.requestID, "reason", sp.msg)
		if f.failureModeAllow {
			f.ex.p.stats.failureModeAllowed.Add(1)
			f.closeStream()
			f.clearAsyncState()
			f.processingComplete = true
		} else {
			f.handleErrorResponse(err)
		}
	default:
		f.ex.p.stats.messagesReceived.Add(1)
		f.handleErrorResponse(err)
	}
	f.closeGRPCStreamIfLastRespReceived(resp, isLastBody)
}

// effectiveModeOverride: DEFAULT header/trailer modes keep the FILTER-level
// value; body modes are copied literally.
func effectiveModeOverride(target, filterLevel ProcessingMode) ProcessingMode {
	m := filterLevel
	if target.RequestHeaderMode != HeaderDefault {
		m.RequestHeaderMode = target.RequestHeaderMode
	}
	if target.ResponseHeaderMode != HeaderDefault {
		m.ResponseHeaderMode = target.ResponseHeaderMode
	}
	if target.RequestTrailerMode != HeaderDefault {
		m.RequestTrailerMode = target.RequestTrailerMode
	}
	if target.ResponseTrailerMode != HeaderDefault {
		m.ResponseTrailerMode = target.ResponseTrailerMode
	}
	m.RequestBodyMode = target.RequestBodyMode
	m.ResponseBodyMode = target.ResponseBodyMode
	return m
}

func isLastBodyResponse(s *procState) bool {
	if s.bodyMode == BodyStreamed && len(s.queue) > 0 {
		return s.queue[0].eos
	}
	return false
}

func (f *extProcFilter) closeGRPCStreamIfLastRespReceived(resp *extprocv3.ProcessingResponse, isLastBody bool) {
	if f.stream == nil {
		return
	}
	last := false
	switch resp.GetResponse().(type) {
	case *extprocv3.ProcessingResponse_RequestHeaders:
		last = (f.dec.noBody || (f.dec.bodyMode == BodyNone && !f.dec.sendTrailers)) && f.enc.noExternalProcess()
	case *extprocv3.ProcessingResponse_RequestBody:
		last = isLastBody && f.enc.noExternalProcess()
	case *extprocv3.ProcessingResponse_RequestTrailers:
		last = f.enc.noExternalProcess()
	case *extprocv3.ProcessingResponse_ResponseHeaders:
		last = f.enc.noBody || (f.enc.bodyMode == BodyNone && !f.enc.sendTrailers)
	case *extprocv3.ProcessingResponse_ResponseBody:
		last = isLastBody
	case *extprocv3.ProcessingResponse_ResponseTrailers:
		last = true
	}
	if last {
		f.ex.p.logger.Debug("envoysim: closing ext_proc stream after the last expected reply", "request_id", f.ex.requestID)
		f.closeStreamMaybeGraceful()
	}
}

func (f *extProcFilter) setDynamicMetadata(resp *extprocv3.ProcessingResponse) {
	dm := resp.GetDynamicMetadata()
	if dm == nil || len(f.receivingNS) == 0 {
		return
	}
	for ns, v := range dm.GetFields() {
		if !slices.Contains(f.receivingNS, ns) {
			continue
		}
		cur := f.ex.dynMeta[ns]
		if cur == nil {
			cur = &structpb.Struct{Fields: map[string]*structpb.Value{}}
			f.ex.dynMeta[ns] = cur
		}
		for k, fv := range v.GetStructValue().GetFields() {
			cur.Fields[k] = proto.Clone(fv).(*structpb.Value)
		}
	}
}

func (f *extProcFilter) processHeaderMutation(s *procState, cr *extprocv3.CommonResponse) error {
	return applyHeaderMutations(cr.GetHeaderMutation(), s.headers,
		cr.GetStatus() == extprocv3.CommonResponse_CONTINUE_AND_REPLACE,
		f.cfg.checker, s.shouldRemoveContentLength(), f.limits(), f.rejectedMutation)
}

func (f *extProcFilter) clearRouteCache(s *procState, cr *extprocv3.CommonResponse) {
	if s.dir != dirRequest || cr.GetHeaderMutation() == nil {
		return
	}
	switch f.cfg.RouteCacheAction {
	case extprocfilterv3.ExternalProcessor_CLEAR:
		f.ex.clearRouteCache()
	case extprocfilterv3.ExternalProcessor_DEFAULT:
		if cr.GetClearRouteCache() {
			f.ex.clearRouteCache()
		}
	}
}

func (f *extProcFilter) handleHeadersResponse(s *procState, hr *extprocv3.HeadersResponse) error {
	if s.cb != cbHeaders {
		return spurious("spurious message")
	}
	cr := hr.GetResponse()
	if cr.GetHeaderMutation() != nil {
		if err := f.processHeaderMutation(s, cr); err != nil {
			return err
		}
	}
	f.clearRouteCache(s, cr)
	s.onFinishProcessorCall(cbIdle)

	if cr.GetStatus() == extprocv3.CommonResponse_CONTINUE_AND_REPLACE {
		if bm := cr.GetBodyMutation(); bm != nil {
			// Always remove content-length: the processor probably did not
			// set it for the replacement body.
			s.headers.remove("content-length")
			s.bodyReplaced = true
			buf, has := s.bufferedData()
			if !has {
				s.addBufferedData(applyBodyMutation(bm, nil))
			} else {
				s.fm.buf = applyBodyMutation(bm, buf)
			}
		}
		s.queue, s.queueData = nil, nil
		s.bodyMode = BodyNone
		s.sendTrailers = false
	} else {
		switch {
		case s.noBody:
			// There never was a body.
		case s.completeBodyAvailable && s.bodyMode != BodyNone:
			if s.cb == cbIdle {
				if buf, has := s.bufferedData(); has {
					// The whole body arrived during the headers call: one
					// message, handled like BUFFERED whatever the mode.
					f.sendBodyChunk(s, cbBufferedBody, f.setupBodyChunk(s, buf, true))
					return nil
				}
			}
		case s.bodyMode == BodyBuffered:
			// Keep the headers until the body is complete.
			return nil
		case s.bodyMode == BodyStreamed:
			f.sendBufferedDataInStreamedMode(s, false)
			s.continueIfNecessary()
			return nil
		}
	}
	s.headers = nil
	s.continueIfNecessary()
	return nil
}

// sendBufferedDataInStreamedMode moves what the filter manager held during
// the headers call into the queue and sends it as one chunk.
func (f *extProcFilter) sendBufferedDataInStreamedMode(s *procState, eos bool) {
	buf, has := s.bufferedData()
	if !has || len(buf) == 0 {
		return
	}
	s.fm.buf = nil
	req := f.setupBodyChunk(s, buf, eos)
	s.enqueue(buf, eos)
	f.sendBodyChunk(s, cbStreamedBody, req)
}

func (f *extProcFilter) handleBodyResponse(s *procState, br *extprocv3.BodyResponse) error {
	if s.cb != cbBufferedBody && s.cb != cbStreamedBody {
		return spurious("spurious message")
	}
	cr := br.GetResponse()
	shouldContinue := false
	switch s.cb {
	case cbBufferedBody:
		if cr.GetHeaderMutation() != nil && s.headers != nil {
			if err := f.processHeaderMutation(s, cr); err != nil {
				return err
			}
		}
		if bm := cr.GetBodyMutation(); bm != nil {
			if bm.GetStreamedResponse() != nil {
				return spurious("spurious message: streamed_response is received while body_mode_ is not FULL_DUPLEX_STREAMED")
			}
			if s.headers != nil {
				if cl, ok := s.headers.get("content-length"); ok {
					var n int
					if _, err := fmt.Sscanf(cl, "%d", &n); err == nil && n != len(bm.GetBody()) {
						return &mutationError{"mismatch between content length and the length of the mutated body"}
					}
				}
			}
			buf, _ := s.bufferedData()
			s.fm.buf = applyBodyMutation(bm, buf)
			s.fm.hasBuf = true
		}
		s.onFinishProcessorCall(cbIdle)
		shouldContinue = true
	case cbStreamedBody:
		if cr.GetBodyMutation().GetStreamedResponse() != nil {
			return spurious("spurious message: streamed_response is received while body_mode_ is not FULL_DUPLEX_STREAMED")
		}
		chunk, data := s.dequeue()
		if bm := cr.GetBodyMutation(); bm != nil {
			data = applyBodyMutation(bm, data)
		}
		shouldContinue = chunk.eos
		if len(data) > 0 {
			s.fm.inject(data, chunk.eos)
		}
		if len(s.queue) == 0 {
			s.onFinishProcessorCall(cbIdle)
		} else {
			// Envoy stops the timer here too: later outstanding chunks run
			// without a timer until another chunk is sent.
			s.onFinishProcessorCall(cbStreamedBody)
		}
	}
	f.clearRouteCache(s, cr)
	s.headers = nil
	if shouldContinue {
		s.continueIfNecessary()
	}
	return nil
}

func (f *extProcFilter) handleTrailersResponse(s *procState) error {
	// HTTP/1.1 trailers are dropped by the codec (enable_trailers is off),
	// so a trailers message is never outstanding.
	if s.cb != cbTrailers {
		return spurious("spurious message")
	}
	s.onFinishProcessorCall(cbIdle)
	s.continueIfNecessary()
	return nil
}

func (f *extProcFilter) onFinishProcessorCalls() {
	f.dec.onFinishProcessorCall(cbIdle)
	f.enc.onFinishProcessorCall(cbIdle)
}

// clearAsyncState re-injects held data unchanged and continues both
// directions (fail-open and OK-close paths).
func (f *extProcFilter) clearAsyncState() {
	for _, s := range []*procState{f.dec, f.enc} {
		s.onFinishProcessorCall(cbIdle)
		if len(s.queue) > 0 {
			eos := s.queue[len(s.queue)-1].eos
			data := s.queueData
			s.queue, s.queueData = nil, nil
			s.fm.inject(data, eos)
		}
		s.continueIfNecessary()
		if f.ex.finished {
			return
		}
	}
}

func (f *extProcFilter) handleErrorResponse(err error) {
	f.processingComplete = true
	f.onFinishProcessorCalls()
	f.closeStream()
	f.sendImmediateResponse(&extprocv3.ImmediateResponse{
		Status:  &typev3.HttpStatus{Code: typev3.StatusCode(f.cfg.statusOnError)},
		Details: err.Error(),
	})
}

func (f *extProcFilter) onGRPCEnd(err error) {
	if f.stream == nil {
		return // we closed it ourselves; what Recv says now is our cancel
	}
	if errors.Is(err, io.EOF) {
		// The server returned status OK: continue without it, unmodified.
		if f.processingComplete {
			return
		}
		f.processingComplete = true
		f.closeStream()
		f.clearAsyncState()
		return
	}
	st := status.Convert(err)
	f.ex.p.stats.streamsFailed.Add(1)
	f.ex.p.logger.Warn("envoysim: ext_proc stream failed", "request_id", f.ex.requestID, "code", st.Code(), "message", st.Message())
	if f.processingComplete {
		return
	}
	if f.failureModeAllow {
		f.ex.p.stats.failureModeAllowed.Add(1)
		f.processingComplete = true
		f.closeStream()
		f.clearAsyncState()
		return
	}
	f.processingComplete = true
	f.onFinishProcessorCalls()
	f.closeStream()
	f.sendImmediateResponse(&extprocv3.ImmediateResponse{
		Status:  &typev3.HttpStatus{Code: typev3.StatusCode(f.cfg.statusOnError)},
		Details: fmt.Sprintf("ext_proc_error_gRPC_error_%d{%s}", int(st.Code()), st.Message()),
	})
}

func (f *extProcFilter) onMessageTimeout(ev evMessageTimeout) {
	s := f.state(ev.dir)
	if !s.timerEnabled || s.timerGen != ev.gen || f.processingComplete {
		return
	}
	f.ex.p.stats.messageTimeouts.Add(1)
	f.ex.p.logger.Warn("envoysim: ext_proc message timeout", "request_id", f.ex.requestID, "direction", ev.dir)
	if f.failureModeAllow {
		f.processingComplete = true
		f.closeStream()
		f.ex.p.stats.failureModeAllowed.Add(1)
		f.clearAsyncState()
		return
	}
	f.processingComplete = true
	f.closeStream()
	f.onFinishProcessorCalls()
	f.sendImmediateResponse(&extprocv3.ImmediateResponse{
		Status:  &typev3.HttpStatus{Code: typev3.StatusCode_GatewayTimeout},
		Details: "ext_proc_error_per-message_timeout_exceeded",
	})
}

func (f *extProcFilter) onNewTimeout(d time.Duration) {
	if d < time.Millisecond || d > f.cfg.MaxMessageTimeout {
		return
	}
	if !f.dec.restartMessageTimer(d) {
		f.enc.restartMessageTimer(d)
	}
}

func (f *extProcFilter) sendImmediateResponse(ir *extprocv3.ImmediateResponse) {
	code := 200
	if ir.GetStatus() != nil {
		code = int(ir.GetStatus().GetCode())
	}
	if code < 200 {
		code = 200
	}
	var grpcStatus *uint32
	if ir.GetGrpcStatus() != nil {
		v := ir.GetGrpcStatus().GetStatus()
		grpcStatus = &v
	}
	f.ex.sendLocalReply(localReply{
		status:     code,
		body:       string(ir.GetBody()),
		details:    replaceAllEmptySpace(ir.GetDetails()),
		grpcStatus: grpcStatus,
		source:     "ext_proc",
		mutate: func(h *headerMap) {
			if ir.GetHeaders() == nil {
				return
			}
			if err := applyHeaderMutations(ir.GetHeaders(), h, false, f.cfg.checker, false, f.limits(), f.rejectedMutation); err != nil {
				// Envoy only logs this; the reply still goes out.
				f.ex.p.logger.Warn("envoysim: immediate response header mutation failed", "request_id", f.ex.requestID, "error", err)
			}
		},
	})
}

// replaceAllEmptySpace is StringUtil::replaceAllEmptySpace: every whitespace
// character becomes '_' (response code details may not contain spaces).
func replaceAllEmptySpace(s string) string {
	return strings.Map(func(r rune) rune {
		if unicode.IsSpace(r) {
			return '_'
		}
		return r
	}, s)
}
