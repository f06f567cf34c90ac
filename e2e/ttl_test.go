package e2e

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/e2e/internal/stack"
)

// boundaryMargin keeps each confirm clear of the second it aims at: exp is
// in whole seconds and valid while now <= exp.
const boundaryMargin = 250 * time.Millisecond

// TestFingerprintExpiryBoundary (TTL 边界): with
// ttl.fingerprint 3s, a confirm sent one second before exp is accepted and
// executes; one sent one second after exp is refused with 410
// fingerprint_expired, and nothing runs for it.
func TestFingerprintExpiryBoundary(t *testing.T) {
	s := startStack(t, stack.Options{FingerprintTTL: 3 * time.Second})
	alice := s.Agent("alice")
	before := preview(t, alice, transfer("10.00", "acct_heidi", "coffee"))
	after := preview(t, alice, transfer("10.00", "acct_heidi", "coffee"))
	require.NotEqual(t, before.Nonce, after.Nonce)
	for _, p := range []*stack.Preview{before, after} {
		require.Equal(t, time.Unix(p.Exp, 0).UTC(), p.ExpiresAt.UTC(), "fingerprint_expires_at is the token's exp")
	}

	// exp − 1 s: accepted.
	sleepUntil(time.Unix(before.Exp-1, 0).Add(boundaryMargin))
	r := confirm(t, alice, before.ConfirmBody())
	requireExecuted(t, r)
	requireRow(t, s, before.Nonce, "DONE")

	// exp + 1 s: refused.
	sleepUntil(time.Unix(after.Exp+1, 0).Add(boundaryMargin))
	r = confirm(t, alice, after.ConfirmBody())
	e := requireEnvelope(t, s, r, http.StatusGone, "fingerprint_expired", notRetryable)
	require.Equal(t, "transfer_preview", e.PreviewWith)

	require.Equal(t, 1, s.Payments.Executions())
	require.Len(t, s.Upstream.Confirms(), 1)
	n, err := s.RowsOf(after.Nonce)
	require.NoError(t, err)
	require.Zero(t, n, "an expired fingerprint claims nothing")
	requireRowCounts(t, s, map[string]int{"DONE": 1})

	// The status tool still answers for an expired fingerprint.
	require.Equal(t, "not_started", statusOf(t, s, alice, after.Fingerprint))
}

// sleepUntil sleeps until t (the boundary tests wait for the clock on
// purpose; nothing can be polled instead).
func sleepUntil(t time.Time) {
	if d := time.Until(t); d > 0 {
		time.Sleep(d)
	}
}

// TestLateRetryAfterExpiryReplaysTheResult: an agent whose workflow stalled
// (or whose context was compacted) comes back after the fingerprint expired
// and confirms again with the same fingerprint. The transfer already ran.
// The retry must get the first execution's result
// (the terminal TTL exists for exactly these late retries) — never "nothing
// was executed, ask the user to confirm again", which leads the agent to a
// second preview, a second confirmation and a second payment.
func TestLateRetryAfterExpiryReplaysTheResult(t *testing.T) {
	s := startStack(t, stack.Options{FingerprintTTL: 2 * time.Second})
	alice := s.Agent("alice")
	p := preview(t, alice, transfer("10.00", "acct_heidi", "coffee"))
	first := confirm(t, alice, p.ConfirmBody())
	requireExecuted(t, first)

	sleepUntil(time.Unix(p.Exp+1, 0).Add(boundaryMargin))
	// The status tool, which accepts expired fingerprints, knows it ran.
	require.Equal(t, "completed", statusOf(t, s, alice, p.Fingerprint))
	late := confirm(t, alice, p.ConfirmBody())
	requireReplay(t, s, late, p.Nonce, first.Body)
	require.Equal(t, 1, s.Payments.Executions())
}
