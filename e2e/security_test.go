package e2e

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/e2e/internal/stack"
)

// requireSecurityAlert waits for idemgate's event=security_alert log line
// for reason and the request's trace_id.
func requireSecurityAlert(t *testing.T, s *stack.Stack, reason, traceID string) {
	t.Helper()
	require.Eventually(t, func() bool {
		return len(s.Idemgate.LogLines("event=security_alert", "reason="+reason, "trace_id="+traceID)) == 1
	}, 10*time.Second, 20*time.Millisecond, "no event=security_alert reason=%s line for trace_id %s", reason, traceID)
}

// TestTamperedParamsAreRefusedAndReported (参数篡改): a
// fingerprint bound to 100.00 EUR to acct_bob never confirms different money
// params — refused with 422 params_changed naming the fields, nothing
// executed, and logged as a security event, not a business error. Free text
// is not bound: a reworded memo with the same money confirms (once).
func TestTamperedParamsAreRefusedAndReported(t *testing.T) {
	s := startStack(t, stack.Options{})
	alice := s.Agent("alice")
	p := preview(t, alice, transfer("100.00", "acct_bob", "rent for March"))

	tampered := []struct {
		name    string
		edit    func(map[string]any)
		changed []string
	}{
		{"amount", func(b map[string]any) { b["amount"] = "1000.00" }, []string{"amount"}},
		{"amount smaller", func(b map[string]any) { b["amount"] = "1.00" }, []string{"amount"}},
		{"payee", func(b map[string]any) {
			b["payee"] = map[string]any{"account_id": "acct_mallory", "name": "Bob Example"}
		}, []string{"payee.account_id"}},
		{"amount and currency", func(b map[string]any) { b["amount"] = "100.01"; b["currency"] = "USD" }, []string{"amount", "currency"}},
	}
	alerts := 0
	for _, tc := range tampered {
		t.Run(tc.name, func(t *testing.T) {
			body := p.ConfirmBody()
			tc.edit(body)
			r := confirm(t, alice, body)
			e := requireEnvelope(t, s, r, http.StatusUnprocessableEntity, "params_changed", notRetryable)
			require.ElementsMatch(t, tc.changed, e.ChangedFields)
			require.Equal(t, "transfer_preview", e.PreviewWith)
			requireSecurityAlert(t, s, "params_changed", e.TraceID)
			alerts++
		})
	}
	require.Zero(t, s.Payments.Executions())
	require.Empty(t, s.Upstream.Confirms(), "a tampered confirm never reaches the upstream")
	requireRowCounts(t, s, map[string]int{})
	require.Equal(t, float64(alerts), metric(t, s, `idemgate_security_events_total{reason="params_changed"}`))

	// The memo is free text: reworded, with the same money params, the
	// confirm is accepted and executes once ...
	reworded := p.ConfirmBody()
	reworded["memo"] = "March rent, thanks!"
	first := confirm(t, alice, reworded)
	tr := requireExecuted(t, first)
	require.Equal(t, "100.00", tr.Amount)

	// ... and reworded again, with the amount written as the JSON number
	// 100 (the same decimal), it is a replay.
	again := p.ConfirmBody()
	again["memo"] = "rent (march)"
	again["amount"] = 100
	requireReplay(t, s, confirm(t, alice, again), p.Nonce, first.Body)

	// After the execution a tampered amount is still refused, not replayed.
	late := p.ConfirmBody()
	late["amount"] = "1000.00"
	e := requireEnvelope(t, s, confirm(t, alice, late), http.StatusUnprocessableEntity, "params_changed", notRetryable)
	require.Equal(t, []string{"amount"}, e.ChangedFields)
	requireSecurityAlert(t, s, "params_changed", e.TraceID)

	require.Equal(t, 1, s.Payments.Executions())
	requireRow(t, s, p.Nonce, "DONE")
	requireRowCounts(t, s, map[string]int{"DONE": 1})
}

// TestAnotherUsersFingerprintIsRefused (越权重放): alice's
// fingerprint under bob's identity is refused with 403 and reported; bob
// cannot claim to be alice with the subject header either, because Envoy
// strips it and sets it from the verified JWT.
func TestAnotherUsersFingerprintIsRefused(t *testing.T) {
	s := startStack(t, stack.Options{})
	alice, bob := s.Agent("alice"), s.Agent("bob")
	p := preview(t, alice, transfer("500.00", "acct_frank", "deposit"))

	r := confirm(t, bob, p.ConfirmBody())
	e := requireEnvelope(t, s, r, http.StatusForbidden, "fingerprint_subject_mismatch", notRetryable)
	requireSecurityAlert(t, s, "fingerprint_subject_mismatch", e.TraceID)

	// The header idemgate trusts, sent by the client: stripped, so bob is
	// still bob.
	spoofed, err := bob.ConfirmWith(p.ConfirmBody(), http.Header{"X-Idemgate-Subject": {"alice"}})
	require.NoError(t, err)
	e = requireEnvelope(t, s, spoofed, http.StatusForbidden, "fingerprint_subject_mismatch", notRetryable)
	requireSecurityAlert(t, s, "fingerprint_subject_mismatch", e.TraceID)

	// Without a JWT the header alone gets nobody anywhere: jwt_authn
	// refuses before idemgate is asked.
	anon, err := s.AnonymousAgent().ConfirmWith(p.ConfirmBody(), http.Header{"X-Idemgate-Subject": {"alice"}})
	require.NoError(t, err)
	require.Equal(t, http.StatusUnauthorized, anon.StatusCode, "got %s", anon)
	require.Nil(t, anon.Envelope)

	// Nor may bob read the status of alice's operation.
	st := status(t, bob, p.Fingerprint)
	e = requireEnvelope(t, s, st, http.StatusForbidden, "fingerprint_subject_mismatch", notRetryable)
	requireSecurityAlert(t, s, "fingerprint_subject_mismatch", e.TraceID)

	require.Zero(t, s.Payments.Executions())
	require.Empty(t, s.Upstream.Confirms())
	requireRowCounts(t, s, map[string]int{})
	require.Equal(t, float64(3), metric(t, s, `idemgate_security_events_total{reason="fingerprint_subject_mismatch"}`))

	// The refusals did not consume alice's fingerprint.
	requireExecuted(t, confirm(t, alice, p.ConfirmBody()))
	require.Equal(t, 1, s.Payments.Executions())
	requireRow(t, s, p.Nonce, "DONE")
}
