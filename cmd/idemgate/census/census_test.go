package census

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/state/postgres"
)

// samples gathers reg into "name{label=value}" -> value (gauges and
// counters).
func samples(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	out := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			name := mf.GetName()
			for _, l := range m.GetLabel() {
				name += "{" + l.GetName() + "=" + l.GetValue() + "}"
			}
			switch {
			case m.GetGauge() != nil:
				out[name] = m.GetGauge().GetValue()
			case m.GetCounter() != nil:
				out[name] = m.GetCounter().GetValue()
			}
		}
	}
	return out
}

// TestGaugesExportedFromStart: before the first census every series is
// there as 0, so an alert on the first UNKNOWN record sees a change.
func TestGaugesExportedFromStart(t *testing.T) {
	reg := prometheus.NewRegistry()
	NewMetrics(reg)
	require.Equal(t, map[string]float64{
		"idemgate_store_records{state=in_flight}":             0,
		"idemgate_store_records{state=in_flight_lease_ended}": 0,
		"idemgate_store_records{state=unknown}":               0,
		"idemgate_approvals_pending":                          0,
		"idemgate_approval_oldest_pending_ttl_ratio":          0,
		"idemgate_census_errors_total":                        0,
		"idemgate_census_last_success_timestamp_seconds":      0,
	}, samples(t, reg))
}

// TestRunSetsTheGaugesAndCountsFailures: a census read sets every gauge; a
// failed one counts an error and keeps the last values.
func TestRunSetsTheGaugesAndCountsFailures(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	var calls atomic.Int32
	read := func(context.Context) (postgres.Census, error) {
		if calls.Add(1) == 1 {
			return postgres.Census{InFlight: 4, InFlightLeaseEnded: 1, Unknown: 2, PendingApprovals: 3, OldestPendingShare: 0.6}, nil
		}
		return postgres.Census{}, errors.New("connection refused")
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		Run(ctx, read, m, time.Millisecond, slog.New(slog.NewTextHandler(io.Discard, nil)))
		close(done)
	}()
	require.Eventually(t, func() bool { return samples(t, reg)["idemgate_census_errors_total"] >= 2 }, 5*time.Second, time.Millisecond)
	cancel()
	<-done
	got := samples(t, reg)
	require.Positive(t, got["idemgate_census_last_success_timestamp_seconds"])
	delete(got, "idemgate_census_last_success_timestamp_seconds")
	delete(got, "idemgate_census_errors_total")
	require.Equal(t, map[string]float64{
		"idemgate_store_records{state=in_flight}":             4,
		"idemgate_store_records{state=in_flight_lease_ended}": 1,
		"idemgate_store_records{state=unknown}":               2,
		"idemgate_approvals_pending":                          3,
		"idemgate_approval_oldest_pending_ttl_ratio":          0.6,
	}, got, "the failed reads kept the last census")
}
