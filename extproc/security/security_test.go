package security

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/internal/testutil"
)

func TestReportLogsLiteralInTextAndJSON(t *testing.T) {
	for _, format := range []string{"text", "json"} {
		t.Run(format, func(t *testing.T) {
			var buf testutil.SyncBuffer
			var h slog.Handler = slog.NewTextHandler(&buf, nil)
			if format == "json" {
				h = slog.NewJSONHandler(&buf, nil)
			}
			var counted []string
			r := New(slog.New(h), Counters{Event: func(reason string) { counted = append(counted, reason) }}, WebhookOptions{})
			defer r.Close()
			r.Report(t.Context(), Event{Reason: ReasonParamsChanged, Operation: "transfer", Nonce: "abc", SubjectTag: "tag", TraceID: "trace-1", ChangedFields: []string{"amount"}})
			out := buf.String()
			require.Contains(t, out, "event=security_alert")
			require.Contains(t, out, "transfer")
			require.Contains(t, out, "trace-1")
			require.Contains(t, out, "amount")
			require.Equal(t, []string{ReasonParamsChanged}, counted)
			if format == "text" {
				require.Contains(t, out, " event=security_alert reason=params_changed operation=transfer nonce=abc subject_tag=tag trace_id=trace-1")
			}
		})
	}
}

func TestWebhookDelivers(t *testing.T) {
	got := make(chan payload, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		require.Equal(t, "application/json", r.Header.Get("Content-Type"))
		var p payload
		body, _ := io.ReadAll(r.Body)
		require.NoError(t, json.Unmarshal(body, &p))
		got <- p
	}))
	defer srv.Close()
	var sent atomic.Int32
	r := New(slog.New(slog.NewTextHandler(io.Discard, nil)), Counters{WebhookSent: func() { sent.Add(1) }},
		WebhookOptions{URL: srv.URL, Timeout: time.Second, QueueSize: 4})
	defer r.Close()
	r.Report(t.Context(), Event{Reason: ReasonBadMAC, Operation: "transfer", TraceID: "t1"})
	select {
	case p := <-got:
		require.Equal(t, "security_alert", p.Event)
		require.Equal(t, ReasonBadMAC, p.Reason)
		require.Equal(t, "t1", p.TraceID)
	case <-time.After(5 * time.Second):
		t.Fatal("webhook not delivered")
	}
	require.Eventually(t, func() bool { return sent.Load() == 1 }, 5*time.Second, 10*time.Millisecond)
}

// A stuck webhook must never block Report: the queue fills, later events are
// dropped and counted.
func TestWebhookQueueFullDropsWithoutBlocking(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		<-release
	}))
	defer srv.Close()
	var dropped atomic.Int32
	r := New(slog.New(slog.NewTextHandler(io.Discard, nil)), Counters{WebhookDropped: func() { dropped.Add(1) }},
		WebhookOptions{URL: srv.URL, Timeout: 10 * time.Second, QueueSize: 2})
	start := time.Now()
	for i := 0; i < 20; i++ {
		r.Report(context.Background(), Event{Reason: ReasonUnknownKey})
	}
	require.Less(t, time.Since(start), 2*time.Second, "Report must not block")
	// One in the sender, two queued, the rest dropped (the sender may or may
	// not have taken the first one yet).
	require.GreaterOrEqual(t, dropped.Load(), int32(17))
	close(release)
	r.Close()
}

func TestWebhookFailureCounted(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusInternalServerError)
	}))
	defer srv.Close()
	var failed atomic.Int32
	r := New(slog.New(slog.NewTextHandler(io.Discard, nil)), Counters{WebhookFailed: func() { failed.Add(1) }},
		WebhookOptions{URL: srv.URL, Timeout: time.Second})
	defer r.Close()
	r.Report(t.Context(), Event{Reason: ReasonSubjectMismatch})
	require.Eventually(t, func() bool { return failed.Load() == 1 }, 5*time.Second, 10*time.Millisecond)
}

// A refused peer's event carries the listener, the peer's address, the
// SANs it presented and why, in the log line and the webhook.
func TestPeerRefusedCarriesThePeer(t *testing.T) {
	got := make(chan payload, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var p payload
		body, _ := io.ReadAll(r.Body)
		if json.Unmarshal(body, &p) == nil {
			got <- p
		}
	}))
	defer srv.Close()
	var buf testutil.SyncBuffer
	r := New(slog.New(slog.NewTextHandler(&buf, nil)), Counters{}, WebhookOptions{URL: srv.URL, Timeout: time.Second, QueueSize: 4})
	defer r.Close()
	r.Report(t.Context(), Event{Reason: ReasonPeerRefused, Listener: "grpc", Peer: "10.1.2.3:40000", PresentedSAN: "spiffe://x/y", Refusal: "san_not_allowed"})
	require.Contains(t, buf.String(), " reason=peer_refused ")
	require.Contains(t, buf.String(), " listener=grpc peer=10.1.2.3:40000 presented_san=spiffe://x/y refusal=san_not_allowed")
	select {
	case p := <-got:
		require.Equal(t, ReasonPeerRefused, p.Reason)
		require.Equal(t, "grpc", p.Listener)
		require.Equal(t, "10.1.2.3:40000", p.Peer)
		require.Equal(t, "spiffe://x/y", p.PresentedSAN)
		require.Equal(t, "san_not_allowed", p.Refusal)
	case <-time.After(5 * time.Second):
		t.Fatal("webhook not delivered")
	}
}
