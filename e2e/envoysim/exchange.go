package envoysim

import (
	"crypto/rand"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/structpb"
)

// event is something that happened to an exchange outside its loop.
type event any

// evDownData is a chunk of the downstream request body (one data callback).
type evDownData struct {
	data []byte
	eos  bool
}

// evDownErr is a failed downstream body read (client went away).
type evDownErr struct{ err error }

// fmDir is the filter manager around ext_proc for one direction: it holds
// data when the filter stops iteration, enforces the buffer limit on
// StopIterationAndBuffer, and passes headers/data to the next stage (the
// router for requests, the downstream codec for responses) on continue.
type fmDir struct {
	ex     *exchange
	dir    direction
	filter func() *extProcFilter

	headers       *headerMap
	headersEOS    bool
	headersPassed bool
	buf           []byte
	hasBuf        bool
	eosSeen       bool
	eosPassed     bool

	nextHeaders func(h *headerMap, eos bool)
	nextData    func(d []byte, eos bool)
	overflow    func()
}

func (f *fmDir) onHeaders(h *headerMap, eos bool) {
	f.headers, f.headersEOS = h, eos
	if eos {
		f.eosSeen = true
	}
	st := fContinue
	if ep := f.filter(); ep != nil {
		if f.dir == dirRequest {
			st = ep.decodeHeaders(h, eos)
		} else {
			st = ep.encodeHeaders(h, eos)
		}
	}
	if f.ex.finished {
		return
	}
	if st == fContinue {
		f.continueIteration()
	}
}

func (f *fmDir) onData(d []byte, eos bool) {
	if f.ex.finished || f.eosPassed {
		return
	}
	if eos {
		f.eosSeen = true
	}
	st := dContinue
	if ep := f.filter(); ep != nil {
		st = ep.onData(ep.state(f.dir), &d, eos)
	}
	if f.ex.finished {
		return
	}
	switch st {
	case dContinue:
		f.buf = append(f.buf, d...)
		f.hasBuf = true
		f.continueIteration()
	case dStopAndBuffer:
		f.buf = append(f.buf, d...)
		f.hasBuf = true
		if len(f.buf) > f.ex.rt.bufferLimit {
			f.overflow()
		}
	case dStopAndWatermark:
		f.buf = append(f.buf, d...)
		f.hasBuf = true
	case dStopNoBuffer:
	}
}

// continueIteration passes the held headers (if not yet passed), then the
// held data, then end of stream if it was seen.
func (f *fmDir) continueIteration() {
	if f.ex.finished {
		return
	}
	if !f.headersPassed {
		f.headersPassed = true
		eos := f.headersEOS && !f.hasBuf
		if eos {
			f.eosPassed = true
		}
		f.nextHeaders(f.headers, eos)
		if f.ex.finished {
			return
		}
	}
	if f.eosPassed {
		f.buf, f.hasBuf = nil, false
		return
	}
	d := f.buf
	f.buf, f.hasBuf = nil, false
	if len(d) > 0 || f.eosSeen {
		if f.eosSeen {
			f.eosPassed = true
		}
		f.nextData(d, f.eosSeen)
	}
}

// inject is inject{De,En}codedDataToFilterChain: data goes straight to the
// next stage.
func (f *fmDir) inject(d []byte, eos bool) {
	if f.ex.finished || f.eosPassed {
		return
	}
	if !f.headersPassed {
		f.headersPassed = true
		f.nextHeaders(f.headers, false)
		if f.ex.finished {
			return
		}
	}
	if eos {
		f.eosPassed = true
	}
	f.nextData(d, eos)
}

// localReply is sendLocalReply's arguments.
type localReply struct {
	status     int
	body       string
	details    string
	grpcStatus *uint32
	mutate     func(h *headerMap)
	source     string
}

