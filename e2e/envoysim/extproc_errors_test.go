package envoysim

import (
	"context"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestSpuriousRepliesAre500UnlessFailOpen(t *testing.T) {
	mistyped := func(req *extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse {
		if isResponseHeaders(req) {
			// A request_headers reply to a response_headers message.
			return headersReply(dirRequest, nil)
		}
		return nil
	}
	empty := func(req *extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse {
		if isRequestHeaders(req) {
			return &extprocv3.ProcessingResponse{} // no oneof set
		}
		return nil
	}
	bodyForHeaders := func(req *extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse {
		if isRequestHeaders(req) {
			return bodyReply(dirRequest, nil)
		}
		return nil
	}
	for _, tc := range []struct {
		name       string
		hook       func(*extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse
		failOpen   bool
		wantStatus int
		wantHits   int64
		wantDetail string
	}{
		{"mistyped reply", mistyped, false, 500, 1, "spurious_message"},
		{"reply with no oneof", empty, false, 500, 0, "unhandled_message"},
		{"body reply while awaiting headers", bodyForHeaders, false, 500, 0, "spurious_message"},
		{"mistyped reply, fail-open", mistyped, true, 200, 1, "via_upstream"},
		{"reply with no oneof, fail-open", empty, true, 200, 1, "via_upstream"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := requireEnv(t, replyAll(tc.hook), func(c *Config) { c.ExtProc.FailureModeAllow = tc.failOpen })
			res := env.do(t, http.MethodGet, "/", "", nil)
			require.NoError(t, res.err)
			require.Equal(t, tc.wantStatus, res.status)
			require.Equal(t, tc.wantHits, env.upstream.hits.Load())
			require.Equal(t, tc.wantDetail, env.waitLogs(t, 1)[0].ResponseCodeDetails)
			if tc.wantStatus == 200 {
				require.Equal(t, "upstream-ok", res.body, "fail-open continues unmodified")
			}
			require.Equal(t, int64(1), env.proxy.Stats().SpuriousMessages)
		})
	}
}

func TestMessageTimeoutIs504OrFailOpen(t *testing.T) {
	for _, tc := range []struct {
		name       string
		failOpen   bool
		wantStatus int
		wantHits   int64
	}{
		{"fail-closed", false, 504, 0},
		{"fail-open", true, 200, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := requireEnv(t, func(s *fakeStream) error {
				s.recv()
				s.drain() // never answers
				return nil
			}, func(c *Config) {
				d := 100 * time.Millisecond
				c.ExtProc.MessageTimeout = &d
				c.ExtProc.FailureModeAllow = tc.failOpen
				c.ExtProc.ProcessingMode = ProcessingMode{RequestBodyMode: BodyBuffered}
			})
			res := env.do(t, http.MethodPost, "/", "body", nil)
			require.NoError(t, res.err)
			require.Equal(t, tc.wantStatus, res.status)
			require.Equal(t, tc.wantHits, env.upstream.hits.Load())
			if !tc.failOpen {
				require.Equal(t, "ext_proc_error_per-message_timeout_exceeded", env.waitLogs(t, 1)[0].ResponseCodeDetails)
			} else {
				require.Equal(t, "body", string(env.upstream.requests()[0].body), "held data is re-injected unchanged")
			}
			require.Equal(t, int64(1), env.proxy.Stats().MessageTimeouts)
			rec := env.fp.nextStream(t)
			rec.waitDone(t)
			require.Len(t, rec.messages(), 1, "nothing more is sent after the timeout")
		})
	}
}

func TestDefaultMessageTimeoutIs200ms(t *testing.T) {
	env := requireEnv(t, func(s *fakeStream) error {
		req := s.recv()
		time.Sleep(350 * time.Millisecond)
		s.send(continueReply(req))
		s.drain()
		return nil
	}, func(c *Config) { c.ExtProc.MessageTimeout = nil })
	res := env.do(t, http.MethodGet, "/", "", nil)
	require.NoError(t, res.err)
	require.Equal(t, 504, res.status, "the reply at 350 ms comes after the 200 ms default timer")
}

func TestStreamClosedWithOKContinuesUnmodified(t *testing.T) {
	env := requireEnv(t, func(s *fakeStream) error {
		s.recv()
		return nil // status OK without replying
	}, func(c *Config) {
		c.ExtProc.ProcessingMode = ProcessingMode{RequestBodyMode: BodyBuffered, ResponseBodyMode: BodyBuffered}
	})
	res := env.do(t, http.MethodPost, "/", "as sent", nil)
	require.NoError(t, res.err)
	require.Equal(t, 200, res.status)
	require.Equal(t, "upstream-ok", res.body)
	up := env.upstream.requests()
	require.Len(t, up, 1)
	require.Equal(t, "as sent", string(up[0].body))
	require.Equal(t, 1, env.fp.streamCount())
}

func TestStreamErrorIs500UnlessFailOpen(t *testing.T) {
	for _, tc := range []struct {
		name       string
		failOpen   bool
		wantStatus int
	}{
		{"fail-closed", false, 500},
		{"fail-open", true, 200},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := requireEnv(t, func(s *fakeStream) error {
				s.recv()
				return status.Error(codes.Internal, "store down")
			}, func(c *Config) { c.ExtProc.FailureModeAllow = tc.failOpen })
			res := env.do(t, http.MethodGet, "/", "", nil)
			require.NoError(t, res.err)
			require.Equal(t, tc.wantStatus, res.status)
			if !tc.failOpen {
				require.Empty(t, res.body)
				require.Equal(t, "ext_proc_error_gRPC_error_13{store_down}", env.waitLogs(t, 1)[0].ResponseCodeDetails)
				require.Equal(t, int64(0), env.upstream.hits.Load())
			}
			require.Equal(t, int64(1), env.proxy.Stats().StreamsFailed)
		})
	}
}

func TestStatusOnErrorChangesTheErrorStatus(t *testing.T) {
	env := requireEnv(t, func(s *fakeStream) error {
		s.recv()
		return status.Error(codes.Unavailable, "nope")
	}, func(c *Config) { c.ExtProc.StatusOnError = 503 })
	res := env.do(t, http.MethodGet, "/", "", nil)
	require.NoError(t, res.err)
	require.Equal(t, 503, res.status)
}

func TestUnreachableProcessorIs500(t *testing.T) {
	env := requireEnv(t, replyAll(), func(c *Config) {
		c.Clusters["extproc"] = Cluster{Address: "127.0.0.1:1", HTTP2: true}
	})
	res := env.do(t, http.MethodGet, "/", "", nil)
	require.NoError(t, res.err)
	require.Equal(t, 500, res.status)
	require.True(t, strings.HasPrefix(env.waitLogs(t, 1)[0].ResponseCodeDetails, "ext_proc_error_gRPC_error_14{"))
	require.Equal(t, int64(0), env.upstream.hits.Load())
}

func TestImmediateResponse(t *testing.T) {
	for _, tc := range []struct {
		name       string
		phase      func(*extprocv3.ProcessingRequest) bool
		reply      *extprocv3.ProcessingResponse
		wantStatus int
		wantBody   string
		wantType   string
		wantHits   int64
		wantDetail string
	}{
		{
			name: "request headers, default status", phase: isRequestHeaders,
			reply:      immediate(0, "nope", "denied by policy"),
			wantStatus: 200, wantBody: "nope", wantType: "text/plain", wantHits: 0, wantDetail: "denied_by_policy",
		},
		{
			name: "request headers, invalid status becomes 200", phase: isRequestHeaders,
			reply:      immediate(99, "", "x"),
			wantStatus: 200, wantHits: 0, wantDetail: "x",
		},
		{
			name: "request body: the upstream is never contacted", phase: isRequestBody,
			reply: func() *extprocv3.ProcessingResponse {
				r := immediate(409, `{"status":"in_progress"}`, "conflict")
				r.GetImmediateResponse().Headers = &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{
					setHeader("content-type", "application/json"), setHeader("retry-after", "1"),
				}}
				return r
			}(),
			wantStatus: 409, wantBody: `{"status":"in_progress"}`, wantType: "application/json", wantHits: 0, wantDetail: "conflict",
		},
		{
			name: "response headers replace the upstream answer", phase: isResponseHeaders,
			reply:      immediate(502, "replaced", "resp"),
			wantStatus: 502, wantBody: "replaced", wantType: "text/plain", wantHits: 1, wantDetail: "resp",
		},
		{
			name: "response body (buffered) replaces the upstream answer", phase: isResponseBody,
			reply:      immediate(503, "late", "resp_body"),
			wantStatus: 503, wantBody: "late", wantType: "text/plain", wantHits: 1, wantDetail: "resp_body",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := requireEnv(t, replyAll(func(req *extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse {
				if tc.phase(req) {
					return tc.reply
				}
				return nil
			}), func(c *Config) {
				c.ExtProc.ProcessingMode = ProcessingMode{RequestBodyMode: BodyBuffered, ResponseBodyMode: BodyBuffered}
			})
			res := env.do(t, http.MethodPost, "/", "payload", nil)
			require.NoError(t, res.err)
			require.Equal(t, tc.wantStatus, res.status)
			require.Equal(t, tc.wantBody, res.body)
			require.Equal(t, tc.wantType, res.header.Get("Content-Type"))
			if tc.wantBody != "" {
				require.Equal(t, []string{strconv.Itoa(len(tc.wantBody))}, res.header.Values("Content-Length"))
			}
			require.Equal(t, tc.wantHits, env.upstream.hits.Load())
			require.Equal(t, tc.wantDetail, env.waitLogs(t, 1)[0].ResponseCodeDetails)

			rec := env.fp.nextStream(t)
			rec.waitDone(t)
			require.ErrorIs(t, rec.ctxErr, context.Canceled)
			require.True(t, rec.wasReset(), "Envoy closes the stream: half-close then reset")
			msgs := rec.messages()
			last := msgs[len(msgs)-1]
			require.True(t, tc.phase(last), "nothing is sent after an immediate response")
		})
	}
}

