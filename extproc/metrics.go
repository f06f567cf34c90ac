package extproc

import (
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemgate/idemgate/extproc/security"
	"github.com/idemgate/idemgate/state"
)

// Metrics are idemgate's Prometheus collectors, registered on a registry the
// caller owns (never the global one). Every label is bounded by the config:
// operation names, route kinds, envelope statuses, store op names, reasons.
type Metrics struct {
	decisions      *prometheus.CounterVec
	storeLatency   *prometheus.HistogramVec
	fallbacks      *prometheus.CounterVec
	securityEvents *prometheus.CounterVec
	openStreams    prometheus.Gauge
	panics         prometheus.Counter
	notOwner       *prometheus.CounterVec
	terminalCache  *prometheus.CounterVec
	// terminalHits and terminalKept are terminalCache's two series,
	// resolved once: a hit is a replay's hot path.
	terminalHits, terminalKept prometheus.Counter
	settlements                *prometheus.CounterVec
	// backgroundAbandons counts claims a failed store call may have written
	// and that were pursued in the background (see abandon.go).
	backgroundAbandons *prometheus.CounterVec
	passthrough        prometheus.Counter
	webhook            *prometheus.CounterVec
	ready              prometheus.Gauge
	// approvals counts approval transitions by operation: requested and
	// consumed by the confirm stream, approved and denied by decisions on
	// the approvers' API, expired by the store (ApprovalTransition).
	approvals *prometheus.CounterVec
	// processing is idemgate's own time per stream (see observeProcessing).
	processing *prometheus.HistogramVec
}

// NewMetrics creates the collectors and registers them on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idemgate_decisions_total",
			Help: "What idemgate decided per request: route kind (preview, confirm, status) and outcome (an envelope status, acquired, signed, passed_through).",
		}, []string{"operation", "route", "outcome"}),
		storeLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "idemgate_store_call_duration_seconds",
			Help:    "Latency of store calls by backend, operation and result (ok, error).",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1},
		}, []string{"backend", "op", "result"}),
		fallbacks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idemgate_store_fallbacks_total",
			Help: "Store calls answered by a fallback path (e.g. PostgreSQL only while Redis is unreachable), by reason.",
		}, []string{"reason"}),
		securityEvents: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idemgate_security_events_total",
			Help: "Security events (event=security_alert) by reason.",
		}, []string{"reason"}),
		openStreams: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "idemgate_open_streams",
			Help: "ext_proc streams currently open.",
		}),
		panics: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "idemgate_panics_total",
			Help: "Panics recovered while processing a stream (answered with internal_error).",
		}),
		terminalCache: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idemgate_terminal_cache_total",
			Help: "The replica's memory of terminal records (limits.terminal_cache_bytes): kept (a DONE or FAILED record read from the store was kept), hit (a replay answered from it without a store call).",
		}, []string{"event"}),
		notOwner: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idemgate_not_owner_total",
			Help: "Completions refused because the record had moved to another owner (a late answer after a takeover).",
		}, []string{"operation"}),
		settlements: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idemgate_settlements_total",
			Help: "How confirm records were settled: done, failed, released or marked_unknown after the upstream call, abandoned when the reply letting the request through was not sent, not_owner, error.",
		}, []string{"operation", "result"}),
		backgroundAbandons: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idemgate_background_abandons_total",
			Help: "Claims an Acquire or Takeover may have written although it failed, given back in the background so the retry is not told to wait: abandoned, not_written, gave_up (the store kept failing), dropped (too many at once).",
		}, []string{"operation", "result"}),
		passthrough: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "idemgate_passthrough_streams_total",
			Help: "Streams for routes no operation matches, passed through untouched.",
		}),
		webhook: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idemgate_security_webhook_total",
			Help: "Security webhook deliveries by result: sent, failed, dropped (queue full).",
		}, []string{"result"}),
		ready: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "idemgate_ready",
			Help: "1 while the required store answers and the process is not draining.",
		}),
		approvals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idemgate_approval_transitions_total",
			Help: "Approval transitions by operation: requested and consumed (confirm streams), approved and denied (decisions on the approvers' API of this process), expired (lapses this process's store marked).",
		}, []string{"operation", "transition"}),
		processing: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "idemgate_stream_processing_seconds",
			Help: "idemgate's own time per guarded stream, by operation and route: the time spent handling its messages (store calls included), not the time waiting for Envoy or the upstream.",
			// From a cached replay (tens of µs) to a store call at its deadline.
			Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5},
		}, []string{"operation", "route"}),
	}
	// Exported as 0 from start: an alert on the first refused peer needs
	// the series to exist before it (docs/design.md §12).
	m.securityEvents.WithLabelValues(security.ReasonPeerRefused)
	reg.MustRegister(m.decisions, m.storeLatency, m.fallbacks, m.securityEvents, m.openStreams,
		m.panics, m.notOwner, m.terminalCache, m.settlements, m.backgroundAbandons, m.passthrough, m.webhook, m.ready, m.approvals, m.processing)
	m.terminalHits, m.terminalKept = m.terminalCache.WithLabelValues("hit"), m.terminalCache.WithLabelValues("kept")
	return m
}

// StoreObserver reports store call latency; pass it to state.Instrument.
func (m *Metrics) StoreObserver() state.Observer {
	return state.ObserverFunc(func(backend, op string, took time.Duration, err error) {
		result := "ok"
		if err != nil {
			result = "error"
		}
		m.storeLatency.WithLabelValues(backend, op, result).Observe(took.Seconds())
	})
}

// Fallback counts a store fallback (for backends that report them).
func (m *Metrics) Fallback(reason string) { m.fallbacks.WithLabelValues(reason).Inc() }

// ApprovalTransition counts a transition of an approval made outside a
// confirm stream: a decision on the approvers' API (approved, denied) or a
// lapse the store reports (expired).
func (m *Metrics) ApprovalTransition(operation, transition string) {
	m.approvals.WithLabelValues(operation, transition).Inc()
}

// SecurityCounters are the counters a security.Reporter bumps.
func (m *Metrics) SecurityCounters() security.Counters {
	return security.Counters{
		Event:          func(reason string) { m.securityEvents.WithLabelValues(reason).Inc() },
		WebhookSent:    func() { m.webhook.WithLabelValues("sent").Inc() },
		WebhookDropped: func() { m.webhook.WithLabelValues("dropped").Inc() },
		WebhookFailed:  func() { m.webhook.WithLabelValues("failed").Inc() },
	}
}

// SetReady records readiness for /metrics.
func (m *Metrics) SetReady(ready bool) {
	if ready {
		m.ready.Set(1)
	} else {
		m.ready.Set(0)
	}
}

// storeResult labels a store error for logs: unavailable or other.
func storeErrorKind(err error) string {
	if errors.Is(err, state.ErrUnavailable) {
		return "unavailable"
	}
	return "error"
}
