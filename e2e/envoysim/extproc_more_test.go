package envoysim

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestHeaderMutationInBodyReplyIgnoredWithoutHeldHeaders(t *testing.T) {
	env := requireEnv(t, replyAll(func(req *extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse {
		if isRequestBody(req) {
			return bodyReply(dirRequest, &extprocv3.CommonResponse{HeaderMutation: &extprocv3.HeaderMutation{
				SetHeaders: []*corev3.HeaderValueOption{setHeader("x-ignored", "1")},
			}})
		}
		return nil
	}), func(c *Config) {
		// BUFFERED with headers SKIP: the headers already went to the router.
		c.ExtProc.ProcessingMode = ProcessingMode{RequestHeaderMode: HeaderSkip, RequestBodyMode: BodyBuffered, ResponseHeaderMode: HeaderSkip}
	})
	res := env.do(t, http.MethodPost, "/", "abc", nil)
	require.NoError(t, res.err)
	require.Equal(t, 200, res.status)
	require.Empty(t, env.upstream.requests()[0].header.Get("X-Ignored"))
}

func TestImmediateResponseInStreamedRequestBodyResetsTheUpstream(t *testing.T) {
	upstreamGone := make(chan struct{})
	env := requireEnv(t, replyAll(func(req *extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse {
		if isRequestBody(req) {
			return immediate(403, "stop", "streamed_deny")
		}
		return nil
	}), func(c *Config) {
		c.ExtProc.ProcessingMode = ProcessingMode{RequestBodyMode: BodyStreamed, ResponseHeaderMode: HeaderSkip}
	})
	env.upstream.setHandler(func(w http.ResponseWriter, r *http.Request) {
		<-r.Context().Done() // the upstream already had the headers; Envoy resets it
		close(upstreamGone)
	})
	pr, pw := io.Pipe()
	go func() {
		time.Sleep(100 * time.Millisecond)
		_, _ = pw.Write([]byte("chunk"))
		time.Sleep(500 * time.Millisecond)
		_ = pw.Close()
	}()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, env.url+"/", pr)
	require.NoError(t, err)
	res := doRequest(req)
	require.NoError(t, res.err)
	require.Equal(t, 403, res.status)
	require.Equal(t, "stop", res.body)
	select {
	case <-upstreamGone:
	case <-time.After(5 * time.Second):
		t.Fatal("the upstream request was not reset")
	}
}

func TestLocalRepliesToGRPCRequestsAreTrailersOnly(t *testing.T) {
	for _, tc := range []struct {
		name     string
		reply    *extprocv3.ProcessingResponse
		wantGRPC string
		wantMsg  string
	}{
		{name: "status mapped from HTTP 503", reply: immediate(503, "busy now", "x"), wantGRPC: "14", wantMsg: "busy%20now"},
		{name: "explicit grpc_status", reply: func() *extprocv3.ProcessingResponse {
			r := immediate(403, "", "x")
			r.GetImmediateResponse().GrpcStatus = &extprocv3.GrpcStatus{Status: uint32(codes.PermissionDenied)}
			return r
		}(), wantGRPC: "7"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := requireEnv(t, replyAll(func(req *extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse { return tc.reply }), nil)
			res := env.do(t, http.MethodPost, "/pkg.Svc/Method", "\x00\x00\x00\x00\x00", map[string]string{"Content-Type": "application/grpc"})
			require.NoError(t, res.err)
			require.Equal(t, 200, res.status)
			require.Equal(t, "application/grpc", res.header.Get("Content-Type"))
			require.Equal(t, tc.wantGRPC, res.header.Get("Grpc-Status"))
			require.Equal(t, tc.wantMsg, res.header.Get("Grpc-Message"))
			require.Empty(t, res.body)
		})
	}
}

func TestHTTP1TrailersAreDroppedSoNoTrailersMessageIsSent(t *testing.T) {
	env := requireEnv(t, replyAll(), func(c *Config) {
		c.ExtProc.ProcessingMode = ProcessingMode{RequestBodyMode: BodyBuffered, RequestTrailerMode: HeaderSend, ResponseHeaderMode: HeaderSkip}
	})
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, env.url+"/", io.NopCloser(strings.NewReader("body")))
	require.NoError(t, err)
	req.ContentLength = -1
	req.Trailer = http.Header{"X-Checksum": []string{"abc"}}
	res := doRequest(req)
	require.NoError(t, res.err)
	require.Equal(t, 200, res.status)

	rec := env.fp.nextStream(t)
	rec.waitDone(t)
	msgs := rec.messages()
	require.Len(t, msgs, 2, "headers and body; the codec dropped the trailers (enable_trailers is off)")
	require.True(t, msgs[1].GetRequestBody().GetEndOfStream(), "so the body message ends the stream")
	require.Empty(t, env.upstream.requests()[0].header.Get("X-Checksum"))
}

