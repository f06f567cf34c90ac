package chaos

import (
	"context"
	"net/http"
	"testing"
	"time"
)

// TestShippedRetryOnResetDoublePays pins what the chaos run found first
// (seed 3, key-ignoring payments): the confirm route's shipped retry_policy,
// retry_on "reset,connect-failure", makes Envoy re-send a confirm whose
// connection the upstream reset after executing it. idemgate sees one
// request (the router retries below ext_proc), acquires once, and records
// the retry's answer as DONE: with a downstream that honours
// Idempotency-Key the retry carries the nonce and is deduplicated, but with
// downstream_idempotency_header "" it is a second payment, and the client
// is told it succeeded once. retry_on "connect-failure,reset-before-request"
// retries only what never reached the upstream: one execution, and the
// reset is the ambiguous outcome it is (UNKNOWN, a person reconciles).
func TestShippedRetryOnResetDoublePays(t *testing.T) {
	if testing.Short() {
		t.Skip("chaos: needs Envoy, Redis and PostgreSQL; skipped with -short")
	}
	if envErr != nil {
		t.Fatalf("chaos: %v", envErr)
	}
	for _, tc := range []struct {
		name       string
		retryOn    string
		executions int
	}{
		{"shipped_retry_on_reset", "", 2},
		{"reset_before_request", SafeRetryOn, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := NewRecorder()
			ledger := NewLedger(rec)
			client := &http.Client{}
			defer client.CloseIdleConnections()
			approvers, err := NewApprovers(client, rec)
			if err != nil {
				t.Fatal(err)
			}
			tp := StartTopology(t, env, Options{Pods: 1, HonoursKeys: false, InFlightTTL: 3 * time.Second,
				ConfirmRouteTimeout: 8 * time.Second, ConfirmRetryOn: tc.retryOn}, ledger, approvers)
			a, err := agentSetup{seed: 1, users: 1, pods: tp.Pods, client: client, rec: rec}.newAgent(0, &memory{})
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			is, ok := a.preview(ctx, Params{Amount: "42.00", Currency: "EUR", Account: "acct_reset"})
			if !ok {
				t.Fatal("preview failed")
			}
			ledger.Arm(FaultUpstreamReset, 0)
			c := a.confirm(ctx, is, is.Params, "rent", 0, defaultTimeout)
			got := tp.Payments.Stats().ExecutionsByKey[is.Nonce]
			t.Logf("confirm answered %s; upstream calls %d; executions %d", describe(c), len(ledger.Calls()), got)
			if got != tc.executions {
				t.Fatalf("executions = %d, want %d", got, tc.executions)
			}
			if tc.executions == 2 && !(c.Err == "" && c.HTTP == http.StatusOK && c.Envelope == nil) {
				t.Fatalf("the double payment was reported to the client as %s, want one 200", describe(c))
			}
			if tc.executions == 1 {
				if c.Err != "" || c.HTTP < 500 {
					t.Fatalf("the reset should reach the client as Envoy's 5xx, got %s", describe(c))
				}
				again := a.confirm(ctx, is, is.Params, "rent", 0, defaultTimeout)
				if again.Envelope == nil || again.Envelope.Status != "needs_reconciliation" {
					t.Fatalf("the retry after an ambiguous reset should need reconciliation, got %s", describe(again))
				}
			}
		})
	}
}
