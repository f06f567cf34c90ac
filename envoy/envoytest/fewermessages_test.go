package envoytest

// Experiments with the pinned Envoy for issue 32: what a guarded request
// would cost and risk if ext_proc skipped the header messages and read the
// path, method and subject from request_attributes (and the status from
// response_attributes). Each case pins one behaviour docs/performance.md
// ("Fewer messages per stream") relies on; if Envoy changes, these fail.

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/structpb"
)

// sentMessage is one ProcessingRequest as the recording processor saw it.
type sentMessage struct {
	kind     string // request_headers, request_body, response_headers, response_body, ...
	eos      bool
	protocol bool              // protocol_config was set
	attrs    map[string]string // the envoy.filters.http.ext_proc attributes, printed
	attrNS   string            // the key the attributes came under
	// upstreamFirst: the upstream had the request before this message was
	// answered (only measured for a refusal).
	upstreamFirst bool
}

// recordingProcessor records every stream's messages and answers each with
// CONTINUE, adding on the body replies the header mutations idemgate makes:
// request body -> set idempotency-key, remove idempotency-fingerprint;
// response body -> set idempotency-fingerprint.
type recordingProcessor struct {
	extprocv3.UnimplementedExternalProcessorServer
	mu      sync.Mutex
	streams [][]sentMessage
	// upstreamArrived is signalled by the upstream when a request to a
	// .../refuse path arrives.
	upstreamArrived chan struct{}
}

func (p *recordingProcessor) Process(s extprocv3.ExternalProcessor_ProcessServer) error {
	p.mu.Lock()
	i := len(p.streams)
	p.streams = append(p.streams, nil)
	p.mu.Unlock()
	var reqPath string // from the request attributes, for the whole stream
	for {
		req, err := s.Recv()
		if err != nil {
			return nil // Envoy closed or reset the stream
		}
		m := sentMessage{protocol: req.GetProtocolConfig() != nil, attrs: map[string]string{}}
		for ns, st := range req.GetAttributes() {
			m.attrNS = ns
			for k, v := range st.GetFields() {
				switch kv := v.GetKind().(type) {
				case *structpb.Value_NumberValue:
					m.attrs[k] = fmt.Sprint(kv.NumberValue)
				case *structpb.Value_BoolValue:
					m.attrs[k] = fmt.Sprint(kv.BoolValue)
				default:
					m.attrs[k] = v.GetStringValue()
				}
			}
		}
		if p, ok := m.attrs["request.path"]; ok {
			reqPath = p
		}
		var resp *extprocv3.ProcessingResponse
		switch r := req.Request.(type) {
		case *extprocv3.ProcessingRequest_RequestHeaders:
			m.kind, m.eos = "request_headers", r.RequestHeaders.GetEndOfStream()
			resp = &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{}}}
			for _, h := range r.RequestHeaders.GetHeaders().GetHeaders() {
				if h.GetKey() == ":path" && strings.HasSuffix(string(h.GetRawValue()), "/override") {
					// What a body-only preview asks at its request headers.
					resp.ModeOverride = &filterv3.ProcessingMode{
						ResponseHeaderMode:  filterv3.ProcessingMode_SKIP,
						RequestBodyMode:     filterv3.ProcessingMode_BUFFERED,
						ResponseBodyMode:    filterv3.ProcessingMode_BUFFERED,
						RequestTrailerMode:  filterv3.ProcessingMode_SKIP,
						ResponseTrailerMode: filterv3.ProcessingMode_SKIP,
					}
				}
			}
		case *extprocv3.ProcessingRequest_RequestBody:
			m.kind, m.eos = "request_body", r.RequestBody.GetEndOfStream()
			if strings.HasSuffix(m.attrs["request.path"], "/refuse") {
				// Before refusing, wait (bounded) for the upstream to see
				// the request: if it does, Envoy forwarded it before this
				// reply.
				select {
				case <-p.upstreamArrived:
					m.upstreamFirst = true
				case <-time.After(2 * time.Second):
				}
				resp = &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{ImmediateResponse: &extprocv3.ImmediateResponse{
					Status: &typev3.HttpStatus{Code: typev3.StatusCode_Conflict}, Body: []byte(`{"status":"refused"}`),
				}}}
				break
			}
			resp = &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{
				Response: &extprocv3.CommonResponse{HeaderMutation: &extprocv3.HeaderMutation{
					SetHeaders:    []*corev3.HeaderValueOption{{Header: &corev3.HeaderValue{Key: "idempotency-key", RawValue: []byte("k-1")}}},
					RemoveHeaders: []string{"idempotency-fingerprint"},
				}},
			}}}
		case *extprocv3.ProcessingRequest_ResponseHeaders:
			m.kind, m.eos = "response_headers", r.ResponseHeaders.GetEndOfStream()
			resp = &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{ResponseHeaders: &extprocv3.HeadersResponse{}}}
		case *extprocv3.ProcessingRequest_ResponseBody:
			m.kind, m.eos = "response_body", r.ResponseBody.GetEndOfStream()
			if strings.HasSuffix(reqPath, "/replace") {
				// What a confirm does with an upstream answer it must not
				// pass on: replace it.
				resp = &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{ImmediateResponse: &extprocv3.ImmediateResponse{
					Status: &typev3.HttpStatus{Code: typev3.StatusCode_BadGateway}, Body: []byte(`{"status":"replaced"}`),
				}}}
				break
			}
			cr := &extprocv3.CommonResponse{HeaderMutation: &extprocv3.HeaderMutation{
				SetHeaders: []*corev3.HeaderValueOption{{Header: &corev3.HeaderValue{Key: "idempotency-fingerprint", RawValue: []byte("fp-1")}}},
			}}
			if strings.HasSuffix(reqPath, "/rewrite") {
				// What a preview does: the fingerprint written into the
				// body (and content-length set to the new length).
				nb := []byte(`{"id":"p-1","fingerprint":"fp-1"}`)
				cr.HeaderMutation.SetHeaders = append(cr.HeaderMutation.SetHeaders, &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: "content-length", RawValue: []byte(fmt.Sprint(len(nb)))}})
				cr.BodyMutation = &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_Body{Body: nb}}
			}
			resp = &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: &extprocv3.BodyResponse{Response: cr}}}
		default:
			m.kind = fmt.Sprintf("%T", req.Request)
		}
		p.mu.Lock()
		p.streams[i] = append(p.streams[i], m)
		p.mu.Unlock()
		if resp == nil {
			return nil
		}
		if err := s.Send(resp); err != nil {
			return nil
		}
	}
}