func TestPerRouteGRPCServiceOverride(t *testing.T) {
	second := requireFakeProcessor(t, replyAll())
	env := requireEnv(t, replyAll(), func(c *Config) {
		c.Clusters["second"] = Cluster{Address: second.addr, HTTP2: true}
		c.VirtualHosts[0].Routes = []Route{
			{Name: "alt", Match: RouteMatch{Prefix: "/alt"}, Cluster: "app",
				ExtProcPerRoute: &ExtProcPerRoute{GRPCService: &GRPCService{ClusterName: "second"}}},
			{Name: "rest", Match: RouteMatch{Prefix: "/"}, Cluster: "app"},
		}
	})
	require.Equal(t, 200, env.do(t, http.MethodGet, "/alt", "", nil).status)
	require.Equal(t, 200, env.do(t, http.MethodGet, "/main", "", nil).status)
	require.Equal(t, 1, second.streamCount())
	require.Equal(t, 1, env.fp.streamCount())
}

func TestPerRouteFailureModeAllow(t *testing.T) {
	allow := true
	env := requireEnv(t, func(s *fakeStream) error {
		s.recv()
		return status.Error(codes.Internal, "boom")
	}, func(c *Config) {
		c.VirtualHosts[0].Routes = []Route{
			{Name: "open", Match: RouteMatch{Prefix: "/open"}, Cluster: "app", ExtProcPerRoute: &ExtProcPerRoute{FailureModeAllow: &allow}},
			{Name: "rest", Match: RouteMatch{Prefix: "/"}, Cluster: "app"},
		}
	})
	require.Equal(t, 200, env.do(t, http.MethodGet, "/open", "", nil).status)
	require.Equal(t, 500, env.do(t, http.MethodGet, "/closed", "", nil).status)
}

func TestExpectContinueIsHandledByTheProxy(t *testing.T) {
	env := requireEnv(t, replyAll(), nil)
	res := env.do(t, http.MethodPost, "/", "abc", map[string]string{"Expect": "100-continue"})
	require.NoError(t, res.err)
	require.Equal(t, 200, res.status)
	require.Empty(t, env.upstream.requests()[0].header.Get("Expect"))
	rec := env.fp.nextStream(t)
	rec.waitDone(t)
	_, ok := headerGet(rec.messages()[0].GetRequestHeaders().GetHeaders(), "expect")
	require.False(t, ok)
}

func TestMutationErrorsAre500EvenWhenFailOpen(t *testing.T) {
	for _, tc := range []struct {
		name  string
		reply *extprocv3.ProcessingResponse
	}{
		{"content-length mismatch", bodyReply(dirRequest, &extprocv3.CommonResponse{BodyMutation: bodyMutation("longer than before")})},
		{"invalid header value", bodyReply(dirRequest, &extprocv3.CommonResponse{HeaderMutation: &extprocv3.HeaderMutation{
			SetHeaders: []*corev3.HeaderValueOption{setHeader("x-bad", "a\nb")},
		}})},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := requireEnv(t, replyAll(func(req *extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse {
				if isRequestBody(req) {
					return tc.reply
				}
				return nil
			}), func(c *Config) {
				c.ExtProc.FailureModeAllow = true
				c.ExtProc.ProcessingMode = ProcessingMode{RequestBodyMode: BodyBuffered}
			})
			res := env.do(t, http.MethodPost, "/", "short", nil)
			require.NoError(t, res.err)
			require.Equal(t, 500, res.status)
			require.Equal(t, int64(0), env.upstream.hits.Load())
		})
	}
}

func TestImmediateResponseWithoutDetailsHasEmptyDetails(t *testing.T) {
	env := requireEnv(t, replyAll(func(req *extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse {
		return immediate(401, "", "")
	}), nil)
	res := env.do(t, http.MethodGet, "/", "", nil)
	require.NoError(t, res.err)
	require.Equal(t, 401, res.status)
	require.Empty(t, env.waitLogs(t, 1)[0].ResponseCodeDetails)
}

func TestWithoutExtProcTheChainIsAPlainProxy(t *testing.T) {
	env := requireEnv(t, replyAll(), func(c *Config) { c.ExtProc = nil })
	res := env.do(t, http.MethodPost, "/x", "payload", nil)
	require.NoError(t, res.err)
	require.Equal(t, 200, res.status)
	require.Equal(t, "upstream-ok", res.body)
	require.Equal(t, "payload", string(env.upstream.requests()[0].body))
	require.Equal(t, int64(7), env.upstream.requests()[0].contentLength)
	require.Equal(t, 0, env.fp.streamCount())
	require.Equal(t, "via_upstream", env.waitLogs(t, 1)[0].ResponseCodeDetails)
}

func TestStartServesAndCloseIsIdempotent(t *testing.T) {
	fu := requireFakeUpstream(t)
	cfg := baseConfig("127.0.0.1:1", fu.srv.Listener.Addr().String())
	cfg.ExtProc = nil
	cfg.Listener.Address = "127.0.0.1:0"
	p, err := New(cfg)
	require.NoError(t, err)
	require.Empty(t, p.Addr())
	require.NoError(t, p.Start(""))
	require.Error(t, p.Start(""))
	res := doRequest(mustRequest(t, http.MethodGet, "http://"+p.Addr()+"/"))
	require.NoError(t, res.err)
	require.Equal(t, 200, res.status)
	require.Equal(t, int64(1), p.Stats().Requests)
	require.NoError(t, p.Close())
	require.NoError(t, p.Close())
}
