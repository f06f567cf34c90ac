package extprocdriver

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// seen is what the fake server observed about one message.
type seen struct {
	kind        string
	eos         bool
	protocol    bool
	metadata    bool
	bodyLen     int
	headerCount int
}

// action is the fake server's answer to message i of a stream: a reply, or
// (reply nil) an error to end the stream with (nil error: close with OK),
// or hang until the client goes away.
type action struct {
	reply *extprocv3.ProcessingResponse
	err   error
	hang  bool
}

// scriptedServer answers each message through script and records what it saw.
type scriptedServer struct {
	extprocv3.UnimplementedExternalProcessorServer
	script func(i int, req *extprocv3.ProcessingRequest) action

	mu      sync.Mutex
	streams [][]seen
	peers   map[string]bool
	ended   chan error
}

func (s *scriptedServer) Process(stream extprocv3.ExternalProcessor_ProcessServer) (err error) {
	var got []seen
	defer func() {
		s.mu.Lock()
		s.streams = append(s.streams, got)
		if p, ok := peer.FromContext(stream.Context()); ok {
			s.peers[p.Addr.String()] = true
		}
		s.mu.Unlock()
	}()
	for i := 0; ; i++ {
		req, err := stream.Recv()
		if err != nil {
			select {
			case s.ended <- err:
			default:
			}
			return nil
		}
		got = append(got, describe(req))
		a := s.script(i, req)
		if a.hang {
			<-stream.Context().Done()
			return nil
		}
		if a.reply == nil {
			return a.err
		}
		if err := stream.Send(a.reply); err != nil {
			return nil
		}
	}
}

func describe(req *extprocv3.ProcessingRequest) seen {
	s := seen{protocol: req.GetProtocolConfig() != nil, metadata: req.GetMetadataContext() != nil}
	switch r := req.GetRequest().(type) {
	case *extprocv3.ProcessingRequest_RequestHeaders:
		s.kind, s.eos, s.headerCount = "request_headers", r.RequestHeaders.GetEndOfStream(), len(r.RequestHeaders.GetHeaders().GetHeaders())
	case *extprocv3.ProcessingRequest_RequestBody:
		s.kind, s.eos, s.bodyLen = "request_body", r.RequestBody.GetEndOfStream(), len(r.RequestBody.GetBody())
	case *extprocv3.ProcessingRequest_ResponseHeaders:
		s.kind, s.eos, s.headerCount = "response_headers", r.ResponseHeaders.GetEndOfStream(), len(r.ResponseHeaders.GetHeaders().GetHeaders())
	case *extprocv3.ProcessingRequest_ResponseBody:
		s.kind, s.eos, s.bodyLen = "response_body", r.ResponseBody.GetEndOfStream(), len(r.ResponseBody.GetBody())
	default:
		s.kind = "other"
	}
	return s
}

func (s *scriptedServer) kinds() [][]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out [][]string
	for _, st := range s.streams {
		var k []string
		for _, m := range st {
			k = append(k, m.kind)
		}
		out = append(out, k)
	}
	return out
}

func newScripted(script func(i int, req *extprocv3.ProcessingRequest) action) *scriptedServer {
	return &scriptedServer{script: script, peers: map[string]bool{}, ended: make(chan error, 1)}
}

func startScripted(t *testing.T, script func(i int, req *extprocv3.ProcessingRequest) action) (*scriptedServer, string) {
	t.Helper()
	srv := newScripted(script)
	addr, stop, err := ServeLoopback(srv)
	require.NoError(t, err)
	t.Cleanup(stop)
	return srv, addr
}

func hv(k, v string) *corev3.HeaderValue { return &corev3.HeaderValue{Key: k, RawValue: []byte(v)} }

func testRequest() *Request {
	body := []byte(`{"amount":"12.50","currency":"EUR"}`)
	resp := []byte(`{"quote_id":"q1"}`)
	return &Request{
		Headers: []*corev3.HeaderValue{
			hv(":authority", "payments.local"), hv(":path", "/v1/transfers/preview"), hv(":method", "POST"), hv(":scheme", "http"),
			hv("content-type", "application/json"), hv("content-length", "35"),
		},
		Body:            body,
		UpstreamStatus:  200,
		ResponseHeaders: []*corev3.HeaderValue{hv(":status", "200"), hv("content-type", "application/json"), hv("content-length", "17")},
		ResponseBody:    resp,
	}
}