func (p *recordingProcessor) snapshot() [][]sentMessage {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([][]sentMessage, len(p.streams))
	for i, s := range p.streams {
		out[i] = append([]sentMessage(nil), s...)
	}
	return out
}

// upstreamSaw is one request as the upstream received it.
type upstreamSaw struct {
	method, path, key, fingerprint, body string
}

type recordingUpstream struct {
	mu      sync.Mutex
	seen    []upstreamSaw
	arrived chan<- struct{}
}

func (u *recordingUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if strings.HasSuffix(r.URL.Path, "/refuse") {
		select {
		case u.arrived <- struct{}{}:
		default:
		}
	}
	b, _ := io.ReadAll(r.Body)
	u.mu.Lock()
	u.seen = append(u.seen, upstreamSaw{r.Method, r.URL.Path, r.Header.Get("Idempotency-Key"), r.Header.Get("Idempotency-Fingerprint"), string(b)})
	u.mu.Unlock()
	if strings.HasSuffix(r.URL.Path, "/no-content") {
		w.WriteHeader(http.StatusNoContent)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write([]byte(`{"id":"p-1"}`))
}

func (u *recordingUpstream) count() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return len(u.seen)
}

func (u *recordingUpstream) last() upstreamSaw {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.seen[len(u.seen)-1]
}

