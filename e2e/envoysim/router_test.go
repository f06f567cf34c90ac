package envoysim

import (
	"context"
	"io"
	"net"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/stretchr/testify/require"
)

// resetConn drops the upstream connection without an answer.
func resetConn(w http.ResponseWriter) {
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		panic(http.ErrAbortHandler)
	}
	if tcp, ok := conn.(*net.TCPConn); ok {
		_ = tcp.SetLinger(0)
	}
	_ = conn.Close()
}

func sawPhase(rec *streamRecord, phase func(*extprocv3.ProcessingRequest) bool) bool {
	for _, m := range rec.messages() {
		if phase(m) {
			return true
		}
	}
	return false
}

func TestRoutesMatchInOrderAndMissingRouteIs404(t *testing.T) {
	other := requireFakeUpstream(t)
	env := requireEnv(t, replyAll(), func(c *Config) {
		c.Clusters["other"] = Cluster{Address: other.srv.Listener.Addr().String()}
		c.VirtualHosts[0].Routes = []Route{
			{Name: "exact", Match: RouteMatch{Path: "/v1/transfers/confirm"}, Cluster: "other"},
			{Name: "prefix", Match: RouteMatch{Prefix: "/v1/"}, Cluster: "app"},
			{Name: "shadowed", Match: RouteMatch{Path: "/v1/never"}, Cluster: "other"},
		}
	})
	require.Equal(t, 200, env.do(t, http.MethodPost, "/v1/transfers/confirm?x=1", "a", nil).status)
	require.Equal(t, 200, env.do(t, http.MethodGet, "/v1/never", "", nil).status)
	require.Len(t, other.requests(), 1, "path match ignores the query; first match wins")
	require.Len(t, env.upstream.requests(), 1)

	res := env.do(t, http.MethodGet, "/nowhere", "", nil)
	require.NoError(t, res.err)
	require.Equal(t, 404, res.status)
	require.Empty(t, res.body)
	for _, l := range env.waitLogs(t, 3) {
		if l.Path == "/nowhere" {
			require.Equal(t, "route_not_found", l.ResponseCodeDetails)
		}
	}
	for range 3 {
		rec := env.fp.nextStream(t)
		rec.waitDone(t)
		if p, _ := headerGet(rec.messages()[0].GetRequestHeaders().GetHeaders(), ":path"); p == "/nowhere" {
			require.False(t, sawPhase(rec, isResponseHeaders), "the router's 404 skips the response phase")
		}
	}
}

func TestRouteTimeoutIs504WithoutAResponsePhase(t *testing.T) {
	env := requireEnv(t, replyAll(), func(c *Config) {
		c.ExtProc.ProcessingMode = ProcessingMode{RequestBodyMode: BodyBuffered, ResponseBodyMode: BodyBuffered}
		d := 150 * time.Millisecond
		c.VirtualHosts[0].Routes[0].Timeout = &d
	})
	env.upstream.setHandler(func(w http.ResponseWriter, r *http.Request) {
		select { // the money moves, the answer comes too late
		case <-time.After(2 * time.Second):
		case <-r.Context().Done():
		}
	})
	res := env.do(t, http.MethodPost, "/", "confirm", nil)
	require.NoError(t, res.err)
	require.Equal(t, 504, res.status)
	require.Equal(t, "upstream request timeout", res.body)
	require.Equal(t, "upstream_response_timeout", env.waitLogs(t, 1)[0].ResponseCodeDetails)
	require.Equal(t, int64(1), env.upstream.hits.Load())

	rec := env.fp.nextStream(t)
	rec.waitDone(t)
	require.False(t, sawPhase(rec, isResponseHeaders))
	require.True(t, sawPhase(rec, isRequestBody))
	require.ErrorIs(t, rec.ctxErr, context.Canceled)
	require.True(t, rec.wasReset(), "the stream is half-closed and cancelled: the server sees Canceled, not a clean end")
}