func setHeaders(kv ...string) *extprocv3.HeaderMutation {
	hm := &extprocv3.HeaderMutation{}
	for i := 0; i < len(kv); i += 2 {
		hm.SetHeaders = append(hm.SetHeaders, &corev3.HeaderValueOption{Header: hv(kv[i], kv[i+1])})
	}
	return hm
}

var allFour = []string{"request_headers", "request_body", "response_headers", "response_body"}

func TestDoHonoursWhatTheServerSays(t *testing.T) {
	replaced := []byte(`{"quote_id":"q1","fingerprint":"abc"}`)
	for _, tc := range []struct {
		name    string
		filter  func(*Filter)
		script  func(i int, req *extprocv3.ProcessingRequest) action
		want    Outcome
		wantMsg []string
	}{
		{
			name:    "continue to everything: four messages, upstream 200",
			script:  func(_ int, req *extprocv3.ProcessingRequest) action { return action{reply: Continue(req)} },
			want:    Outcome{Status: 200},
			wantMsg: allFour,
		},
		{
			name: "immediate response to the request body ends the request with its status",
			script: func(i int, req *extprocv3.ProcessingRequest) action {
				if i == 1 {
					return action{reply: &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{
						ImmediateResponse: &extprocv3.ImmediateResponse{Status: &typev3.HttpStatus{Code: typev3.StatusCode_Conflict}, Body: []byte(`{}`)},
					}}}
				}
				return action{reply: Continue(req)}
			},
			want:    Outcome{Status: 409, Local: true},
			wantMsg: allFour[:2],
		},
		{
			name: "immediate response without a status is a 200",
			script: func(int, *extprocv3.ProcessingRequest) action {
				return action{reply: &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{ImmediateResponse: &extprocv3.ImmediateResponse{}}}}
			},
			want:    Outcome{Status: 200, Local: true},
			wantMsg: allFour[:1],
		},
		{
			name: "mode_override response_body_mode NONE in the response headers reply: no body message",
			script: func(i int, req *extprocv3.ProcessingRequest) action {
				r := Continue(req)
				if i == 2 {
					r.ModeOverride = &filterv3.ProcessingMode{ResponseBodyMode: filterv3.ProcessingMode_NONE}
				}
				return action{reply: r}
			},
			want:    Outcome{Status: 200, Marks: MarkModeOverride},
			wantMsg: allFour[:3],
		},
		{
			name: "mode_override is ignored without allow_mode_override",
			filter: func(f *Filter) {
				f.AllowModeOverride = false
			},
			script: func(i int, req *extprocv3.ProcessingRequest) action {
				r := Continue(req)
				if i == 2 {
					r.ModeOverride = &filterv3.ProcessingMode{ResponseBodyMode: filterv3.ProcessingMode_NONE}
				}
				return action{reply: r}
			},
			want:    Outcome{Status: 200},
			wantMsg: allFour,
		},
		{
			name: "pass-through override at request headers skips every later phase",
			script: func(i int, req *extprocv3.ProcessingRequest) action {
				r := Continue(req)
				r.ModeOverride = &filterv3.ProcessingMode{
					ResponseHeaderMode: filterv3.ProcessingMode_SKIP, RequestBodyMode: filterv3.ProcessingMode_NONE,
					ResponseBodyMode: filterv3.ProcessingMode_NONE,
				}
				return action{reply: r}
			},
			want:    Outcome{Status: 200, Marks: MarkModeOverride},
			wantMsg: allFour[:1],
		},
		{
			name: "CONTINUE_AND_REPLACE at request headers: no request body message",
			script: func(i int, req *extprocv3.ProcessingRequest) action {
				r := Continue(req)
				if i == 0 {
					r.GetRequestHeaders().Response = &extprocv3.CommonResponse{Status: extprocv3.CommonResponse_CONTINUE_AND_REPLACE}
				}
				return action{reply: r}
			},
			want:    Outcome{Status: 200},
			wantMsg: []string{"request_headers", "response_headers", "response_body"},
		},
		{
			name: "idempotency-key set on the request and the response body replaced with its content-length",
			script: func(i int, req *extprocv3.ProcessingRequest) action {
				r := Continue(req)
				switch i {
				case 1:
					r.GetRequestBody().Response = &extprocv3.CommonResponse{HeaderMutation: setHeaders("idempotency-key", "00ff")}
				case 3:
					r.GetResponseBody().Response = &extprocv3.CommonResponse{
						HeaderMutation: setHeaders("content-length", "37", "idempotency-fingerprint", "abc"),
						BodyMutation:   &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_Body{Body: replaced}},
					}
				}
				return action{reply: r}
			},
			want:    Outcome{Status: 200, Marks: MarkRequestHeaders | MarkIdempotencyKey | MarkResponseHeaders | MarkResponseBody},
			wantMsg: allFour,
		},
		{
			name: "a body replacement without the new content-length is a 500",
			script: func(i int, req *extprocv3.ProcessingRequest) action {
				r := Continue(req)
				if i == 3 {
					r.GetResponseBody().Response = &extprocv3.CommonResponse{
						BodyMutation: &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_Body{Body: replaced}},
					}
				}
				return action{reply: r}
			},
			want:    Outcome{Status: 500, Local: true, Error: ErrContentLength, Marks: MarkResponseBody},
			wantMsg: allFour,
		},
		{
			name: "a header with value and raw_value is a 500",
			script: func(i int, req *extprocv3.ProcessingRequest) action {
				r := Continue(req)
				r.GetRequestHeaders().Response = &extprocv3.CommonResponse{HeaderMutation: &extprocv3.HeaderMutation{
					SetHeaders: []*corev3.HeaderValueOption{{Header: &corev3.HeaderValue{Key: "x-a", Value: "v", RawValue: []byte("v")}}},
				}}
				return action{reply: r}
			},
			want:    Outcome{Status: 500, Local: true, Error: ErrMutation},
			wantMsg: allFour[:1],
		},
		{
			name: "a reply of the wrong kind is spurious: 500",
			script: func(i int, req *extprocv3.ProcessingRequest) action {
				if i == 1 {
					return action{reply: &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: &extprocv3.BodyResponse{}}}}
				}
				return action{reply: Continue(req)}
			},
			want:    Outcome{Status: 500, Local: true, Error: ErrSpurious},
			wantMsg: allFour[:2],
		},
		{
			name: "no reply within the message timeout is a 504",
			filter: func(f *Filter) {
				f.MessageTimeout = 50 * time.Millisecond
			},
			script: func(i int, req *extprocv3.ProcessingRequest) action {
				if i == 2 {
					return action{hang: true}
				}
				return action{reply: Continue(req)}
			},
			want:    Outcome{Status: 504, Local: true, Error: ErrTimeout},
			wantMsg: allFour[:3],
		},
		{
			name: "the stream ending with an error status is a 500",
			script: func(i int, req *extprocv3.ProcessingRequest) action {
				return action{err: status.Error(codes.Unavailable, "store down")}
			},
			want:    Outcome{Status: 500, Local: true, Error: ErrGRPC, Code: codes.Unavailable},
			wantMsg: allFour[:1],
		},
		{
			name: "the stream closing with OK lets the request continue unmodified",
			script: func(i int, req *extprocv3.ProcessingRequest) action {
				if i == 1 {
					return action{}
				}
				return action{reply: Continue(req)}
			},
			want:    Outcome{Status: 200, Marks: MarkClosedEarly},
			wantMsg: allFour[:2],
		},
	} {
		for _, transport := range []string{"grpc", "in-process"} {
			t.Run(transport+"/"+tc.name, func(t *testing.T) {
				var (
					srv *scriptedServer
					c   Client
				)
				if transport == "grpc" {
					var addr string
					srv, addr = startScripted(t, tc.script)
					conns, err := Dial(t.Context(), addr, 1)
					require.NoError(t, err)
					defer conns.Close()
					c = conns.Next()
				} else {
					srv = newScripted(tc.script)
					c = &InProcess{Server: srv}
				}
				f := EnvoyFilter()
				if tc.filter != nil {
					tc.filter(&f)
				}
				got := f.Do(t.Context(), c, testRequest(), nil)
				require.Equal(t, tc.want, got)
				require.Eventually(t, func() bool { return len(srv.kinds()) == 1 }, 5*time.Second, 5*time.Millisecond)
				require.Equal(t, tc.wantMsg, srv.kinds()[0])
				// Trace ends the same way.
				gotTraced, v := f.Trace(t.Context(), c, testRequest(), nil)
				require.Equal(t, tc.want, gotTraced)
				require.Equal(t, tc.want.Status, v.Status)
			})
		}
	}
}