func TestImmediateResponseWithNothingOutstanding(t *testing.T) {
	release := make(chan struct{})
	env := requireEnv(t, func(s *fakeStream) error {
		req := s.recv()
		s.send(continueReply(req))
		time.Sleep(100 * time.Millisecond) // the upstream is working now
		s.send(immediate(503, "unsolicited", "unsolicited"))
		close(release)
		s.drain()
		return nil
	}, func(c *Config) { c.ExtProc.ProcessingMode.ResponseHeaderMode = HeaderSend })
	env.upstream.setHandler(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	})
	res := env.do(t, http.MethodGet, "/", "", nil)
	require.NoError(t, res.err)
	require.Equal(t, 503, res.status)
	require.Equal(t, "unsolicited", res.body)
}

func TestDisableImmediateResponseMakesItSpurious(t *testing.T) {
	env := requireEnv(t, replyAll(func(req *extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse {
		return immediate(418, "teapot", "x")
	}), func(c *Config) { c.ExtProc.DisableImmediateResponse = true })
	res := env.do(t, http.MethodGet, "/", "", nil)
	require.NoError(t, res.err)
	require.Equal(t, 500, res.status)
	require.Equal(t, "unhandled_immediate_response_due_to_config_disabled_it", env.waitLogs(t, 1)[0].ResponseCodeDetails)
}

func TestFailureAfterDownstreamHeadersResetsTheClient(t *testing.T) {
	env := requireEnv(t, func(s *fakeStream) error {
		for {
			req := s.recv()
			if req == nil {
				return nil
			}
			if isResponseBody(req) {
				return status.Error(codes.Internal, "crash mid-body")
			}
			s.send(continueReply(req))
		}
	}, func(c *Config) {
		c.ExtProc.ProcessingMode = ProcessingMode{ResponseBodyMode: BodyStreamed}
	})
	env.upstream.setHandler(func(w http.ResponseWriter, _ *http.Request) {
		// A slow body, so the headers reply arrives before the body is
		// complete (a complete body would be handled like BUFFERED).
		_, _ = w.Write([]byte("first"))
		_ = http.NewResponseController(w).Flush()
		time.Sleep(300 * time.Millisecond)
		_, _ = w.Write([]byte("second"))
	})
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, env.url+"/", nil)
	require.NoError(t, err)
	resp, err := (&http.Client{Transport: &http.Transport{DisableKeepAlives: true}}).Do(req)
	require.NoError(t, err, "the headers already went out")
	require.Equal(t, 200, resp.StatusCode)
	_, err = io.ReadAll(resp.Body)
	require.Error(t, err, "the body is cut: the stream is reset instead of a reply")
	require.NoError(t, resp.Body.Close())
	log := env.waitLogs(t, 1)[0]
	require.True(t, log.DownstreamReset)
}

