// Package census exports what may need a person as gauges: records
// IN_FLIGHT (and of those, with their lease ended) and UNKNOWN, pending
// approvals and how far the oldest is into its TTL. The counters idemgate
// keeps elsewhere say what happened; these say what is waiting now, which
// the alerts on reconciliation and on approvals need (deploy/monitoring).
// Every replica reads the same PostgreSQL, so dashboards take max(), not
// sum(), over replicas.
package census

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemgate/idemgate/state/postgres"
)

// Every is how often the census is read: alerts on these gauges wait
// minutes, and two indexed counts per replica that often cost nothing.
const Every = 30 * time.Second

// Record states of idemgate_store_records.
const (
	StateInFlight           = "in_flight"
	StateInFlightLeaseEnded = "in_flight_lease_ended"
	StateUnknown            = "unknown"
)

// Metrics are the census gauges and the counter of failed reads. All are
// exported from start (as 0), so an alert sees the first change.
type Metrics struct {
	records        *prometheus.GaugeVec
	pending        prometheus.Gauge
	oldestShare    prometheus.Gauge
	errors         prometheus.Counter
	lastSuccessful prometheus.Gauge
}

// NewMetrics creates the collectors and registers them on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		records: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "idemgate_store_records",
			Help: "Records not terminal in PostgreSQL, by state: in_flight, in_flight_lease_ended (of those, lease ended: nobody works on them), unknown (a person reconciles each).",
		}, []string{"state"}),
		pending: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "idemgate_approvals_pending",
			Help: "Approvals waiting for a decision.",
		}),
		oldestShare: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "idemgate_approval_oldest_pending_ttl_ratio",
			Help: "How far the oldest pending approval is into its TTL: 0.5 half gone, 1 or more expired (0 when none is pending).",
		}),
		errors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "idemgate_census_errors_total",
			Help: "Census reads that failed (PostgreSQL unreachable or slow); the gauges keep their last values.",
		}),
		lastSuccessful: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "idemgate_census_last_success_timestamp_seconds",
			Help: "When the census was last read (Unix seconds); the gauges are that old.",
		}),
	}
	for _, s := range []string{StateInFlight, StateInFlightLeaseEnded, StateUnknown} {
		m.records.WithLabelValues(s).Set(0)
	}
	reg.MustRegister(m.records, m.pending, m.oldestShare, m.errors, m.lastSuccessful)
	return m
}

// Set records one census.
func (m *Metrics) Set(c postgres.Census, at time.Time) {
	m.records.WithLabelValues(StateInFlight).Set(float64(c.InFlight))
	m.records.WithLabelValues(StateInFlightLeaseEnded).Set(float64(c.InFlightLeaseEnded))
	m.records.WithLabelValues(StateUnknown).Set(float64(c.Unknown))
	m.pending.Set(float64(c.PendingApprovals))
	m.oldestShare.Set(c.OldestPendingShare)
	m.lastSuccessful.Set(float64(at.Unix()))
}

// Run reads the census now and then every period until ctx ends.
func Run(ctx context.Context, read func(context.Context) (postgres.Census, error), m *Metrics, every time.Duration, logger *slog.Logger) {
	for {
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		c, err := read(rctx)
		cancel()
		switch {
		case err == nil:
			m.Set(c, time.Now())
		case !errors.Is(err, context.Canceled):
			m.errors.Inc()
			logger.Warn("failed to read the census of records and approvals", "error", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(every):
		}
	}
}