// exchange is one downstream HTTP request: the HCM stream with its filter
// chain, driven by a single loop goroutine like an Envoy worker.
type exchange struct {
	p      *Proxy
	rt     *runtime
	w      http.ResponseWriter
	r      *http.Request
	events chan event
	done   chan struct{}
	start  time.Time

	requestID  string
	reqHeaders *headerMap
	route      *compiledRoute
	dynMeta    map[string]*structpb.Struct
	isGRPC     bool

	dec    fmDir
	enc    fmDir
	ep     *extProcFilter
	router *routerFilter

	downstreamHeadersSent bool
	requestComplete       bool          // the downstream request's last byte arrived
	readerDone            chan struct{} // closed when readDownstream has returned; nil without a body
	finished              bool
	resetDownstream       bool
	status                int
	details               string
}

func (ex *exchange) post(e event) bool {
	select {
	case ex.events <- e:
		return true
	case <-ex.done:
		return false
	}
}

func newExchange(p *Proxy, w http.ResponseWriter, r *http.Request) *exchange {
	ex := &exchange{
		p:       p,
		rt:      p.rt,
		w:       w,
		r:       r,
		events:  make(chan event, 64),
		done:    make(chan struct{}),
		start:   time.Now(),
		dynMeta: map[string]*structpb.Struct{},
	}
	if p.rt.extProc != nil {
		ex.ep = newExtProcFilter(ex, p.rt.extProc)
	}
	ex.router = newRouterFilter(ex)
	filter := func() *extProcFilter { return ex.ep }
	ex.dec = fmDir{ex: ex, dir: dirRequest, filter: filter,
		nextHeaders: ex.router.decodeHeaders, nextData: ex.router.decodeData,
		overflow: func() {
			ex.sendLocalReply(localReply{status: 413, body: "Payload Too Large", details: "request_payload_too_large", source: "hcm"})
		}}
	ex.enc = fmDir{ex: ex, dir: dirResponse, filter: filter,
		nextHeaders: ex.writeDownstreamHeaders, nextData: ex.writeDownstreamData,
		overflow: func() {
			ex.sendLocalReply(localReply{status: 500, body: "Internal Server Error", details: "response_payload_too_large", source: "hcm"})
		}}
	return ex
}

func (ex *exchange) run() {
	_ = http.NewResponseController(ex.w).EnableFullDuplex()
	ex.p.stats.requests.Add(1)
	ex.buildRequestHeaders()
	headersEOS := ex.r.Body == nil || ex.r.Body == http.NoBody || (ex.r.ContentLength == 0 && len(ex.r.TransferEncoding) == 0)
	ex.requestComplete = headersEOS
	if ex.hcmChecks() {
		ex.mutateRequestHeaders()
		if !headersEOS {
			ex.readerDone = make(chan struct{})
			go ex.readDownstream()
		}
		ex.decodeHeaders(headersEOS)
	}
	for !ex.finished {
		select {
		case e := <-ex.events:
			ex.handle(e)
		case <-ex.r.Context().Done():
			// Downstream went away: Envoy destroys the stream.
			ex.details = "downstream_remote_disconnect"
			ex.finished = true
			ex.resetDownstream = true
		}
	}
	ex.destroy()
	ex.awaitDownstreamReader()
	if ex.resetDownstream {
		ex.p.stats.downstreamResets.Add(1)
		// Abort the HTTP/1.1 response: the connection is closed mid-message.
		panic(http.ErrAbortHandler)
	}
}

// awaitDownstreamReader waits for readDownstream to stop before the handler
// returns (net/http forbids reading a request body afterwards). A response
// that ended before the request did is followed by Envoy's delayed close:
// the rest of the body is read and discarded for up to delayedCloseTimeout;
// a reset stops reading at once.
func (ex *exchange) awaitDownstreamReader() {
	if ex.readerDone == nil {
		return
	}
	select {
	case <-ex.readerDone:
		return
	default:
	}
	deadline := time.Now()
	if !ex.resetDownstream {
		deadline = deadline.Add(delayedCloseTimeout)
	}
	if err := http.NewResponseController(ex.w).SetReadDeadline(deadline); err != nil {
		return // not served by net/http's server: nothing to wait on safely
	}
	<-ex.readerDone
}

