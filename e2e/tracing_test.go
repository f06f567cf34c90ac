package e2e

import (
	"context"
	"encoding/hex"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"

	"github.com/idemgate/idemgate/e2e/internal/stack"
)

// otlpReceiver is an OTLP/gRPC trace collector inside the test: it keeps
// every span idemgate exports, with its resource's service.name.
type otlpReceiver struct {
	coltracepb.UnimplementedTraceServiceServer
	mu    sync.Mutex
	spans []receivedSpan
}

type receivedSpan struct {
	service string
	span    *tracepb.Span
}

func (r *otlpReceiver) Export(_ context.Context, req *coltracepb.ExportTraceServiceRequest) (*coltracepb.ExportTraceServiceResponse, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, rs := range req.GetResourceSpans() {
		service := ""
		for _, kv := range rs.GetResource().GetAttributes() {
			if kv.GetKey() == "service.name" {
				service = kv.GetValue().GetStringValue()
			}
		}
		for _, ss := range rs.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				r.spans = append(r.spans, receivedSpan{service: service, span: s})
			}
		}
	}
	return &coltracepb.ExportTraceServiceResponse{}, nil
}

func (r *otlpReceiver) received() []receivedSpan {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]receivedSpan(nil), r.spans...)
}

func startOTLPReceiver(t *testing.T) (*otlpReceiver, string) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	gs := grpc.NewServer()
	r := &otlpReceiver{}
	coltracepb.RegisterTraceServiceServer(gs, r)
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.Stop)
	return r, lis.Addr().String()
}

func spanAttr(s *tracepb.Span, key string) string {
	for _, kv := range s.GetAttributes() {
		if kv.GetKey() == key {
			return kv.GetValue().GetStringValue()
		}
	}
	return ""
}

// TestTracingThroughEnvoy: with tracing on, a confirm whose caller sent a
// W3C traceparent through the real Envoy arrives at an OTLP collector as
// idemgate's confirm span under the caller's span, with the verify,
// acquire, upstream wait and complete steps and the store calls beneath it.
// sample_ratio 0 shows that the caller's sampled flag, not the ratio,
// decides for a continued trace: the preview, sent without traceparent,
// is not exported at all.
func TestTracingThroughEnvoy(t *testing.T) {
	recv, addr := startOTLPReceiver(t)
	s := startStack(t, stack.Options{IdemgateConfig: map[string]any{
		"tracing": map[string]any{
			"otlp":         map[string]any{"endpoint": addr, "insecure": true, "timeout": "5s"},
			"sample_ratio": 0,
			"service_name": "idemgate-e2e",
		},
	}})
	alice := s.Agent("alice")
	p := preview(t, alice, transfer("100.00", "acct_bob", "rent for March"))

	const traceID, callerSpan = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
	r, err := alice.ConfirmWith(p.ConfirmBody(), http.Header{"Traceparent": {"00-" + traceID + "-" + callerSpan + "-01"}})
	require.NoError(t, err)
	requireExecuted(t, r)

	// Spans leave in batches (every 5 s by default); wait for the stream's.
	var confirmSpan *tracepb.Span
	require.Eventually(t, func() bool {
		for _, rs := range recv.received() {
			if rs.span.GetName() == "idemgate.confirm" {
				confirmSpan = rs.span
				return true
			}
		}
		return false
	}, 30*time.Second, 100*time.Millisecond, "the confirm's span never reached the collector")
	// The children end before the stream span, so they were in its batch
	// or an earlier one.
	spans := recv.received()

	require.Equal(t, traceID, hex.EncodeToString(confirmSpan.GetTraceId()))
	require.Equal(t, callerSpan, hex.EncodeToString(confirmSpan.GetParentSpanId()))
	require.Equal(t, tracepb.Span_SPAN_KIND_SERVER, confirmSpan.GetKind())
	require.Equal(t, "transfer", spanAttr(confirmSpan, "idemgate.operation"))
	require.Equal(t, "acquired", spanAttr(confirmSpan, "idemgate.decision"))
	require.Equal(t, "done", spanAttr(confirmSpan, "idemgate.outcome_class"))
	require.Equal(t, p.Nonce, spanAttr(confirmSpan, "idemgate.nonce"))

	byID := map[string]*tracepb.Span{}
	names := map[string]int{}
	for _, rs := range spans {
		require.Equal(t, "idemgate-e2e", rs.service)
		require.Equal(t, traceID, hex.EncodeToString(rs.span.GetTraceId()), "span %s is outside the caller's trace (the untraced preview must not be exported)", rs.span.GetName())
		byID[hex.EncodeToString(rs.span.GetSpanId())] = rs.span
		names[rs.span.GetName()]++
	}
	confirmID := hex.EncodeToString(confirmSpan.GetSpanId())
	for _, name := range []string{"idemgate.verify", "idemgate.acquire", "idemgate.upstream", "idemgate.complete"} {
		found := false
		for _, rs := range spans {
			if rs.span.GetName() == name {
				found = true
				require.Equal(t, confirmID, hex.EncodeToString(rs.span.GetParentSpanId()), "%s must be a child of the confirm span", name)
			}
		}
		require.True(t, found, "no %s span (got %v)", name, names)
	}
	// Store calls nest under the step that made them: acquire and complete,
	// whichever backend tier answered (the stack runs Redis + PostgreSQL).
	for _, store := range []struct{ name, under string }{{"store.acquire", "idemgate.acquire"}, {"store.complete", "idemgate.complete"}} {
		found := false
		for _, rs := range spans {
			if rs.span.GetName() == store.name {
				parent := byID[hex.EncodeToString(rs.span.GetParentSpanId())]
				require.NotNil(t, parent)
				require.Equal(t, store.under, parent.GetName())
				require.Equal(t, p.Nonce, spanAttr(rs.span, "idemgate.nonce"))
				found = true
			}
		}
		require.True(t, found, "no %s span (got %v)", store.name, names)
	}
	// Nothing of the user or the money in any attribute.
	for _, rs := range spans {
		for _, kv := range rs.span.GetAttributes() {
			v := kv.GetValue().GetStringValue()
			for _, secret := range []string{"alice", "100.00", "acct_bob", "rent for March"} {
				require.NotContains(t, v, secret, "span %s attribute %s", rs.span.GetName(), kv.GetKey())
			}
		}
	}
}
