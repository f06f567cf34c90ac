package extproc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"

	"github.com/idemgate/idemgate/extproc/config"
	"github.com/idemgate/idemgate/extproc/security"
	"github.com/idemgate/idemgate/internal/extprocdriver"
	"github.com/idemgate/idemgate/internal/testutil"
	"github.com/idemgate/idemgate/state"
	"github.com/idemgate/idemgate/state/memory"
)

// Test keys (not secrets).
var testKeys = map[string]string{
	"K1": "dGVzdC1rZXktazEtbm90LWEtc2VjcmV0LTMyYnl0ZXM=",
	"K0": "dGVzdC1rZXktazAtbm90LWEtc2VjcmV0LTMyYnl0ZXM=",
}

const testConfigYAML = `
signing: {active_key: k1, keys: {k1: {env: K1}, k0: {env: K0}}}
limits: {max_body_bytes: 4096}
store: {timeout: 2s}
ttl: {fingerprint: 15m, in_flight: 2m, terminal: 72h}
operations:
  - name: transfer
    scope: payments.transfer
    preview: {method: POST, path: /v1/transfers/preview}
    confirm: {method: POST, path: /v1/transfers/confirm}
    status: {method: POST, path: /v1/transfers/status}
    preview_tool: transfer_preview
    status_tool: transfer_status
    params: [{path: amount, type: decimal}, currency, payee.account_id]
    result_ref: transfer_id
  - name: payout
    scope: payments.payout
    preview: {method: POST, path: "/v1/accounts/{account}/payouts/preview"}
    confirm: {method: POST, path: "/v1/accounts/{account}/payouts/confirm"}
    status: {method: POST, path: "/v1/accounts/{account}/payouts/status"}
    preview_tool: payout_preview
    status_tool: payout_status
    params: [path.account, amount]
    downstream_idempotency_header: ""
    replay: raw
  - name: cancel_order
    scope: orders.cancel
    preview: {method: POST, path: "/v1/orders/{order}/cancel/preview"}
    confirm: {method: POST, path: "/v1/orders/{order}/cancel"}
    status: {method: GET, path: "/v1/orders/{order}/cancel/status"}
    preview_tool: cancel_preview
    status_tool: cancel_status
    params: [path.order]
`

func testConfig(t testing.TB, yaml string) *config.Runtime {
	t.Helper()
	rt, _, err := config.Parse("test.yaml", []byte(yaml), "", config.Options{LookupEnv: func(k string) (string, bool) {
		v, ok := testKeys[k]
		return v, ok
	}})
	require.NoError(t, err)
	return rt
}

// clock is a settable clock shared by the server and the memory store.
type clock struct{ ns atomic.Int64 }

func newClock() *clock {
	c := &clock{}
	c.ns.Store(time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC).UnixNano())
	return c
}
func (c *clock) Now() time.Time          { return time.Unix(0, c.ns.Load()).UTC() }
func (c *clock) Advance(d time.Duration) { c.ns.Add(int64(d)) }

// countingStore counts calls per operation (and can inject failures and
// panics), wrapping a real store. Hand-written, no mocks.
type countingStore struct {
	state.Store
	mu     sync.Mutex
	calls  map[string]int
	fail   atomic.Bool // every call fails with state.ErrUnavailable
	panics atomic.Bool // Acquire panics
}

func newCountingStore(s state.Store) *countingStore {
	return &countingStore{Store: s, calls: map[string]int{}}
}

func (c *countingStore) count(op string) error {
	c.mu.Lock()
	c.calls[op]++
	c.mu.Unlock()
	if c.fail.Load() {
		return state.Unavailable(op, errors.New("injected outage"))
	}
	return nil
}

func (c *countingStore) Calls(op string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.calls[op]
}

func (c *countingStore) Total() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, v := range c.calls {
		n += v
	}
	return n
}

func (c *countingStore) Acquire(ctx context.Context, req state.AcquireRequest) (state.Answer, error) {
	if c.panics.Load() {
		panic("injected panic in Acquire")
	}
	if err := c.count(state.OpAcquire); err != nil {
		return state.Answer{}, err
	}
	return c.Store.Acquire(ctx, req)
}

func (c *countingStore) Complete(ctx context.Context, claim state.Claim, comp state.Completion) (state.Answer, error) {
	if err := c.count(state.OpComplete); err != nil {
		return state.Answer{}, err
	}
	return c.Store.Complete(ctx, claim, comp)
}

