package redis_test

import (
	"bytes"
	"net"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/internal/testutil"
	"github.com/idemgate/idemgate/state"
	"github.com/idemgate/idemgate/state/redis"
	"github.com/idemgate/idemgate/state/statetest"
)

// clusterBehindProxy starts a one-node Redis Cluster holding every slot
// that announces the proxy's address, so every cluster connection of the
// client goes through the proxy.
func clusterBehindProxy(t *testing.T) *testutil.CutProxy {
	t.Helper()
	if _, err := exec.LookPath("redis-cli"); err != nil {
		t.Fatalf("redis-cli (Debian package redis-tools) is required: %v", err)
	}
	proxyPort := testutil.FreePort(t)
	node := testutil.StartRedis(t, "--cluster-enabled", "yes",
		"--cluster-config-file", filepath.Join(t.TempDir(), "nodes.conf"),
		"--cluster-announce-ip", "127.0.0.1", "--cluster-announce-port", strconv.Itoa(proxyPort))
	proxy := testutil.StartCutProxy(t, "127.0.0.1:"+strconv.Itoa(proxyPort), node.Addr)
	_, port, _ := net.SplitHostPort(node.Addr)
	out, err := exec.Command("redis-cli", "-p", port, "cluster", "addslotsrange", "0", "16383").CombinedOutput()
	require.NoError(t, err, string(out))
	require.Eventually(t, func() bool {
		info, err := exec.Command("redis-cli", "-p", port, "cluster", "info").Output()
		return err == nil && bytes.Contains(info, []byte("cluster_state:ok"))
	}, 20*time.Second, 50*time.Millisecond)
	return proxy
}

// A script whose reply is lost with its connection has run: the Cluster
// client must report the failure, not run the script again (which would
// answer IN_FLIGHT to the caller that has just acquired). With and without
// pipelining, which send scripts differently.
func TestClusterNeverRetriesAScriptWhoseReplyWasLost(t *testing.T) {
	for _, pipelined := range []bool{true, false} {
		t.Run("pipelined="+strconv.FormatBool(pipelined), func(t *testing.T) {
			proxy := clusterBehindProxy(t)
			s, err := redis.New(redis.Options{Addrs: []string{proxy.Addr}, Mode: redis.ModeCluster,
				Batch: redis.BatchOptions{Disabled: !pipelined}})
			require.NoError(t, err)
			t.Cleanup(func() { _ = s.Close() })
			ctx := t.Context()
			require.NoError(t, s.LoadScripts(ctx))

			key := statetest.NewKey(t)
			proxy.CutAfterReplyTo("evalsha")
			a, err := s.Acquire(ctx, statetest.AcquireRequest(key, "owner-a"))
			require.Equal(t, int64(1), proxy.Cuts(), "the proxy cut the connection after the script ran")
			require.ErrorIs(t, err, state.ErrUnavailable, "a lost reply is a failure, not %s", a.Outcome)

			// The script did run once: the claim is there, and it is owner-a's.
			rec, found, err := s.Get(ctx, key)
			require.NoError(t, err)
			require.True(t, found)
			require.Equal(t, "owner-a", rec.Owner)
			require.Equal(t, int64(1), rec.Fence)
		})
	}
}
