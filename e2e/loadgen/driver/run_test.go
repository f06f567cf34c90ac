package driver

import (
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/peer"

	"github.com/idemgate/idemgate/internal/extprocdriver"
)

// server answers message i of each stream with reply(i, req) (nil: CONTINUE)
// and records the connections streams came on.
type server struct {
	extprocv3.UnimplementedExternalProcessorServer
	reply func(i int, req *extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse
	mu    sync.Mutex
	peers map[string]bool
}

func (s *server) Process(stream extprocv3.ExternalProcessor_ProcessServer) error {
	if p, ok := peer.FromContext(stream.Context()); ok {
		s.mu.Lock()
		s.peers[p.Addr.String()] = true
		s.mu.Unlock()
	}
	for i := 0; ; i++ {
		req, err := stream.Recv()
		if err != nil {
			return nil
		}
		var r *extprocv3.ProcessingResponse
		if s.reply != nil {
			r = s.reply(i, req)
		}
		if r == nil {
			r = extprocdriver.Continue(req)
		}
		if err := stream.Send(r); err != nil {
			return nil
		}
	}
}

func start(t *testing.T, reply func(i int, req *extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse, conns int) (*server, *extprocdriver.Conns) {
	t.Helper()
	srv := &server{reply: reply, peers: map[string]bool{}}
	addr, stop, err := extprocdriver.ServeLoopback(srv)
	require.NoError(t, err)
	t.Cleanup(stop)
	c, err := extprocdriver.Dial(t.Context(), addr, conns)
	require.NoError(t, err)
	t.Cleanup(c.Close)
	return srv, c
}

func hv(k, v string) *corev3.HeaderValue { return &corev3.HeaderValue{Key: k, RawValue: []byte(v)} }

func testRequest() *extprocdriver.Request {
	return &extprocdriver.Request{
		Headers: []*corev3.HeaderValue{
			hv(":authority", "payments.local"), hv(":path", "/v1/transfers/preview"), hv(":method", "POST"), hv(":scheme", "http"),
			hv("content-type", "application/json"), hv("content-length", "35"),
		},
		Body:            []byte(`{"amount":"12.50","currency":"EUR"}`),
		UpstreamStatus:  200,
		ResponseHeaders: []*corev3.HeaderValue{hv(":status", "200"), hv("content-type", "application/json"), hv("content-length", "17")},
		ResponseBody:    []byte(`{"quote_id":"q1"}`),
	}
}

type fixedSource struct{ req *extprocdriver.Request }

func (s fixedSource) Next(int) *extprocdriver.Request { return s.req }

type countedSource struct {
	mu   sync.Mutex
	left int
	req  *extprocdriver.Request
}

func (s *countedSource) Next(int) *extprocdriver.Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.left == 0 {
		return nil
	}
	s.left--
	return s.req
}

func TestRunMeasuresAWindowOverSeveralConnections(t *testing.T) {
	srv, conns := start(t, nil, 3)
	started := make(chan struct{})
	res, err := Run{
		Conns: conns, Filter: extprocdriver.EnvoyFilter(), Source: fixedSource{testRequest()},
		Concurrency: 4, Warmup: 100 * time.Millisecond, Duration: 300 * time.Millisecond,
		WindowStarted: func() { close(started) },
	}.Execute(t.Context())
	require.NoError(t, err)
	<-started
	require.Positive(t, res.Requests)
	require.Zero(t, res.Unexpected)
	require.Equal(t, map[extprocdriver.Outcome]uint64{{Status: 200}: res.Requests}, res.Outcomes)
	require.Equal(t, res.Requests, res.Latency.Count())
	require.Equal(t, 300*time.Millisecond, res.Elapsed)
	require.False(t, res.Exhausted)
	require.InDelta(t, float64(res.Requests)/0.3, res.RPS(), 0.001)
	srv.mu.Lock()
	require.Len(t, srv.peers, 3, "streams were spread over three connections")
	srv.mu.Unlock()
}

func TestRunEndsEarlyWhenTheSourceRunsOut(t *testing.T) {
	_, conns := start(t, nil, 1)

	_, err := Run{Conns: conns, Filter: extprocdriver.EnvoyFilter(), Source: &countedSource{left: 0, req: testRequest()},
		Concurrency: 2, Warmup: 50 * time.Millisecond, Duration: time.Second}.Execute(t.Context())
	require.ErrorIs(t, err, ErrExhaustedInWarmup)

	res, err := Run{Conns: conns, Filter: extprocdriver.EnvoyFilter(), Source: &countedSource{left: 200, req: testRequest()},
		Concurrency: 2, Duration: 10 * time.Second}.Execute(t.Context())
	require.NoError(t, err)
	require.True(t, res.Exhausted)
	require.Equal(t, uint64(200), res.Requests)
	require.Less(t, res.Elapsed, 10*time.Second)
}

func TestRunCountsUnexpectedOutcomes(t *testing.T) {
	_, conns := start(t, func(i int, _ *extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse {
		if i == 1 {
			return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{
				ImmediateResponse: &extprocv3.ImmediateResponse{Status: &typev3.HttpStatus{Code: typev3.StatusCode_Conflict}},
			}}
		}
		return nil
	}, 1)
	res, err := Run{Conns: conns, Filter: extprocdriver.EnvoyFilter(), Source: fixedSource{testRequest()},
		Concurrency: 2, Duration: 200 * time.Millisecond}.Execute(t.Context())
	require.NoError(t, err)
	require.Positive(t, res.Requests)
	require.Equal(t, res.Requests, res.Unexpected)
	require.Equal(t, "local 409", extprocdriver.Outcome{Status: 409, Local: true}.String())
	require.Equal(t, map[extprocdriver.Outcome]uint64{{Status: 409, Local: true}: res.Requests}, res.Outcomes)
}
