package envoysim

import (
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// resetReason is Http::StreamResetReason for the cases the router can see.
type resetReason int

const (
	resetConnectionFailure resetReason = iota
	resetConnectionTermination
)

func (r resetReason) text() string {
	if r == resetConnectionFailure {
		return "remote connection failure"
	}
	return "connection termination"
}

func (r resetReason) detail() string {
	if r == resetConnectionFailure {
		return "remote_connection_failure"
	}
	return "connection_termination"
}

type evUpstreamHeaders struct {
	attempt  int
	resp     *http.Response
	decision chan bool
}

type evUpstreamData struct {
	attempt int
	data    []byte
	eos     bool
}

type evUpstreamError struct {
	attempt      int
	reason       resetReason
	afterHeaders bool
}

type evRouteTimeout struct{ gen int }

type evRetry struct{ gen int }

// replayBody is the request body as the router received it; every attempt
// (the first and each retry) reads it from the start.
type replayBody struct {
	mu       sync.Mutex
	cond     *sync.Cond
	data     []byte
	complete bool
}

func newReplayBody() *replayBody {
	b := &replayBody{}
	b.cond = sync.NewCond(&b.mu)
	return b
}

func (b *replayBody) append(d []byte, eos bool) {
	b.mu.Lock()
	b.data = append(b.data, d...)
	b.complete = b.complete || eos
	b.mu.Unlock()
	b.cond.Broadcast()
}

func (b *replayBody) wake() { b.cond.Broadcast() }

// replayReader is deliberately not an io.Seeker or a bytes.Reader: the Go
// transport must not see a replayable body, or it would retry on its own.
type replayReader struct {
	b       *replayBody
	off     int
	stopped *atomic.Bool
}

func (r *replayReader) Read(p []byte) (int, error) {
	r.b.mu.Lock()
	defer r.b.mu.Unlock()
	for r.off == len(r.b.data) && !r.b.complete && !r.stopped.Load() {
		r.b.cond.Wait()
	}
	if r.stopped.Load() {
		return 0, context.Canceled
	}
	if r.off == len(r.b.data) {
		return 0, io.EOF
	}
	n := copy(p, r.b.data[r.off:])
	r.off += n
	return n, nil
}

func (r *replayReader) Close() error { return nil }

type attempt struct {
	id      int
	cancel  context.CancelFunc
	stopped atomic.Bool
	start   time.Time
}

// routerFilter is envoy.filters.http.router for one request.
type routerFilter struct {
	ex *exchange

	route      *compiledRoute
	cluster    Cluster
	headers    *headerMap
	headersEOS bool
	body       *replayBody

	cur              *attempt
	attempts         int
	retriesUsed      int
	retryGen         int
	timer            *time.Timer
	timerGen         int
	responseStarted  bool
	upstreamComplete bool
	started          bool
}

func newRouterFilter(ex *exchange) *routerFilter {
	return &routerFilter{ex: ex, body: newReplayBody()}
}

func (rf *routerFilter) decodeHeaders(h *headerMap, eos bool) {
	ex := rf.ex
	route := ex.route
	if route == nil {
		ex.sendLocalReply(localReply{status: 404, details: "route_not_found", source: "router"})
		return
	}
	if dr := route.route.DirectResponse; dr != nil {
		ex.sendLocalReply(localReply{status: dr.Status, body: dr.Body, details: "direct_response", source: "router"})
		return
	}
	cl, ok := ex.rt.cfg.Clusters[route.route.Cluster]
	if !ok {
		ex.sendLocalReply(localReply{status: 503, details: "cluster_not_found", source: "router"})
		return
	}
	rf.route, rf.cluster, rf.headers, rf.headersEOS = route, cl, h, eos
	rf.started = true
	if route.timeout > 0 && !ex.rt.cfg.Router.SuppressEnvoyHeaders {
		h.setCopy("x-envoy-expected-rq-timeout-ms", strconv.FormatInt(route.timeout.Milliseconds(), 10))
	}
	if eos {
		rf.body.append(nil, true)
		rf.startRouteTimer()
	}
	rf.startAttempt()
}

func (rf *routerFilter) decodeData(d []byte, eos bool) {
	if !rf.started {
		return
	}
	rf.body.append(d, eos)
	if eos {
		rf.startRouteTimer()
	}
}

// startRouteTimer starts the route timeout once the request is complete.
func (rf *routerFilter) startRouteTimer() {
	if rf.route.timeout <= 0 || rf.timer != nil {
		return
	}
	rf.timerGen++
	gen, post := rf.timerGen, rf.ex.post
	rf.timer = time.AfterFunc(rf.route.timeout, func() { post(evRouteTimeout{gen: gen}) })
}

func (rf *routerFilter) stopRouteTimer() {
	if rf.timer != nil {
		rf.timer.Stop()
		rf.timerGen++
	}
}

func (rf *routerFilter) startAttempt() {
	ex := rf.ex
	rf.attempts++
	a := &attempt{id: rf.attempts, start: time.Now()}
	ctx, cancel := context.WithCancel(context.Background())
	a.cancel = cancel
	rf.cur = a

	h := rf.headers
	method := headerOr(h, ":method")
	path := headerOr(h, ":path")
	req := &http.Request{
		Method:     method,
		URL:        &url.URL{Scheme: "http", Host: rf.cluster.Address, Opaque: path},
		Proto:      "HTTP/1.1",
		ProtoMajor: 1,
		ProtoMinor: 1,
		Header:     http.Header{},
		Host:       headerOr(h, ":authority"),
	}
	req = req.WithContext(ctx)
	h.toHTTP(req.Header)
	if _, ok := req.Header["User-Agent"]; !ok {
		req.Header["User-Agent"] = nil // Envoy adds none
	}
	if !rf.headersEOS {
		req.Body = &replayReader{b: rf.body, stopped: &a.stopped}
		req.ContentLength = -1
		if cl, ok := h.get("content-length"); ok {
			if n, err := strconv.ParseInt(cl, 10, 64); err == nil {
				req.ContentLength = n
			}
		}
		if req.ContentLength == 0 {
			req.Body = nil
		}
	} else if cl, ok := h.get("content-length"); ok && cl == "0" {
		req.ContentLength = 0
	}
	ex.p.stats.upstreamRequests.Add(1)
	if hook := ex.p.hooks.OnUpstreamRequest; hook != nil {
		hook(UpstreamRequest{RequestID: ex.requestID, Attempt: a.id, Cluster: rf.route.route.Cluster,
			Method: method, Path: path, Authority: req.Host, Header: req.Header.Clone()})
	}
	transport := ex.p.transport(rf.route.route.Cluster)
	post := ex.post
	go func() {
		resp, err := transport.RoundTrip(req)
		if err != nil {
			if a.stopped.Load() {
				return
			}
			reason := resetConnectionTermination
			var opErr *net.OpError
			if errors.As(err, &opErr) && opErr.Op == "dial" {
				reason = resetConnectionFailure
			}
			post(evUpstreamError{attempt: a.id, reason: reason})
			return
		}
		decision := make(chan bool, 1)
		if !post(evUpstreamHeaders{attempt: a.id, resp: resp, decision: decision}) || !<-decision {
			_ = resp.Body.Close()
			return
		}
		defer resp.Body.Close()
		buf := make([]byte, 32<<10)
		var total int64
		for {
			n, err := resp.Body.Read(buf)
			if n > 0 {
				total += int64(n)
				eos := resp.ContentLength > 0 && total >= resp.ContentLength
				if !post(evUpstreamData{attempt: a.id, data: append([]byte(nil), buf[:n]...), eos: eos}) || eos {
					return
				}
			}
			if err == io.EOF {
				post(evUpstreamData{attempt: a.id, eos: true})
				return
			}
			if err != nil {
				if !a.stopped.Load() {
					post(evUpstreamError{attempt: a.id, reason: resetConnectionTermination, afterHeaders: true})
				}
				return
			}
		}
	}()
}

func (rf *routerFilter) handle(e event) {
	switch ev := e.(type) {
	case evUpstreamHeaders:
		rf.onUpstreamHeaders(ev)
	case evUpstreamData:
		if rf.cur == nil || ev.attempt != rf.cur.id || rf.ex.finished {
			return
		}
		if ev.eos {
			rf.upstreamComplete = true
			rf.stopRouteTimer()
		}
		rf.ex.enc.onData(ev.data, ev.eos)
	case evUpstreamError:
		rf.onUpstreamError(ev)
	case evRouteTimeout:
		if ev.gen != rf.timerGen || rf.ex.finished {
			return
		}
		rf.onRouteTimeout()
	case evRetry:
		if ev.gen != rf.retryGen || rf.ex.finished {
			return
		}
		rf.startAttempt()
	}
}

func (rf *routerFilter) onUpstreamHeaders(ev evUpstreamHeaders) {
	ex := rf.ex
	if rf.cur == nil || ev.attempt != rf.cur.id || ex.finished {
		ev.decision <- false
		return
	}
	code := ev.resp.StatusCode
	if rf.retryOnStatus(code) && rf.retriesLeft() {
		ev.decision <- false
		rf.scheduleRetry()
		return
	}
	ev.decision <- true
	rf.responseStarted = true
	ex.details = "via_upstream"
	h := newResponseHeaderMap()
	h.insert(":status", strconv.Itoa(code))
	h.appendHTTP(ev.resp.Header)
	for _, te := range ev.resp.TransferEncoding {
		h.addCopy("transfer-encoding", te) // the codec keeps it in the map, like for requests
	}
	if !ex.rt.cfg.Router.SuppressEnvoyHeaders {
		h.setCopy("x-envoy-upstream-service-time", strconv.FormatInt(time.Since(rf.cur.start).Milliseconds(), 10))
	}
	eos := ev.resp.ContentLength == 0 || code == http.StatusNoContent || code == http.StatusNotModified ||
		headerOr(rf.headers, ":method") == http.MethodHead
	if eos {
		rf.upstreamComplete = true
		rf.stopRouteTimer()
	}
	ex.enc.onHeaders(h, eos)
}

func (rf *routerFilter) onUpstreamError(ev evUpstreamError) {
	ex := rf.ex
	if rf.cur == nil || ev.attempt != rf.cur.id || ex.finished {
		return
	}
	if !rf.responseStarted {
		if rf.retryOnReset(ev.reason) && rf.retriesLeft() {
			rf.scheduleRetry()
			return
		}
		body := "upstream connect error or disconnect/reset before headers. "
		if rf.retriesUsed > 0 {
			body += "retried and the latest "
		}
		body += "reset reason: " + ev.reason.text()
		ex.sendLocalReply(localReply{status: 503, body: body,
			details: "upstream_reset_before_response_started{" + ev.reason.detail() + "}", source: "router"})
		return
	}
	ex.details = "upstream_reset_after_response_started{" + ev.reason.detail() + "}"
	rf.cancel()
	ex.finished = true
	ex.resetDownstream = true
}

func (rf *routerFilter) onRouteTimeout() {
	ex := rf.ex
	ex.p.logger.Info("envoysim: upstream request timeout", "request_id", ex.requestID, "timeout", rf.route.timeout)
	if rf.responseStarted {
		ex.details = "upstream_response_timeout"
		rf.cancel()
		ex.finished = true
		ex.resetDownstream = true
		return
	}
	ex.sendLocalReply(localReply{status: 504, body: "upstream request timeout", details: "upstream_response_timeout", source: "router"})
}

func (rf *routerFilter) retriesLeft() bool {
	return rf.route.retry != nil && rf.retriesUsed < rf.route.retry.numRetries
}

func (rf *routerFilter) retryOnReset(r resetReason) bool {
	rp := rf.route.retry
	if rp == nil {
		return false
	}
	return rp.on["reset"] || rp.on["5xx"] || rp.on["gateway-error"] ||
		(rp.on["connect-failure"] && r == resetConnectionFailure)
}

func (rf *routerFilter) retryOnStatus(code int) bool {
	rp := rf.route.retry
	if rp == nil {
		return false
	}
	return (rp.on["5xx"] && code >= 500) ||
		(rp.on["gateway-error"] && (code == 502 || code == 503 || code == 504)) ||
		(rp.on["retriable-status-codes"] && rp.codes[code])
}

// scheduleRetry abandons the current attempt and starts another after
// Envoy's jittered exponential back-off.
func (rf *routerFilter) scheduleRetry() {
	rf.stopAttempt()
	rf.cur = nil
	rf.retriesUsed++
	rf.ex.p.stats.upstreamRetries.Add(1)
	rp := rf.route.retry
	ceiling := time.Duration((1<<min(rf.retriesUsed, 30))-1) * rp.base
	var backoff time.Duration
	if ceiling > 0 {
		backoff = min(time.Duration(rand.Int64N(int64(ceiling))), rp.limit)
	}
	rf.retryGen++
	gen, post := rf.retryGen, rf.ex.post
	time.AfterFunc(backoff, func() { post(evRetry{gen: gen}) })
}

func (rf *routerFilter) stopAttempt() {
	if rf.cur != nil {
		rf.cur.stopped.Store(true)
		rf.cur.cancel()
		rf.body.wake()
	}
}

// cancel resets whatever is in flight upstream (local reply, destroy).
func (rf *routerFilter) cancel() {
	rf.stopRouteTimer()
	rf.retryGen++
	rf.stopAttempt()
	rf.cur = nil
}
