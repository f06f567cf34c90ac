package tiered_test

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/internal/testutil"
	"github.com/idemgate/idemgate/state"
	"github.com/idemgate/idemgate/state/postgres"
	"github.com/idemgate/idemgate/state/redis"
	"github.com/idemgate/idemgate/state/statetest"
	"github.com/idemgate/idemgate/state/tiered"
)

type env struct {
	redisSrv *testutil.RedisServer
	dsn      string
}

func newEnv(t *testing.T) env {
	t.Helper()
	dsn := testutil.CreateDatabase(t)
	require.NoError(t, postgres.Migrate(t.Context(), dsn))
	return env{redisSrv: testutil.StartRedis(t), dsn: dsn}
}

func newRedis(t testing.TB, addrs ...string) *redis.Store {
	t.Helper()
	mode := redis.ModeSingle
	if len(addrs) > 1 {
		mode = redis.ModeCluster
	}
	r, err := redis.New(redis.Options{Addrs: addrs, Mode: mode})
	require.NoError(t, err)
	return r
}

func newPostgres(t testing.TB, dsn string) *postgres.Store {
	t.Helper()
	p, err := postgres.New(t.Context(), postgres.Options{DSN: dsn})
	require.NoError(t, err)
	return p
}

// counting wraps a store and counts every call that reaches it.
type countingCache struct {
	tiered.Cache
	n atomic.Int64
}

func (c *countingCache) Acquire(ctx context.Context, r state.AcquireRequest) (state.Answer, error) {
	c.n.Add(1)
	return c.Cache.Acquire(ctx, r)
}

func (c *countingCache) Complete(ctx context.Context, cl state.Claim, x state.Completion) (state.Answer, error) {
	c.n.Add(1)
	return c.Cache.Complete(ctx, cl, x)
}

func (c *countingCache) Get(ctx context.Context, key string) (state.Record, bool, error) {
	c.n.Add(1)
	return c.Cache.Get(ctx, key)
}

func (c *countingCache) Repair(ctx context.Context, rec state.Record, ttl time.Duration) (bool, error) {
	c.n.Add(1)
	return c.Cache.Repair(ctx, rec, ttl)
}

func (c *countingCache) DropOrphan(ctx context.Context, cl state.Claim) (bool, error) {
	c.n.Add(1)
	return c.Cache.DropOrphan(ctx, cl)
}

func (c *countingCache) Ping(ctx context.Context) error {
	c.n.Add(1)
	return c.Cache.Ping(ctx)
}

type countingStore struct {
	state.Store
	acquires atomic.Int64
}

func (c *countingStore) Acquire(ctx context.Context, r state.AcquireRequest) (state.Answer, error) {
	c.acquires.Add(1)
	return c.Store.Acquire(ctx, r)
}

type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

type fallbacks struct {
	mu      sync.Mutex
	reasons map[string]int
}

func (f *fallbacks) record(reason string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.reasons == nil {
		f.reasons = map[string]int{}
	}
	f.reasons[reason]++
}

func (f *fallbacks) count(reason string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.reasons[reason]
}