// fewerMessagesBootstrap is an Envoy with one ext_proc filter in the
// reduced mode under study: both header messages skipped, both bodies
// buffered, what idemgate reads from the headers asked for as attributes.
func fewerMessagesBootstrap(procAddr, upstreamAddr string, requestHeaderMode, responseHeaderMode string, composite bool) string {
	ph, pp, _ := net.SplitHostPort(procAddr)
	uh, up, _ := net.SplitHostPort(upstreamAddr)
	return fmt.Sprintf(`admin: {address: {socket_address: {address: 127.0.0.1, port_value: 0}}}
static_resources:
  listeners:
  - name: in
    address: {socket_address: {address: 127.0.0.1, port_value: 0}}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: in
          codec_type: AUTO
          route_config:
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes:
              - match: {prefix: /}
                route: {cluster: upstream}
          http_filters:
%s          - name: envoy.filters.http.router
            typed_config: {"@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router}
  clusters:
  - name: upstream
    type: STATIC
    connect_timeout: 1s
    load_assignment:
      cluster_name: upstream
      endpoints: [{lb_endpoints: [{endpoint: {address: {socket_address: {address: %s, port_value: %s}}}}]}]
  - name: proc
    type: STATIC
    connect_timeout: 1s
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config: {http2_protocol_options: {}}
    load_assignment:
      cluster_name: proc
      endpoints: [{lb_endpoints: [{endpoint: {address: {socket_address: {address: %s, port_value: %s}}}}]}]
`, extProcFilter(requestHeaderMode, responseHeaderMode, composite), uh, up, ph, pp)
}

// extProcFilter is the ext_proc filter under study, as an HCM http_filters
// entry: plain, or (composite) run by a composite filter whose matcher
// selects every request, as idemgate envoy-config writes it.
func extProcFilter(requestHeaderMode, responseHeaderMode string, composite bool) string {
	plain := fmt.Sprintf(`          - name: idemgate-under-test
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor
              grpc_service: {envoy_grpc: {cluster_name: proc}}
              failure_mode_allow: false
              message_timeout: 5s
              allow_mode_override: true
              processing_mode:
                request_header_mode: %[1]s
                response_header_mode: %[2]s
                request_body_mode: BUFFERED
                response_body_mode: BUFFERED
                request_trailer_mode: SKIP
                response_trailer_mode: SKIP
              request_attributes: [request.path, request.method, request.id, "request.headers['x-subject']", "request.headers['content-type']"]
              response_attributes: [response.code]
`, requestHeaderMode, responseHeaderMode)
	if !composite {
		return plain
	}
	// The same typed_config, as the composite's action.
	_, cfg, _ := strings.Cut(plain, "            typed_config:\n")
	var inner strings.Builder
	for _, line := range strings.Split(strings.TrimRight(cfg, "\n"), "\n") {
		inner.WriteString("                " + line + "\n")
	}
	return `          - name: idemgate-under-test
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.common.matching.v3.ExtensionWithMatcher
              xds_matcher:
                matcher_list:
                  matchers:
                  - predicate:
                      single_predicate:
                        input:
                          name: request-path
                          typed_config: {"@type": type.googleapis.com/envoy.type.matcher.v3.HttpRequestHeaderMatchInput, header_name: ":path"}
                        value_match: {prefix: /}
                    on_match:
                      action:
                        name: run-ext-proc
                        typed_config:
                          "@type": type.googleapis.com/envoy.extensions.filters.http.composite.v3.ExecuteFilterAction
                          typed_config:
                            name: envoy.filters.http.ext_proc
                            typed_config:
` + inner.String() + `              extension_config:
                name: envoy.filters.http.composite
                typed_config: {"@type": type.googleapis.com/envoy.extensions.filters.http.composite.v3.Composite}
`
}

// fewerMessagesRig is the pinned Envoy between a recording upstream and a
// recording processor.
type fewerMessagesRig struct {
	envoy    *Envoy
	proc     *recordingProcessor
	upstream *recordingUpstream
	h1, h2   *http.Client
}

func startFewerMessagesRig(t *testing.T, responseHeaderMode string) *fewerMessagesRig {
	t.Helper()
	return startRig(t, "SKIP", responseHeaderMode)
}

