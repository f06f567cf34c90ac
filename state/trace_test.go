package state_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemgate/idemgate/state"
	"github.com/idemgate/idemgate/state/memory"
)

// failingPing is a memory store whose Ping fails.
type failingPing struct{ state.Store }

func (failingPing) Ping(context.Context) error { return errors.New("injected ping failure") }

func TestTraceSpansPerCallUnderTheCallersSpan(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	tracer := tp.Tracer("test")
	s := state.Trace(failingPing{memory.New(memory.Options{})}, "memory", tracer)

	// Outside a trace (readiness pings, the sweeper): no span at all.
	require.Error(t, s.Ping(t.Context()))
	_, err := s.Sweep(t.Context(), 10)
	require.NoError(t, err)
	require.Empty(t, exp.GetSpans())

	ctx, parent := tracer.Start(t.Context(), "stream")
	key := "0123456789abcdef0123456789abcdef"
	ans, err := s.Acquire(ctx, state.AcquireRequest{Key: key, Scope: "s", SubjectTag: "tag", ParamHash: "h", Owner: "o", Lease: time.Minute, Retention: time.Hour})
	require.NoError(t, err)
	require.Equal(t, state.OutcomeAcquired, ans.Outcome)
	_, found, err := s.Get(ctx, key)
	require.NoError(t, err)
	require.True(t, found)
	require.Error(t, s.Ping(ctx))
	parent.End()

	spans := exp.GetSpans()
	require.Len(t, spans, 4)
	byName := map[string]tracetest.SpanStub{}
	for _, sp := range spans {
		byName[sp.Name] = sp
	}
	for _, name := range []string{"store.acquire", "store.get", "store.ping"} {
		sp := byName[name]
		require.Equal(t, parent.SpanContext().SpanID(), sp.Parent.SpanID(), name)
		require.Equal(t, trace.SpanKindClient, sp.SpanKind, name)
	}
	attrs := func(sp tracetest.SpanStub) map[string]string {
		m := map[string]string{}
		for _, kv := range sp.Attributes {
			m[string(kv.Key)] = kv.Value.String()
		}
		return m
	}
	a := attrs(byName["store.acquire"])
	require.Equal(t, map[string]string{state.AttrStoreBackend: "memory", state.AttrStoreOp: "acquire", state.AttrNonce: key, state.AttrStoreOutcome: "ACQUIRED"}, a)
	require.Equal(t, "IN_FLIGHT", attrs(byName["store.get"])[state.AttrStoreOutcome])
	ping := byName["store.ping"]
	require.Equal(t, codes.Error, ping.Status.Code)
	require.Equal(t, "injected ping failure", ping.Status.Description)
	require.Len(t, ping.Events, 1)
	require.Equal(t, "exception", ping.Events[0].Name)
}