func TestUpstreamResetAndConnectFailureAre503(t *testing.T) {
	for _, tc := range []struct {
		name           string
		connectFailure bool
		wantBody       string
		wantDetail     string
	}{
		{
			name:       "reset before headers",
			wantBody:   "upstream connect error or disconnect/reset before headers. reset reason: connection termination",
			wantDetail: "upstream_reset_before_response_started{connection_termination}",
		},
		{
			name:           "connect failure",
			connectFailure: true,
			wantBody:       "upstream connect error or disconnect/reset before headers. reset reason: remote connection failure",
			wantDetail:     "upstream_reset_before_response_started{remote_connection_failure}",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := requireEnv(t, replyAll(), func(c *Config) {
				if tc.connectFailure {
					c.Clusters["app"] = Cluster{Address: "127.0.0.1:1"}
				}
			})
			env.upstream.setHandler(func(w http.ResponseWriter, _ *http.Request) { resetConn(w) })
			res := env.do(t, http.MethodGet, "/", "", nil)
			require.NoError(t, res.err)
			require.Equal(t, 503, res.status)
			require.Equal(t, tc.wantBody, res.body)
			require.Equal(t, "text/plain", res.header.Get("Content-Type"))
			require.Equal(t, tc.wantDetail, env.waitLogs(t, 1)[0].ResponseCodeDetails)
			rec := env.fp.nextStream(t)
			rec.waitDone(t)
			require.False(t, sawPhase(rec, isResponseHeaders), "local replies skip the response phase")
		})
	}
}

func TestRetryOnResetResendsTheMutatedRequest(t *testing.T) {
	env := requireEnv(t, replyAll(func(req *extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse {
		if isRequestBody(req) {
			return bodyReply(dirRequest, &extprocv3.CommonResponse{HeaderMutation: &extprocv3.HeaderMutation{
				SetHeaders: []*corev3.HeaderValueOption{setHeader("idempotency-key", "nonce-123")},
			}})
		}
		return nil
	}), func(c *Config) {
		c.ExtProc.ProcessingMode = ProcessingMode{RequestBodyMode: BodyBuffered, ResponseBodyMode: BodyBuffered}
		n := uint32(2)
		c.VirtualHosts[0].Routes[0].RetryPolicy = &RetryPolicy{RetryOn: []string{"reset,connect-failure"}, NumRetries: &n}
	})
	var calls atomic.Int64
	env.upstream.setHandler(func(w http.ResponseWriter, _ *http.Request) {
		if calls.Add(1) == 1 {
			resetConn(w) // executed, then the connection died
			return
		}
		_, _ = w.Write([]byte("second attempt"))
	})
	res := env.do(t, http.MethodPost, "/", `{"amount":"10"}`, map[string]string{"Idempotency-Key": "client-value"})
	require.NoError(t, res.err)
	require.Equal(t, 200, res.status)
	require.Equal(t, "second attempt", res.body)

	up := env.upstream.requests()
	require.Len(t, up, 2)
	for _, u := range up {
		require.Equal(t, "nonce-123", u.header.Get("Idempotency-Key"), "the retry carries the key ext_proc set")
		require.Equal(t, `{"amount":"10"}`, string(u.body))
	}
	require.Equal(t, int64(1), env.proxy.Stats().UpstreamRetries)
	require.Equal(t, 2, env.waitLogs(t, 1)[0].UpstreamAttempts)

	rec := env.fp.nextStream(t)
	rec.waitDone(t)
	var kinds []string
	for _, m := range rec.messages() {
		switch {
		case isRequestHeaders(m):
			kinds = append(kinds, "request_headers")
		case isRequestBody(m):
			kinds = append(kinds, "request_body")
		case isResponseHeaders(m):
			kinds = append(kinds, "response_headers")
		case isResponseBody(m):
			kinds = append(kinds, "response_body")
		}
	}
	require.Equal(t, []string{"request_headers", "request_body", "response_headers", "response_body"}, kinds,
		"retries happen after ext_proc: it sees one request and only the final response")
}

func TestRetriesExhaustedIs503(t *testing.T) {
	env := requireEnv(t, replyAll(), func(c *Config) {
		n := uint32(2)
		c.VirtualHosts[0].Routes[0].RetryPolicy = &RetryPolicy{RetryOn: []string{"reset"}, NumRetries: &n, BaseInterval: time.Millisecond}
	})
	env.upstream.setHandler(func(w http.ResponseWriter, _ *http.Request) { resetConn(w) })
	res := env.do(t, http.MethodGet, "/", "", nil)
	require.NoError(t, res.err)
	require.Equal(t, 503, res.status)
	require.Equal(t, "upstream connect error or disconnect/reset before headers. retried and the latest reset reason: connection termination", res.body)
	require.Equal(t, int64(3), env.upstream.hits.Load())
}

func TestRetryOnGatewayError(t *testing.T) {
	env := requireEnv(t, replyAll(), func(c *Config) {
		c.VirtualHosts[0].Routes[0].RetryPolicy = &RetryPolicy{RetryOn: []string{"gateway-error"}}
	})
	var calls atomic.Int64
	env.upstream.setHandler(func(w http.ResponseWriter, _ *http.Request) {
		if calls.Add(1) == 1 {
			w.WriteHeader(http.StatusBadGateway)
			return
		}
		_, _ = w.Write([]byte("ok"))
	})
	res := env.do(t, http.MethodGet, "/", "", nil)
	require.NoError(t, res.err)
	require.Equal(t, 200, res.status)
	rec := env.fp.nextStream(t)
	rec.waitDone(t)
	status, _ := headerGet(rec.messages()[1].GetResponseHeaders().GetHeaders(), ":status")
	require.Equal(t, "200", status, "ext_proc sees only the final response")
}

func TestUpstreamResetAfterHeadersResetsTheClient(t *testing.T) {
	for _, tc := range []struct {
		name         string
		responseMode HeaderSendMode
		headersSeen  bool
	}{
		// ext_proc SKIPs response headers: they reach the client, then the body is cut.
		{name: "headers already downstream", responseMode: HeaderSkip, headersSeen: true},
		// ext_proc holds the headers: the router already started the response,
		// so the stream is reset and the client gets nothing at all.
		{name: "headers held by ext_proc", responseMode: HeaderSend, headersSeen: false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := requireEnv(t, func(s *fakeStream) error {
				for req := s.recv(); req != nil; req = s.recv() {
					if isResponseHeaders(req) {
						time.Sleep(100 * time.Millisecond) // the reset arrives meanwhile
					}
					s.send(continueReply(req))
				}
				return nil
			}, func(c *Config) { c.ExtProc.ProcessingMode.ResponseHeaderMode = tc.responseMode })
			env.upstream.setHandler(func(w http.ResponseWriter, _ *http.Request) {
				w.Header().Set("Content-Length", "100")
				_, _ = w.Write([]byte("short"))
				_ = http.NewResponseController(w).Flush()
				resetConn(w)
			})
			req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, env.url+"/", nil)
			require.NoError(t, err)
			resp, err := (&http.Client{Transport: &http.Transport{DisableKeepAlives: true}}).Do(req)
			if tc.headersSeen {
				require.NoError(t, err)
				_, err = io.ReadAll(resp.Body)
				require.Error(t, err)
				require.NoError(t, resp.Body.Close())
			} else {
				require.Error(t, err)
			}
			log := env.waitLogs(t, 1)[0]
			require.Equal(t, "upstream_reset_after_response_started{connection_termination}", log.ResponseCodeDetails)
			require.True(t, log.DownstreamReset)
		})
	}
}