// startRig is the rig with both header modes chosen.
func startRig(t *testing.T, requestHeaderMode, responseHeaderMode string) *fewerMessagesRig {
	t.Helper()
	return startRigWith(t, requestHeaderMode, responseHeaderMode, false)
}

// startRigWith is startRig, the filter run by a composite when composite
// is set.
func startRigWith(t *testing.T, requestHeaderMode, responseHeaderMode string, composite bool) *fewerMessagesRig {
	t.Helper()
	bin := RequireEnvoy(t)
	arrived := make(chan struct{}, 1)
	r := &fewerMessagesRig{proc: &recordingProcessor{upstreamArrived: arrived}, upstream: &recordingUpstream{arrived: arrived}}

	pl, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	gs := grpc.NewServer()
	extprocv3.RegisterExternalProcessorServer(gs, r.proc)
	go func() { _ = gs.Serve(pl) }()
	t.Cleanup(gs.Stop)

	ul, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	us := &http.Server{Handler: r.upstream, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = us.Serve(ul) }()
	t.Cleanup(func() { _ = us.Close() })

	// Start's error carries Envoy's last lines.
	e, err := Start(t.Context(), Options{Bin: bin, Bootstrap: []byte(fewerMessagesBootstrap(pl.Addr().String(), ul.Addr().String(), requestHeaderMode, responseHeaderMode, composite)),
		Dir: t.TempDir(), Listener: "in"})
	require.NoError(t, err)
	t.Cleanup(e.Kill)
	r.envoy = e

	r.h1 = &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	h2 := &http.Transport{Protocols: new(http.Protocols)}
	h2.Protocols.SetUnencryptedHTTP2(true)
	r.h2 = &http.Client{Timeout: 10 * time.Second, Transport: h2}
	t.Cleanup(h2.CloseIdleConnections)
	return r
}

// exchange is what one request through the rig produced.
type fewerMessagesExchange struct {
	status      int
	fingerprint string // the response's Idempotency-Fingerprint header
	body        string
	streams     [][]sentMessage // streams opened by this request
	msgsSent    int64           // Envoy's ext_proc stream_msgs_sent for it
	reachedUp   bool
	up          upstreamSaw
}

func (r *fewerMessagesRig) do(t *testing.T, c *http.Client, req *http.Request) fewerMessagesExchange {
	t.Helper()
	before := len(r.proc.snapshot())
	sentBefore := r.stat(t, "stream_msgs_sent")
	upBefore := r.upstream.count()
	resp, err := c.Do(req)
	require.NoError(t, err)
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	_ = resp.Body.Close()
	x := fewerMessagesExchange{status: resp.StatusCode, fingerprint: resp.Header.Get("Idempotency-Fingerprint"), body: string(b)}
	// Envoy counts a message when it sends it, before the answer reaches
	// the client; the recorder's slice is complete once the reply was sent.
	x.msgsSent = r.stat(t, "stream_msgs_sent") - sentBefore
	x.streams = r.proc.snapshot()[before:]
	if r.upstream.count() > upBefore {
		x.reachedUp, x.up = true, r.upstream.last()
	}
	return x
}

func (r *fewerMessagesRig) stat(t *testing.T, name string) int64 {
	t.Helper()
	n, err := r.envoy.Stat("http.in.ext_proc." + name)
	require.NoError(t, err)
	return n
}

func (r *fewerMessagesRig) url(path string) string { return "http://" + r.envoy.ListenAddr + path }

func newRequest(t *testing.T, method, url string, body io.Reader, h map[string]string) *http.Request {
	t.Helper()
	req, err := http.NewRequest(method, url, body)
	require.NoError(t, err)
	for k, v := range h {
		req.Header.Set(k, v)
	}
	return req
}

// unsized hides a body's length from net/http: HTTP/1.1 sends it chunked,
// HTTP/2 without content-length.
type unsized struct{ io.Reader }

func kinds(s []sentMessage) []string {
	out := make([]string, len(s))
	for i, m := range s {
		out[i] = m.kind
	}
	return out
}