func newTiered(t testing.TB, opts tiered.Options) *tiered.Store {
	t.Helper()
	if opts.RedisTimeout == 0 {
		// Generous: the race detector on two shared cores makes loopback
		// calls slow at times, and these tests are about answers, not speed.
		opts.RedisTimeout = 2 * time.Second
	}
	s, err := tiered.New(opts)
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func TestConformance(t *testing.T) {
	e := newEnv(t)
	statetest.Run(t, func(t *testing.T) state.Store {
		return newTiered(t, tiered.Options{Redis: newRedis(t, e.redisSrv.Addr), Postgres: newPostgres(t, e.dsn)})
	})
}

func TestConformanceRedisCluster(t *testing.T) {
	addrs := testutil.StartRedisCluster(t, 3)
	dsn := testutil.CreateDatabase(t)
	require.NoError(t, postgres.Migrate(t.Context(), dsn))
	statetest.Run(t, func(t *testing.T) state.Store {
		return newTiered(t, tiered.Options{Redis: newRedis(t, addrs...), Postgres: newPostgres(t, dsn)})
	})
}

func countRows(t *testing.T, p *postgres.Store, key string) int {
	t.Helper()
	var n int
	require.NoError(t, p.Pool().QueryRow(t.Context(),
		"SELECT count(*) FROM idempotency_record WHERE idem_key = $1::char(32)", key).Scan(&n))
	return n
}

func TestConcurrentAcquireOneRowAndByteIdenticalReplays(t *testing.T) {
	e := newEnv(t)
	pg := newPostgres(t, e.dsn)
	s := newTiered(t, tiered.Options{Redis: newRedis(t, e.redisSrv.Addr), Postgres: pg})
	ctx := t.Context()
	key := statetest.NewKey(t)

	answers := statetest.ConcurrentAcquire(t, ctx, s, key, 200)
	require.Equal(t, map[state.Outcome]int{state.OutcomeAcquired: 1, state.OutcomeInFlight: 199}, statetest.CountOutcomes(answers))
	require.Equal(t, 1, countRows(t, pg, key))
	var winner state.Answer
	for _, a := range answers {
		if a.Outcome == state.OutcomeAcquired {
			winner = a
		}
	}
	done, err := s.Complete(ctx, state.Claim{Key: key, Owner: winner.Record.Owner, Fence: winner.Record.Fence}, statetest.Done())
	statetest.RequireOutcome(t, state.OutcomeOK, done, err)

	answers = statetest.ConcurrentAcquire(t, ctx, s, key, 200)
	require.Equal(t, map[state.Outcome]int{state.OutcomeDone: 200}, statetest.CountOutcomes(answers))
	for _, a := range answers {
		statetest.RequireSameResult(t, statetest.SampleResult(), a.Record.Result)
	}
	require.Equal(t, 1, countRows(t, pg, key))
}

func flushAll(t *testing.T, addr string) {
	t.Helper()
	c := goredis.NewClient(&goredis.Options{Addr: addr})
	defer c.Close()
	require.NoError(t, c.FlushAll(t.Context()).Err())
}

func TestFlushAfterDoneStillReplays(t *testing.T) {
	e := newEnv(t)
	rs := newRedis(t, e.redisSrv.Addr)
	pg := &countingStore{Store: newPostgres(t, e.dsn)}
	s := newTiered(t, tiered.Options{Redis: rs, Postgres: pg})
	ctx := t.Context()
	key := statetest.NewKey(t)
	a, err := s.Acquire(ctx, statetest.AcquireRequest(key, "owner-a"))
	statetest.RequireOutcome(t, state.OutcomeAcquired, a, err)
	c, err := s.Complete(ctx, state.Claim{Key: key, Owner: "owner-a", Fence: 1}, statetest.Done())
	statetest.RequireOutcome(t, state.OutcomeOK, c, err)

	flushAll(t, e.redisSrv.Addr)
	_, found, err := rs.Get(ctx, key)
	require.NoError(t, err)
	require.False(t, found)

	r, err := s.Acquire(ctx, statetest.AcquireRequest(key, "owner-b"))
	statetest.RequireOutcome(t, state.OutcomeDone, r, err)
	statetest.RequireSameResult(t, statetest.SampleResult(), r.Record.Result)
	require.Equal(t, "owner-a", r.Record.Owner)

	// Redis was repaired from PostgreSQL: it holds the DONE record again and
	// answers the next retry without asking PostgreSQL.
	rec, found, err := rs.Get(ctx, key)
	require.NoError(t, err)
	require.True(t, found)
	require.Equal(t, state.Done, rec.State)
	statetest.RequireSameResult(t, statetest.SampleResult(), rec.Result)
	before := pg.acquires.Load()
	r, err = s.Acquire(ctx, statetest.AcquireRequest(key, "owner-c"))
	statetest.RequireOutcome(t, state.OutcomeDone, r, err)
	statetest.RequireSameResult(t, statetest.SampleResult(), r.Record.Result)
	require.Equal(t, before, pg.acquires.Load(), "a Redis DONE is answered from Redis")
	require.GreaterOrEqual(t, s.Stats().Repairs, uint64(1))
}

func TestFlushWhileInFlightDoesNotHandOutASecondClaim(t *testing.T) {
	e := newEnv(t)
	rs := newRedis(t, e.redisSrv.Addr)
	s := newTiered(t, tiered.Options{Redis: rs, Postgres: newPostgres(t, e.dsn)})
	ctx := t.Context()
	key := statetest.NewKey(t)
	a, err := s.Acquire(ctx, statetest.AcquireRequest(key, "owner-a"))
	statetest.RequireOutcome(t, state.OutcomeAcquired, a, err)

	flushAll(t, e.redisSrv.Addr)

	b, err := s.Acquire(ctx, statetest.AcquireRequest(key, "owner-b"))
	statetest.RequireOutcome(t, state.OutcomeInFlight, b, err)
	require.Equal(t, "owner-a", b.Record.Owner)
	rec, found, err := rs.Get(ctx, key)
	require.NoError(t, err)
	require.True(t, found)
	require.Equal(t, "owner-a", rec.Owner, "redis repaired with the real owner")

	// A tampered confirm after the flush is refused by PostgreSQL's hash.
	flushAll(t, e.redisSrv.Addr)
	req := statetest.AcquireRequest(key, "owner-x")
	req.ParamHash = "ph-other"
	m, err := s.Acquire(ctx, req)
	statetest.RequireOutcome(t, state.OutcomeParamMismatch, m, err)

	c, err := s.Complete(ctx, state.Claim{Key: key, Owner: "owner-a", Fence: 1}, statetest.Done())
	statetest.RequireOutcome(t, state.OutcomeOK, c, err)
	r, err := s.Acquire(ctx, statetest.AcquireRequest(key, "owner-c"))
	statetest.RequireOutcome(t, state.OutcomeDone, r, err)
}

func TestRedisInFlightOrUnknownIsCheckedAgainstPostgres(t *testing.T) {
	e := newEnv(t)
	rs := newRedis(t, e.redisSrv.Addr)
	pg := newPostgres(t, e.dsn)
	s := newTiered(t, tiered.Options{Redis: rs, Postgres: pg})
	ctx := t.Context()

	// Marked UNKNOWN through the gateway, then settled by a person with
	// `idemgate ops resolve`, which talks to PostgreSQL only.
	key := statetest.NewKey(t)
	a, err := s.Acquire(ctx, statetest.AcquireRequest(key, "owner-a"))
	statetest.RequireOutcome(t, state.OutcomeAcquired, a, err)
	m, err := s.MarkUnknown(ctx, state.Claim{Key: key, Owner: "owner-a", Fence: 1})
	statetest.RequireOutcome(t, state.OutcomeOK, m, err)
	rec, _, err := rs.Get(ctx, key)
	require.NoError(t, err)
	require.Equal(t, state.Unknown, rec.State)
	r, err := pg.Resolve(ctx, key, statetest.Done())
	statetest.RequireOutcome(t, state.OutcomeOK, r, err)

	got, err := s.Acquire(ctx, statetest.AcquireRequest(key, "owner-b"))
	statetest.RequireOutcome(t, state.OutcomeDone, got, err)
	statetest.RequireSameResult(t, statetest.SampleResult(), got.Record.Result)
	rec, _, err = rs.Get(ctx, key)
	require.NoError(t, err)
	require.Equal(t, state.Done, rec.State, "redis repaired")

	// The owner finished in PostgreSQL but the Redis copy never happened.
	key2 := statetest.NewKey(t)
	a, err = s.Acquire(ctx, statetest.AcquireRequest(key2, "owner-a"))
	statetest.RequireOutcome(t, state.OutcomeAcquired, a, err)
	c, err := pg.Complete(ctx, state.Claim{Key: key2, Owner: "owner-a", Fence: 1}, statetest.Done())
	statetest.RequireOutcome(t, state.OutcomeOK, c, err)
	got, err = s.Acquire(ctx, statetest.AcquireRequest(key2, "owner-b"))
	statetest.RequireOutcome(t, state.OutcomeDone, got, err)

	// An orphan Redis claim (PostgreSQL never got it) does not block: the
	// PostgreSQL check creates the claim for the caller.
	key3 := statetest.NewKey(t)
	orphan, err := rs.Acquire(ctx, statetest.AcquireRequest(key3, "ghost"))
	statetest.RequireOutcome(t, state.OutcomeAcquired, orphan, err)
	got, err = s.Acquire(ctx, statetest.AcquireRequest(key3, "owner-real"))
	statetest.RequireOutcome(t, state.OutcomeAcquired, got, err)
	rec, _, err = rs.Get(ctx, key3)
	require.NoError(t, err)
	require.Equal(t, "owner-real", rec.Owner)
}

func TestStaleOwnerAfterTakeoverLeavesNewResult(t *testing.T) {
	e := newEnv(t)
	rs := newRedis(t, e.redisSrv.Addr)
	pg := newPostgres(t, e.dsn)
	s := newTiered(t, tiered.Options{Redis: rs, Postgres: pg})
	ctx := t.Context()
	key := statetest.NewKey(t)
	a, err := s.Acquire(ctx, statetest.AcquireRequest(key, "owner-a"))
	statetest.RequireOutcome(t, state.OutcomeAcquired, a, err)
	rel, err := s.EndLease(ctx, state.Claim{Key: key, Owner: "owner-a", Fence: 1})
	statetest.RequireOutcome(t, state.OutcomeOK, rel, err)
	tk, err := s.Takeover(ctx, state.TakeoverRequest{Key: key, NewOwner: "owner-b", Fence: 1, Lease: time.Minute})
	statetest.RequireOutcome(t, state.OutcomeAcquired, tk, err)
	newResult := statetest.Done()
	newResult.Result.Body = []byte(`{"transfer_id":"t-2"}`)
	d, err := s.Complete(ctx, state.Claim{Key: key, Owner: "owner-b", Fence: 2}, newResult)
	statetest.RequireOutcome(t, state.OutcomeOK, d, err)

	late, err := s.Complete(ctx, state.Claim{Key: key, Owner: "owner-a", Fence: 1}, statetest.Done())
	statetest.RequireOutcome(t, state.OutcomeNotOwner, late, err)

	for name, st := range map[string]state.Store{"redis": rs, "postgres": pg, "tiered": s} {
		rec, found, err := st.Get(ctx, key)
		require.NoError(t, err, name)
		require.True(t, found, name)
		require.Equal(t, "owner-b", rec.Owner, name)
		statetest.RequireSameResult(t, newResult.Result, rec.Result)
	}
}

func TestRedisKilledBreakerOpensAndComesBack(t *testing.T) {
	e := newEnv(t)
	rs := newRedis(t, e.redisSrv.Addr)
	cache := &countingCache{Cache: rs}
	pg := &countingStore{Store: newPostgres(t, e.dsn)}
	clock := &fakeClock{t: time.Unix(1_000_000, 0)}
	fb := &fallbacks{}
	s := newTiered(t, tiered.Options{
		Redis: cache, Postgres: pg, Now: clock.Now,
		FailureThreshold: 3, CoolDown: time.Minute, OnFallback: fb.record,
	})
	ctx := t.Context()
	claim := func(key, owner string) state.Claim { return state.Claim{Key: key, Owner: owner, Fence: 1} }

	before := statetest.NewKey(t)
	a, err := s.Acquire(ctx, statetest.AcquireRequest(before, "o"))
	statetest.RequireOutcome(t, state.OutcomeAcquired, a, err)
	c, err := s.Complete(ctx, claim(before, "o"), statetest.Done())
	statetest.RequireOutcome(t, state.OutcomeOK, c, err)

	e.redisSrv.Kill()

	// Answers stay right (from PostgreSQL) while Redis fails, and the
	// breaker opens after three failures.
	r, err := s.Acquire(ctx, statetest.AcquireRequest(before, "p"))
	statetest.RequireOutcome(t, state.OutcomeDone, r, err)
	statetest.RequireSameResult(t, statetest.SampleResult(), r.Record.Result)
	during := statetest.NewKey(t)
	a, err = s.Acquire(ctx, statetest.AcquireRequest(during, "o"))
	statetest.RequireOutcome(t, state.OutcomeAcquired, a, err)
	b, err := s.Acquire(ctx, statetest.AcquireRequest(during, "p"))
	statetest.RequireOutcome(t, state.OutcomeInFlight, b, err)
	require.Equal(t, tiered.BreakerOpen, s.Stats().Breaker)
	require.GreaterOrEqual(t, fb.count(tiered.FallbackRedisError), 3)

	// Open: Redis is not called at all, however many calls come.
	redisCalls := cache.n.Load()
	skipped := s.Stats().RedisSkipped
	c, err = s.Complete(ctx, claim(during, "o"), statetest.Done())
	statetest.RequireOutcome(t, state.OutcomeOK, c, err)
	for i := 0; i < 10; i++ {
		r, err := s.Acquire(ctx, statetest.AcquireRequest(during, fmt.Sprintf("retry-%d", i)))
		statetest.RequireOutcome(t, state.OutcomeDone, r, err)
		rec, found, err := s.Get(ctx, during)
		require.NoError(t, err)
		require.True(t, found)
		require.Equal(t, state.Done, rec.State)
	}
	require.Equal(t, redisCalls, cache.n.Load(), "no Redis call while the breaker is open")
	require.Greater(t, s.Stats().RedisSkipped, skipped+20)
	require.Greater(t, fb.count(tiered.FallbackBreakerOpen), 20)
	require.NoError(t, s.Ping(ctx), "the store is ready on PostgreSQL alone")
	require.ErrorIs(t, s.PingRedis(ctx), tiered.ErrBreakerOpen)

	// Redis comes back empty. After the cool-down a probe closes the
	// breaker (a pooled connection from before the crash may spend one
	// probe, hence the few tries).
	e.redisSrv.Restart()
	for i := 0; i < 5 && s.Stats().Breaker != tiered.BreakerClosed; i++ {
		clock.Advance(2 * time.Minute)
		_ = s.PingRedis(ctx)
	}
	require.Equal(t, tiered.BreakerClosed, s.Stats().Breaker)

	// The record written while Redis was away reaches Redis through the
	// PostgreSQL check, and from then on the fast path answers alone.
	r, err = s.Acquire(ctx, statetest.AcquireRequest(during, "late"))
	statetest.RequireOutcome(t, state.OutcomeDone, r, err)
	rec, found, err := rs.Get(ctx, during)
	require.NoError(t, err)
	require.True(t, found)
	require.Equal(t, state.Done, rec.State)
	pgAcquires := pg.acquires.Load()
	r, err = s.Acquire(ctx, statetest.AcquireRequest(during, "later"))
	statetest.RequireOutcome(t, state.OutcomeDone, r, err)
	statetest.RequireSameResult(t, statetest.SampleResult(), r.Record.Result)
	require.Equal(t, pgAcquires, pg.acquires.Load(), "fast path is back")
}

// hungRedis accepts connections and never answers, like a Redis stuck in a
// long command or a network black hole.
func hungRedis(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var mu sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		_ = l.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			_ = c.Close()
		}
	})
	return l.Addr().String()
}

