package envoysim

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/stretchr/testify/require"
)

func bodyMutation(b string) *extprocv3.BodyMutation {
	return &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_Body{Body: []byte(b)}}
}

func clearBody() *extprocv3.BodyMutation {
	return &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_ClearBody{ClearBody: true}}
}

func TestBufferedHoldsHeadersAndUpstreamUntilBodyReply(t *testing.T) {
	var env *testEnv
	upstreamHitsAtBody := int64(-1)
	env = requireEnv(t, replyAll(func(req *extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse {
		if !isRequestBody(req) {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
		upstreamHitsAtBody = env.upstream.hits.Load()
		return bodyReply(dirRequest, &extprocv3.CommonResponse{
			HeaderMutation: &extprocv3.HeaderMutation{SetHeaders: []*corev3HVO{
				setHeader("x-from-body-reply", "yes"), setHeader("content-length", "8"),
			}},
			BodyMutation: bodyMutation("replaced"),
		})
	}), func(c *Config) {
		c.ExtProc.ProcessingMode = ProcessingMode{RequestBodyMode: BodyBuffered, ResponseHeaderMode: HeaderSkip}
	})
	res := env.do(t, http.MethodPost, "/", "original body", nil)
	require.NoError(t, res.err)
	require.Equal(t, 200, res.status)
	require.Equal(t, int64(0), upstreamHitsAtBody, "upstream is not contacted before the body reply")
	up := env.upstream.requests()
	require.Len(t, up, 1)
	require.Equal(t, "replaced", string(up[0].body))
	require.Equal(t, int64(8), up[0].contentLength, "BUFFERED + SEND keeps content-length")
	require.Equal(t, "yes", up[0].header.Get("X-From-Body-Reply"), "headers are still held: body-reply mutations apply")

	rec := env.fp.nextStream(t)
	rec.waitDone(t)
	msgs := rec.messages()
	require.Len(t, msgs, 2)
	require.Equal(t, "original body", string(msgs[1].GetRequestBody().GetBody()))
	require.True(t, msgs[1].GetRequestBody().GetEndOfStream())
}

func TestBufferedRequestOverTheLimitIs413(t *testing.T) {
	for _, tc := range []struct {
		name         string
		delayHeaders time.Duration
	}{
		{name: "after the headers reply"},
		{name: "while awaiting the headers reply", delayHeaders: time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := requireEnv(t, replyAll(func(req *extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse {
				if isRequestHeaders(req) && tc.delayHeaders > 0 {
					time.Sleep(tc.delayHeaders)
				}
				return nil
			}), func(c *Config) {
				c.Listener.PerConnectionBufferLimitBytes = 1024
				c.ExtProc.ProcessingMode = ProcessingMode{RequestBodyMode: BodyBuffered}
			})
			res := env.do(t, http.MethodPost, "/", strings.Repeat("x", 4096), nil)
			require.NoError(t, res.err)
			require.Equal(t, 413, res.status)
			require.Equal(t, "Payload Too Large", res.body)
			require.Equal(t, int64(0), env.upstream.hits.Load())
			log := env.waitLogs(t, 1)[0]
			require.Equal(t, "request_payload_too_large", log.ResponseCodeDetails)

			rec := env.fp.nextStream(t)
			rec.waitDone(t)
			for _, m := range rec.messages() {
				require.False(t, isResponseHeaders(m), "local replies skip the response phase")
			}
		})
	}
}

// A client that is still sending a large body when the 413 is written must
// be able to read it: Envoy closes an HTTP/1 connection whose response
// ended before its request (connection: close) and drains the socket for
// delayed_close_timeout instead of resetting it. curl sends Expect:
// 100-continue for large bodies, so both shapes are covered.
func TestLocalReplyBeforeTheRequestEndsIsReadableAndClosesTheConnection(t *testing.T) {
	for name, expect := range map[string]string{"plain": "", "expect 100-continue": "Expect: 100-continue\r\n"} {
		t.Run(name, func(t *testing.T) {
			env := requireEnv(t, replyAll(), func(c *Config) {
				c.Listener.PerConnectionBufferLimitBytes = 1024
				c.ExtProc.ProcessingMode = ProcessingMode{RequestBodyMode: BodyBuffered}
			})
			conn, err := net.Dial("tcp", strings.TrimPrefix(env.url, "http://"))
			require.NoError(t, err)
			defer conn.Close()
			require.NoError(t, conn.SetDeadline(time.Now().Add(10*time.Second)))

			body := bytes.Repeat([]byte("x"), 8<<20) // far beyond the socket buffers
			written := make(chan error, 1)
			go func() {
				head := "POST / HTTP/1.1\r\nHost: app\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\n" + expect + "\r\n"
				if _, err := conn.Write([]byte(head)); err != nil {
					written <- err
					return
				}
				_, err := conn.Write(body)
				written <- err
			}()
			br := bufio.NewReader(conn)
			res, err := http.ReadResponse(br, nil)
			require.NoError(t, err)
			if res.StatusCode == http.StatusContinue {
				res, err = http.ReadResponse(br, nil)
				require.NoError(t, err)
			}
			got, err := io.ReadAll(res.Body)
			require.NoError(t, err)
			require.Equal(t, 413, res.StatusCode)
			require.Equal(t, "Payload Too Large", string(got))
			require.True(t, res.Close, "connection: close on a response that ended before its request")
			require.NoError(t, <-written, "the whole body was accepted, not reset")
			_, err = br.ReadByte()
			require.ErrorIs(t, err, io.EOF, "the connection is closed after the reply")
			require.Equal(t, int64(0), env.upstream.hits.Load())
		})
	}
}

func TestBufferedRequestAtTheLimitPasses(t *testing.T) {
	env := requireEnv(t, replyAll(), func(c *Config) {
		c.Listener.PerConnectionBufferLimitBytes = 1024
		c.ExtProc.ProcessingMode = ProcessingMode{RequestBodyMode: BodyBuffered}
	})
	res := env.do(t, http.MethodPost, "/", strings.Repeat("x", 1024), nil)
	require.NoError(t, res.err)
	require.Equal(t, 200, res.status)
}

func TestBufferedResponseOverTheLimitIs500(t *testing.T) {
	env := requireEnv(t, replyAll(), func(c *Config) {
		c.Listener.PerConnectionBufferLimitBytes = 1024
		c.ExtProc.ProcessingMode = ProcessingMode{ResponseBodyMode: BodyBuffered}
	})
	env.upstream.setHandler(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte(strings.Repeat("y", 4096)))
	})
	res := env.do(t, http.MethodGet, "/", "", nil)
	require.NoError(t, res.err)
	require.Equal(t, 500, res.status)
	require.Equal(t, "Internal Server Error", res.body)
	require.Equal(t, "response_payload_too_large", env.waitLogs(t, 1)[0].ResponseCodeDetails)
}

