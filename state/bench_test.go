package state_test

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/internal/testutil"
	"github.com/idemgate/idemgate/state"
	"github.com/idemgate/idemgate/state/memory"
	"github.com/idemgate/idemgate/state/postgres"
	"github.com/idemgate/idemgate/state/redis"
	"github.com/idemgate/idemgate/state/statetest"
	"github.com/idemgate/idemgate/state/tiered"
)

// The benchmarks live together so that one run measures every backend and
// the raw EVALSHA baseline under the same load:
//
//	go test -run '^$' -bench . -benchtime 2s ./state/
//
// Each runs with 8 goroutines per GOMAXPROCS, like a gateway serving many
// streams at once, and reports ops/s (one op = one Acquire+Complete pair,
// one replayed Acquire, or one EVALSHA).
const benchParallelism = 8

type benchBackends struct {
	redisAddr string
	dsn       string
}

func setupBackends(b *testing.B) benchBackends {
	b.Helper()
	dsn := testutil.CreateDatabase(b)
	require.NoError(b, postgres.Migrate(b.Context(), dsn))
	return benchBackends{redisAddr: testutil.StartRedis(b).Addr, dsn: dsn}
}

func (e benchBackends) stores(b *testing.B) map[string]func() state.Store {
	return map[string]func() state.Store{
		"memory": func() state.Store { return memory.New(memory.Options{}) },
		"redis": func() state.Store {
			r, err := redis.New(redis.Options{Addrs: []string{e.redisAddr}})
			require.NoError(b, err)
			return r
		},
		"postgres": func() state.Store {
			p, err := postgres.New(b.Context(), postgres.Options{DSN: e.dsn})
			require.NoError(b, err)
			return p
		},
		"tiered": func() state.Store {
			r, err := redis.New(redis.Options{Addrs: []string{e.redisAddr}})
			require.NoError(b, err)
			p, err := postgres.New(b.Context(), postgres.Options{DSN: e.dsn})
			require.NoError(b, err)
			s, err := tiered.New(tiered.Options{Redis: r, Postgres: p})
			require.NoError(b, err)
			return s
		},
	}
}

var benchRun atomic.Uint64

// keyMaker hands out unique nonces without crypto/rand in the loop.
func keyMaker() func() string {
	run := benchRun.Add(1) + uint64(time.Now().UnixNano())
	var n atomic.Uint64
	return func() string { return fmt.Sprintf("%016x%016x", run, n.Add(1)) }
}

func reportOps(b *testing.B) {
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "ops/s")
}

func BenchmarkStores(b *testing.B) {
	e := setupBackends(b)
	for _, name := range []string{"memory", "redis", "postgres", "tiered"} {
		newStore := e.stores(b)[name]
		b.Run("AcquireComplete/"+name, func(b *testing.B) {
			st := newStore()
			defer st.Close()
			next := keyMaker()
			done := statetest.Done()
			b.SetParallelism(benchParallelism)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					key := next()
					a, err := st.Acquire(b.Context(), statetest.AcquireRequest(key, "bench"))
					if err != nil || a.Outcome != state.OutcomeAcquired {
						b.Fatalf("acquire: %v %v", a.Outcome, err)
					}
					c, err := st.Complete(b.Context(), state.Claim{Key: key, Owner: "bench", Fence: a.Record.Fence}, done)
					if err != nil || c.Outcome != state.OutcomeOK {
						b.Fatalf("complete: %v %v", c.Outcome, err)
					}
				}
			})
			reportOps(b)
		})
		b.Run("Replay/"+name, func(b *testing.B) {
			st := newStore()
			defer st.Close()
			key := keyMaker()()
			a, err := st.Acquire(b.Context(), statetest.AcquireRequest(key, "bench"))
			require.NoError(b, err)
			_, err = st.Complete(b.Context(), state.Claim{Key: key, Owner: "bench", Fence: a.Record.Fence}, statetest.Done())
			require.NoError(b, err)
			b.SetParallelism(benchParallelism)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					r, err := st.Acquire(b.Context(), statetest.AcquireRequest(key, "retry"))
					if err != nil || r.Outcome != state.OutcomeDone {
						b.Fatalf("replay: %v %v", r.Outcome, err)
					}
				}
			})
			reportOps(b)
		})
	}
	b.Run("RawEVALSHA", func(b *testing.B) {
		c := goredis.NewClient(&goredis.Options{Addr: e.redisAddr})
		defer c.Close()
		trivial := goredis.NewScript(`return 1`)
		require.NoError(b, trivial.Load(b.Context(), c).Err())
		next := keyMaker()
		b.SetParallelism(benchParallelism)
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if err := trivial.Run(b.Context(), c, []string{"idem:{" + next() + "}"}).Err(); err != nil {
					b.Fatalf("evalsha: %v", err)
				}
			}
		})
		reportOps(b)
	})
}