func TestHungRedisCostsOneTimeoutThenNothing(t *testing.T) {
	dsn := testutil.CreateDatabase(t)
	require.NoError(t, postgres.Migrate(t.Context(), dsn))
	cache := &countingCache{Cache: newRedis(t, hungRedis(t))}
	fb := &fallbacks{}
	s := newTiered(t, tiered.Options{
		Redis: cache, Postgres: newPostgres(t, dsn), RedisTimeout: 100 * time.Millisecond,
		FailureThreshold: 3, CoolDown: time.Hour, OnFallback: fb.record,
	})
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	key := statetest.NewKey(t)
	a, err := s.Acquire(ctx, statetest.AcquireRequest(key, "o"))
	statetest.RequireOutcome(t, state.OutcomeAcquired, a, err)
	require.Equal(t, 1, fb.count(tiered.FallbackRedisTimeout))
	require.Equal(t, tiered.BreakerOpen, s.Stats().Breaker, "one timeout opens the breaker")

	calls := cache.n.Load()
	b, err := s.Acquire(ctx, statetest.AcquireRequest(key, "p"))
	statetest.RequireOutcome(t, state.OutcomeInFlight, b, err)
	c, err := s.Complete(ctx, state.Claim{Key: key, Owner: "o", Fence: 1}, statetest.Done())
	statetest.RequireOutcome(t, state.OutcomeOK, c, err)
	require.Equal(t, calls, cache.n.Load())
}

