package mainlib

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/cmd/idemgate/settings"
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