func TestDoSendsWhatEnvoySends(t *testing.T) {
	srv, addr := startScripted(t, func(_ int, req *extprocv3.ProcessingRequest) action { return action{reply: Continue(req)} })
	conns, err := Dial(t.Context(), addr, 1)
	require.NoError(t, err)
	defer conns.Close()
	req := testRequest()
	req.Metadata = &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{"envoy.filters.http.jwt_authn": {}}}
	require.Equal(t, Outcome{Status: 200}, EnvoyFilter().Do(t.Context(), conns.Next(), req, nil))

	require.Eventually(t, func() bool { return len(srv.kinds()) == 1 }, 5*time.Second, 5*time.Millisecond)
	srv.mu.Lock()
	msgs := srv.streams[0]
	srv.mu.Unlock()
	require.Equal(t, []seen{
		{kind: "request_headers", protocol: true, metadata: true, headerCount: 6},
		{kind: "request_body", eos: true, metadata: true, bodyLen: len(req.Body)},
		{kind: "response_headers", metadata: true, headerCount: 3},
		{kind: "response_body", eos: true, metadata: true, bodyLen: len(req.ResponseBody)},
	}, msgs)
	// Envoy half-closes and resets: the server sees the stream end.
	select {
	case err := <-srv.ended:
		require.True(t, status.Code(err) == codes.Canceled || err.Error() == "EOF", "stream ended with %v", err)
	case <-time.After(5 * time.Second):
		t.Fatal("the stream was not closed")
	}
}

