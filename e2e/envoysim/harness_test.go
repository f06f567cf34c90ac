package envoysim

import (
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// fakeStream is the server side of one ext_proc stream, driven by a script.
type fakeStream struct {
	t      *testing.T
	srv    extprocv3.ExternalProcessor_ProcessServer
	record *streamRecord
}

// streamRecord is what a fake server saw on one stream.
type streamRecord struct {
	mu       sync.Mutex
	received []*extprocv3.ProcessingRequest
	md       metadata.MD
	// recvErr is the error Recv returned when the script stopped reading
	// (io.EOF or a Canceled status) and ctxErr the stream context's error
	// once it was done.
	recvErr error
	ctxErr  error
	// resetWhileOpen is true when the proxy cancelled the stream while the
	// handler was still running: Recv failed with Canceled, or returned
	// io.EOF (half-close) and the context was cancelled right after.
	resetWhileOpen bool
	done           chan struct{}
}

func (r *streamRecord) messages() []*extprocv3.ProcessingRequest {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]*extprocv3.ProcessingRequest(nil), r.received...)
}

// recv returns the next message, or nil when the stream ended (recording
// how it ended).
func (s *fakeStream) recv() *extprocv3.ProcessingRequest {
	req, err := s.srv.Recv()
	if err != nil {
		reset := status.Code(err) == codes.Canceled
		if errors.Is(err, io.EOF) {
			select {
			case <-s.srv.Context().Done():
				reset = true
			case <-time.After(2 * time.Second):
			}
		}
		s.record.mu.Lock()
		s.record.recvErr = err
		s.record.resetWhileOpen = reset
		s.record.mu.Unlock()
		return nil
	}
	s.record.mu.Lock()
	s.record.received = append(s.record.received, req)
	s.record.mu.Unlock()
	return req
}

func (s *fakeStream) send(resp *extprocv3.ProcessingResponse) {
	_ = s.srv.Send(resp)
}

// drain reads until the proxy ends the stream.
func (s *fakeStream) drain() {
	for s.recv() != nil {
	}
}

// script handles one stream; returning an error ends it with that status
// (nil = OK).
type script func(s *fakeStream) error

// fakeProcessor is a real gRPC ExternalProcessor on loopback whose streams
// run a script.
type fakeProcessor struct {
	extprocv3.UnimplementedExternalProcessorServer
	t      *testing.T
	addr   string
	script atomic.Pointer[script]

	mu      sync.Mutex
	streams []*streamRecord
	opened  chan *streamRecord
}

func requireFakeProcessor(t *testing.T, sc script) *fakeProcessor {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	fp := &fakeProcessor{t: t, addr: ln.Addr().String(), opened: make(chan *streamRecord, 1000)}
	fp.setScript(sc)
	srv := grpc.NewServer()
	extprocv3.RegisterExternalProcessorServer(srv, fp)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)
	return fp
}

func (fp *fakeProcessor) setScript(sc script) { fp.script.Store(&sc) }

func (fp *fakeProcessor) Process(srv extprocv3.ExternalProcessor_ProcessServer) error {
	md, _ := metadata.FromIncomingContext(srv.Context())
	rec := &streamRecord{md: md, done: make(chan struct{})}
	fp.mu.Lock()
	fp.streams = append(fp.streams, rec)
	fp.mu.Unlock()
	fp.opened <- rec
	defer func() {
		go func() {
			<-srv.Context().Done()
			rec.mu.Lock()
			rec.ctxErr = srv.Context().Err()
			rec.mu.Unlock()
			close(rec.done)
		}()
	}()
	return (*fp.script.Load())(&fakeStream{t: fp.t, srv: srv, record: rec})
}

func (fp *fakeProcessor) streamCount() int {
	fp.mu.Lock()
	defer fp.mu.Unlock()
	return len(fp.streams)
}

// nextStream waits for the next stream the proxy opens.
func (fp *fakeProcessor) nextStream(t *testing.T) *streamRecord {
	t.Helper()
	select {
	case r := <-fp.opened:
		return r
	case <-time.After(5 * time.Second):
		t.Fatal("no ext_proc stream was opened")
		return nil
	}
}

func (r *streamRecord) wasReset() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.resetWhileOpen
}

// waitDone waits for the stream to end on the server side.
func (r *streamRecord) waitDone(t *testing.T) {
	t.Helper()
	select {
	case <-r.done:
	case <-time.After(5 * time.Second):
		t.Fatal("ext_proc stream did not end")
	}
}

