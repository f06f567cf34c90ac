package extproc

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/internal/testutil"
	"github.com/idemgate/idemgate/state"
	"github.com/idemgate/idemgate/state/postgres"
	"github.com/idemgate/idemgate/state/redis"
	"github.com/idemgate/idemgate/state/tiered"
)

// tieredStore is the production store for t: a redis-server of its own in
// front of a PostgreSQL database created for it, closed at cleanup.
// onFallback (may be nil) receives the store's fallback reasons.
func tieredStore(t *testing.T, onFallback func(reason string)) *tiered.Store {
	t.Helper()
	rs := testutil.StartRedis(t)
	dsn := testutil.CreateDatabase(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, postgres.Migrate(ctx, dsn))
	pg, err := postgres.New(ctx, postgres.Options{DSN: dsn})
	require.NoError(t, err)
	rd, err := redis.New(redis.Options{Addrs: []string{rs.Addr}, KeyPrefix: "idem:test:"})
	require.NoError(t, err)
	ts, err := tiered.New(tiered.Options{Redis: rd, Postgres: pg, OnFallback: onFallback})
	require.NoError(t, err)
	t.Cleanup(func() { ts.Close() })
	require.NoError(t, ts.Ping(ctx))
	return ts
}

// The whole suite over a real grpc.Server on a loopback port, the client
// driving each stream as Envoy does, against the embedded memory store.
func TestGRPCMemoryStore(t *testing.T) {
	e := newEnv(t, nil, nil)
	runSuite(t, e, e.startGRPC(t))
}

// The same suite against the production store: Redis (a redis-server of this
// test's own) in front of PostgreSQL (a database created for this test),
// through the tiered store and state.Instrument.
func TestGRPCTieredStore(t *testing.T) {
	if testing.Short() {
		t.Skip("needs Redis and PostgreSQL")
	}
	e := newEnv(t, nil, nil)
	ts := tieredStore(t, e.metrics.Fallback)
	e.useStore(t, state.Instrument(ts, "tiered", e.metrics.StoreObserver()))

	runSuite(t, e, e.startGRPC(t))

	families, err := e.reg.Gather()
	require.NoError(t, err)
	found := false
	for _, f := range families {
		if f.GetName() == "idemgate_store_call_duration_seconds" {
			for _, m := range f.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == "backend" && l.GetValue() == "tiered" {
						found = true
					}
				}
			}
		}
	}
	require.True(t, found, "store latency is exported by backend and op")
}