func (ex *exchange) destroy() {
	if ex.ep != nil {
		ex.ep.onDestroy()
	}
	ex.router.cancel()
	close(ex.done)
	if h := ex.p.hooks.OnRequestDone; h != nil {
		path, _ := ex.reqHeaders.get(":path")
		method, _ := ex.reqHeaders.get(":method")
		h(AccessLog{
			RequestID:           ex.requestID,
			Method:              method,
			Path:                path,
			ResponseCode:        ex.status,
			ResponseCodeDetails: ex.details,
			ExtProcStreamOpened: ex.ep != nil && ex.ep.streamEverOpened,
			UpstreamAttempts:    ex.router.attempts,
			DownstreamReset:     ex.resetDownstream,
			Duration:            time.Since(ex.start),
		})
	}
}

func (ex *exchange) handle(e event) {
	switch ev := e.(type) {
	case evDownData:
		if ev.eos {
			ex.requestComplete = true
		}
		ex.dec.onData(ev.data, ev.eos)
	case evDownErr:
		ex.details = "downstream_remote_disconnect"
		ex.finished = true
		ex.resetDownstream = true
	case evGRPCMsg:
		if ex.ep != nil {
			ex.ep.onReceiveMessage(ev.resp)
		}
	case evGRPCEnd:
		if ex.ep != nil {
			ex.ep.onGRPCEnd(ev.err)
		}
	case evMessageTimeout:
		if ex.ep != nil {
			ex.ep.onMessageTimeout(ev)
		}
	default:
		ex.router.handle(e)
	}
}

// delayedCloseTimeout is the HCM's delayed_close_timeout default: after a
// response that ended before the request did, Envoy keeps reading (and
// discarding) for this long before it closes the socket, so a client still
// sending its body gets to read the answer instead of a reset.
const delayedCloseTimeout = time.Second

func (ex *exchange) readDownstream() {
	defer close(ex.readerDone)
	buf := make([]byte, 32<<10)
	var total int64
	for {
		n, err := ex.r.Body.Read(buf)
		if n > 0 {
			total += int64(n)
			// With a content-length the codec knows the last byte ends the
			// message, so the last chunk carries end_stream; a chunked body
			// ends with a separate empty end_stream callback.
			eos := ex.r.ContentLength > 0 && total >= ex.r.ContentLength
			if eos {
				ex.post(evDownData{data: append([]byte(nil), buf[:n]...), eos: true})
				return
			}
			if !ex.post(evDownData{data: append([]byte(nil), buf[:n]...)}) {
				// The stream is over (a local reply, a reset): discard the
				// rest until the deadline awaitDownstreamReader sets.
				_, _ = io.Copy(io.Discard, ex.r.Body)
				return
			}
		}
		if err == io.EOF {
			ex.post(evDownData{eos: true})
			return
		}
		if err != nil {
			ex.post(evDownErr{err: err})
			return
		}
	}
}

// buildRequestHeaders is what the HTTP/1.1 codec puts in the header map.
func (ex *exchange) buildRequestHeaders() {
	r := ex.r
	h := newRequestHeaderMap()
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	h.insert(":authority", r.Host)
	path := r.RequestURI
	if path == "" {
		path = r.URL.RequestURI()
	}
	h.insert(":path", path)
	h.insert(":method", r.Method)
	h.insert(":scheme", scheme)
	h.appendHTTP(r.Header)
	for _, te := range r.TransferEncoding {
		h.addCopy("transfer-encoding", te)
	}
	if strings.EqualFold(headerOr(h, "expect"), "100-continue") {
		// The HCM answers 100-continue itself (proxy_100_continue is off) and
		// drops the header; Go's server sends the 100 when the body is read.
		h.remove("expect")
	}
	ex.isGRPC = strings.HasPrefix(headerOr(h, "content-type"), "application/grpc")
	ex.reqHeaders = h
}