// TestFewerMessagesBodylessRequestsReachTheUpstreamUnchecked pins the trap
// of skipping the request-headers message: a request without a body
// produces no body message, so with request_header_mode SKIP Envoy sends
// idemgate nothing about the request and forwards it unchecked; the
// processor first hears of it from the upstream's answer. A reduced mode
// may therefore only serve requests that certainly carry a body.
func TestFewerMessagesBodylessRequestsReachTheUpstreamUnchecked(t *testing.T) {
	r := startFewerMessagesRig(t, "SKIP")
	hdr := map[string]string{"x-subject": "alice", "Idempotency-Fingerprint": "fp-client"}
	cases := []struct {
		name string
		c    *http.Client
		req  *http.Request
	}{
		{"HTTP/1.1 POST content-length 0", r.h1, newRequest(t, http.MethodPost, r.url("/v1/payments/confirm"), http.NoBody, hdr)},
		{"HTTP/1.1 GET", r.h1, newRequest(t, http.MethodGet, r.url("/v1/payments/confirm"), nil, hdr)},
		{"HTTP/1.1 DELETE", r.h1, newRequest(t, http.MethodDelete, r.url("/v1/payments/confirm"), nil, hdr)},
		{"HTTP/2 POST, HEADERS with END_STREAM", r.h2, newRequest(t, http.MethodPost, r.url("/v1/payments/confirm"), http.NoBody, hdr)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			x := r.do(t, tc.c, tc.req)
			// The response body (BUFFERED) still opens a stream, but only
			// after the upstream answered: its first message is the
			// response body, and no request message was ever sent.
			require.Len(t, x.streams, 1)
			require.Equal(t, []string{"response_body"}, kinds(x.streams[0]), "no request message at all")
			require.True(t, x.streams[0][0].protocol, "protocol_config on the first message of the stream")
			require.Equal(t, int64(1), x.msgsSent)
			require.Equal(t, http.StatusOK, x.status)
			require.True(t, x.reachedUp, "the request reaches the upstream unchecked")
			require.Equal(t, "fp-client", x.up.fingerprint, "and unchanged: no mutation could be made")
			require.Empty(t, x.up.key)
		})
	}
}

// TestFewerMessagesOneMessagePerDirection pins what the reduced mode gives a
// request with a body: one request_body message carrying protocol_config
// and the request attributes, and one response_body message carrying
// response.code. The header mutations of both body replies are dropped:
// Envoy applies a body reply's header mutation only to headers it holds,
// and with the header mode SKIP it holds none.
func TestFewerMessagesOneMessagePerDirection(t *testing.T) {
	r := startFewerMessagesRig(t, "SKIP")
	body := `{"amount":100}`
	hdr := map[string]string{"x-subject": "alice", "Idempotency-Fingerprint": "fp-client", "Content-Type": "application/json"}
	cases := []struct {
		name string
		c    *http.Client
		req  *http.Request
	}{
		{"HTTP/1.1 content-length", r.h1, newRequest(t, http.MethodPost, r.url("/v1/payments/confirm"), strings.NewReader(body), hdr)},
		{"HTTP/1.1 chunked", r.h1, newRequest(t, http.MethodPost, r.url("/v1/payments/confirm"), unsized{strings.NewReader(body)}, hdr)},
		{"HTTP/2 content-length", r.h2, newRequest(t, http.MethodPost, r.url("/v1/payments/confirm"), strings.NewReader(body), hdr)},
		{"HTTP/2 without content-length", r.h2, newRequest(t, http.MethodPost, r.url("/v1/payments/confirm"), unsized{strings.NewReader(body)}, hdr)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			x := r.do(t, tc.c, tc.req)
			require.Equal(t, http.StatusOK, x.status, x.body)
			require.Len(t, x.streams, 1)
			s := x.streams[0]
			require.Equal(t, []string{"request_body", "response_body"}, kinds(s))
			require.Equal(t, int64(2), x.msgsSent)

			rb := s[0]
			require.True(t, rb.eos)
			require.True(t, rb.protocol, "protocol_config rides on the first message, the body")
			require.Equal(t, "/v1/payments/confirm", rb.attrs["request.path"])
			require.Equal(t, "POST", rb.attrs["request.method"])
			require.Equal(t, "alice", rb.attrs["request.headers['x-subject']"])
			require.Equal(t, "application/json", rb.attrs["request.headers['content-type']"])
			require.NotEmpty(t, rb.attrs["request.id"], "x-request-id, generated by the HCM")

			require.True(t, x.reachedUp)
			require.Equal(t, body, x.up.body)
			// The trap for a confirm: without the headers message there are
			// no held headers, and Envoy ignores the body reply's header
			// mutation (set and remove alike).
			require.Empty(t, x.up.key, "a header set on the body reply does NOT reach the upstream")
			require.Equal(t, "fp-client", x.up.fingerprint, "a header removed on the body reply is still there upstream")

			sb := s[1]
			require.Equal(t, "200", sb.attrs["response.code"])
			require.False(t, sb.protocol)
			require.Empty(t, x.fingerprint, "a header set on the response body reply does NOT reach the client")
		})
	}
}