func TestBufferedResponseBodyReplacement(t *testing.T) {
	env := requireEnv(t, replyAll(func(req *extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse {
		if !isResponseBody(req) {
			return nil
		}
		nb := `{"wrapped":"` + string(req.GetResponseBody().GetBody()) + `"}`
		return bodyReply(dirResponse, &extprocv3.CommonResponse{
			HeaderMutation: &extprocv3.HeaderMutation{SetHeaders: []*corev3HVO{
				setHeader("content-length", strconv.Itoa(len(nb))), setHeader("content-type", "application/json"),
			}},
			BodyMutation: bodyMutation(nb),
		})
	}), func(c *Config) {
		c.ExtProc.ProcessingMode = ProcessingMode{ResponseBodyMode: BodyBuffered}
	})
	res := env.do(t, http.MethodGet, "/", "", nil)
	require.NoError(t, res.err)
	require.Equal(t, 200, res.status)
	require.Equal(t, `{"wrapped":"upstream-ok"}`, res.body)
	require.Equal(t, "application/json", res.header.Get("Content-Type"))
}

func TestStreamedRequestForwardsHeadersFirstAndPipelinesChunks(t *testing.T) {
	var env *testEnv
	sawUpstreamBeforeBody := false
	env = requireEnv(t, func(s *fakeStream) error {
		first := true
		for {
			req := s.recv()
			if req == nil {
				return nil
			}
			if b := req.GetRequestBody(); b != nil {
				if first {
					first = false
					// Headers were forwarded after the headers reply.
					sawUpstreamBeforeBody = waitFor(func() bool { return env.upstream.hits.Load() == 1 }, 2*time.Second)
				}
				s.send(bodyReply(dirRequest, &extprocv3.CommonResponse{
					HeaderMutation: &extprocv3.HeaderMutation{SetHeaders: []*corev3HVO{setHeader("x-too-late", "1")}},
					BodyMutation:   bodyMutation(strings.ToUpper(string(b.GetBody()))),
				}))
				continue
			}
			s.send(continueReply(req))
		}
	}, func(c *Config) {
		c.ExtProc.ProcessingMode = ProcessingMode{RequestBodyMode: BodyStreamed, ResponseHeaderMode: HeaderSkip}
	})
	pr, pw := io.Pipe()
	go func() {
		for _, part := range []string{"abc", "def", "ghi"} {
			time.Sleep(60 * time.Millisecond)
			_, _ = pw.Write([]byte(part))
		}
		_ = pw.Close()
	}()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, env.url+"/", pr)
	require.NoError(t, err)
	req.ContentLength = 9
	res := doRequest(req)
	require.NoError(t, res.err)
	require.Equal(t, 200, res.status)
	require.True(t, sawUpstreamBeforeBody)

	up := env.upstream.requests()
	require.Len(t, up, 1)
	require.Equal(t, "ABCDEFGHI", string(up[0].body))
	require.Equal(t, int64(-1), up[0].contentLength, "STREAMED strips content-length: the upstream gets chunked")
	require.Empty(t, up[0].header.Get("X-Too-Late"), "header mutations in STREAMED body replies are ignored")

	rec := env.fp.nextStream(t)
	rec.waitDone(t)
	msgs := rec.messages()
	cl, ok := headerGet(msgs[0].GetRequestHeaders().GetHeaders(), "content-length")
	require.True(t, ok, "the headers message is built before content-length is stripped")
	require.Equal(t, "9", cl)
	var got strings.Builder
	for _, m := range msgs[1:] {
		got.Write(m.GetRequestBody().GetBody())
	}
	require.Equal(t, "abcdefghi", got.String())
	require.True(t, msgs[len(msgs)-1].GetRequestBody().GetEndOfStream())
	require.Greater(t, len(msgs), 2, "chunks are separate messages")
}

