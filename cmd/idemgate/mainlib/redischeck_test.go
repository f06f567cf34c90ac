package mainlib

import (
	"fmt"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/internal/testutil"
)

// A Redis-only store on a Redis that may evict keys could forget a DONE and
// execute its replay: serve reports not ready and starts nothing until the
// policy is noeviction. Checked from INFO, on every readiness round.
func TestServeRedisOnlyRefusesAnEvictingPolicy(t *testing.T) {
	srv := testutil.StartRedis(t, "--maxmemory-policy", "volatile-lru")
	s := startServe(t, writeConfig(t, fmt.Sprintf("store: {redis: {addrs: [%q]}}", srv.Addr)))
	conn := s.conn(t)
	require.Eventually(t, func() bool {
		code, body := s.get(t, "/readyz")
		return code == 503 && containsAll(body, "maxmemory-policy is volatile-lru")
	}, 10*time.Second, 50*time.Millisecond)
	fp := previewFingerprint(t, conn)
	im := confirm(t, conn, fp).GetImmediateResponse()
	require.NotNil(t, im, "nothing starts on a Redis that may forget it")
	require.Equal(t, 503, int(im.GetStatus().GetCode()))
	require.Contains(t, string(im.GetBody()), `"status":"temporarily_unavailable"`)

	c := goredis.NewClient(&goredis.Options{Addr: srv.Addr})
	defer c.Close()
	require.NoError(t, c.ConfigSet(t.Context(), "maxmemory-policy", "noeviction").Err())
	require.Eventually(t, func() bool { code, _ := s.get(t, "/readyz"); return code == 200 }, 10*time.Second, 50*time.Millisecond)
	reply := confirm(t, conn, fp)
	require.Nil(t, reply.GetImmediateResponse(), "acquired once the policy keeps records")
	require.NotNil(t, reply.GetRequestBody())
}

// A tiered store on an evicting Redis only warns: PostgreSQL answers what
// Redis forgets. A cluster node addressed as a single server is refused.
func TestServeTieredRedisChecks(t *testing.T) {
	t.Run("evicting policy: a warning", func(t *testing.T) {
		srv := testutil.StartRedis(t, "--maxmemory-policy", "allkeys-lru")
		dsn := testutil.CreateDatabase(t)
		s := startServe(t, writeConfig(t, fmt.Sprintf("store: {redis: {addrs: [%q]}, postgres: {dsn: %q}}", srv.Addr, dsn)))
		require.Eventually(t, func() bool { code, _ := s.get(t, "/readyz"); return code == 200 }, 20*time.Second, 50*time.Millisecond)
		require.Eventually(t, func() bool { return containsAll(s.stderr.String(), "maxmemory-policy is allkeys-lru") }, 5*time.Second, 20*time.Millisecond)
	})
	t.Run("mode single at a cluster node: not ready", func(t *testing.T) {
		addrs := testutil.StartRedisCluster(t, 3)
		dsn := testutil.CreateDatabase(t)
		s := startServe(t, writeConfig(t, fmt.Sprintf("store: {redis: {addrs: [%q], mode: single}, postgres: {dsn: %q}}", addrs[0], dsn)))
		require.Eventually(t, func() bool {
			code, body := s.get(t, "/readyz")
			return code == 503 && containsAll(body, "cluster_enabled:1", "set mode: cluster")
		}, 20*time.Second, 50*time.Millisecond)
	})
}

func containsAll(s string, parts ...string) bool {
	for _, p := range parts {
		if !strings.Contains(s, p) {
			return false
		}
	}
	return true
}

// serve warns at start when PostgreSQL reports no synchronous standby (the
// shared test server has none): a failover could lose an acknowledged DONE.
func TestServeWarnsWithoutASynchronousStandby(t *testing.T) {
	dsn := testutil.CreateDatabase(t)
	s := startServe(t, writeConfig(t, fmt.Sprintf("store: {postgres: {dsn: %q}}", dsn)))
	require.Eventually(t, func() bool { code, _ := s.get(t, "/readyz"); return code == 200 }, 20*time.Second, 50*time.Millisecond)
	require.Contains(t, s.stderr.String(), "no synchronous standby (synchronous_standby_names is empty)")
}
