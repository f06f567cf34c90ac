package extproc

import (
	"context"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/idemgate/idemgate/state"
)

// The cost of tracing: the same exchanges as BenchmarkConfirmReplay with
// every stream sampled (100 %) and exported in batches, as serve does, to an
// exporter that drops them (so the collector's cost is not measured, only
// idemgate's: span creation, attributes, the batch queue).

type discardExporter struct{}

func (discardExporter) ExportSpans(context.Context, []sdktrace.ReadOnlySpan) error { return nil }
func (discardExporter) Shutdown(context.Context) error                             { return nil }

func tracedBenchServer(b *testing.B, e *env) {
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(discardExporter{}), sdktrace.WithSampler(sdktrace.AlwaysSample()))
	b.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	tracer := tp.Tracer(TracerName)
	srv, err := NewServer(Options{Config: e.cfg, Store: state.Trace(e.store, "memory", tracer), Logger: e.logger, Metrics: e.metrics, Now: e.clock.Now, Tracer: tracer})
	if err != nil {
		b.Fatal(err)
	}
	e.srv = srv
}

func BenchmarkConfirmReplayWithTracing(b *testing.B) {
	e := newEnv(b, nil, nil)
	tracedBenchServer(b, e)
	d := fakeDialer{srv: e.srv, shareReplies: true}
	fp := preview(b, d, "alice", `1`)
	req := post("/v1/transfers/confirm", "alice", transferBody(`1`, "EUR", "DE89", fp), header{"traceparent", traceparent})
	do(b, d, req, newPayments().handle)
	b.ReportAllocs()
	for b.Loop() {
		do(b, d, req, neverCalled(b))
	}
}

// benchConfirmExecute runs a preview and the confirm that executes it (verify,
// acquire, upstream, complete) per iteration.
func benchConfirmExecute(b *testing.B, tracing bool) {
	e := newEnv(b, nil, nil)
	if tracing {
		tracedBenchServer(b, e)
	}
	d := fakeDialer{srv: e.srv, shareReplies: true}
	up := newPayments()
	b.ReportAllocs()
	for b.Loop() {
		fp := preview(b, d, "alice", `1`)
		do(b, d, post("/v1/transfers/confirm", "alice", transferBody(`1`, "EUR", "DE89", fp), header{"traceparent", traceparent}), up.handle)
	}
}

func BenchmarkConfirmExecute(b *testing.B)            { benchConfirmExecute(b, false) }
func BenchmarkConfirmExecuteWithTracing(b *testing.B) { benchConfirmExecute(b, true) }
