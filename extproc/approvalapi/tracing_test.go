package approvalapi

import (
	"bytes"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/idemgate/idemgate/state/memory"
)

// TestDecisionsAreSpanEvents: each decision that changes what is stored is
// a span idemgate.approval.decide with one event (approval.decision while
// more approvers are needed, then approval.approved or approval.denied),
// continuing the caller's traceparent; refused and repeated decisions
// record none.
func TestDecisionsAreSpanEvents(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(t.Context()) })
	f := newFixtureOpts(t, memory.New(memory.Options{}), func(o *Options) { o.Tracer = tp.Tracer("test") })
	soon := time.Now().Add(5 * time.Minute)
	alice, bob, requester := f.token(f.key, "alice", soon), f.token(f.key, "bob", soon), f.token(f.key, "agent-user", soon)
	const traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	decide := func(id, tok, verb string) int {
		req, err := http.NewRequestWithContext(t.Context(), "POST", f.srv.URL+"/v1/approvals/"+id+"/"+verb, bytes.NewReader([]byte(`{"reason":"checked"}`)))
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+tok)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Traceparent", "00-"+traceID+"-00f067aa0ba902b7-01")
		res, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		_ = res.Body.Close()
		return res.StatusCode
	}
	// events lists the decide spans' events, in order, and checks each
	// continues the caller's trace and names its approval.
	events := func(id string) []string {
		var out []string
		for _, s := range exp.GetSpans() {
			require.Equal(t, "idemgate.approval.decide", s.Name)
			require.Equal(t, traceID, s.SpanContext.TraceID().String(), "continues the caller's traceparent")
			require.Len(t, s.Events, 1)
			attrs := map[string]string{}
			for _, kv := range s.Events[0].Attributes {
				attrs[string(kv.Key)] = kv.Value.String()
			}
			require.Equal(t, id, attrs["idemgate.approval_id"])
			require.Equal(t, "transfer", attrs["idemgate.operation"])
			require.NotContains(t, attrs, "idemgate.approver", "no person's identity on a span")
			out = append(out, s.Events[0].Name)
		}
		exp.Reset()
		return out
	}

	a := f.request(t, "agent-user")
	require.Equal(t, http.StatusForbidden, decide(a.ID, requester, "approve"))
	require.Empty(t, events(a.ID), "a refused self-approval changes nothing")
	require.Equal(t, http.StatusOK, decide(a.ID, alice, "approve"))
	require.Equal(t, []string{"approval.decision"}, events(a.ID), "one of two required approvers")
	require.Equal(t, http.StatusOK, decide(a.ID, alice, "approve"))
	require.Empty(t, events(a.ID), "alice's repeated approve changes nothing")
	require.Equal(t, http.StatusOK, decide(a.ID, bob, "approve"))
	require.Equal(t, []string{"approval.approved"}, events(a.ID))

	d := f.request(t, "agent-user")
	require.Equal(t, http.StatusOK, decide(d.ID, bob, "deny"))
	require.Equal(t, []string{"approval.denied"}, events(d.ID))
}