func TestStreamedCoalescesDataReceivedDuringTheHeadersCall(t *testing.T) {
	env := requireEnv(t, func(s *fakeStream) error {
		req := s.recv()
		time.Sleep(400 * time.Millisecond) // the client sends everything meanwhile
		s.send(continueReply(req))
		for req = s.recv(); req != nil; req = s.recv() {
			s.send(continueReply(req))
		}
		return nil
	}, func(c *Config) {
		c.ExtProc.ProcessingMode = ProcessingMode{RequestBodyMode: BodyStreamed, ResponseHeaderMode: HeaderSkip}
	})
	pr, pw := io.Pipe()
	go func() {
		for _, part := range []string{"one-", "two-", "three"} {
			_, _ = pw.Write([]byte(part))
			time.Sleep(20 * time.Millisecond)
		}
		time.Sleep(600 * time.Millisecond)
		_, _ = pw.Write([]byte("-late"))
		_ = pw.Close()
	}()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, env.url+"/", pr)
	require.NoError(t, err)
	res := doRequest(req)
	require.NoError(t, res.err)
	require.Equal(t, 200, res.status)
	require.Equal(t, "one-two-three-late", string(env.upstream.requests()[0].body))

	rec := env.fp.nextStream(t)
	rec.waitDone(t)
	msgs := rec.messages()
	require.Equal(t, "one-two-three", string(msgs[1].GetRequestBody().GetBody()), "held data goes out as one chunk")
	require.False(t, msgs[1].GetRequestBody().GetEndOfStream())
}

