package extproc

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemgate/idemgate/extproc/security"
	"github.com/idemgate/idemgate/state"
)

// The caller's trace: what an agent (or Envoy's tracer) sends as traceparent.
const (
	callerTraceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	callerSpanID  = "00f067aa0ba902b7"
	traceparent   = "00-" + callerTraceID + "-" + callerSpanID + "-01"
)

// traced rebuilds e's server with a tracer exporting synchronously to an
// in-memory exporter, and the traced store decorator over e's counting
// store (as serve wires them).
func traced(t testing.TB, e *env) *tracetest.InMemoryExporter {
	t.Helper()
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(t.Context()) })
	tracer := tp.Tracer(TracerName)
	srv, err := NewServer(Options{
		Config: e.cfg, Store: state.Trace(e.store, "memory", tracer), Logger: e.logger, Metrics: e.metrics,
		Security: security.New(e.logger, e.metrics.SecurityCounters(), security.WebhookOptions{}),
		Now:      e.clock.Now, Tracer: tracer,
	})
	require.NoError(t, err)
	e.srv = srv
	return exp
}

// streamSpans waits for the stream span named name (the stream span ends
// when Process returns, after the client saw its last reply) and returns it
// with every span exported so far.
func streamSpans(t *testing.T, exp *tracetest.InMemoryExporter, name string) (tracetest.SpanStub, tracetest.SpanStubs) {
	t.Helper()
	var root tracetest.SpanStub
	require.Eventually(t, func() bool {
		for _, s := range exp.GetSpans() {
			if s.Name == name {
				root = s
				return true
			}
		}
		return false
	}, 5*time.Second, 5*time.Millisecond, "no %s span exported", name)
	return root, exp.GetSpans()
}

func attrs(s tracetest.SpanStub) map[string]string {
	m := map[string]string{}
	for _, kv := range s.Attributes {
		m[string(kv.Key)] = kv.Value.String()
	}
	return m
}

func childrenOf(spans tracetest.SpanStubs, parent trace.SpanID) map[string]tracetest.SpanStub {
	m := map[string]tracetest.SpanStub{}
	for _, s := range spans {
		if s.Parent.SpanID() == parent {
			m[s.Name] = s
		}
	}
	return m
}

func TestTracingConfirmContinuesTheCallersTrace(t *testing.T) {
	e := newEnv(t, nil, nil)
	exp := traced(t, e)
	d := fakeDialer{srv: e.srv}
	fp := preview(t, d, "alice", `"100.00"`)
	_, _ = streamSpans(t, exp, "idemgate.preview")
	exp.Reset()

	res := do(t, d, post("/v1/transfers/confirm", "alice", transferBody(`"100.00"`, "EUR", "DE89", fp), header{"traceparent", traceparent}), newPayments().handle)
	require.Nil(t, res.immediate, "confirm refused: %s", res.body)
	root, spans := streamSpans(t, exp, "idemgate.confirm")

	// The stream span continues the caller's trace, under the caller's span.
	require.Equal(t, callerTraceID, root.SpanContext.TraceID().String())
	require.Equal(t, callerSpanID, root.Parent.SpanID().String())
	require.True(t, root.Parent.IsRemote())
	require.Equal(t, trace.SpanKindServer, root.SpanKind)
	a := attrs(root)
	require.Equal(t, "transfer", a[attrOperation])
	require.Equal(t, "payments.transfer", a[attrScope])
	require.Equal(t, "acquired", a[attrDecision])
	require.Equal(t, "done", a[attrOutcomeClass])
	nonce := res.upstreamHdrs["idempotency-key"]
	require.Len(t, nonce, 32)
	require.Equal(t, nonce, a[state.AttrNonce])
	require.Equal(t, codes.Unset, root.Status.Code)

	kids := childrenOf(spans, root.SpanContext.SpanID())
	for _, name := range []string{spanVerify, spanAcquire, spanUpstream, spanComplete} {
		require.Contains(t, kids, name, "child spans: %v", kids)
		require.Equal(t, callerTraceID, kids[name].SpanContext.TraceID().String())
	}
	require.Equal(t, "201", attrs(kids[spanUpstream])[attrHTTPStatus])
	// The upstream wait lies between acquire and complete.
	require.False(t, kids[spanUpstream].StartTime.Before(kids[spanAcquire].EndTime))
	require.False(t, kids[spanComplete].StartTime.Before(kids[spanUpstream].EndTime))
	// Each store call is a span under the step that made it.
	acq := childrenOf(spans, kids[spanAcquire].SpanContext.SpanID())
	require.Contains(t, acq, "store.acquire")
	require.Equal(t, "ACQUIRED", attrs(acq["store.acquire"])[state.AttrStoreOutcome])
	require.Equal(t, nonce, attrs(acq["store.acquire"])[state.AttrNonce])
	require.Contains(t, childrenOf(spans, kids[spanComplete].SpanContext.SpanID()), "store.complete")

	// No subject and no param value in any attribute or event of any span.
	for _, s := range spans {
		for _, kv := range s.Attributes {
			v := kv.Value.String()
			for _, secret := range []string{"alice", "100.00", "EUR", "DE89", "rent"} {
				require.NotContains(t, v, secret, "span %s attribute %s", s.Name, kv.Key)
			}
		}
	}

	// A replay is decided by the store: the decision says so, no upstream span.
	exp.Reset()
	res = do(t, d, post("/v1/transfers/confirm", "alice", transferBody(`"100.00"`, "EUR", "DE89", fp), header{"traceparent", traceparent}), neverCalled(t))
	require.NotNil(t, res.immediate)
	root, spans = streamSpans(t, exp, "idemgate.confirm")
	require.Equal(t, "already_completed", attrs(root)[attrDecision])
	require.NotContains(t, childrenOf(spans, root.SpanContext.SpanID()), spanUpstream)
}