// continueReply is the empty reply of the matching type.
func continueReply(req *extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse {
	switch req.GetRequest().(type) {
	case *extprocv3.ProcessingRequest_RequestHeaders:
		return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{}}}
	case *extprocv3.ProcessingRequest_ResponseHeaders:
		return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{ResponseHeaders: &extprocv3.HeadersResponse{}}}
	case *extprocv3.ProcessingRequest_RequestBody:
		return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{}}}
	case *extprocv3.ProcessingRequest_ResponseBody:
		return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: &extprocv3.BodyResponse{}}}
	case *extprocv3.ProcessingRequest_RequestTrailers:
		return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestTrailers{RequestTrailers: &extprocv3.TrailersResponse{}}}
	case *extprocv3.ProcessingRequest_ResponseTrailers:
		return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseTrailers{ResponseTrailers: &extprocv3.TrailersResponse{}}}
	}
	return &extprocv3.ProcessingResponse{}
}

// replyAll answers every message with the matching empty reply; optional
// hooks can replace the reply per message.
func replyAll(hooks ...func(req *extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse) script {
	return func(s *fakeStream) error {
		for {
			req := s.recv()
			if req == nil {
				return nil
			}
			var resp *extprocv3.ProcessingResponse
			for _, h := range hooks {
				if resp = h(req); resp != nil {
					break
				}
			}
			if resp == nil {
				resp = continueReply(req)
			}
			s.send(resp)
		}
	}
}

func headersReply(dir direction, cr *extprocv3.CommonResponse) *extprocv3.ProcessingResponse {
	if dir == dirRequest {
		return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{Response: cr}}}
	}
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{ResponseHeaders: &extprocv3.HeadersResponse{Response: cr}}}
}

func bodyReply(dir direction, cr *extprocv3.CommonResponse) *extprocv3.ProcessingResponse {
	if dir == dirRequest {
		return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{Response: cr}}}
	}
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: &extprocv3.BodyResponse{Response: cr}}}
}

func immediate(code int, body string, details string) *extprocv3.ProcessingResponse {
	ir := &extprocv3.ImmediateResponse{Body: []byte(body), Details: details}
	if code != 0 {
		ir.Status = statusOf(code)
	}
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{ImmediateResponse: ir}}
}

func statusOf(code int) *typev3.HttpStatus { return &typev3.HttpStatus{Code: typev3.StatusCode(code)} }

func setHeader(key, raw string) *corev3.HeaderValueOption {
	return &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: key, RawValue: []byte(raw)}}
}

func appendHeader(key, raw string) *corev3.HeaderValueOption {
	return &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: key, RawValue: []byte(raw)}, Append: wrapperspb.Bool(true)}
}

func isRequestHeaders(req *extprocv3.ProcessingRequest) bool { return req.GetRequestHeaders() != nil }
func isRequestBody(req *extprocv3.ProcessingRequest) bool    { return req.GetRequestBody() != nil }
func isResponseHeaders(req *extprocv3.ProcessingRequest) bool {
	return req.GetResponseHeaders() != nil
}
func isResponseBody(req *extprocv3.ProcessingRequest) bool { return req.GetResponseBody() != nil }

// headerValues turns a HeaderMap into ordered key/raw pairs; value-only
// entries would show up with an empty raw value.
func headerValues(hm *corev3.HeaderMap) [][2]string {
	var out [][2]string
	for _, h := range hm.GetHeaders() {
		out = append(out, [2]string{h.GetKey(), string(h.GetRawValue())})
	}
	return out
}

func headerGet(hm *corev3.HeaderMap, key string) (string, bool) {
	for _, h := range hm.GetHeaders() {
		if h.GetKey() == key {
			return string(h.GetRawValue()), true
		}
	}
	return "", false
}

// upstreamRecord is one request the fake upstream received.
type upstreamRecord struct {
	method, path, host string
	header             http.Header
	body               []byte
	contentLength      int64
	transferEncoding   []string
}

// fakeUpstream records requests and answers with handler (default: 200
// "upstream-ok" with a content-length).
type fakeUpstream struct {
	srv     *httptest.Server
	mu      sync.Mutex
	reqs    []upstreamRecord
	handler atomic.Pointer[http.HandlerFunc]
	hits    atomic.Int64
}