func TestStreamedWholeBodyBeforeHeadersReplyIsOneMessage(t *testing.T) {
	env := requireEnv(t, func(s *fakeStream) error {
		req := s.recv()
		time.Sleep(300 * time.Millisecond)
		s.send(continueReply(req))
		req = s.recv()
		if req != nil {
			// Handled like BUFFERED: a header mutation still applies.
			s.send(bodyReply(dirRequest, &extprocv3.CommonResponse{
				HeaderMutation: &extprocv3.HeaderMutation{SetHeaders: []*corev3HVO{setHeader("x-late", "applied")}},
			}))
		}
		s.drain()
		return nil
	}, func(c *Config) {
		c.ExtProc.ProcessingMode = ProcessingMode{RequestBodyMode: BodyStreamed, ResponseHeaderMode: HeaderSkip}
	})
	res := env.do(t, http.MethodPost, "/", "complete", nil)
	require.NoError(t, res.err)
	rec := env.fp.nextStream(t)
	rec.waitDone(t)
	msgs := rec.messages()
	require.Len(t, msgs, 2)
	require.Equal(t, "complete", string(msgs[1].GetRequestBody().GetBody()))
	require.True(t, msgs[1].GetRequestBody().GetEndOfStream())
	require.Equal(t, "applied", env.upstream.requests()[0].header.Get("X-Late"))
}