// mutateRequestHeaders is ConnectionManagerUtility::mutateRequestHeaders.
func (ex *exchange) mutateRequestHeaders() {
	r, h := ex.r, ex.reqHeaders
	scheme := headerOr(h, ":scheme")

	// use_remote_address: the peer is appended to x-forwarded-for and the
	// request is external (no address is internal by default).
	edge := ex.rt.cfg.HCM.UseRemoteAddress
	if edge {
		peer, _, err := net.SplitHostPort(r.RemoteAddr)
		if err != nil {
			peer = r.RemoteAddr
		}
		h.addCopy("x-forwarded-for", peer)
		for _, k := range []string{
			"x-envoy-decorator-operation", "x-envoy-downstream-service-cluster", "x-envoy-downstream-service-node",
			"x-envoy-expected-rq-timeout-ms", "x-envoy-force-trace", "x-envoy-internal", "x-envoy-ip-tags",
			"x-envoy-max-retries", "x-envoy-retry-grpc-on", "x-envoy-retry-on", "x-envoy-retriable-status-codes",
			"x-envoy-upstream-alt-stat-name", "x-envoy-upstream-rq-per-try-timeout-ms", "x-envoy-upstream-rq-timeout-ms",
		} {
			h.remove(k)
		}
		h.setCopy("x-forwarded-proto", scheme)
		h.setCopy("x-envoy-external-address", peer)
	} else if !h.has("x-forwarded-proto") {
		h.setCopy("x-forwarded-proto", scheme)
	}
	if ex.rt.generateID {
		id, ok := h.get("x-request-id")
		if !ok || id == "" || (edge && !ex.rt.cfg.HCM.PreserveExternalRequestID) {
			h.setCopy("x-request-id", newUUID())
		}
	}
	ex.requestID, _ = h.get("x-request-id")
}

func headerOr(h *headerMap, k string) string {
	v, _ := h.get(k)
	return v
}

// newUUID returns a random RFC 4122 version 4 UUID, like Envoy's request ids.
func newUUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// decodeHeaders runs the decoder filter chain: header_mutation, jwt_authn,
// ext_proc (through the filter manager), router.
func (ex *exchange) decodeHeaders(eos bool) {
	h := ex.reqHeaders
	if hm := ex.rt.headerMut; hm != nil {
		applyFilterMutations(hm.RequestMutations, h)
	}
	if ex.rt.jwt != nil {
		d := ex.rt.jwt.decodeHeaders(h, ex.dynMeta, ex.p.now())
		if d.denied != nil {
			ex.p.stats.jwtDenied.Add(1)
			realm := fmt.Sprintf("Bearer realm=\"%s://%s%s\"", headerOr(h, ":scheme"), headerOr(h, ":authority"), headerOr(h, ":path"))
			if d.denied.msg != jwtMissing {
				realm += ", error=\"invalid_token\""
			}
			ex.sendLocalReply(localReply{
				status:  d.denied.status,
				body:    d.denied.msg,
				details: jwtDeniedDetails(d.denied.msg),
				source:  "jwt_authn",
				mutate:  func(rh *headerMap) { rh.setCopy("www-authenticate", realm) },
			})
			return
		}
	}
	ex.route = ex.rt.findRoute(headerOr(h, ":authority"), headerOr(h, ":path"))
	ex.dec.onHeaders(h, eos)
}

// clearRouteCache makes the router recompute the route from the (mutated)
// request headers.
func (ex *exchange) clearRouteCache() {
	ex.route = ex.rt.findRoute(headerOr(ex.reqHeaders, ":authority"), headerOr(ex.reqHeaders, ":path"))
}

