package e2e

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/e2e/internal/stack"
)

// TestPreviewThroughTheFullStack: the preview answer as an agent receives
// it through the front carries the signed fingerprint in the body and the
// Idempotency-Fingerprint header, the quote itself untouched, and a
// content-length that matches the rewritten body. Nothing is stored.
func TestPreviewThroughTheFullStack(t *testing.T) {
	s := startStack(t, stack.Options{})
	alice := s.Agent("alice")

	before := time.Now()
	p := preview(t, alice, transfer("100.00", "acct_bob", "rent for March"))
	r := p.Response

	require.Equal(t, http.StatusOK, r.StatusCode)
	require.Equal(t, int64(len(r.Body)), r.ContentLength, "content-length must match the body after the fingerprint was injected")
	require.Equal(t, p.Fingerprint, r.Header.Get("Idempotency-Fingerprint"))

	var quote map[string]any
	require.NoError(t, json.Unmarshal(r.Body, &quote))
	require.Equal(t, "quoted", quote["status"])
	require.Equal(t, "100.00", quote["amount"])
	require.Equal(t, "EUR", quote["currency"])
	require.Equal(t, "1.00", quote["fee"])
	require.Equal(t, "101.00", quote["total"])
	require.Equal(t, false, quote["executed"])
	require.Equal(t, p.Fingerprint, quote["fingerprint"])

	// fingerprint_expires_at is the token's exp, ttl.fingerprint (15m as
	// shipped) after signing.
	require.Equal(t, time.Unix(p.Exp, 0).UTC(), p.ExpiresAt.UTC())
	require.WithinDuration(t, before.Add(15*time.Minute), p.ExpiresAt, time.Minute)
	payload, err := stack.DecodeFingerprint(p.Fingerprint)
	require.NoError(t, err)
	require.Equal(t, 1, payload.Version)
	require.Equal(t, "payments.transfer", payload.Scope)
	require.Regexp(t, `^[0-9a-f]{32}$`, payload.Nonce)

	// Zero storage writes on preview.
	requireRowCounts(t, s, map[string]int{})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	n, err := s.RedisClient().DBSize(ctx).Result()
	require.NoError(t, err)
	require.Zero(t, n, "a preview writes nothing to Redis")
	require.Equal(t, 1, s.Payments.Stats().Previews)
	require.Zero(t, s.Payments.Executions())

	// A second preview of the same transfer gets a fresh nonce.
	p2 := preview(t, alice, transfer("100.00", "acct_bob", "rent for March"))
	require.NotEqual(t, p.Nonce, p2.Nonce)
}

// TestStatusToolNotStartedThenCompleted: the status tool an agent is told to
// poll answers not_started before the confirm and completed, with the
// stored result, after it.
func TestStatusToolNotStartedThenCompleted(t *testing.T) {
	s := startStack(t, stack.Options{})
	alice := s.Agent("alice")
	p := preview(t, alice, transfer("42.50", "acct_carol", "books"))

	r := status(t, alice, p.Fingerprint)
	requireEnvelope(t, s, r, http.StatusOK, "not_started", notRetryable)
	require.Nil(t, r.Envelope.Result)
	requireRowCounts(t, s, map[string]int{})

	done := confirm(t, alice, p.ConfirmBody())
	tr := requireExecuted(t, done)

	r = status(t, alice, p.Fingerprint)
	e := requireEnvelope(t, s, r, http.StatusOK, "completed", notRetryable)
	require.Equal(t, string(done.Body), string(e.Result), "the status tool returns the stored result byte for byte")
	require.Equal(t, tr.TransferID, e.ResultRef)
	require.Equal(t, http.StatusOK, e.ResultStatus)

	row := requireRow(t, s, p.Nonce, "DONE")
	require.Equal(t, string(done.Body), string(row.ResultBody))
	require.Equal(t, 1, s.Payments.Executions())
}