// TestFewerMessagesBodylessResponseSendsNothing pins the response-side trap:
// with response_header_mode SKIP a bodiless answer (204) produces no
// response message, so a confirm would never learn its outcome; with
// response headers sent, it does.
func TestFewerMessagesBodylessResponseSendsNothing(t *testing.T) {
	body := `{"amount":100}`
	hdr := map[string]string{"x-subject": "alice", "Content-Type": "application/json"}

	t.Run("response headers skipped", func(t *testing.T) {
		r := startFewerMessagesRig(t, "SKIP")
		x := r.do(t, r.h1, newRequest(t, http.MethodPost, r.url("/v1/payments/no-content"), strings.NewReader(body), hdr))
		require.Equal(t, http.StatusNoContent, x.status)
		require.True(t, x.reachedUp)
		require.Len(t, x.streams, 1)
		require.Equal(t, []string{"request_body"}, kinds(x.streams[0]), "the 204 is never shown to the processor")
		require.Equal(t, int64(1), x.msgsSent)
	})
	t.Run("response headers sent", func(t *testing.T) {
		r := startFewerMessagesRig(t, "SEND")
		x := r.do(t, r.h1, newRequest(t, http.MethodPost, r.url("/v1/payments/no-content"), strings.NewReader(body), hdr))
		require.Equal(t, http.StatusNoContent, x.status)
		require.Len(t, x.streams, 1)
		s := x.streams[0]
		require.Equal(t, []string{"request_body", "response_headers"}, kinds(s))
		require.True(t, s[1].eos)
		require.Equal(t, "204", s[1].attrs["response.code"], "response attributes ride on the first response message")

		y := r.do(t, r.h1, newRequest(t, http.MethodPost, r.url("/v1/payments/confirm"), strings.NewReader(body), hdr))
		require.Equal(t, []string{"request_body", "response_headers", "response_body"}, kinds(y.streams[0]))
		require.Equal(t, int64(3), y.msgsSent)
		require.Empty(t, y.streams[0][2].attrs, "attributes are sent once per direction")
	})
}

// TestFewerMessagesRefusalOnTheBodyComesTooLate pins why the request
// headers message cannot go: a refusal answered to the first (body)
// message does NOT keep the request from the upstream. With header mode
// SKIP and body BUFFERED, Envoy forwards the headers before the body reply.
func TestFewerMessagesRefusalOnTheBodyComesTooLate(t *testing.T) {
	r := startFewerMessagesRig(t, "SKIP")
	hdr := map[string]string{"x-subject": "alice", "Content-Type": "application/json"}
	for _, c := range []*http.Client{r.h1, r.h2} {
		upBefore := r.upstream.count()
		x := r.do(t, c, newRequest(t, http.MethodPost, r.url("/v1/payments/refuse"), strings.NewReader(`{"amount":100}`), hdr))
		require.Equal(t, http.StatusConflict, x.status)
		require.JSONEq(t, `{"status":"refused"}`, x.body)
		// The trap that rules the request-side reduction out: with no
		// headers message Envoy holds nothing back. The request line and
		// headers reach the upstream at once; only the body waits for the
		// reply, and the refusal resets an upstream request that a handler
		// acting on headers alone has already executed.
		require.True(t, x.streams[0][0].upstreamFirst, "the upstream had the request before idemgate's answer to its first message")
		require.Eventually(t, func() bool { return r.upstream.count() > upBefore },
			5*time.Second, 10*time.Millisecond, "the upstream handler ran")
		require.Equal(t, "/v1/payments/refuse", r.upstream.last().path)
		require.Empty(t, r.upstream.last().body, "without the body, which Envoy held")
		require.Len(t, x.streams, 1)
		require.Equal(t, []string{"request_body"}, kinds(x.streams[0]), "one message, then the refusal")
		require.Equal(t, int64(1), x.msgsSent)
	}
}

