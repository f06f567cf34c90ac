package e2e

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/e2e/internal/stack"
	"github.com/idemgate/idemgate/e2e/payments"
)

// crashLease is ttl.in_flight in the crash tests: long enough that the
// restarted idemgate is asked before the dead owner's lease ends (a race
// build restarts in about a second), short enough to wait for.
const crashLease = 6 * time.Second

// confirmResult is a confirm sent in the background.
type confirmResult struct {
	resp *stack.Response
	err  error
}

// crashAnswerDelay is how long payments sleeps between executing the crash
// test's confirm and answering it: idemgate is killed in between. Payments
// then writes its answer to a connection nobody reads any more; the
// Upstream recorder keeps it as the payments ledger.
const crashAnswerDelay = 3 * time.Second

// crashAfterExecution sends a confirm, waits until payments executed it
// (it then sleeps before answering, so idemgate has not seen the response),
// kills idemgate with SIGKILL, and returns what the agent got: the front's
// own error for the broken ext_proc stream. It then restarts idemgate on the
// same ports and waits until the front reaches it again.
func crashAfterExecution(t *testing.T, s *stack.Stack, a *stack.Agent, p *stack.Preview) *stack.Response {
	t.Helper()
	s.Payments.SetFaults(payments.Faults{DelayAfterExecute: crashAnswerDelay, Times: 1})
	done := make(chan confirmResult, 1)
	go func() {
		r, err := a.Confirm(p.ConfirmBody())
		done <- confirmResult{r, err}
	}()
	require.Eventually(t, func() bool { return s.Payments.Executions() == 1 }, 30*time.Second, 5*time.Millisecond,
		"payments never executed the confirm")
	s.Idemgate.Kill()

	var first confirmResult
	select {
	case first = <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("the confirm got no answer after idemgate died")
	}
	require.NoError(t, first.err)
	// Envoy's own reply to a broken ext_proc stream (status_on_error 500,
	// no body: "Received gRPC error on stream" in its log), not an envelope
	// and certainly not a success.
	require.Equal(t, http.StatusInternalServerError, first.resp.StatusCode, "got %s", first.resp)
	require.Nil(t, first.resp.Envelope)
	require.Empty(t, first.resp.Body)

	// The crash left the claim behind.
	requireRow(t, s, p.Nonce, "IN_FLIGHT")

	require.NoError(t, s.Idemgate.Start(), "idemgate did not restart on the same ports")
	// The front reconnects to the new process: the status tool (a read)
	// answers again.
	require.Eventually(t, func() bool {
		r, err := a.Status(p.Fingerprint)
		return err == nil && r.Envelope != nil && r.StatusCode == http.StatusOK
	}, 30*time.Second, 50*time.Millisecond, "the front never reached the restarted idemgate")
	return first.resp
}

// ledgerEntry waits until payments wrote its (undelivered) answer to the
// first confirm and returns it.
func ledgerEntry(t *testing.T, s *stack.Stack) []byte {
	t.Helper()
	var body []byte
	require.Eventually(t, func() bool {
		calls := s.Upstream.Confirms()
		if len(calls) > 0 {
			body = calls[0].Body
		}
		return len(body) > 0
	}, 10*crashAnswerDelay, 10*time.Millisecond, "payments never answered the first confirm")
	return body
}

