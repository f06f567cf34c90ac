// Package security reports security events: a confirm whose parameters
// drifted from the preview, a fingerprint presented by the wrong user, a
// forged or foreign MAC, a store that holds the nonce under other parameters.
// These are not business errors: each one is a
// structured log line carrying the literal event=security_alert, a counter
// by reason, and — when configured — a webhook POST that never blocks the
// request that triggered it.
package security

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"go.opentelemetry.io/otel/trace"
)

// Reasons reported by the server.
const (
	ReasonParamsChanged      = "params_changed"
	ReasonSubjectMismatch    = "fingerprint_subject_mismatch"
	ReasonBadMAC             = "bad_mac"
	ReasonUnknownKey         = "unknown_key"
	ReasonStoreParamMismatch = "store_param_mismatch"
	// ReasonAmbiguousKey: a body in which a bound field could be read two
	// ways (keys equal ignoring case, U+0000 in a key), refused before the
	// upstream (the binding rule, docs/design.md §2).
	ReasonAmbiguousKey = "ambiguous_key"
	// ReasonPathNotExact, ReasonMethodNotAllowed, ReasonHeaderNotAllowed:
	// a request named a guarded operation with another spelling of its
	// path, another method, or a header asking Envoy to re-send it.
	ReasonPathNotExact     = "path_not_exact"
	ReasonMethodNotAllowed = "method_not_allowed"
	ReasonHeaderNotAllowed = "header_not_allowed"
	// ReasonAmbiguousValue: a bound value that mainstream parsers read
	// differently (negative zero, 1E400, U+0000...), refused likewise.
	ReasonAmbiguousValue = "ambiguous_value"
	// ReasonPeerRefused: a connection to a listener with client
	// certificates refused in the TLS handshake (no certificate, another
	// CA's, a SAN not allowed): it opened no stream (docs/design.md §12).
	ReasonPeerRefused         = "peer_refused"
	eventName                 = "security_alert"
	logMessage                = "event=" + eventName
	defaultWebhookQueueLength = 1000
)

// Event is one security event. It never carries a raw subject, a token or a
// parameter value: only the keyed subject tag and the names of drifted fields.
type Event struct {
	Reason        string
	Operation     string
	Nonce         string // the fingerprint nonce, when the MAC verified
	SubjectTag    string // keyed tag of the presenting subject
	TraceID       string
	ChangedFields []string
	// Keys are the JSON paths of ambiguous keys, escaped to printable
	// ASCII by the fingerprint package.
	Keys []string
	// Request is the method and path of a request refused for how it named
	// a guarded operation (path_not_exact, method_not_allowed), quoted
	// and cut to a bounded length by the caller.
	Request string
	// Listener, Peer, PresentedSAN and Refusal describe a refused
	// connection (peer_refused): the listener, the remote address, the
	// SANs of the certificate it presented ("none" without one) and why
	// (no_certificate, untrusted_certificate, san_not_allowed).
	Listener     string
	Peer         string
	PresentedSAN string
	Refusal      string
}

// Counters are the metrics a Reporter bumps. Nil functions are skipped.
type Counters struct {
	Event          func(reason string)
	WebhookSent    func()
	WebhookDropped func()
	WebhookFailed  func()
}

// WebhookOptions configure the optional webhook; an empty URL turns it off.
type WebhookOptions struct {
	URL       string
	Timeout   time.Duration
	QueueSize int
	// Client defaults to a client with Timeout.
	Client *http.Client
}

// Reporter logs, counts and forwards security events.
type Reporter struct {
	logger   *slog.Logger
	counters Counters
	webhook  WebhookOptions
	queue    chan payload
	wg       sync.WaitGroup
	stop     chan struct{}
	once     sync.Once
	now      func() time.Time
}

// payload is the webhook body.
type payload struct {
	Event         string   `json:"event"`
	Reason        string   `json:"reason"`
	Operation     string   `json:"operation"`
	Nonce         string   `json:"nonce,omitempty"`
	SubjectTag    string   `json:"subject_tag,omitempty"`
	TraceID       string   `json:"trace_id,omitempty"`
	ChangedFields []string `json:"changed_fields,omitempty"`
	Keys          []string `json:"keys,omitempty"`
	Request       string   `json:"request,omitempty"`
	Listener      string   `json:"listener,omitempty"`
	Peer          string   `json:"peer,omitempty"`
	PresentedSAN  string   `json:"presented_san,omitempty"`
	Refusal       string   `json:"refusal,omitempty"`
	Time          string   `json:"time"`
}