func TestContentLengthRules(t *testing.T) {
	for _, tc := range []struct {
		name       string
		mode       ProcessingMode
		headers    *extprocv3.CommonResponse
		body       *extprocv3.CommonResponse
		wantStatus int
		wantCL     int64
		wantBody   string
		wantDetail string
	}{
		{
			name: "buffered: new length set in the same reply",
			mode: ProcessingMode{RequestBodyMode: BodyBuffered},
			body: &extprocv3.CommonResponse{
				HeaderMutation: &extprocv3.HeaderMutation{SetHeaders: []*corev3HVO{setHeader("content-length", "3")}},
				BodyMutation:   bodyMutation("new"),
			},
			wantStatus: 200, wantCL: 3, wantBody: "new",
		},
		{
			name:       "buffered: length not fixed is a 500",
			mode:       ProcessingMode{RequestBodyMode: BodyBuffered},
			body:       &extprocv3.CommonResponse{BodyMutation: bodyMutation("longer body")},
			wantStatus: 500, wantDetail: "mismatch_between_content_length_and_the_length_of_the_mutated_body",
		},
		{
			name:       "buffered: clear_body counts as length 0",
			mode:       ProcessingMode{RequestBodyMode: BodyBuffered},
			body:       &extprocv3.CommonResponse{BodyMutation: clearBody()},
			wantStatus: 500, wantDetail: "mismatch_between_content_length_and_the_length_of_the_mutated_body",
		},
		{
			name: "buffered: clear_body with content-length 0",
			mode: ProcessingMode{RequestBodyMode: BodyBuffered},
			body: &extprocv3.CommonResponse{
				HeaderMutation: &extprocv3.HeaderMutation{SetHeaders: []*corev3HVO{setHeader("content-length", "0")}},
				BodyMutation:   clearBody(),
			},
			wantStatus: 200, wantCL: 0, wantBody: "",
		},
		{
			name: "buffered: content-length removed in the headers reply",
			mode: ProcessingMode{RequestBodyMode: BodyBuffered},
			headers: &extprocv3.CommonResponse{
				HeaderMutation: &extprocv3.HeaderMutation{RemoveHeaders: []string{"content-length"}},
			},
			body:       &extprocv3.CommonResponse{BodyMutation: bodyMutation("any length")},
			wantStatus: 200, wantCL: -1, wantBody: "any length",
		},
		{
			name: "streamed: stripped, and the server cannot put it back",
			mode: ProcessingMode{RequestBodyMode: BodyStreamed},
			headers: &extprocv3.CommonResponse{
				HeaderMutation: &extprocv3.HeaderMutation{SetHeaders: []*corev3HVO{setHeader("content-length", "5")}},
			},
			wantStatus: 200, wantCL: -1, wantBody: "hello",
		},
		{
			name:       "buffered with headers SKIP: stripped",
			mode:       ProcessingMode{RequestHeaderMode: HeaderSkip, RequestBodyMode: BodyBuffered},
			body:       &extprocv3.CommonResponse{BodyMutation: bodyMutation("other")},
			wantStatus: 200, wantCL: -1, wantBody: "other",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := requireEnv(t, replyAll(func(req *extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse {
				switch {
				case isRequestHeaders(req) && tc.headers != nil:
					return headersReply(dirRequest, tc.headers)
				case isRequestBody(req) && tc.body != nil:
					return bodyReply(dirRequest, tc.body)
				}
				return nil
			}), func(c *Config) {
				tc.mode.ResponseHeaderMode = HeaderSkip
				c.ExtProc.ProcessingMode = tc.mode
			})
			res := env.do(t, http.MethodPost, "/", "hello", nil)
			require.NoError(t, res.err)
			require.Equal(t, tc.wantStatus, res.status)
			if tc.wantStatus != 200 {
				require.Equal(t, int64(0), env.upstream.hits.Load())
				require.Equal(t, tc.wantDetail, env.waitLogs(t, 1)[0].ResponseCodeDetails)
				require.Empty(t, res.body, "error replies have an empty body")
				return
			}
			up := env.upstream.requests()
			require.Len(t, up, 1)
			require.Equal(t, tc.wantBody, string(up[0].body))
			require.Equal(t, tc.wantCL, up[0].contentLength)
		})
	}
}

func TestContinueAndReplace(t *testing.T) {
	replace := func(cr *extprocv3.CommonResponse) *extprocv3.CommonResponse {
		cr.Status = extprocv3.CommonResponse_CONTINUE_AND_REPLACE
		return cr
	}
	for _, tc := range []struct {
		name       string
		method     string
		body       string
		reply      *extprocv3.CommonResponse
		wantMethod string
		wantBody   string
		wantCL     int64
	}{
		{
			name: "replaces the body and strips content-length", method: http.MethodPost, body: "original",
			reply: replace(&extprocv3.CommonResponse{
				HeaderMutation: &extprocv3.HeaderMutation{SetHeaders: []*corev3HVO{setHeader("content-length", "11")}},
				BodyMutation:   bodyMutation("replacement"),
			}),
			wantMethod: http.MethodPost, wantBody: "replacement", wantCL: -1,
		},
		{
			name: "adds a body to a GET and may change :method", method: http.MethodGet,
			reply: replace(&extprocv3.CommonResponse{
				HeaderMutation: &extprocv3.HeaderMutation{SetHeaders: []*corev3HVO{setHeader(":method", "PUT")}},
				BodyMutation:   bodyMutation("added"),
			}),
			wantMethod: http.MethodPut, wantBody: "added", wantCL: -1,
		},
		{
			name: "without a body mutation the original body passes unprocessed", method: http.MethodPost, body: "kept",
			reply:      replace(&extprocv3.CommonResponse{}),
			wantMethod: http.MethodPost, wantBody: "kept", wantCL: 4,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := requireEnv(t, replyAll(func(req *extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse {
				if isRequestHeaders(req) {
					return headersReply(dirRequest, tc.reply)
				}
				return nil
			}), func(c *Config) {
				c.ExtProc.ProcessingMode = ProcessingMode{RequestBodyMode: BodyBuffered, ResponseHeaderMode: HeaderSkip}
			})
			res := env.do(t, tc.method, "/", tc.body, nil)
			require.NoError(t, res.err)
			require.Equal(t, 200, res.status)
			up := env.upstream.requests()
			require.Len(t, up, 1)
			require.Equal(t, tc.wantMethod, up[0].method)
			require.Equal(t, tc.wantBody, string(up[0].body))
			require.Equal(t, tc.wantCL, up[0].contentLength)

			rec := env.fp.nextStream(t)
			rec.waitDone(t)
			require.Len(t, rec.messages(), 1, "no body message after CONTINUE_AND_REPLACE")
		})
	}
}