// TestFewerMessagesResponseChangedFromItsBody pins what a processor that
// sees only the response body (response headers skipped) can still change.
// With response headers sent, Envoy holds them until the body reply: the
// answer can be replaced (a confirm's envelope) and the body rewritten with
// a header added (a preview). With them skipped Envoy holds nothing: the
// status and headers are on their way to the client when the body message
// is sent, so a replacement becomes a reset after a 200, and a rewritten
// body arrives (chunked: content-length was stripped) without the header.
func TestFewerMessagesResponseChangedFromItsBody(t *testing.T) {
	hdr := map[string]string{"x-subject": "alice", "Content-Type": "application/json"}
	for _, mode := range []string{"SEND", "SKIP"} {
		t.Run("response headers "+mode, func(t *testing.T) {
			r := startFewerMessagesRig(t, mode)

			resp, err := r.h1.Do(newRequest(t, http.MethodPost, r.url("/v1/payments/replace"), strings.NewReader(`{"amount":100}`), hdr))
			require.NoError(t, err)
			b, err := io.ReadAll(resp.Body)
			_ = resp.Body.Close()
			if mode == "SEND" {
				require.NoError(t, err)
				require.Equal(t, http.StatusBadGateway, resp.StatusCode)
				require.JSONEq(t, `{"status":"replaced"}`, string(b))
			} else {
				require.Equal(t, http.StatusOK, resp.StatusCode, "the upstream's status went out before the body reply")
				require.Error(t, err, "then the stream is reset")
				require.NotContains(t, string(b), "replaced")
			}

			x := r.do(t, r.h1, newRequest(t, http.MethodPost, r.url("/v1/payments/rewrite"), strings.NewReader(`{"amount":100}`), hdr))
			require.Equal(t, http.StatusOK, x.status)
			require.JSONEq(t, `{"id":"p-1","fingerprint":"fp-1"}`, x.body, "the body rewrite arrives in both modes")
			if mode == "SEND" {
				require.Equal(t, "fp-1", x.fingerprint)
			} else {
				require.Empty(t, x.fingerprint, "the header set with it does not")
			}
		})
	}
}

// TestFewerMessagesResponseHeadersSkippedByOverride pins what a body-only
// preview relies on: with both header modes SEND at filter level, a
// mode_override in the request-headers reply skips the response headers;
// the response body message then carries response.code.
func TestFewerMessagesResponseHeadersSkippedByOverride(t *testing.T) {
	for _, composite := range []bool{false, true} {
		t.Run(fmt.Sprintf("composite=%v", composite), func(t *testing.T) {
			r := startRigWith(t, "SEND", "SEND", composite)
			hdr := map[string]string{"x-subject": "alice", "Content-Type": "application/json"}
			x := r.do(t, r.h1, newRequest(t, http.MethodPost, r.url("/v1/payments/override"), strings.NewReader(`{"amount":100}`), hdr))
			require.Equal(t, http.StatusOK, x.status)
			require.Len(t, x.streams, 1)
			s := x.streams[0]
			t.Logf("%+v", s)
			require.Equal(t, []string{"request_headers", "request_body", "response_body"}, kinds(s))
			require.Equal(t, "200", s[2].attrs["response.code"])
		})
	}
}
