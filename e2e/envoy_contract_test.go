package e2e

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/e2e/internal/stack"
	"github.com/idemgate/idemgate/e2e/payments"
)

// The tests in this file pin what the pinned Envoy binary does around
// idemgate, each from three sides: what the client got, what idemgate saw
// (its metrics, log and records) and what the upstream saw.

// envoyStat reads one of Envoy's counters.
func envoyStat(t *testing.T, s *stack.Stack, name string) int64 {
	t.Helper()
	v, err := s.Envoy.Stat(name)
	require.NoError(t, err)
	return v
}

// Envoy's ext_proc filter stats (stat_prefix ingress_http).
const (
	statStreamsStarted  = "http.ingress_http.ext_proc.streams_started"
	statStreamsFailed   = "http.ingress_http.ext_proc.streams_failed"
	statMessageTimeouts = "http.ingress_http.ext_proc.message_timeouts"
)

// settledWithin waits until idemgate counted one settlement with result and
// returns how long that took.
func settledWithin(t *testing.T, s *stack.Stack, result string, within time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	sample := fmt.Sprintf(`idemgate_settlements_total{operation="transfer",result=%q}`, result)
	require.Eventually(t, func() bool { return metric(t, s, sample) == 1 }, within, 10*time.Millisecond,
		"idemgate must settle the claim (%s) at once when the stream ends without a response", result)
	return time.Since(start)
}

