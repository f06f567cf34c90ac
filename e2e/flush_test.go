package e2e

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/e2e/internal/stack"
)

// TestReplayAfterRedisFlushall (缓存清空): Redis is only the
// fast path. After FLUSHALL on the (test-owned) Redis, PostgreSQL's record
// still answers the retry with the original result, byte for byte, and
// nothing executes again.
func TestReplayAfterRedisFlushall(t *testing.T) {
	s := startStack(t, stack.Options{})
	alice := s.Agent("alice")
	p := preview(t, alice, transfer("75.10", "acct_erin", "team lunch"))
	first := confirm(t, alice, p.ConfirmBody())
	requireExecuted(t, first)

	rdb := s.RedisClient()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	require.NoError(t, rdb.FlushAll(ctx).Err())
	size, err := rdb.DBSize(ctx).Result()
	require.NoError(t, err)
	require.Zero(t, size)

	requireReplay(t, s, confirm(t, alice, p.ConfirmBody()), p.Nonce, first.Body)
	// And the status tool agrees.
	r := status(t, alice, p.Fingerprint)
	e := requireEnvelope(t, s, r, http.StatusOK, "completed", notRetryable)
	require.Equal(t, string(first.Body), string(e.Result))

	require.Equal(t, 1, s.Payments.Executions())
	require.Len(t, s.Upstream.Confirms(), 1)
	requireRow(t, s, p.Nonce, "DONE")
	requireRowCounts(t, s, map[string]int{"DONE": 1})
}