func TestContinueAndReplaceIsIgnoredInBodyReplies(t *testing.T) {
	env := requireEnv(t, replyAll(func(req *extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse {
		if isRequestBody(req) {
			return bodyReply(dirRequest, &extprocv3.CommonResponse{
				Status:         extprocv3.CommonResponse_CONTINUE_AND_REPLACE,
				HeaderMutation: &extprocv3.HeaderMutation{SetHeaders: []*corev3HVO{setHeader(":method", "PUT")}},
			})
		}
		return nil
	}), func(c *Config) {
		c.ExtProc.ProcessingMode = ProcessingMode{RequestBodyMode: BodyBuffered, ResponseHeaderMode: HeaderSkip}
	})
	res := env.do(t, http.MethodPost, "/", "x", nil)
	require.NoError(t, res.err)
	require.Equal(t, 200, res.status)
	// In a body reply the status is just CONTINUE, but replacing_message still
	// lets :method through, exactly as mutation_utils does.
	require.Equal(t, http.MethodPut, env.upstream.requests()[0].method)
}

func waitFor(cond func() bool, d time.Duration) bool {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if cond() {
			return true
		}
		time.Sleep(2 * time.Millisecond)
	}
	return cond()
}

func TestResponseContentLengthMustBeFixedInBufferedMode(t *testing.T) {
	for _, tc := range []struct {
		name       string
		chunked    bool
		fixLength  bool
		wantStatus int
	}{
		{name: "upstream content-length not fixed", wantStatus: 500},
		{name: "upstream content-length fixed", fixLength: true, wantStatus: 200},
		{name: "chunked upstream answer needs no fix", chunked: true, wantStatus: 200},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := requireEnv(t, replyAll(func(req *extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse {
				if !isResponseBody(req) {
					return nil
				}
				cr := &extprocv3.CommonResponse{BodyMutation: bodyMutation("a different body")}
				if tc.fixLength {
					cr.HeaderMutation = &extprocv3.HeaderMutation{SetHeaders: []*corev3HVO{setHeader("content-length", "16")}}
				}
				return bodyReply(dirResponse, cr)
			}), func(c *Config) { c.ExtProc.ProcessingMode = ProcessingMode{ResponseBodyMode: BodyBuffered} })
			env.upstream.setHandler(func(w http.ResponseWriter, _ *http.Request) {
				if !tc.chunked {
					w.Header().Set("Content-Length", "4")
				}
				_, _ = w.Write([]byte("orig"))
				_ = http.NewResponseController(w).Flush()
			})
			res := env.do(t, http.MethodGet, "/", "", nil)
			require.NoError(t, res.err)
			require.Equal(t, tc.wantStatus, res.status)
			if tc.wantStatus == 200 {
				require.Equal(t, "a different body", res.body)
			}
			if tc.chunked {
				rec := env.fp.nextStream(t)
				rec.waitDone(t)
				te, _ := headerGet(rec.messages()[1].GetResponseHeaders().GetHeaders(), "transfer-encoding")
				require.Equal(t, "chunked", te)
			}
		})
	}
}