func TestRouterHeaders(t *testing.T) {
	env := requireEnv(t, replyAll(), nil)
	env.upstream.setHandler(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte("<html>sniff me</html>"))
	})
	res := env.do(t, http.MethodGet, "/", "", map[string]string{"User-Agent": ""})
	require.NoError(t, res.err)
	require.Equal(t, "15000", env.upstream.requests()[0].header.Get("X-Envoy-Expected-Rq-Timeout-Ms"))
	require.Empty(t, env.upstream.requests()[0].header.Get("User-Agent"))
	require.NotEmpty(t, res.header.Get("X-Envoy-Upstream-Service-Time"))
	require.Equal(t, "envoy", res.header.Get("Server"))
	// Go's upstream sniffed a type; the proxy itself never adds one.
	require.Equal(t, "text/html; charset=utf-8", res.header.Get("Content-Type"))
}

func TestSuppressEnvoyHeaders(t *testing.T) {
	env := requireEnv(t, replyAll(), func(c *Config) { c.Router.SuppressEnvoyHeaders = true })
	res := env.do(t, http.MethodGet, "/", "", nil)
	require.NoError(t, res.err)
	require.Empty(t, res.header.Get("X-Envoy-Upstream-Service-Time"))
	require.Empty(t, env.upstream.requests()[0].header.Get("X-Envoy-Expected-Rq-Timeout-Ms"))
}