func TestDoIgnoresOverrideMessageTimeout(t *testing.T) {
	// With max_message_timeout unset Envoy drops a timer extension and keeps
	// waiting for the real reply.
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	gs := grpc.NewServer()
	extprocv3.RegisterExternalProcessorServer(gs, overrideFirst{})
	go func() { _ = gs.Serve(lis) }()
	defer gs.Stop()
	conns, err := Dial(t.Context(), lis.Addr().String(), 1)
	require.NoError(t, err)
	defer conns.Close()
	require.Equal(t, Outcome{Status: 200}, EnvoyFilter().Do(t.Context(), conns.Next(), testRequest(), nil))
}

// overrideFirst sends override_message_timeout before each real reply.
type overrideFirst struct {
	extprocv3.UnimplementedExternalProcessorServer
}

func (overrideFirst) Process(stream extprocv3.ExternalProcessor_ProcessServer) error {
	for {
		req, err := stream.Recv()
		if err != nil {
			return nil
		}
		if err := stream.Send(&extprocv3.ProcessingResponse{OverrideMessageTimeout: durationpb.New(time.Second)}); err != nil {
			return nil
		}
		if err := stream.Send(Continue(req)); err != nil {
			return nil
		}
	}
}

func TestHoldKeepsTheStreamOpenBeforeTheResponsePhase(t *testing.T) {
	srv, addr := startScripted(t, func(_ int, req *extprocv3.ProcessingRequest) action { return action{reply: Continue(req)} })
	conns, err := Dial(t.Context(), addr, 1)
	require.NoError(t, err)
	defer conns.Close()
	held := make(chan struct{})
	release := make(chan struct{})
	done := make(chan Outcome, 1)
	go func() {
		done <- EnvoyFilter().Do(t.Context(), conns.Next(), testRequest(), func(ctx context.Context) error {
			close(held)
			select {
			case <-release:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		})
	}()
	<-held
	// Longer than the message timeout would allow: holding is not waiting
	// for a reply.
	time.Sleep(1200 * time.Millisecond)
	require.Empty(t, srv.kinds(), "the stream is still open")
	close(release)
	require.Equal(t, Outcome{Status: 200}, <-done)
	require.Eventually(t, func() bool { return len(srv.kinds()) == 1 }, 5*time.Second, 5*time.Millisecond)
	require.Equal(t, allFour, srv.kinds()[0])
}

func TestOutcomeString(t *testing.T) {
	for _, tc := range []struct {
		o    Outcome
		want string
	}{
		{Outcome{Status: 200}, "200"},
		{Outcome{Status: 200, Local: true}, "local 200"},
		{Outcome{Status: 504, Local: true, Error: ErrTimeout}, "504 message timeout"},
		{Outcome{Status: 500, Local: true, Error: ErrGRPC, Code: codes.Unavailable}, "500 grpc error Unavailable"},
	} {
		require.Equal(t, tc.want, tc.o.String())
	}
}

// BenchmarkDo measures one request against an in-process CONTINUE server
// (client and server share the process): the load tool's own cost.
func BenchmarkDo(b *testing.B) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(b, err)
	gs := grpc.NewServer()
	extprocv3.RegisterExternalProcessorServer(gs, continueServer{})
	go func() { _ = gs.Serve(lis) }()
	defer gs.Stop()
	conns, err := Dial(b.Context(), lis.Addr().String(), 2)
	require.NoError(b, err)
	defer conns.Close()
	f := EnvoyFilter()
	req := testRequest()
	b.ReportAllocs()
	b.SetParallelism(8)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if out := f.Do(b.Context(), conns.Next(), req, nil); out.Status != 200 {
				b.Fatalf("outcome %v", out)
			}
		}
	})
}