func TestTracingStoreFailureIsRecorded(t *testing.T) {
	e := newEnv(t, nil, nil)
	exp := traced(t, e)
	d := fakeDialer{srv: e.srv}
	fp := preview(t, d, "alice", `1`)
	e.store.fail.Store(true)
	exp.Reset()
	res := do(t, d, post("/v1/transfers/confirm", "alice", transferBody(`1`, "EUR", "DE89", fp), header{"traceparent", traceparent}), neverCalled(t))
	require.NotNil(t, res.immediate)
	root, spans := streamSpans(t, exp, "idemgate.confirm")
	require.Equal(t, "temporarily_unavailable", attrs(root)[attrDecision])
	require.Equal(t, codes.Error, root.Status.Code)
	require.True(t, hasException(root), "stream span has no exception event")
	acq := childrenOf(spans, root.SpanContext.SpanID())[spanAcquire]
	require.Equal(t, codes.Error, acq.Status.Code)
	call := childrenOf(spans, acq.SpanContext.SpanID())["store.acquire"]
	require.Equal(t, codes.Error, call.Status.Code)
	require.Contains(t, call.Status.Description, "injected outage")
	require.True(t, hasException(call))
}

func hasException(s tracetest.SpanStub) bool {
	for _, ev := range s.Events {
		if ev.Name == "exception" {
			return true
		}
	}
	return false
}

func TestTracingSecurityAlertCarriesTheTraceID(t *testing.T) {
	e := newEnv(t, nil, nil)
	exp := traced(t, e)
	d := fakeDialer{srv: e.srv}
	fp := preview(t, d, "alice", `"100.00"`)
	exp.Reset()
	res := do(t, d, post("/v1/transfers/confirm", "alice", transferBody(`"250.00"`, "EUR", "DE89", fp), header{"traceparent", traceparent}), neverCalled(t))
	require.NotNil(t, res.immediate)
	root, spans := streamSpans(t, exp, "idemgate.confirm")
	require.Equal(t, "params_changed", attrs(root)[attrDecision])
	require.Equal(t, codes.Error, root.Status.Code)
	require.Equal(t, "security_alert: params_changed", root.Status.Description)
	verify := childrenOf(spans, root.SpanContext.SpanID())[spanVerify]
	require.Equal(t, "params_changed", attrs(verify)[attrVerify])
	for _, s := range spans {
		for _, kv := range s.Attributes {
			require.NotContains(t, kv.Value.String(), "250.00")
		}
	}
	var line string
	for _, l := range strings.Split(e.logs.String(), "\n") {
		if strings.Contains(l, "event=security_alert") {
			line = l
		}
	}
	require.Contains(t, line, "otel_trace_id="+callerTraceID)

	// Without a sampled span (tracing off) the line has no otel_trace_id.
	e2 := newEnv(t, nil, nil)
	d2 := fakeDialer{srv: e2.srv}
	fp = preview(t, d2, "alice", `"100.00"`)
	do(t, d2, post("/v1/transfers/confirm", "alice", transferBody(`"250.00"`, "EUR", "DE89", fp), header{"traceparent", traceparent}), neverCalled(t))
	require.Contains(t, e2.logs.String(), "event=security_alert")
	require.NotContains(t, e2.logs.String(), "otel_trace_id")
}

func TestTracingSkipsPassThroughAndStartsATraceWithoutTraceparent(t *testing.T) {
	e := newEnv(t, nil, nil)
	exp := traced(t, e)
	d := fakeDialer{srv: e.srv}
	s := d.openFake(t)
	require.NoError(t, s.Send(passThroughRequest("/v1/other")))
	_, err := s.Recv()
	require.NoError(t, err)
	s.Close()
	require.NoError(t, s.wait(t))
	require.Empty(t, exp.GetSpans(), "pass-through traffic must not be traced")

	preview(t, d, "alice", `1`)
	root, _ := streamSpans(t, exp, "idemgate.preview")
	require.False(t, root.Parent.IsValid(), "without traceparent the stream span is a root")
	require.Equal(t, "preview", attrs(root)[attrRoute])
}
