package e2e

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/e2e/internal/stack"
)

// TestStaleOwnersLateAnswerDoesNotOverwrite (乱序): the
// first confirm is slow at the upstream, its lease (ttl.in_flight 2s) ends,
// a retry takes over (same key) and completes DONE. Then the first call's
// late answer arrives — a definite failure — and its completion is refused
// as NOT_OWNER: the record keeps the new owner's result, the metric counts
// it, the status tool says completed. The first call's client still gets
// the answer the upstream gave it.
func TestStaleOwnersLateAnswerDoesNotOverwrite(t *testing.T) {
	const lease = 2 * time.Second
	s := startStack(t, stack.Options{InFlightTTL: lease})
	alice := s.Agent("alice")
	p := preview(t, alice, transfer("30.00", "acct_ivan", "concert tickets"))

	hold := s.Upstream.HoldNextConfirm()
	done := make(chan confirmResult, 1)
	go func() {
		r, err := alice.Confirm(p.ConfirmBody())
		done <- confirmResult{r, err}
	}()
	select {
	case <-hold.Arrived():
	case <-time.After(30 * time.Second):
		t.Fatal("the first confirm never reached the upstream")
	}
	require.Equal(t, p.Nonce, hold.Key())
	stale := requireRow(t, s, p.Nonce, "IN_FLIGHT")

	// The lease ends while the first call is still at the upstream.
	waitStatus(t, s, alice, p.Fingerprint, "not_started", 10*lease)
	second := confirm(t, alice, p.ConfirmBody())
	tr := requireExecuted(t, second)
	fresh := requireRow(t, s, p.Nonce, "DONE")
	require.Greater(t, fresh.Fence, stale.Fence)
	require.Equal(t, string(second.Body), string(fresh.ResultBody))

	// Now the stale owner's late answer: a definite failure (FAILED class).
	late := []byte(`{"error":"insufficient_funds","message":"late answer of the first attempt"}`)
	hold.Answer(http.StatusUnprocessableEntity, late)
	var first confirmResult
	select {
	case first = <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("the first confirm got no answer")
	}
	require.NoError(t, first.err)
	require.Equal(t, http.StatusUnprocessableEntity, first.resp.StatusCode, "a stale owner's client receives what its upstream call returned")
	require.Equal(t, string(late), string(first.resp.Body))

	require.Eventually(t, func() bool {
		return metric(t, s, `idemgate_not_owner_total{operation="transfer"}`) == 1
	}, 10*time.Second, 20*time.Millisecond, "the refused completion is counted")
	require.Equal(t, float64(1), metric(t, s, `idemgate_settlements_total{operation="transfer",result="not_owner"}`))

	kept := requireRow(t, s, p.Nonce, "DONE")
	require.Equal(t, fresh.Fence, kept.Fence)
	require.Equal(t, fresh.Owner, kept.Owner)
	require.Equal(t, http.StatusOK, *kept.ResultStatus)
	require.Equal(t, string(second.Body), string(kept.ResultBody), "the late failure must not overwrite the new owner's result")

	r := status(t, alice, p.Fingerprint)
	e := requireEnvelope(t, s, r, http.StatusOK, "completed", notRetryable)
	require.Equal(t, string(second.Body), string(e.Result))
	require.Equal(t, tr.TransferID, e.ResultRef)
	requireReplay(t, s, confirm(t, alice, p.ConfirmBody()), p.Nonce, second.Body)

	calls := s.Upstream.Confirms()
	require.Len(t, calls, 2)
	require.True(t, calls[0].Held)
	require.Equal(t, calls[0].IdempotencyKey, calls[1].IdempotencyKey)
	require.Equal(t, 1, s.Payments.Executions())
	requireRowCounts(t, s, map[string]int{"DONE": 1})
}