// continueServer answers CONTINUE to every message.
type continueServer struct {
	extprocv3.UnimplementedExternalProcessorServer
}

func (continueServer) Process(stream extprocv3.ExternalProcessor_ProcessServer) error {
	for {
		req, err := stream.Recv()
		if err != nil {
			return nil
		}
		if err := stream.Send(Continue(req)); err != nil {
			return nil
		}
	}
}

func TestTraceReportsWhatTheUpstreamAndTheClientSee(t *testing.T) {
	replaced := []byte(`{"quote_id":"q1","fingerprint":"abc"}`)
	srv := newScripted(func(i int, req *extprocv3.ProcessingRequest) action {
		r := Continue(req)
		switch i {
		case 1:
			hm := setHeaders("idempotency-key", "00ff")
			hm.RemoveHeaders = []string{"content-type"}
			r.GetRequestBody().Response = &extprocv3.CommonResponse{
				HeaderMutation: hm,
				BodyMutation:   &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_Body{Body: []byte(`{"amount":"12.50","currency":"EUR"}`)}},
			}
		case 2:
			hm := setHeaders("x-b", "2")
			//lint:ignore SA1019 Envoy still honours append, which idemgate sets
			hm.SetHeaders[0].Append = wrapperspb.Bool(true)
			r.GetResponseHeaders().Response = &extprocv3.CommonResponse{HeaderMutation: hm}
		case 3:
			r.GetResponseBody().Response = &extprocv3.CommonResponse{
				HeaderMutation: setHeaders("content-length", "37"),
				BodyMutation:   &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_Body{Body: replaced}},
			}
		}
		return action{reply: r}
	})
	var upstreamSaw map[string]string
	out, v := EnvoyFilter().Trace(t.Context(), &InProcess{Server: srv}, testRequest(), func(h map[string]string, body []byte) Response {
		upstreamSaw = h
		return Response{Status: 201, Headers: []*corev3.HeaderValue{hv(":status", "201"), hv("x-b", "1"), hv("content-length", "17")}, Body: []byte(`{"quote_id":"q1"}`)}
	})
	require.Equal(t, Outcome{Status: 201, Marks: MarkRequestHeaders | MarkIdempotencyKey | MarkRequestBody | MarkResponseHeaders | MarkResponseBody}, out)
	require.True(t, v.UpstreamCalled)
	require.Equal(t, "00ff", upstreamSaw["idempotency-key"])
	require.NotContains(t, upstreamSaw, "content-type", "removed")
	require.Equal(t, upstreamSaw, v.UpstreamHeaders)
	require.Equal(t, 201, v.Status)
	require.Equal(t, "1,2", v.Headers["x-b"], "append joins")
	require.Equal(t, "37", v.Headers["content-length"])
	require.Equal(t, replaced, v.Body)
	require.Equal(t, 4, v.Replies)
	require.Nil(t, v.Immediate)
}