// TestEnvoyLocalRepliesSettleTheClaim: Envoy answers a confirm that
// idemgate let through with a reply of its own — the route timeout (504),
// an upstream reset on every try (503), an upstream answer larger than the
// buffer limit (500). None of them goes through ext_proc's response phase:
// idemgate sees its stream end after the request phase and settles the
// claim at once — released for a downstream that honours keys (the retry
// re-sends the same key), UNKNOWN for one that ignores them — instead of
// leaving it IN_FLIGHT for the 2 minute lease.
func TestEnvoyLocalRepliesSettleTheClaim(t *testing.T) {
	hugeAnswer := []byte(`{"transfer_id":"tr_huge","pad":"` + strings.Repeat("y", 1100000) + `"}`)
	cases := []struct {
		name   string
		opts   stack.Options
		arm    func(s *stack.Stack, ignoresKeys bool)
		status int
		body   string // what Envoy writes
		// why is the reason idemgate logs: Envoy sends the router's own
		// 504 and 503 through ext_proc's response phase (the request
		// phase had completed); the 500 for an answer over the buffer
		// limit comes while ext_proc is buffering and never reaches it.
		why        string
		executions int // by payments (a held answer executes nothing)
		// upstreamTries is what reached the upstream for the one confirm.
		upstreamTries func(ignoresKeys bool) int
	}{
		{
			name: "route timeout 504",
			opts: stack.Options{ConfirmRouteTimeout: time.Second},
			arm: func(s *stack.Stack, _ bool) {
				s.Payments.SetFaults(payments.Faults{DelayAfterExecute: 3 * time.Second, Times: 1})
			},
			status: http.StatusGatewayTimeout, body: "upstream request timeout", executions: 1,
			why:           "upstream answered 504",
			upstreamTries: func(bool) int { return 1 },
		},
		{
			name: "upstream reset 503",
			arm: func(s *stack.Stack, ignoresKeys bool) {
				// envoy.yaml retries a reset once (retry_on: reset), for a
				// downstream that honours keys only: every try is reset.
				tries := 2
				if ignoresKeys {
					tries = 1
				}
				s.Upstream.ResetNextConfirms(tries)
			},
			status: http.StatusServiceUnavailable, body: "upstream connect error or disconnect/reset before headers", executions: 0,
			why: "upstream answered 503",
			upstreamTries: func(ignoresKeys bool) int {
				if ignoresKeys {
					return 1
				}
				return 2
			},
		},
		{
			name: "upstream answer over the buffer limit 500",
			arm: func(s *stack.Stack, _ bool) {
				h := s.Upstream.HoldNextConfirm()
				go func() {
					<-h.Arrived()
					h.Answer(http.StatusOK, hugeAnswer)
				}()
			},
			status: http.StatusInternalServerError, body: "Internal Server Error", executions: 0,
			why:           "the stream ended before the upstream response was recorded",
			upstreamTries: func(bool) int { return 1 },
		},
	}
	for _, tc := range cases {
		for _, ignoresKeys := range []bool{false, true} {
			mode := "downstream honours keys"
			if ignoresKeys {
				mode = "downstream ignores keys"
			}
			t.Run(tc.name+"/"+mode, func(t *testing.T) {
				opts := tc.opts
				opts.DownstreamIgnoresKeys = ignoresKeys
				s := startStack(t, opts)
				alice := s.Agent("alice")
				p := preview(t, alice, transfer("12.34", "acct_ken", "parking"))

				tc.arm(s, ignoresKeys)
				r := confirm(t, alice, p.ConfirmBody())
				answered := time.Now()

				// The client: Envoy's own reply, not an envelope.
				require.Equal(t, tc.status, r.StatusCode, "got %s", r)
				require.Nil(t, r.Envelope, "Envoy's local reply, not idemgate's")
				require.Contains(t, string(r.Body), tc.body)
				rid, err := s.RequestID(r)
				require.NoError(t, err)

				// The upstream: the confirm arrived, with the key, as often
				// as Envoy tried.
				calls := s.Upstream.Confirms()
				require.Len(t, calls, tc.upstreamTries(ignoresKeys))
				for _, c := range calls {
					require.Equal(t, rid, c.RequestID)
					if ignoresKeys {
						require.Empty(t, c.IdempotencyKey)
					} else {
						require.Equal(t, p.Nonce, c.IdempotencyKey)
					}
				}
				require.Equal(t, tc.executions, s.Payments.Executions(), "executed once at most, retries included")

				// idemgate: no upstream answer reached it, and it settled the
				// claim at once.
				wantRow, wantStatus := "IN_FLIGHT", "not_started"
				result := "released"
				if ignoresKeys {
					wantRow, wantStatus, result = "UNKNOWN", "needs_reconciliation", "marked_unknown"
				}
				if tc.status == http.StatusInternalServerError && ignoresKeys {
					// The 200 status line reached idemgate before Envoy gave
					// up on the body: executed, its answer lost. Recorded as
					// DONE (what is known) rather than asking a person.
					wantRow, wantStatus, result = "DONE", "completed", "done"
				}
				took := settledWithin(t, s, result, 2*time.Second)
				t.Logf("settled %s within %s of the answer", result, time.Since(answered)-took)
				lines := s.Idemgate.LogLines("trace_id="+rid, "settled the record")
				if result != "done" {
					require.Len(t, lines, 1, "one settlement log line for the request")
					require.Contains(t, lines[0], `why="`+tc.why+`"`)
				}
				row := requireRow(t, s, p.Nonce, wantRow)
				if wantRow == "IN_FLIGHT" {
					require.False(t, row.LeaseUntil.After(time.Now()), "a released claim has no lease left")
				}
				require.Equal(t, wantStatus, statusOf(t, s, alice, p.Fingerprint))

				// The agent's retry.
				retry := confirm(t, alice, p.ConfirmBody())
				switch {
				case wantRow == "IN_FLIGHT" && tc.executions == 1:
					// Same key again; payments answers with the transfer it made.
					tr := requireExecuted(t, retry)
					rec, ok := s.Payments.RecordForKey(p.Nonce)
					require.True(t, ok)
					require.Equal(t, rec.TransferID, tr.TransferID)
					require.Equal(t, 1, s.Payments.Executions())
					require.Equal(t, p.Nonce, s.Upstream.Confirms()[len(s.Upstream.Confirms())-1].IdempotencyKey)
					requireRow(t, s, p.Nonce, "DONE")
				case wantRow == "IN_FLIGHT":
					// Nothing had executed (a reset before payments, a held
					// answer); now payments does, with the same key.
					requireExecuted(t, retry)
					require.Equal(t, 1, s.Payments.Executions())
					require.Equal(t, 1, s.Payments.ExecutionsForKey(p.Nonce))
					requireRow(t, s, p.Nonce, "DONE")
				case wantRow == "UNKNOWN":
					requireEnvelope(t, s, retry, http.StatusConflict, "needs_reconciliation", false)
					require.Len(t, s.Upstream.Confirms(), tc.upstreamTries(ignoresKeys), "never sent again")
				default:
					e := requireEnvelope(t, s, retry, http.StatusOK, "already_completed", false)
					require.Contains(t, []string{"", "null"}, string(e.Result), "the body never reached idemgate")
					require.Len(t, s.Upstream.Confirms(), 1, "never sent again")
				}
			})
		}
	}
}