// sendLocalReply is Envoy's sendLocalReply. The reply goes through the
// encoder filters except ext_proc (skip_ext_proc_on_local_reply).
func (ex *exchange) sendLocalReply(lr localReply) {
	if ex.finished {
		return
	}
	ex.p.stats.localReplies.Add(1)
	ex.details = lr.details
	if hook := ex.p.hooks.OnLocalReply; hook != nil {
		hook(LocalReply{RequestID: ex.requestID, Status: lr.status, Body: lr.body, Details: lr.details, Source: lr.source})
	}
	ex.router.cancel()
	if ex.downstreamHeadersSent {
		// Too late for a reply: reset the downstream stream.
		ex.finished = true
		ex.resetDownstream = true
		return
	}
	h := newResponseHeaderMap()
	h.insert(":status", strconv.Itoa(lr.status))
	if lr.mutate != nil {
		lr.mutate(h)
	}
	body := lr.body
	if ex.isGRPC {
		// gRPC requests get a trailers-only reply with the status mapped.
		code := grpcStatusForHTTP(lr.status)
		if lr.grpcStatus != nil {
			code = *lr.grpcStatus
		}
		h.setCopy(":status", "200")
		h.setCopy("content-type", "application/grpc")
		h.setCopy("grpc-status", strconv.Itoa(int(code)))
		if body != "" {
			h.setCopy("grpc-message", url.PathEscape(body))
		}
		body = ""
	} else if body != "" {
		h.setCopy("content-length", strconv.Itoa(len(body)))
		if !h.has("content-type") {
			h.setCopy("content-type", "text/plain")
		}
	}
	ex.writeDownstreamHeaders(h, body == "")
	if body != "" {
		ex.writeDownstreamData([]byte(body), true)
	}
	ex.finished = true
}

// grpcStatusForHTTP is Grpc::Utility::httpToGrpcStatus.
func grpcStatusForHTTP(code int) uint32 {
	switch code {
	case 400:
		return 13
	case 401:
		return 16
	case 403:
		return 7
	case 404:
		return 12
	case 429, 502, 503, 504:
		return 14
	}
	return 2
}

// writeDownstreamHeaders runs the remaining encoder filters (header_mutation)
// and the HTTP/1.1 codec.
func (ex *exchange) writeDownstreamHeaders(h *headerMap, eos bool) {
	if ex.finished {
		return
	}
	if hm := ex.rt.headerMut; hm != nil {
		applyFilterMutations(hm.ResponseMutations, h)
	}
	h.setCopy("server", ex.rt.serverName)
	code, err := strconv.Atoi(headerOr(h, ":status"))
	if err != nil || code < 100 || code > 999 {
		ex.details = "invalid_status"
		ex.finished = true
		ex.resetDownstream = true
		return
	}
	hdr := ex.w.Header()
	h.toHTTP(hdr)
	if !ex.requestComplete {
		// A response before the request's last byte: HTTP/1 cannot reuse
		// the connection, so the HCM drains it and says so
		// (downstream_rq_response_before_rq_complete).
		hdr.Set("Connection", "close")
	}
	delete(hdr, "Date") // the codec writes its own date, like Envoy's date provider
	if !h.has("content-type") {
		hdr["Content-Type"] = nil // no sniffing: Envoy never adds one
	}
	ex.w.WriteHeader(code)
	ex.status = code
	ex.downstreamHeadersSent = true
	if eos {
		ex.finished = true
		return
	}
	if !h.has("content-length") {
		// Commit the headers now: without a length the body is chunked.
		_ = http.NewResponseController(ex.w).Flush()
	}
}

func (ex *exchange) writeDownstreamData(d []byte, eos bool) {
	if ex.finished {
		return
	}
	if len(d) > 0 {
		if _, err := ex.w.Write(d); err != nil {
			ex.finished = true
			ex.resetDownstream = true
			return
		}
		_ = http.NewResponseController(ex.w).Flush()
	}
	if eos {
		ex.finished = true
	}
}