func (c *countingStore) EndLease(ctx context.Context, claim state.Claim) (state.Answer, error) {
	if err := c.count(state.OpEndLease); err != nil {
		return state.Answer{}, err
	}
	return c.Store.EndLease(ctx, claim)
}

func (c *countingStore) AbandonUnsent(ctx context.Context, claim state.Claim) (state.Answer, error) {
	if err := c.count(state.OpAbandonUnsent); err != nil {
		return state.Answer{}, err
	}
	return c.Store.AbandonUnsent(ctx, claim)
}

func (c *countingStore) MarkUnknown(ctx context.Context, claim state.Claim) (state.Answer, error) {
	if err := c.count(state.OpMarkUnknown); err != nil {
		return state.Answer{}, err
	}
	return c.Store.MarkUnknown(ctx, claim)
}

func (c *countingStore) Takeover(ctx context.Context, req state.TakeoverRequest) (state.Answer, error) {
	if err := c.count(state.OpTakeover); err != nil {
		return state.Answer{}, err
	}
	return c.Store.Takeover(ctx, req)
}

func (c *countingStore) Get(ctx context.Context, key string) (state.Record, bool, error) {
	if err := c.count(state.OpGet); err != nil {
		return state.Record{}, false, err
	}
	return c.Store.Get(ctx, key)
}

// env is one server under test with its store, clock, logs and metrics.
type env struct {
	t       testing.TB
	cfg     *config.Runtime
	store   *countingStore
	clock   *clock
	logs    *testutil.SyncBuffer
	logger  *slog.Logger
	reg     *prometheus.Registry
	metrics *Metrics
	srv     *Server
}