func requireFakeUpstream(t *testing.T) *fakeUpstream {
	t.Helper()
	fu := &fakeUpstream{}
	fu.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fu.hits.Add(1)
		body, _ := io.ReadAll(r.Body)
		fu.mu.Lock()
		fu.reqs = append(fu.reqs, upstreamRecord{method: r.Method, path: r.URL.RequestURI(), host: r.Host,
			header: r.Header.Clone(), body: body, contentLength: r.ContentLength, transferEncoding: r.TransferEncoding})
		fu.mu.Unlock()
		if h := fu.handler.Load(); h != nil {
			(*h)(w, r)
			return
		}
		w.Header().Set("Content-Type", "text/plain")
		w.Header().Set("Content-Length", "11")
		_, _ = io.WriteString(w, "upstream-ok")
	}))
	t.Cleanup(fu.srv.Close)
	return fu
}

func (fu *fakeUpstream) setHandler(h http.HandlerFunc) { fu.handler.Store(&h) }

func (fu *fakeUpstream) requests() []upstreamRecord {
	fu.mu.Lock()
	defer fu.mu.Unlock()
	return append([]upstreamRecord(nil), fu.reqs...)
}

// testEnv is a proxy wired to a fake ext_proc server and a fake upstream.
type testEnv struct {
	proxy    *Proxy
	url      string
	fp       *fakeProcessor
	upstream *fakeUpstream

	mu      sync.Mutex
	logs    []AccessLog
	replies []LocalReply
	attempt []UpstreamRequest
}

// baseConfig: ext_proc on cluster "extproc", one catch-all route to "app".
func baseConfig(fpAddr, upstreamAddr string) Config {
	timeout := 2 * time.Second
	return Config{
		ExtProc: &ExtProc{
			GRPCService:    GRPCService{ClusterName: "extproc"},
			MessageTimeout: &timeout,
		},
		VirtualHosts: []VirtualHost{{
			Name:    "all",
			Domains: []string{"*"},
			Routes:  []Route{{Name: "catch-all", Match: RouteMatch{Prefix: "/"}, Cluster: "app"}},
		}},
		Clusters: map[string]Cluster{
			"extproc": {Address: fpAddr, HTTP2: true},
			"app":     {Address: upstreamAddr},
		},
	}
}

func requireEnv(t *testing.T, sc script, mutate func(*Config)) *testEnv {
	t.Helper()
	fp := requireFakeProcessor(t, sc)
	fu := requireFakeUpstream(t)
	cfg := baseConfig(fp.addr, fu.srv.Listener.Addr().String())
	if mutate != nil {
		mutate(&cfg)
	}
	env := &testEnv{fp: fp, upstream: fu}
	p, err := New(cfg, WithHooks(Hooks{
		OnRequestDone: func(l AccessLog) { env.mu.Lock(); env.logs = append(env.logs, l); env.mu.Unlock() },
		OnLocalReply:  func(l LocalReply) { env.mu.Lock(); env.replies = append(env.replies, l); env.mu.Unlock() },
		OnUpstreamRequest: func(u UpstreamRequest) {
			env.mu.Lock()
			env.attempt = append(env.attempt, u)
			env.mu.Unlock()
		},
	}))
	require.NoError(t, err)
	srv := httptest.NewServer(p)
	t.Cleanup(func() {
		srv.Close()
		require.NoError(t, p.Close())
	})
	env.proxy, env.url = p, srv.URL
	return env
}

func (env *testEnv) accessLogs() []AccessLog {
	env.mu.Lock()
	defer env.mu.Unlock()
	return append([]AccessLog(nil), env.logs...)
}

func (env *testEnv) localReplies() []LocalReply {
	env.mu.Lock()
	defer env.mu.Unlock()
	return append([]LocalReply(nil), env.replies...)
}

// lastLog waits for the access log of the n-th request (1-based).
func (env *testEnv) waitLogs(t *testing.T, n int) []AccessLog {
	t.Helper()
	require.Eventually(t, func() bool { return len(env.accessLogs()) >= n }, 5*time.Second, 2*time.Millisecond)
	return env.accessLogs()
}

type result struct {
	status int
	header http.Header
	body   string
	err    error
}

func (env *testEnv) do(t *testing.T, method, path string, body string, hdr map[string]string) result {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(t.Context(), method, env.url+path, rd)
	require.NoError(t, err)
	for k, v := range hdr {
		if strings.EqualFold(k, "host") {
			req.Host = v
			continue
		}
		req.Header.Set(k, v)
	}
	return doRequest(req)
}

func doRequest(req *http.Request) result {
	client := &http.Client{
		Transport:     &http.Transport{DisableKeepAlives: true},
		Timeout:       10 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	resp, err := client.Do(req)
	if err != nil {
		return result{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return result{status: resp.StatusCode, header: resp.Header, body: string(b), err: err}
}

func durationOf(d time.Duration) *durationpb.Duration { return durationpb.New(d) }

type corev3HVO = corev3.HeaderValueOption
