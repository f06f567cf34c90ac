package tiered_test

import (
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/state"
	"github.com/idemgate/idemgate/state/statetest"
	"github.com/idemgate/idemgate/state/tiered"
)

// Redis keeps a record for the replay window (ttl.replay_cache), not for
// its whole retention: PostgreSQL keeps it that long, and answers a replay
// once Redis has forgotten it.
func TestRedisKeepsRecordsForTheReplayWindowOnly(t *testing.T) {
	e := newEnv(t)
	rs := newRedis(t, e.redisSrv.Addr)
	const window = 10 * time.Minute
	s := newTiered(t, tiered.Options{Redis: rs, Postgres: newPostgres(t, e.dsn), RedisMaxTTL: window})
	ctx := t.Context()
	raw := goredis.NewClient(&goredis.Options{Addr: e.redisSrv.Addr})
	defer raw.Close()
	key := statetest.NewKey(t)
	ttl := func() time.Duration {
		t.Helper()
		d, err := raw.PTTL(ctx, rs.Key(key)).Result()
		require.NoError(t, err)
		return d
	}

	req := statetest.AcquireRequest(key, "owner-a")
	require.Greater(t, req.Retention, window, "the test needs a retention longer than the window")
	a, err := s.Acquire(ctx, req)
	statetest.RequireOutcome(t, state.OutcomeAcquired, a, err)
	require.Positive(t, ttl())
	require.LessOrEqual(t, ttl(), window, "a claim lives in Redis for the window, not the retention")

	c, err := s.Complete(ctx, state.Claim{Key: key, Owner: "owner-a", Fence: 1}, statetest.Done())
	statetest.RequireOutcome(t, state.OutcomeOK, c, err)
	require.Positive(t, ttl())
	require.LessOrEqual(t, ttl(), window, "a completed record lives in Redis for the window")

	// Past the window Redis has forgotten it; the replay still comes from
	// PostgreSQL, which keeps the record for its retention.
	require.NoError(t, raw.Del(ctx, rs.Key(key)).Err())
	r, err := s.Acquire(ctx, statetest.AcquireRequest(key, "owner-b"))
	statetest.RequireOutcome(t, state.OutcomeDone, r, err)
	statetest.RequireSameResult(t, statetest.SampleResult(), r.Record.Result)
	require.Greater(t, time.Until(r.Record.ExpiresAt), window)
}
