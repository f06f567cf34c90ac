package mainlib

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemgate/idemgate/cmd/idemgate/settings"
	"github.com/idemgate/idemgate/extproc"
)

// startTracing builds the tracer serve hands the server and the store
// decorator, exporting over OTLP/gRPC in batches (an export never runs on a
// request's path). It returns a nil tracer when tracing is off, so the
// server skips every hook. shutdown flushes what is queued.
//
// The provider is not installed as the global one: idemgate's spans come
// only from this tracer, and a library reaching for otel.GetTracerProvider
// keeps the no-op default.
func startTracing(ctx context.Context, s settings.TracingSettings) (trace.Tracer, func(context.Context) error, error) {
	if !s.Enabled {
		return nil, func(context.Context) error { return nil }, nil
	}
	opts := []otlptracegrpc.Option{otlptracegrpc.WithEndpoint(s.Endpoint), otlptracegrpc.WithTimeout(s.Timeout)}
	if s.Insecure {
		opts = append(opts, otlptracegrpc.WithInsecure())
	}
	// The client connects lazily: a collector that is down at start must not
	// stop serve (spans are dropped and the exporter retries).
	exp, err := otlptracegrpc.New(ctx, opts...)
	if err != nil {
		return nil, nil, fmt.Errorf("failed to set up the OTLP trace exporter for %s: %w", s.Endpoint, err)
	}
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exp),
		// A caller's sampled traceparent is followed whatever the ratio; the
		// ratio decides only for traces idemgate starts.
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(s.SampleRatio))),
		sdktrace.WithResource(resource.NewSchemaless(attribute.String("service.name", s.ServiceName))),
	)
	return tp.Tracer(extproc.TracerName), tp.Shutdown, nil
}

// flushTraces exports the spans still queued at shutdown, for at most a
// few seconds: a collector that is gone must not hold the process up.
func flushTraces(shutdown func(context.Context) error, logger *slog.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := shutdown(ctx); err != nil {
		logger.Warn("failed to flush traces at shutdown", "error", err)
	}
}