func TestPostgresUnreachableRefusesAndReleasesRedisClaim(t *testing.T) {
	srv := testutil.StartRedis(t)
	rs := newRedis(t, srv.Addr)
	dead := fmt.Sprintf("postgres://postgres@127.0.0.1:%d/none?sslmode=disable&connect_timeout=1", testutil.FreePort(t))
	s := newTiered(t, tiered.Options{Redis: rs, Postgres: newPostgres(t, dead)})
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()

	key := statetest.NewKey(t)
	_, err := s.Acquire(ctx, statetest.AcquireRequest(key, "o"))
	require.ErrorIs(t, err, state.ErrUnavailable)
	_, found, err := rs.Get(ctx, key)
	require.NoError(t, err)
	require.False(t, found, "the Redis claim made by the failed call is released")
	require.Equal(t, uint64(1), s.Stats().OrphansDropped)

	_, err = s.Complete(ctx, state.Claim{Key: key, Owner: "o", Fence: 1}, statetest.Done())
	require.ErrorIs(t, err, state.ErrUnavailable)
	_, _, err = s.Get(ctx, key)
	require.ErrorIs(t, err, state.ErrUnavailable)
	require.ErrorIs(t, s.Ping(ctx), state.ErrUnavailable)

	// A terminal record already in Redis came from PostgreSQL: it is still
	// replayed while PostgreSQL is down.
	done := statetest.NewKey(t)
	res := statetest.SampleResult()
	now := time.Now()
	_, err = rs.Repair(ctx, state.Record{
		Key: done, Scope: "payments.transfer", SubjectTag: "subj-tag-1", ParamHash: "ph-1", State: state.Done,
		Owner: "o", Fence: 1, LeaseUntil: now, CreatedAt: now, UpdatedAt: now, ExpiresAt: now.Add(time.Hour), Result: &res,
	}, time.Hour)
	require.NoError(t, err)
	r, err := s.Acquire(ctx, statetest.AcquireRequest(done, "p"))
	statetest.RequireOutcome(t, state.OutcomeDone, r, err)
	statetest.RequireSameResult(t, res, r.Record.Result)
	rec, found, err := s.Get(ctx, done)
	require.NoError(t, err)
	require.True(t, found)
	require.Equal(t, state.Done, rec.State)
}

