package redis_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/internal/testutil"
	"github.com/idemgate/idemgate/state/redis"
)

// At start the store reads INFO (CONFIG is often blocked on managed Redis)
// and refuses what would let it forget a DONE or silently stop using Redis.
func TestCheckServer(t *testing.T) {
	t.Run("noeviction, single at a single server: fine", func(t *testing.T) {
		s := newSingle(t, testutil.StartRedis(t, "--maxmemory-policy", "noeviction").Addr)
		for _, asRecord := range []bool{true, false} {
			warns, err := s.CheckServer(t.Context(), asRecord)
			require.NoError(t, err)
			require.Empty(t, warns)
		}
	})
	t.Run("an evicting policy: refused as the record, a warning as the fast path", func(t *testing.T) {
		for _, policy := range []string{"volatile-lru", "allkeys-lru", "volatile-ttl"} {
			s := newSingle(t, testutil.StartRedis(t, "--maxmemory-policy", policy).Addr)
			_, err := s.CheckServer(t.Context(), true)
			require.ErrorIs(t, err, redis.ErrMisconfigured, policy)
			require.ErrorContains(t, err, policy)
			warns, err := s.CheckServer(t.Context(), false)
			require.NoError(t, err)
			require.Len(t, warns, 1)
			require.Contains(t, warns[0], policy)
		}
	})
	t.Run("mode single at a cluster node: refused", func(t *testing.T) {
		addrs := testutil.StartRedisCluster(t, 3)
		s := newSingle(t, addrs[0])
		for _, asRecord := range []bool{true, false} {
			_, err := s.CheckServer(t.Context(), asRecord)
			require.ErrorIs(t, err, redis.ErrMisconfigured)
			require.ErrorContains(t, err, "cluster_enabled:1")
		}
		c, err := redis.New(redis.Options{Addrs: addrs, Mode: redis.ModeCluster})
		require.NoError(t, err)
		t.Cleanup(func() { _ = c.Close() })
		warns, err := c.CheckServer(t.Context(), true)
		require.NoError(t, err, "mode cluster at a cluster is what it should be")
		require.Empty(t, warns)
	})
}
