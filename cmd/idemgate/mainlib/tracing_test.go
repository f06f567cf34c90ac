package mainlib

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/idemgate/idemgate/cmd/idemgate/settings"
	"github.com/idemgate/idemgate/extproc"
)

func TestStartTracingOffHasNoTracer(t *testing.T) {
	tracer, shutdown, err := startTracing(t.Context(), settings.TracingSettings{})
	require.NoError(t, err)
	require.Nil(t, tracer, "no tracer: the server skips every hook")
	require.NoError(t, shutdown(t.Context()))
}

// With a collector that is not there, serve still starts (the exporter
// connects lazily) and shutdown gives up within its deadline.
func TestStartTracingWithoutACollector(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := lis.Addr().String()
	require.NoError(t, lis.Close())

	tracer, shutdown, err := startTracing(t.Context(), settings.TracingSettings{
		Enabled: true, Endpoint: addr, Insecure: true, Timeout: 200 * time.Millisecond, SampleRatio: 1, ServiceName: "t",
	})
	require.NoError(t, err)
	require.NotNil(t, tracer)
	_, span := tracer.Start(t.Context(), "x")
	require.True(t, span.SpanContext().IsSampled(), "sample_ratio 1 samples a new trace")
	span.End()
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
	defer cancel()
	start := time.Now()
	_ = shutdown(ctx) // the export fails; what matters is that it returns
	require.Less(t, time.Since(start), 3*time.Second)
}

// TestApprovalLapseIsCountedAndTraced: a lapse the store reports counts as
// transition expired and, with tracing on, is a span of its own with the
// event approval.expired; without a tracer it is only counted.
func TestApprovalLapseIsCountedAndTraced(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(t.Context()) })
	reg := prometheus.NewRegistry()
	metrics := extproc.NewMetrics(reg)

	approvalLapsed(metrics, tp.Tracer("test"))("transfer")
	approvalLapsed(metrics, nil)("transfer")

	spans := exp.GetSpans()
	require.Len(t, spans, 1)
	require.Equal(t, "idemgate.approval.lapse", spans[0].Name)
	require.Len(t, spans[0].Events, 1)
	require.Equal(t, "approval.expired", spans[0].Events[0].Name)
	mfs, err := reg.Gather()
	require.NoError(t, err)
	var expired float64
	for _, mf := range mfs {
		if mf.GetName() == "idemgate_approval_transitions_total" {
			for _, m := range mf.GetMetric() {
				expired += m.GetCounter().GetValue()
			}
		}
	}
	require.Equal(t, 2.0, expired, "both lapses counted")
}