// TestCrashBetweenExecutionAndRecord (崩溃注入): idemgate is
// killed -9 after the upstream executed and before the response reached it.
// The retry never gets a bare "duplicate" error and nothing executes twice:
// with a downstream that honours keys, the retry takes over once the lease
// ends and re-sends the same Idempotency-Key, and payments answers with the
// transfer it already made; with one that ignores keys, the record becomes
// UNKNOWN (needs_reconciliation) until a person settles it with
// `idemgate ops resolve`.
func TestCrashBetweenExecutionAndRecord(t *testing.T) {
	t.Run("downstream honours keys", func(t *testing.T) {
		s := startStack(t, stack.Options{InFlightTTL: crashLease})
		alice := s.Agent("alice")
		p := preview(t, alice, transfer("999.99", "acct_grace", "car repair"))

		crashAfterExecution(t, s, alice, p)
		row := requireRow(t, s, p.Nonce, "IN_FLIGHT")

		// Before the dead owner's lease ends, a retry is told to wait and
		// poll, not to retry and not "duplicate".
		r := confirm(t, alice, p.ConfirmBody())
		require.True(t, time.Now().Before(row.LeaseUntil), "the restart took longer than the lease (%s); raise crashLease", crashLease)
		requireInProgress(t, s, r)
		require.Equal(t, "in_progress", statusOf(t, s, alice, p.Fingerprint))

		// Once it ends, the status tool says the operation was interrupted
		// (not_started), and the retry takes over.
		waitStatus(t, s, alice, p.Fingerprint, "not_started", 3*crashLease)
		took := confirm(t, alice, p.ConfirmBody())
		tr := requireExecuted(t, took)

		// The same key both times; payments answered the second from its
		// unique-key store with the transfer of the first.
		calls := s.Upstream.Confirms()
		require.Len(t, calls, 2)
		require.Equal(t, p.Nonce, calls[0].IdempotencyKey)
		require.Equal(t, calls[0].IdempotencyKey, calls[1].IdempotencyKey, "the takeover must re-send the same Idempotency-Key")
		rec, ok := s.Payments.RecordForKey(p.Nonce)
		require.True(t, ok)
		require.Equal(t, rec.TransferID, tr.TransferID)
		require.Equal(t, string(rec.Body), string(took.Body), "the retry gets the original transfer")
		require.Equal(t, string(ledgerEntry(t, s)), string(took.Body))
		st := s.Payments.Stats()
		require.Equal(t, 1, st.Executions)
		require.Equal(t, 1, st.Replays)
		require.Equal(t, 1, s.Payments.ExecutionsForKey(p.Nonce))

		done := requireRow(t, s, p.Nonce, "DONE")
		require.Greater(t, done.Fence, row.Fence, "the takeover is a new owner with a higher fence")
		require.Equal(t, string(took.Body), string(done.ResultBody))

		// And from now on: already_completed.
		requireReplay(t, s, confirm(t, alice, p.ConfirmBody()), p.Nonce, took.Body)
		require.Equal(t, 1, s.Payments.Executions())
		requireRowCounts(t, s, map[string]int{"DONE": 1})
	})

	t.Run("downstream ignores keys", func(t *testing.T) {
		s := startStack(t, stack.Options{InFlightTTL: crashLease, DownstreamIgnoresKeys: true})
		alice := s.Agent("alice")
		p := preview(t, alice, transfer("999.99", "acct_grace", "car repair"))

		crashAfterExecution(t, s, alice, p)
		row := requireRow(t, s, p.Nonce, "IN_FLIGHT")

		r := confirm(t, alice, p.ConfirmBody())
		require.True(t, time.Now().Before(row.LeaseUntil), "the restart took longer than the lease (%s); raise crashLease", crashLease)
		requireInProgress(t, s, r)

		// After the lease: re-sending could pay twice, so idemgate does not;
		// a person must look.
		waitStatus(t, s, alice, p.Fingerprint, "needs_reconciliation", 3*crashLease)
		r = confirm(t, alice, p.ConfirmBody())
		e := requireEnvelope(t, s, r, http.StatusConflict, "needs_reconciliation", notRetryable)
		require.Equal(t, "transfer_status", e.PollWith)
		requireRow(t, s, p.Nonce, "UNKNOWN")
		// Asking again changes nothing.
		requireEnvelope(t, s, confirm(t, alice, p.ConfirmBody()), http.StatusConflict, "needs_reconciliation", notRetryable)
		require.Equal(t, 1, s.Payments.Executions())
		calls := s.Upstream.Confirms()
		require.Len(t, calls, 1, "a downstream that ignores keys is never sent the confirm again")
		require.Empty(t, calls[0].IdempotencyKey, "downstream_idempotency_header is empty: no key is sent")

		// The human path (对账): list, check the payments ledger, resolve.
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		out, errOut, err := s.Idemgate.Run(ctx, "ops", "list", "--state", "UNKNOWN", "--dsn", s.DSN)
		require.NoError(t, err, errOut)
		require.Contains(t, out, p.Nonce)
		require.Contains(t, errOut, "1 record(s)")

		ledger := ledgerEntry(t, s) // what payments answered the first time; nobody received it
		require.Contains(t, string(ledger), `"transfer_id"`)
		bodyFile := filepath.Join(t.TempDir(), "transfer.json")
		require.NoError(t, os.WriteFile(bodyFile, ledger, 0o600))
		out, errOut, err = s.Idemgate.Run(ctx, "ops", "resolve", p.Nonce, "--done", "--status", "200", "--body", "@"+bodyFile,
			"--as", "ops-oncall", "--reason", "the payments ledger shows the transfer", "--dsn", s.DSN)
		require.NoError(t, err, errOut)
		require.Contains(t, out, "resolved "+p.Nonce+" as DONE")

		resolved := requireRow(t, s, p.Nonce, "DONE")
		require.Equal(t, string(ledger), string(resolved.ResultBody))
		requireReplay(t, s, confirm(t, alice, p.ConfirmBody()), p.Nonce, ledger)
		r = status(t, alice, p.Fingerprint)
		e = requireEnvelope(t, s, r, http.StatusOK, "completed", notRetryable)
		require.Equal(t, string(ledger), string(e.Result))

		out, _, err = s.Idemgate.Run(ctx, "ops", "list", "--state", "UNKNOWN", "--dsn", s.DSN)
		require.NoError(t, err)
		require.False(t, strings.Contains(out, p.Nonce), "a resolved record is no longer listed")

		require.Equal(t, 1, s.Payments.Executions())
		require.Len(t, s.Upstream.Confirms(), 1)
		requireRowCounts(t, s, map[string]int{"DONE": 1})
	})
}