// New returns a Reporter. With a webhook URL it starts one sender goroutine;
// call Close to stop it.
func New(logger *slog.Logger, counters Counters, webhook WebhookOptions) *Reporter {
	r := &Reporter{logger: logger, counters: counters, webhook: webhook, stop: make(chan struct{}), now: time.Now}
	if webhook.URL == "" {
		return r
	}
	if r.webhook.QueueSize <= 0 {
		r.webhook.QueueSize = defaultWebhookQueueLength
	}
	if r.webhook.Client == nil {
		r.webhook.Client = &http.Client{Timeout: webhook.Timeout}
	}
	r.queue = make(chan payload, r.webhook.QueueSize)
	r.wg.Add(1)
	go r.send()
	return r
}

// Report records e: one log line at WARN whose message is the literal
// event=security_alert (so it appears in text and JSON logs alike), the
// counter for its reason, and a webhook delivery if one is configured. It
// never blocks: a full webhook queue drops the delivery and counts it.
func (r *Reporter) Report(ctx context.Context, e Event) {
	attrs := []slog.Attr{
		slog.String("event", eventName),
		slog.String("reason", e.Reason),
		slog.String("operation", e.Operation),
		slog.String("nonce", e.Nonce),
		slog.String("subject_tag", e.SubjectTag),
		slog.String("trace_id", e.TraceID),
	}
	// trace_id above is Envoy's x-request-id (what the envelopes carry);
	// a traced stream's OpenTelemetry trace id goes beside it so the line
	// leads to the trace.
	if sc := trace.SpanContextFromContext(ctx); sc.IsSampled() {
		attrs = append(attrs, slog.String("otel_trace_id", sc.TraceID().String()))
	}
	if len(e.ChangedFields) > 0 {
		attrs = append(attrs, slog.Any("changed_fields", e.ChangedFields))
	}
	if len(e.Keys) > 0 {
		attrs = append(attrs, slog.Any("keys", e.Keys))
	}
	if e.Request != "" {
		attrs = append(attrs, slog.String("request", e.Request))
	}
	if e.Peer != "" {
		attrs = append(attrs, slog.String("listener", e.Listener), slog.String("peer", e.Peer), slog.String("presented_san", e.PresentedSAN),
			slog.String("refusal", e.Refusal))
	}
	r.logger.LogAttrs(ctx, slog.LevelWarn, logMessage, attrs...)
	if r.counters.Event != nil {
		r.counters.Event(e.Reason)
	}
	if r.queue == nil {
		return
	}
	p := payload{
		Event: eventName, Reason: e.Reason, Operation: e.Operation, Nonce: e.Nonce,
		SubjectTag: e.SubjectTag, TraceID: e.TraceID, ChangedFields: e.ChangedFields, Keys: e.Keys, Request: e.Request,
		Listener: e.Listener, Peer: e.Peer, PresentedSAN: e.PresentedSAN, Refusal: e.Refusal,
		Time: r.now().UTC().Format(time.RFC3339Nano),
	}
	select {
	case <-r.stop:
		return
	default:
	}
	select {
	case r.queue <- p:
	default:
		if r.counters.WebhookDropped != nil {
			r.counters.WebhookDropped()
		}
		r.logger.Warn("security webhook queue full, event dropped", "reason", e.Reason, "trace_id", e.TraceID)
	}
}

func (r *Reporter) send() {
	defer r.wg.Done()
	for {
		select {
		case <-r.stop:
			return
		case p := <-r.queue:
			select {
			case <-r.stop: // closing: do not start another delivery
				return
			default:
			}
			if err := r.post(p); err != nil {
				if r.counters.WebhookFailed != nil {
					r.counters.WebhookFailed()
				}
				r.logger.Warn("failed to deliver security webhook", "error", err, "reason", p.Reason, "trace_id", p.TraceID)
				continue
			}
			if r.counters.WebhookSent != nil {
				r.counters.WebhookSent()
			}
		}
	}
}

func (r *Reporter) post(p payload) error {
	body, err := json.Marshal(p)
	if err != nil {
		return fmt.Errorf("failed to encode webhook payload: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), r.webhook.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, r.webhook.URL, bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("failed to build webhook request: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := r.webhook.Client.Do(req)
	if err != nil {
		return fmt.Errorf("failed to post webhook: %w", err)
	}
	resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return fmt.Errorf("webhook answered %d", resp.StatusCode)
	}
	return nil
}

// Close stops the webhook sender; queued deliveries not yet started are
// dropped (security events are in the log regardless).
func (r *Reporter) Close() {
	r.once.Do(func() { close(r.stop) })
	r.wg.Wait()
}