func newEnv(t testing.TB, backend state.Store, clk *clock) *env {
	t.Helper()
	if clk == nil {
		clk = newClock()
	}
	if backend == nil {
		backend = memory.New(memory.Options{Now: clk.Now})
	}
	e := &env{t: t, cfg: testConfig(t, testConfigYAML), clock: clk, logs: &testutil.SyncBuffer{}, reg: prometheus.NewRegistry()}
	e.metrics = NewMetrics(e.reg)
	e.logger = slog.New(slog.NewTextHandler(e.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	e.useStore(t, backend)
	return e
}

// useStore (re)builds the server on backend.
func (e *env) useStore(t testing.TB, backend state.Store) {
	t.Helper()
	e.store = newCountingStore(backend)
	srv, err := NewServer(Options{
		Config: e.cfg, Store: e.store, Logger: e.logger, Metrics: e.metrics,
		Security: security.New(e.logger, e.metrics.SecurityCounters(), security.WebhookOptions{}),
		Now:      e.clock.Now,
	})
	require.NoError(t, err)
	e.srv = srv
}

// clientStream is the Envoy side of one ext_proc stream.
type clientStream interface {
	Send(*extprocv3.ProcessingRequest) error
	Recv() (*extprocv3.ProcessingResponse, error)
	// Close ends the stream the way Envoy does: half-close, then cancel.
	Close()
}

// dialer opens streams to the server under test.
type dialer interface {
	client() extprocdriver.Client
	open(t testing.TB) clientStream
}

// fakeDialer serves streams in-process (extprocdriver.InProcess).
type fakeDialer struct {
	srv *Server
	// shareReplies hands the client the server's reply itself instead of a
	// copy: only for benchmarks, which are sequential and read each reply
	// before the next request (so their allocation counts are the server's
	// and the harness's, not a copy's).
	shareReplies bool
}

func (d fakeDialer) client() extprocdriver.Client {
	return &extprocdriver.InProcess{Server: d.srv, ShareReplies: d.shareReplies}
}

func (d fakeDialer) open(t testing.TB) clientStream { return d.openFake(t) }

// fakeClient is one in-process stream.
type fakeClient struct{ *extprocdriver.Stream }

func (d fakeDialer) openFake(t testing.TB) *fakeClient {
	c := &fakeClient{(&extprocdriver.InProcess{Server: d.srv, ShareReplies: d.shareReplies}).Open(context.Background())}
	t.Cleanup(c.Close)
	return c
}

// wait returns what Process returned.
func (c *fakeClient) wait(t testing.TB) error {
	select {
	case <-c.Done():
		return c.Err()
	case <-time.After(10 * time.Second):
		t.Fatal("Process did not return")
		return nil
	}
}

// --- real gRPC ----------------------------------------------------------------

type grpcDialer struct {
	c extprocv3.ExternalProcessorClient
}

func (d grpcDialer) client() extprocdriver.Client { return d.c }

type grpcClient struct {
	extprocv3.ExternalProcessor_ProcessClient
	cancel context.CancelFunc
}

func (c *grpcClient) Close() {
	_ = c.CloseSend()
	c.cancel()
}

func (d grpcDialer) open(t testing.TB) clientStream {
	ctx, cancel := context.WithCancel(context.Background())
	s, err := d.c.Process(ctx)
	require.NoError(t, err)
	t.Cleanup(cancel)
	return &grpcClient{ExternalProcessor_ProcessClient: s, cancel: cancel}
}

// startGRPC serves e.srv on a loopback port and returns a dialer.
func (e *env) startGRPC(t testing.TB) grpcDialer {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	hs := health.NewServer()
	SetServing(hs, true)
	g := NewGRPCServer(e.srv, hs)
	go func() { _ = g.Serve(lis) }()
	t.Cleanup(g.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	return grpcDialer{c: extprocv3.NewExternalProcessorClient(conn)}
}

// --- one HTTP exchange, Envoy's side played by extprocdriver ----------------

type header struct{ k, v string }

// httpRequest is what the downstream client sends through Envoy.
type httpRequest struct {
	method, path string
	headers      []header
	body         []byte // nil: the request has no body (end_of_stream on headers)
	metadata     *corev3.Metadata
}

// upstreamReply is what the upstream answers; reset simulates an upstream
// timeout or reset (Envoy's local reply never reaches ext_proc: the stream
// is just torn down).
type upstreamReply struct {
	status  int
	headers []header
	body    []byte
	reset   bool
}

type upstreamFunc func(headers map[string]string, body []byte) upstreamReply

// result is what happened to the exchange.
type result struct {
	immediate      *extprocv3.ImmediateResponse
	upstreamCalled bool
	upstreamHdrs   map[string]string
	upstreamBody   []byte
	// What the client received.
	status  int
	headers map[string]string
	body    []byte
	// replies counts the messages idemgate answered.
	replies int
	// marks are what the driver observed (extprocdriver.Marks).
	marks extprocdriver.Marks
}

func (r result) json(t testing.TB) map[string]any {
	t.Helper()
	var m map[string]any
	require.NoError(t, json.Unmarshal(r.body, &m), string(r.body))
	return m
}

func headerValues(hs []header) []*corev3.HeaderValue {
	out := make([]*corev3.HeaderValue, 0, len(hs))
	for _, h := range hs {
		out = append(out, &corev3.HeaderValue{Key: h.k, RawValue: []byte(h.v)})
	}
	return out
}

func headerMap(hs []header) *corev3.HeaderMap {
	return &corev3.HeaderMap{Headers: headerValues(hs)}
}

// testFilter is envoy/envoy.yaml's ext_proc filter (BUFFERED both ways,
// headers SEND, trailers SKIP, allow_mode_override), with a message timeout
// long enough for a loaded test machine.
var testFilter = func() extprocdriver.Filter {
	f := extprocdriver.EnvoyFilter()
	f.MessageTimeout = 10 * time.Second
	return f
}()

// do runs one HTTP exchange through idemgate exactly as Envoy does (see
// extprocdriver): one message per phase, one reply each, mode overrides
// honoured, header mutations in body replies applied to the held headers,
// content-length checked after a body mutation. Anything Envoy would fail
// the request for, a header set through value (Envoy reads raw_value) and a
// mode_override in a body reply (Envoy ignores it) fail the test.
func do(t testing.TB, d dialer, req httpRequest, upstream upstreamFunc) result {
	t.Helper()
	return doWith(t, testFilter, d, req, upstream)
}

// doWith is do through filter f.
func doWith(t testing.TB, f extprocdriver.Filter, d dialer, req httpRequest, upstream upstreamFunc) result {
	t.Helper()
	hs := append([]header{{":method", req.method}, {":path", req.path}, {":authority", "api.example"}, {":scheme", "http"}}, req.headers...)
	if req.body != nil {
		hs = append(hs, header{"content-length", strconv.Itoa(len(req.body))})
	}
	dreq := &extprocdriver.Request{Headers: headerValues(hs), Body: req.body, Metadata: req.metadata}
	out, v := f.Trace(context.Background(), d.client(), dreq, func(headers map[string]string, body []byte) extprocdriver.Response {
		up := upstream(headers, body)
		rhs := append([]header{{":status", strconv.Itoa(up.status)}}, up.headers...)
		if len(up.body) > 0 {
			rhs = append(rhs, header{"content-length", strconv.Itoa(len(up.body))})
		}
		return extprocdriver.Response{Status: up.status, Headers: headerValues(rhs), Body: up.body, Reset: up.reset}
	})
	require.Equal(t, extprocdriver.ErrNone, out.Error, "Envoy would fail the request: %v", out)
	require.Zero(t, out.Marks&extprocdriver.MarkValueField, "a header set through value, Envoy reads raw_value only")
	require.Zero(t, out.Marks&extprocdriver.MarkIgnoredOverride, "mode_override in a body reply is ignored by Envoy")
	require.Zero(t, out.Marks&extprocdriver.MarkClosedEarly, "the stream closed before a reply")
	return result{
		marks:     out.Marks,
		immediate: v.Immediate, upstreamCalled: v.UpstreamCalled, upstreamHdrs: v.UpstreamHeaders, upstreamBody: v.UpstreamBody,
		status: v.Status, headers: v.Headers, body: v.Body, replies: v.Replies,
	}
}

// --- the demo upstream ------------------------------------------------------

// payments is a test upstream that honours Idempotency-Key: a repeated key
// gets the first answer again without executing twice.
type payments struct {
	mu         sync.Mutex
	executions int
	byKey      map[string]upstreamReply
	next       func(n int) upstreamReply // overrides the default 201
}

func newPayments() *payments { return &payments{byKey: map[string]upstreamReply{}} }

func (p *payments) Executions() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.executions
}

func (p *payments) handle(headers map[string]string, body []byte) upstreamReply {
	p.mu.Lock()
	defer p.mu.Unlock()
	key := headers["idempotency-key"]
	if r, ok := p.byKey[key]; ok && key != "" {
		return r
	}
	p.executions++
	var r upstreamReply
	if p.next != nil {
		r = p.next(p.executions)
	} else {
		r = upstreamReply{status: 201, headers: []header{{"content-type", "application/json"}, {"x-upstream", "1"}},
			body: []byte(fmt.Sprintf(`{"transfer_id":"tr_%d","state":"executed"}`, p.executions))}
	}
	if key != "" && !r.reset {
		p.byKey[key] = r
	}
	return r
}

// previewOK is an upstream answering a preview quote.
func previewOK(headers map[string]string, body []byte) upstreamReply {
	return upstreamReply{status: 200, headers: []header{{"content-type", "application/json"}}, body: []byte(`{"quote":{"fee":"0.50"},"amount":"100.00"}`)}
}

func neverCalled(t testing.TB) upstreamFunc {
	return func(map[string]string, []byte) upstreamReply {
		t.Fatal("the upstream must not be contacted")
		return upstreamReply{}
	}
}

// transfer builds a transfer request body.
func transferBody(amount, currency, account, fp string) []byte {
	m := map[string]any{"amount": json.RawMessage(amount), "currency": currency, "payee": map[string]any{"account_id": account}, "memo": "rent"}
	if fp != "" {
		m["fingerprint"] = fp
	}
	b, _ := json.Marshal(m)
	return b
}

func post(path string, subject string, body []byte, extra ...header) httpRequest {
	hs := []header{{"x-request-id", "req-" + strings.ReplaceAll(path, "/", "_")}, {"content-type", "application/json"}}
	if subject != "" {
		hs = append(hs, header{"x-idemgate-subject", subject})
	}
	return httpRequest{method: "POST", path: path, headers: append(hs, extra...), body: body}
}

// preview runs a transfer preview and returns the fingerprint.
func preview(t testing.TB, d dialer, subject, amount string) string {
	t.Helper()
	res := do(t, d, post("/v1/transfers/preview", subject, transferBody(amount, "EUR", "DE89", "")), previewOK)
	require.Nil(t, res.immediate, "preview refused: %s", res.body)
	fp := res.json(t)["fingerprint"].(string)
	require.NotEmpty(t, fp)
	return fp
}