func TestPostgresDroppedDatabaseRefuses(t *testing.T) {
	e := newEnv(t)
	rs := newRedis(t, e.redisSrv.Addr)
	pg := newPostgres(t, e.dsn)
	s := newTiered(t, tiered.Options{Redis: rs, Postgres: pg})
	ctx := t.Context()
	_, err := pg.Pool().Exec(ctx, "DROP TABLE idempotency_record")
	require.NoError(t, err)
	key := statetest.NewKey(t)
	_, err = s.Acquire(ctx, statetest.AcquireRequest(key, "o"))
	require.ErrorIs(t, err, state.ErrUnavailable)
	_, found, err := rs.Get(ctx, key)
	require.NoError(t, err)
	require.False(t, found)
}

func TestNewNeedsBothBackends(t *testing.T) {
	_, err := tiered.New(tiered.Options{})
	require.ErrorIs(t, err, state.ErrInvalidArgument)
}

// AbandonUnsent keeps Redis in line with PostgreSQL: a deleted fresh claim leaves
// no Redis copy behind (the next confirm is answered ACQUIRED at once), a
// taken-over claim's ended lease is copied, and a Redis claim PostgreSQL
// never had (an orphan of a failed Acquire) is dropped too.
func TestAbandonFollowsPostgresIntoRedis(t *testing.T) {
	e := newEnv(t)
	rs := newRedis(t, e.redisSrv.Addr)
	pg := newPostgres(t, e.dsn)
	s := newTiered(t, tiered.Options{Redis: rs, Postgres: pg})
	ctx := t.Context()

	fresh := statetest.NewKey(t)
	a, err := s.Acquire(ctx, statetest.AcquireRequest(fresh, "owner-a"))
	statetest.RequireOutcome(t, state.OutcomeAcquired, a, err)
	ab, err := s.AbandonUnsent(ctx, state.Claim{Key: fresh, Owner: "owner-a", Fence: 1})
	statetest.RequireOutcome(t, state.OutcomeOK, ab, err)
	_, found, err := rs.Get(ctx, fresh)
	require.NoError(t, err)
	require.False(t, found, "the Redis copy of the deleted claim is gone")
	require.Zero(t, countRows(t, pg, fresh))

	taken := statetest.NewKey(t)
	a, err = s.Acquire(ctx, statetest.AcquireRequest(taken, "owner-a"))
	statetest.RequireOutcome(t, state.OutcomeAcquired, a, err)
	_, err = s.EndLease(ctx, state.Claim{Key: taken, Owner: "owner-a", Fence: 1})
	require.NoError(t, err)
	tk, err := s.Takeover(ctx, state.TakeoverRequest{Key: taken, NewOwner: "owner-b", Fence: 1, Lease: time.Minute})
	statetest.RequireOutcome(t, state.OutcomeAcquired, tk, err)
	ab, err = s.AbandonUnsent(ctx, state.Claim{Key: taken, Owner: "owner-b", Fence: 2})
	statetest.RequireOutcome(t, state.OutcomeOK, ab, err)
	rec, found, err := rs.Get(ctx, taken)
	require.NoError(t, err)
	require.True(t, found)
	require.Equal(t, int64(2), rec.Fence)
	require.True(t, rec.LeaseExpired, "redis has the ended lease")

	orphan := statetest.NewKey(t)
	o, err := rs.Acquire(ctx, statetest.AcquireRequest(orphan, "ghost"))
	statetest.RequireOutcome(t, state.OutcomeAcquired, o, err)
	ab, err = s.AbandonUnsent(ctx, state.Claim{Key: orphan, Owner: "ghost", Fence: 1})
	statetest.RequireOutcome(t, state.OutcomeNotOwner, ab, err)
	_, found, err = rs.Get(ctx, orphan)
	require.NoError(t, err)
	require.False(t, found, "the orphan Redis claim is dropped")
}

