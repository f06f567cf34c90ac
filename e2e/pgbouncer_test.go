package e2e

import (
	"net/http"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/e2e/internal/stack"
)

// TestThroughPgBouncerTransactionMode: the tiered store's PostgreSQL behind
// PgBouncer 1.18 in transaction mode (two server connections shared by
// every client connection idemgate opens), through the real Envoy: the
// migration at start, confirms from several agents at once, the status
// tool, and replays answered by PostgreSQL through the pooler once Redis
// has forgotten: exactly one execution each.
func TestThroughPgBouncerTransactionMode(t *testing.T) {
	s := startStack(t, stack.Options{PostgresThroughPgBouncer: true})
	alice := s.Agent("alice")
	const n = 8
	previews := make([]*stack.Preview, n)
	for i := range previews {
		previews[i] = preview(t, alice, transfer("10.00", "acct_bob", "split"))
	}
	first := make([]*stack.Response, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range previews {
		wg.Add(1)
		go func() {
			defer wg.Done()
			first[i], errs[i] = s.Agent("alice").Confirm(previews[i].ConfirmBody())
		}()
	}
	wg.Wait()
	for i := range first {
		require.NoError(t, errs[i])
		requireExecuted(t, first[i])
	}
	require.Equal(t, n, s.Payments.Executions())
	requireRowCounts(t, s, map[string]int{"DONE": n})
	for _, p := range previews {
		requireEnvelope(t, s, status(t, alice, p.Fingerprint), http.StatusOK, "completed", notRetryable)
	}

	// Redis forgets; PostgreSQL, through the pooler, answers the replays.
	require.NoError(t, s.RedisClient().FlushAll(t.Context()).Err())
	for i, p := range previews {
		requireReplay(t, s, confirm(t, alice, p.ConfirmBody()), p.Nonce, first[i].Body)
	}
	require.Equal(t, n, s.Payments.Executions(), "nothing executed twice")
	require.NotContains(t, s.Idemgate.Log(), "prepared statement", "no named statement reached the pooler")
}