func TestModeOverride(t *testing.T) {
	override := func(mo *ProcessingMode) func(*extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse {
		return func(req *extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse {
			if isResponseHeaders(req) {
				r := continueReply(req)
				r.ModeOverride = mo.toProto()
				return r
			}
			return nil
		}
	}
	for _, tc := range []struct {
		name          string
		allow         bool
		allowedModes  []ProcessingMode
		hook          func(*extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse
		wantRespBody  bool
		wantLastPhase func(*extprocv3.ProcessingRequest) bool
	}{
		{name: "response_body_mode NONE stops the response body message", allow: true,
			hook: override(&ProcessingMode{RequestBodyMode: BodyBuffered}), wantRespBody: false},
		{name: "ignored without allow_mode_override", allow: false,
			hook: override(&ProcessingMode{RequestBodyMode: BodyBuffered}), wantRespBody: true},
		{name: "ignored when not in allowed_override_modes", allow: true,
			allowedModes: []ProcessingMode{{ResponseBodyMode: BodyStreamed}},
			hook:         override(&ProcessingMode{RequestBodyMode: BodyBuffered}), wantRespBody: true},
		{name: "honoured when in allowed_override_modes", allow: true,
			allowedModes: []ProcessingMode{{RequestBodyMode: BodyBuffered}},
			hook:         override(&ProcessingMode{RequestBodyMode: BodyBuffered}), wantRespBody: false},
		{name: "ignored in a body reply", allow: true,
			hook: func(req *extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse {
				if isRequestBody(req) {
					r := continueReply(req)
					r.ModeOverride = (&ProcessingMode{}).toProto()
					return r
				}
				return nil
			}, wantRespBody: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := requireEnv(t, replyAll(tc.hook), func(c *Config) {
				c.ExtProc.ProcessingMode = ProcessingMode{RequestBodyMode: BodyBuffered, ResponseBodyMode: BodyBuffered}
				c.ExtProc.AllowModeOverride = tc.allow
				c.ExtProc.AllowedOverrideModes = tc.allowedModes
			})
			res := env.do(t, http.MethodPost, "/", "x", nil)
			require.NoError(t, res.err)
			require.Equal(t, 200, res.status)
			require.Equal(t, "upstream-ok", res.body)
			rec := env.fp.nextStream(t)
			rec.waitDone(t)
			saw := false
			for _, m := range rec.messages() {
				saw = saw || isResponseBody(m)
			}
			require.Equal(t, tc.wantRespBody, saw)
		})
	}
}

func TestModeOverrideDefaultHeaderModesKeepFilterLevel(t *testing.T) {
	// Filter level skips response headers; a per-route override turns them
	// on; a mode_override with DEFAULT header modes in the request_headers
	// reply falls back to the FILTER level (SKIP), not the route's SEND.
	env := requireEnv(t, replyAll(func(req *extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse {
		if isRequestHeaders(req) {
			r := continueReply(req)
			r.ModeOverride = (&ProcessingMode{}).toProto()
			return r
		}
		return nil
	}), func(c *Config) {
		c.ExtProc.AllowModeOverride = true
		c.ExtProc.ProcessingMode = ProcessingMode{ResponseHeaderMode: HeaderSkip}
		c.VirtualHosts[0].Routes[0].ExtProcPerRoute = &ExtProcPerRoute{ProcessingMode: &ProcessingMode{ResponseHeaderMode: HeaderSend}}
	})
	res := env.do(t, http.MethodGet, "/", "", nil)
	require.NoError(t, res.err)
	rec := env.fp.nextStream(t)
	rec.waitDone(t)
	require.Len(t, rec.messages(), 1)
}

func TestStreamClosesEarlyAfterTheLastExpectedReply(t *testing.T) {
	release := make(chan struct{})
	env := requireEnv(t, replyAll(), func(c *Config) {
		c.ExtProc.ProcessingMode = ProcessingMode{ResponseHeaderMode: HeaderSkip}
	})
	env.upstream.setHandler(func(w http.ResponseWriter, r *http.Request) {
		<-release
		_, _ = w.Write([]byte("done"))
	})
	done := make(chan result, 1)
	go func() { done <- env.do(t, http.MethodGet, "/", "", nil) }()
	rec := env.fp.nextStream(t)
	// The stream ends while the upstream is still working (1.37 behaviour).
	rec.waitDone(t)
	require.ErrorIs(t, rec.ctxErr, context.Canceled)
	require.True(t, rec.wasReset())
	close(release)
	res := <-done
	require.NoError(t, res.err)
	require.Equal(t, 200, res.status)
}

func TestStreamClosesAtResponseHeadersWhenResponseProcessingIsOff(t *testing.T) {
	arrived := make(chan struct{})
	release := make(chan struct{})
	env := requireEnv(t, replyAll(), func(c *Config) {
		// BUFFERED request: the body reply is never "last" (Envoy skips the
		// optimisation for BUFFERED), so the stream stays open until the
		// response headers arrive and response processing is off.
		c.ExtProc.ProcessingMode = ProcessingMode{RequestBodyMode: BodyBuffered, ResponseHeaderMode: HeaderSkip}
	})
	env.upstream.setHandler(func(w http.ResponseWriter, r *http.Request) {
		close(arrived)
		<-release
	})
	done := make(chan result, 1)
	go func() { done <- env.do(t, http.MethodPost, "/", "x", nil) }()
	rec := env.fp.nextStream(t)
	<-arrived
	select {
	case <-rec.done:
		t.Fatal("the stream closed before the response headers")
	case <-time.After(150 * time.Millisecond):
	}
	close(release)
	require.Equal(t, 200, (<-done).status)
	rec.waitDone(t)
}