// A Sentinel failover (master killed, its replica promoted) is, with
// FLUSHALL, how Redis loses data under the tiered store. While there is no
// master the answers come from PostgreSQL; once Sentinel has promoted the
// replica the fast path is back on it, and what was decided in between
// reaches it from PostgreSQL.
func TestSentinelFailoverKeepsAnswersAndComesBack(t *testing.T) {
	dsn := testutil.CreateDatabase(t)
	require.NoError(t, postgres.Migrate(t.Context(), dsn))
	master := testutil.StartRedis(t)
	host, port, err := net.SplitHostPort(master.Addr)
	require.NoError(t, err)
	replica := testutil.StartRedis(t, "--replicaof", host, port)
	const name = "idemfailover"
	sentinelAddr := testutil.StartRedisSentinelDownAfter(t, name, master.Addr, 500*time.Millisecond)
	sentinel := goredis.NewSentinelClient(&goredis.Options{Addr: sentinelAddr})
	defer sentinel.Close()
	replicaClient := goredis.NewClient(&goredis.Options{Addr: replica.Addr})
	defer replicaClient.Close()
	ctx := t.Context()

	// Sentinel can only promote a replica it has discovered, and a record
	// reaches the replica only once the initial sync is over (on a loaded
	// machine that takes seconds).
	require.Eventually(t, func() bool {
		replicas, err := sentinel.Replicas(ctx, name).Result()
		return err == nil && len(replicas) == 1
	}, 20*time.Second, 50*time.Millisecond, "sentinel never saw the replica")
	require.Eventually(t, func() bool {
		info, err := replicaClient.Info(ctx, "replication").Result()
		return err == nil && strings.Contains(info, "master_link_status:up")
	}, 20*time.Second, 50*time.Millisecond, "the replica never finished its sync")
	masterClient := goredis.NewClient(&goredis.Options{Addr: master.Addr})
	defer masterClient.Close()

	rs, err := redis.New(redis.Options{Addrs: []string{sentinelAddr}, Mode: redis.ModeSentinel, MasterName: name})
	require.NoError(t, err)
	fb := &fallbacks{}
	s := newTiered(t, tiered.Options{
		Redis: rs, Postgres: newPostgres(t, dsn), RedisTimeout: 500 * time.Millisecond,
		FailureThreshold: 1, CoolDown: 100 * time.Millisecond, OnFallback: fb.record,
	})
	claim := func(key, owner string) state.Claim { return state.Claim{Key: key, Owner: owner, Fence: 1} }

	before := statetest.NewKey(t)
	a, err := s.Acquire(ctx, statetest.AcquireRequest(before, "o"))
	statetest.RequireOutcome(t, state.OutcomeAcquired, a, err)
	c, err := s.Complete(ctx, claim(before, "o"), statetest.Done())
	statetest.RequireOutcome(t, state.OutcomeOK, c, err)
	// WAIT returns once the replica acknowledged every write before it.
	acked, err := masterClient.Wait(ctx, 1, 20*time.Second).Result()
	require.NoError(t, err)
	require.Equal(t, int64(1), acked, "the replica did not acknowledge the record")
	require.Equal(t, int64(1), replicaClient.Exists(ctx, rs.Key(before)).Val(), "the record reached the replica")

	master.Kill()

	// No master: every answer is still right, from PostgreSQL.
	r, err := s.Acquire(ctx, statetest.AcquireRequest(before, "retry"))
	statetest.RequireOutcome(t, state.OutcomeDone, r, err)
	statetest.RequireSameResult(t, statetest.SampleResult(), r.Record.Result)
	during := statetest.NewKey(t)
	a, err = s.Acquire(ctx, statetest.AcquireRequest(during, "o"))
	statetest.RequireOutcome(t, state.OutcomeAcquired, a, err)
	b, err := s.Acquire(ctx, statetest.AcquireRequest(during, "p"))
	statetest.RequireOutcome(t, state.OutcomeInFlight, b, err)
	c, err = s.Complete(ctx, claim(during, "o"), statetest.Done())
	statetest.RequireOutcome(t, state.OutcomeOK, c, err)
	require.Positive(t, fb.count(tiered.FallbackRedisError)+fb.count(tiered.FallbackBreakerOpen))

	// Sentinel promotes the replica; a probe closes the breaker.
	require.Eventually(t, func() bool {
		addr, err := sentinel.GetMasterAddrByName(ctx, name).Result()
		return err == nil && net.JoinHostPort(addr[0], addr[1]) == replica.Addr
	}, 30*time.Second, 100*time.Millisecond, "sentinel did not promote the replica")
	require.Eventually(t, func() bool {
		_ = s.PingRedis(ctx)
		return s.Stats().Breaker == tiered.BreakerClosed
	}, 20*time.Second, 100*time.Millisecond, "the fast path did not come back")

	// The fast path runs on the promoted replica, and what was decided
	// while there was no master reaches it.
	after := statetest.NewKey(t)
	a, err = s.Acquire(ctx, statetest.AcquireRequest(after, "o"))
	statetest.RequireOutcome(t, state.OutcomeAcquired, a, err)
	require.Equal(t, int64(1), replicaClient.Exists(ctx, rs.Key(after)).Val(), "claimed on the new master")
	r, err = s.Acquire(ctx, statetest.AcquireRequest(during, "late"))
	statetest.RequireOutcome(t, state.OutcomeDone, r, err)
	statetest.RequireSameResult(t, statetest.SampleResult(), r.Record.Result)
	require.Equal(t, int64(1), replicaClient.Exists(ctx, rs.Key(during)).Val(), "repaired from PostgreSQL")
	r, err = s.Acquire(ctx, statetest.AcquireRequest(before, "later"))
	statetest.RequireOutcome(t, state.OutcomeDone, r, err)
}
