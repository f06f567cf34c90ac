package e2e

import (
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/e2e/internal/stack"
	"github.com/idemgate/idemgate/e2e/payments"
)

// TestConcurrentIdenticalConfirmsExecuteOnce (并发压测): many
// parallel confirms of one fingerprint execute exactly once and leave one
// PostgreSQL row; every other answer is the replay of that one result or
// "in progress, poll the status tool" — never a 5xx, never a second run.
func TestConcurrentIdenticalConfirmsExecuteOnce(t *testing.T) {
	s := startStack(t, stack.Options{})
	alice := s.Agent("alice")
	p := preview(t, alice, transfer("250.00", "acct_dave", "invoice 2024-117"))
	body := p.ConfirmBody()

	// The one execution stays in flight a while, so most duplicates arrive
	// while it runs and some after it finished.
	s.Payments.SetFaults(payments.Faults{DelayAfterExecute: 500 * time.Millisecond, Times: 1})

	// 120 confirms at once: one executes, the rest find it in flight.
	const n = 120
	first := confirmInParallel(t, alice, body, n)
	var original *stack.Response
	var replays, inProgress []*stack.Response
	for _, r := range first {
		require.Less(t, r.StatusCode, 500, "no 5xx: %s", r)
		switch {
		case r.Envelope == nil:
			require.Nil(t, original, "a second original answer means a second execution: %s", r)
			requireExecuted(t, r)
			original = r
		case r.Envelope.Status == "already_completed":
			replays = append(replays, r)
		case r.Envelope.Status == "in_progress":
			inProgress = append(inProgress, r)
		default:
			t.Fatalf("unexpected answer %s", r)
		}
	}
	require.NotNil(t, original, "exactly one confirm must execute")
	for _, r := range replays {
		requireReplay(t, s, r, p.Nonce, original.Body)
	}
	for _, r := range inProgress {
		requireInProgress(t, s, r)
	}
	t.Logf("%d parallel confirms: 1 executed, %d replays, %d in_progress", n, len(replays), len(inProgress))

	// 40 more at once after it completed: all replays of the one result.
	for _, r := range confirmInParallel(t, alice, body, 40) {
		requireReplay(t, s, r, p.Nonce, original.Body)
	}

	require.Equal(t, 1, s.Payments.Executions())
	require.Len(t, s.Upstream.Confirms(), 1, "duplicates never reach the upstream")
	row := requireRow(t, s, p.Nonce, "DONE")
	require.Equal(t, http.StatusOK, *row.ResultStatus)
	require.Equal(t, string(original.Body), string(row.ResultBody))
	requireRowCounts(t, s, map[string]int{"DONE": 1})

	// Afterwards a single retry is the replay of the original result too.
	requireReplay(t, s, confirm(t, alice, body), p.Nonce, original.Body)
	require.Equal(t, 1, s.Payments.Executions())
}

// confirmInParallel sends n identical confirms at the same moment and
// returns every answer.
func confirmInParallel(t *testing.T, a *stack.Agent, body map[string]any, n int) []*stack.Response {
	t.Helper()
	results := make([]*stack.Response, n)
	errs := make([]error, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			results[i], errs[i] = a.Confirm(body)
		})
	}
	close(start)
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
	return results
}