func TestTraceImmediateResponseResetAndMarks(t *testing.T) {
	im := &extprocv3.ImmediateResponse{
		Status:  &typev3.HttpStatus{Code: typev3.StatusCode_Conflict},
		Headers: setHeaders("content-type", "application/json"),
		Body:    []byte(`{"status":"in_progress"}`),
	}
	srv := newScripted(func(i int, req *extprocv3.ProcessingRequest) action {
		if i == 1 {
			return action{reply: &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{ImmediateResponse: im}}}
		}
		return action{reply: Continue(req)}
	})
	out, v := EnvoyFilter().Trace(t.Context(), &InProcess{Server: srv}, testRequest(), func(map[string]string, []byte) Response {
		t.Fatal("the upstream must not be called")
		return Response{}
	})
	require.Equal(t, Outcome{Status: 409, Local: true}, out)
	require.False(t, v.UpstreamCalled)
	require.Equal(t, 409, v.Status)
	require.Equal(t, map[string]string{"content-type": "application/json"}, v.Headers)
	require.Equal(t, im.GetBody(), v.Body)
	require.Equal(t, 2, v.Replies)

	// An upstream reset: Envoy's own 504, no response phase.
	cont := newScripted(func(_ int, req *extprocv3.ProcessingRequest) action { return action{reply: Continue(req)} })
	out, v = EnvoyFilter().Trace(t.Context(), &InProcess{Server: cont}, testRequest(), func(map[string]string, []byte) Response {
		return Response{Reset: true}
	})
	require.Equal(t, Outcome{Status: 504, Local: true}, out)
	require.True(t, v.UpstreamCalled)
	require.Equal(t, 504, v.Status)
	require.Equal(t, 2, v.Replies)

	// A header set through value and a mode_override in a body reply are
	// marked (Envoy reads raw_value only, and ignores the override).
	odd := newScripted(func(i int, req *extprocv3.ProcessingRequest) action {
		r := Continue(req)
		if i == 1 {
			r.GetRequestBody().Response = &extprocv3.CommonResponse{HeaderMutation: &extprocv3.HeaderMutation{
				SetHeaders: []*corev3.HeaderValueOption{{Header: &corev3.HeaderValue{Key: "x-a", Value: "v"}}},
			}}
			r.ModeOverride = &filterv3.ProcessingMode{ResponseBodyMode: filterv3.ProcessingMode_NONE}
		}
		return action{reply: r}
	})
	out, _ = EnvoyFilter().Trace(t.Context(), &InProcess{Server: odd}, testRequest(), nil)
	require.Equal(t, Outcome{Status: 200, Marks: MarkRequestHeaders | MarkValueField | MarkIgnoredOverride}, out)
}

func TestInProcessStream(t *testing.T) {
	srv := newScripted(func(i int, req *extprocv3.ProcessingRequest) action {
		if i == 1 {
			return action{err: status.Error(codes.Unavailable, "down")}
		}
		return action{reply: Continue(req)}
	})
	s := (&InProcess{Server: srv}).Open(t.Context())
	defer s.Close()
	require.NoError(t, s.Send(testRequestHeaders()))
	resp, err := s.Recv()
	require.NoError(t, err)
	require.NotNil(t, resp.GetRequestHeaders())
	require.Equal(t, 1, s.Received())
	require.NoError(t, s.Send(testRequestHeaders()))
	_, err = s.Recv()
	require.Equal(t, codes.Unavailable, status.Code(err))
	<-s.Done()
	require.Equal(t, codes.Unavailable, status.Code(s.Err()))

	// A failing transport: the server's Send fails, Process returns it.
	broken := errors.New("transport is closing")
	s = (&InProcess{Server: newScripted(func(_ int, req *extprocv3.ProcessingRequest) action { return action{reply: Continue(req)} })}).Open(t.Context())
	defer s.Close()
	s.FailSends(broken)
	require.NoError(t, s.Send(testRequestHeaders()))
	_, err = s.Recv()
	require.ErrorIs(t, err, io.EOF, "the scripted server ends with OK when its Send fails")
}

func testRequestHeaders() *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
		Headers: &corev3.HeaderMap{Headers: testRequest().Headers},
	}}}
}
