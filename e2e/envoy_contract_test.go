package e2e

import (
	"encoding/json"
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
	statMsgsSent        = "http.ingress_http.ext_proc.stream_msgs_sent"
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
// buffer limit (500). No upstream answer reaches idemgate: Envoy 1.40 shows
// it the 504 and 503 as response headers (an ambiguous 5xx), and ends the
// stream without a response for the 500. Either way idemgate settles the
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
		// 504 and 503 through ext_proc's response phase; the 500 for an
		// answer over the buffer limit comes while ext_proc holds that
		// answer and never reaches it.
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
				sent := envoyStat(t, s, statMsgsSent)
				r := confirm(t, alice, p.ConfirmBody())
				answered := time.Now()
				// request headers, request body, response headers: the 504
				// and 503 as the response headers, the 500 not at all (the
				// upstream's 200 headers were the third).
				require.Equal(t, sent+3, envoyStat(t, s, statMsgsSent), "ext_proc messages Envoy sent for the confirm")

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
					requireEnvelope(t, s, retry, http.StatusConflict, "needs_reconciliation", notRetryable)
					require.Len(t, s.Upstream.Confirms(), tc.upstreamTries(ignoresKeys), "never sent again")
				default:
					e := requireEnvelope(t, s, retry, http.StatusOK, "already_completed", notRetryable)
					require.Contains(t, []string{"", "null"}, string(e.Result), "the body never reached idemgate")
					require.Len(t, s.Upstream.Confirms(), 1, "never sent again")
				}
			})
		}
	}
}

// TestEnvoyRequestBodyOverTheBufferLimit: a confirm body over 1 MiB (the
// listener's per_connection_buffer_limit_bytes, equal to idemgate's
// limits.max_body_bytes). With a content-length idemgate refuses it from
// the headers alone (413 request_too_large envelope); chunked, nobody knows
// the size in advance, Envoy's buffer overflows and Envoy answers 413
// itself, which envoy.yaml's local_reply_config answers with the same
// envelope. Either way nothing is claimed or executed. (Unlike the reference
// notes, Envoy 1.40 runs its 413 through ext_proc's response phase on the
// same stream — response headers, then the body "Payload Too Large" — which
// idemgate, holding no claim, lets pass.)
func TestEnvoyRequestBodyOverTheBufferLimit(t *testing.T) {
	s := startStack(t, stack.Options{})
	alice := s.Agent("alice")
	p := preview(t, alice, transfer("40.00", "acct_olga", "books"))
	body := p.ConfirmBody()
	body["memo"] = strings.Repeat("x", 1100000)
	raw, err := json.Marshal(body)
	require.NoError(t, err)

	streams := envoyStat(t, s, statStreamsStarted)
	r, err := alice.Raw(confirmTarget, raw, stack.WithLength)
	require.NoError(t, err)
	requireEnvelope(t, s, r, http.StatusRequestEntityTooLarge, "request_too_large", notRetryable)

	// Envoy's own 413, rewritten into the envelope by the local_reply_config
	// piece of envoy-config.
	r, err = alice.Raw(confirmTarget, raw, stack.Chunked)
	require.NoError(t, err)
	requireEnvelope(t, s, r, http.StatusRequestEntityTooLarge, "request_too_large", notRetryable)

	// idemgate had a stream for each (it answered the first, the second
	// was cut while Envoy buffered) and claimed nothing.
	require.Equal(t, streams+2, envoyStat(t, s, statStreamsStarted))
	require.Zero(t, metric(t, s, `idemgate_decisions_total{operation="transfer",outcome="acquired",route="confirm"}`))
	requireRowCounts(t, s, map[string]int{})
	require.Empty(t, s.Upstream.Confirms())
	require.Zero(t, s.Payments.Executions())

	// The fingerprint was not consumed.
	requireExecuted(t, confirm(t, alice, p.ConfirmBody()))
	require.Equal(t, 1, s.Payments.Executions())
}

// confirmTarget is the confirm path on a raw request line.
const confirmTarget = "/v1/transfers/confirm"

// TestEnvoyFailsClosedWithoutIdemgate: failure_mode_allow is false, so an
// idemgate that is gone (killed: connection refused) or hung (SIGSTOP: the
// connection is open, nothing answers) stops every operation call at
// Envoy — 500 for the broken stream, 504 when message_timeout passes —
// and nothing reaches the upstream. A fingerprint confirmed meanwhile is
// not consumed: once idemgate is back the same confirm executes, once.
func TestEnvoyFailsClosedWithoutIdemgate(t *testing.T) {
	t.Run("killed", func(t *testing.T) {
		s := startStack(t, stack.Options{})
		alice := s.Agent("alice")
		p := preview(t, alice, transfer("70.00", "acct_pia", "rent"))
		s.Idemgate.Kill()

		failed := envoyStat(t, s, statStreamsFailed)
		seen := len(s.Upstream.Requests())
		for _, call := range []func() (*stack.Response, error){
			func() (*stack.Response, error) { return alice.Confirm(p.ConfirmBody()) },
			func() (*stack.Response, error) { return alice.Status(p.Fingerprint) },
			func() (*stack.Response, error) {
				return alice.Post("/v1/transfers/preview", transfer("1.00", "acct_pia", "x"), nil)
			},
		} {
			r, err := call()
			require.NoError(t, err)
			require.Equal(t, http.StatusInternalServerError, r.StatusCode, "got %s", r)
			require.Nil(t, r.Envelope)
			require.Empty(t, r.Body, "ext_proc's error reply has no body")
		}
		require.Equal(t, failed+3, envoyStat(t, s, statStreamsFailed), "each call failed its ext_proc stream")
		require.Len(t, s.Upstream.Requests(), seen, "nothing reached the upstream, not even the preview")
		requireRowCounts(t, s, map[string]int{})

		require.NoError(t, s.Idemgate.Start())
		require.Eventually(t, func() bool {
			r, err := alice.Status(p.Fingerprint)
			return err == nil && r.StatusCode == http.StatusOK
		}, 30*time.Second, 50*time.Millisecond, "Envoy never reached the restarted idemgate")
		requireExecuted(t, confirm(t, alice, p.ConfirmBody()))
		require.Equal(t, 1, s.Payments.Executions())
		requireRowCounts(t, s, map[string]int{"DONE": 1})
	})

	t.Run("hung", func(t *testing.T) {
		const messageTimeout = 500 * time.Millisecond
		s := startStack(t, stack.Options{MessageTimeout: messageTimeout})
		alice := s.Agent("alice")
		p := preview(t, alice, transfer("70.00", "acct_pia", "rent"))
		timeouts := envoyStat(t, s, statMessageTimeouts)
		seen := len(s.Upstream.Requests())

		require.NoError(t, s.Idemgate.Pause())
		start := time.Now()
		r := confirm(t, alice, p.ConfirmBody())
		took := time.Since(start)
		require.NoError(t, s.Idemgate.Resume())

		require.Equal(t, http.StatusGatewayTimeout, r.StatusCode, "got %s", r)
		require.Nil(t, r.Envelope)
		require.Empty(t, r.Body)
		// Envoy's timer may fire a few ms early (#41090) and starts after
		// the request reached Envoy.
		require.GreaterOrEqual(t, took, messageTimeout*9/10, "Envoy waited message_timeout")
		require.Equal(t, timeouts+1, envoyStat(t, s, statMessageTimeouts))
		require.Len(t, s.Upstream.Requests(), seen)

		// Resumed, idemgate finds the stream gone; nothing is left
		// claimed, and the same confirm executes once.
		require.Eventually(t, func() bool {
			r, err := alice.Confirm(p.ConfirmBody())
			return err == nil && r.StatusCode == http.StatusOK && r.Envelope == nil
		}, 10*time.Second, 100*time.Millisecond, "the confirm never executed after idemgate resumed")
		require.Equal(t, 1, s.Payments.Executions())
		require.Len(t, s.Upstream.Confirms(), 1)
		requireRowCounts(t, s, map[string]int{"DONE": 1})
	})
}

// TestEnvoyMessageTimeoutWithASlowStore: PostgreSQL answers slowly (behind
// the stack's TCP proxy) and ext_proc's message_timeout is 500 ms: Envoy
// gives up on idemgate's request-body reply and answers 504 itself; the
// upstream is never contacted.
//   - Slower than message_timeout, within store.timeout (2 s): the acquire
//     succeeds after Envoy gave up, so the reply letting the request through
//     cannot be sent; idemgate gives the claim back at once and the same
//     confirm executes right after.
//   - Slower than store.timeout too: the acquire fails, the background
//     give-back fails against the same slow store, and the claim waits for
//     its lease (ttl.in_flight, 3 s here): retries are told in_progress until
//     then, and nothing executes twice.
func TestEnvoyMessageTimeoutWithASlowStore(t *testing.T) {
	const messageTimeout = 500 * time.Millisecond
	cases := []struct {
		name    string
		latency time.Duration
		// settled is the idemgate log line of the undelivered reply.
		settled string
	}{
		// pgx's acquire is one or two round trips (statement cache), each
		// delayed once: 0.65-1.3 s, after Envoy's 0.5 s and within 2 s.
		{"slower than message_timeout", 650 * time.Millisecond, "action=abandoned"},
		{"slower than store.timeout", 2500 * time.Millisecond, "answering temporarily_unavailable"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			const lease = 3 * time.Second
			s := startStack(t, stack.Options{MessageTimeout: messageTimeout, PostgresThroughProxy: true, InFlightTTL: lease})
			alice := s.Agent("alice")
			p := preview(t, alice, transfer("80.00", "acct_quinn", "tools"))
			timeouts := envoyStat(t, s, statMessageTimeouts)
			seen := len(s.Upstream.Requests())

			s.PGProxy.SetLatency(tc.latency)
			start := time.Now()
			r := confirm(t, alice, p.ConfirmBody())
			took := time.Since(start)
			require.Equal(t, http.StatusGatewayTimeout, r.StatusCode, "got %s", r)
			require.Nil(t, r.Envelope)
			require.Empty(t, r.Body)
			require.GreaterOrEqual(t, took, messageTimeout*9/10)
			require.Less(t, took, tc.latency, "Envoy answered at message_timeout, not after the store")
			require.Equal(t, timeouts+1, envoyStat(t, s, statMessageTimeouts))
			require.Len(t, s.Upstream.Requests(), seen)

			// idemgate finished the call after Envoy had given up.
			rid, err := s.RequestID(r)
			require.NoError(t, err)
			require.Eventually(t, func() bool {
				return len(s.Idemgate.LogLines("trace_id="+rid, tc.settled)) > 0
			}, 10*time.Second, 20*time.Millisecond, "no %q log line for the timed-out confirm", tc.settled)
			s.PGProxy.SetLatency(0)

			var answers []string
			require.Eventually(t, func() bool {
				r, err := alice.Confirm(p.ConfirmBody())
				if err != nil {
					return false
				}
				if r.Envelope != nil {
					answers = append(answers, r.Envelope.Status)
					return false
				}
				return r.StatusCode == http.StatusOK
			}, 3*lease, 100*time.Millisecond, "the confirm never executed once the store was fast (answers: %v)", answers)
			for _, a := range answers {
				require.Equal(t, "in_progress", a, "only a claim waiting for its lease may delay the retry")
			}
			if tc.settled == "action=abandoned" {
				require.Empty(t, answers, "a claim given back at once never makes the retry wait")
			}
			require.Equal(t, 1, s.Payments.Executions())
			require.Len(t, s.Upstream.Confirms(), 1)
			requireRow(t, s, p.Nonce, "DONE")
		})
	}
}

// idemgateDecisions is the sum of idemgate's decisions over every label set.
func idemgateDecisions(t *testing.T, s *stack.Stack) float64 {
	t.Helper()
	v, err := s.Idemgate.MetricSum("idemgate_decisions_total")
	require.NoError(t, err)
	return v
}

// TestEnvoyOtherPathsNeverReachIdemgate: a request whose path cannot name
// an operation opens no ext_proc stream at all (the composite's matcher
// runs no ext_proc for it) — the health check and the catch-all route to the payments API —
// while every other spelling of an operation path does, on whatever route,
// and idemgate refuses it before the upstream.
func TestEnvoyOtherPathsNeverReachIdemgate(t *testing.T) {
	s := startStack(t, stack.Options{})
	alice := s.Agent("alice")
	streams, decisions := envoyStat(t, s, statStreamsStarted), idemgateDecisions(t, s)
	passthrough := metric(t, s, "idemgate_passthrough_streams_total")
	seen := len(s.Upstream.Requests())

	resp, err := http.Get(s.URL() + "/healthz")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	for _, path := range []string{"/v1/accounts", "/v1/transfers/by-key/" + strings.Repeat("0", 32)} {
		r, err := alice.Post(path, map[string]any{}, nil)
		require.NoError(t, err)
		require.Contains(t, []int{http.StatusNotFound, http.StatusMethodNotAllowed}, r.StatusCode, "%s: got %s", path, r)
	}

	// Envoy opened no stream, idemgate decided nothing, and the catch-all
	// requests reached the upstream unprocessed.
	require.Equal(t, streams, envoyStat(t, s, statStreamsStarted), "no ext_proc stream for a path no operation has")
	require.Equal(t, decisions, idemgateDecisions(t, s))
	require.Equal(t, passthrough, metric(t, s, "idemgate_passthrough_streams_total"))
	reached := s.Upstream.Requests()[seen:]
	require.Len(t, reached, 2, "the catch-all requests reach the upstream: %v", reached)
	for _, r := range reached {
		require.False(t, r.Confirm)
	}

	// Near-miss spellings take the catch-all route, and reach idemgate there.
	for _, target := range []string{"/v1/transfers/confirm/", "/v1/transfers/Confirm", "/v1/transfers/preview.json"} {
		r, err := alice.RawPost(target, map[string]any{"amount": "1.00"})
		require.NoError(t, err)
		requireEnvelope(t, s, r, http.StatusNotFound, "path_not_exact", notRetryable)
	}
	require.Equal(t, streams+3, envoyStat(t, s, statStreamsStarted))
	require.Len(t, s.Upstream.Requests()[seen:], 2, "no near miss reached the upstream")

	// An operation route opens one too.
	preview(t, alice, transfer("1.00", "acct_ron", "x"))
	require.Equal(t, streams+4, envoyStat(t, s, statStreamsStarted))
}

// TestEnvoyStripsTheClientsSubjectHeader: x-idemgate-subject is the header
// idemgate trusts; the shipped config removes every client copy before any
// filter reads it and sets it from the verified JWT's sub. idemgate's
// security event carries the keyed tag of the subject it used — bob's, not
// the alice bob wrote into the header — and the upstream, which sees the
// header map idemgate saw, gets exactly one value: bob.
func TestEnvoyStripsTheClientsSubjectHeader(t *testing.T) {
	s := startStack(t, stack.Options{})
	alice, bob := s.Agent("alice"), s.Agent("bob")
	aliceTag, err := s.SubjectTag("alice")
	require.NoError(t, err)
	bobTag, err := s.SubjectTag("bob")
	require.NoError(t, err)
	p := preview(t, alice, transfer("500.00", "acct_frank", "deposit"))

	// Two client copies of the header, in two spellings.
	spoof := []string{"X-Idemgate-Subject: alice", "x-idemgate-subject: alice"}
	r, err := bob.RawPost(confirmTarget, p.ConfirmBody(), spoof...)
	require.NoError(t, err)
	e := requireEnvelope(t, s, r, http.StatusForbidden, "fingerprint_subject_mismatch", notRetryable)
	requireSecurityAlert(t, s, "fingerprint_subject_mismatch", e.TraceID)
	line := s.Idemgate.LogLines("event=security_alert", "trace_id="+e.TraceID)[0]
	require.Contains(t, line, "subject_tag="+bobTag, "idemgate used the JWT's subject")
	require.NotContains(t, line, aliceTag)

	// bob's own confirm with the spoofed header executes as bob.
	bp := preview(t, bob, transfer("5.00", "acct_sam", "lunch"))
	r, err = bob.RawPost(confirmTarget, bp.ConfirmBody(), spoof...)
	require.NoError(t, err)
	requireExecuted(t, r)
	calls := s.Upstream.Confirms()
	require.Len(t, calls, 1)
	require.Equal(t, []string{"bob"}, calls[0].Subject, "only the JWT's subject is forwarded")

	// Without a JWT the header gets nobody past jwt_authn: its 401 comes
	// before ext_proc sees the request. The composite filter delegates to
	// ext_proc when its matcher runs on the request headers, which the 401
	// ended before: no ext_proc filter exists for the local reply, so no
	// stream opens at all. (An ext_proc filter in the chain itself, as
	// Envoy 1.40 runs it, opens one for the 401 at response_headers.)
	streams, decisions := envoyStat(t, s, statStreamsStarted), idemgateDecisions(t, s)
	r, err = s.AnonymousAgent().RawPost(confirmTarget, p.ConfirmBody(), spoof...)
	require.NoError(t, err)
	require.Equal(t, http.StatusUnauthorized, r.StatusCode, "got %s", r)
	require.Equal(t, "Jwt is missing", string(r.Body))
	require.Equal(t, streams, envoyStat(t, s, statStreamsStarted), "no stream for the local reply")
	require.Equal(t, decisions, idemgateDecisions(t, s))

	// Header names with underscores are refused by Envoy's HTTP/1 codec
	// (some upstreams treat x_idemgate_subject as x-idemgate-subject): the
	// client gets the 400, or, where an ext_proc filter runs for the local
	// reply and Envoy closes the connection before its answer, sees the
	// connection close. Either way idemgate decides nothing and the upstream
	// sees nothing.
	r, err = bob.ConfirmWith(p.ConfirmBody(), http.Header{"X_idemgate_subject": {"alice"}})
	if err == nil {
		require.Equal(t, http.StatusBadRequest, r.StatusCode, "got %s", r)
	}
	require.Equal(t, decisions, idemgateDecisions(t, s))

	require.Len(t, s.Upstream.Confirms(), 1)
	require.Equal(t, 1, s.Payments.Executions())
	requireRowCounts(t, s, map[string]int{"DONE": 1})
}

// TestEnvoyRequestIDIsTheTraceID: the shipped HCM (use_remote_address,
// edge) replaces a client's x-request-id with its own; that id is the
// trace_id of idemgate's envelopes and security events, and the one the
// upstream receives.
func TestEnvoyRequestIDIsTheTraceID(t *testing.T) {
	s := startStack(t, stack.Options{})
	alice := s.Agent("alice")
	p := preview(t, alice, transfer("60.00", "acct_tom", "gift"))
	const clientID = "client-chosen-request-id"
	clientHeader := http.Header{"X-Request-Id": {clientID}}

	tampered := p.ConfirmBody()
	tampered["amount"] = "600.00"
	r, err := alice.ConfirmWith(tampered, clientHeader)
	require.NoError(t, err)
	e := requireEnvelope(t, s, r, http.StatusUnprocessableEntity, "params_changed", notRetryable) // trace_id == Envoy's access log id
	require.NotEqual(t, clientID, e.TraceID)
	requireSecurityAlert(t, s, "params_changed", e.TraceID)

	r, err = alice.ConfirmWith(p.ConfirmBody(), clientHeader)
	require.NoError(t, err)
	requireExecuted(t, r)
	rid, err := s.RequestID(r)
	require.NoError(t, err)
	require.NotEqual(t, clientID, rid)
	calls := s.Upstream.Confirms()
	require.Len(t, calls, 1)
	require.Equal(t, rid, calls[0].RequestID, "the upstream gets Envoy's x-request-id")

	st, err := alice.Post("/v1/transfers/status", map[string]any{"fingerprint": p.Fingerprint}, clientHeader)
	require.NoError(t, err)
	e = requireEnvelope(t, s, st, http.StatusOK, "completed", notRetryable)
	require.NotEqual(t, clientID, e.TraceID)
}

// TestEnvoyConfirmPathVariants: spellings of the confirm path that a
// normalising router (Go's ServeMux in the payments API cleans dot segments
// and double slashes and unescapes %6F) could deliver to the confirm
// handler. Each is sent on a raw request line with a fresh, valid
// fingerprint. Envoy either normalises it to the exact confirm route,
// where idemgate checks it (the upstream gets the fingerprint's
// Idempotency-Key and a record exists), or refuses it (404 near-miss
// route, 307 redirect to the unescaped path, 400). The upstream's confirm
// handler never runs for a confirm idemgate did not check.
func TestEnvoyConfirmPathVariants(t *testing.T) {
	const (
		checked = "checked"
		refused = "refused"
	)
	variants := []struct {
		target string
		want   string
		status int
	}{
		{"/v1/transfers/confirm?x=1", checked, 200},
		{"/v1/transfers/co%6Efirm?a=b", checked, 200},
		{"/v1/transfers//confirm", checked, 200},     // merge_slashes
		{"//v1/transfers/confirm", checked, 200},     // merge_slashes
		{"/v1/transfers/c%6Fnfirm", checked, 200},    // normalize_path decodes unreserved characters
		{"/v1/transfers/c%6fnfirm", checked, 200},    //
		{"/v1/transfers/%63onfirm", checked, 200},    //
		{"/v1/transfers/./confirm", checked, 200},    // normalize_path removes dot segments
		{"/v1/./transfers/confirm", checked, 200},    //
		{"/v1/transfers/x/../confirm", checked, 200}, //
		{"/v1/transfers/%2e/confirm", checked, 200},  //
		{"/v1/transfers/x/%2e%2e/confirm", checked, 200},
		{"/v1/transfers/x/..;/confirm", checked, 200}, // 1.40 strips ..; and .; segments
		{"/v1/transfers/.;/confirm", checked, 200},
		{`/v1/transfers\confirm`, checked, 200}, // a backslash becomes a slash
		{"http://payments.example/v1/transfers/confirm", checked, 200},
		{"/v1/transfers/confirm/", refused, 404}, // idemgate: path_not_exact
		{"/v1/transfers/confirm;x", refused, 404},
		{"/v1/transfers/confirm.json", refused, 404},
		{"/V1/TRANSFERS/CONFIRM", refused, 404},
		{"/v1/transfers/Confirm", refused, 404},
		{"/v1/transfers/confirm%20", refused, 404},
		{"/v1/transfers/confirm%3B", refused, 404},
		{"/v1/transfers/confirm/.", refused, 404},
		{"/v1/transfers%2Fconfirm", refused, 307}, // UNESCAPE_AND_REDIRECT
		{"/v1/transfers%2fconfirm", refused, 307},
		{"/v1%2Ftransfers%2Fconfirm", refused, 307},
		{"/v1/transfers/x/..%2Fconfirm", refused, 307},
		{"/v1/transfers/confirm%2F", refused, 307},
		{"/v1/transfers/confirm#frag", refused, 400},
		// Normalised to /v1/transfers/: the catch-all, which payments
		// does not route to the confirm handler.
		{"/v1/transfers/confirm/..", refused, 404},
	}
	s := startStack(t, stack.Options{})
	alice := s.Agent("alice")
	executions := 0
	for _, v := range variants {
		p := preview(t, alice, transfer("3.00", "acct_uma", v.target))
		before := len(s.Upstream.Confirms())
		acquired := metric(t, s, `idemgate_decisions_total{operation="transfer",outcome="acquired",route="confirm"}`)
		r, err := alice.RawPost(v.target, p.ConfirmBody())
		require.NoError(t, err, v.target)
		calls := s.Upstream.Confirms()[before:]
		require.Equal(t, v.status, r.StatusCode, "%s: got %s", v.target, r)

		switch v.want {
		case checked:
			executions++
			requireExecuted(t, r)
			require.Len(t, calls, 1, v.target)
			require.Equal(t, p.Nonce, calls[0].IdempotencyKey, "%s reached the upstream without idemgate's key", v.target)
			require.Equal(t, acquired+1, metric(t, s, `idemgate_decisions_total{operation="transfer",outcome="acquired",route="confirm"}`), v.target)
			requireRow(t, s, p.Nonce, "DONE")
		case refused:
			require.Empty(t, calls, "%s reached the confirm handler", v.target)
			n, err := s.RowsOf(p.Nonce)
			require.NoError(t, err)
			require.Zero(t, n, "%s claimed the fingerprint", v.target)
			if v.status == http.StatusTemporaryRedirect {
				// The redirect names the unescaped path: the exact route.
				require.NotContains(t, r.Header.Get("Location"), "%2")
			}
		}
		require.Equal(t, executions, s.Payments.Executions(), v.target)
	}
	for _, c := range s.Upstream.Confirms() {
		require.NotEmpty(t, c.IdempotencyKey, "the confirm handler ran without idemgate: %s", c.RequestURI)
	}
}

// TestEnvoyWithoutPathNormalisationSpellingsAreStillRefused: the same
// stack with envoy.yaml's normalize_path, merge_slashes and
// path_with_escaped_slashes_action turned off. /v1/transfers/c%6Fnfirm then
// matches no operation route and takes the catch-all, where Go's ServeMux
// would unescape it and run the confirm handler; but the ext_proc filter's
// matcher sends every percent-encoded path to idemgate whatever its route,
// and idemgate refuses the spelling (path_not_exact) before the upstream.
// (With per-route switches, as the pieces were before, this paid twice.)
func TestEnvoyWithoutPathNormalisationSpellingsAreStillRefused(t *testing.T) {
	s := startStack(t, stack.Options{WithoutPathNormalisation: true, DownstreamIgnoresKeys: true})
	alice := s.Agent("alice")
	p := preview(t, alice, transfer("9.00", "acct_vic", "unchecked"))
	for _, target := range []string{"/v1/transfers/c%6Fnfirm", "//v1/transfers/confirm", "/v1/transfers/./confirm", "/v1/transfers%2Fconfirm"} {
		r, err := alice.RawPost(target, p.ConfirmBody())
		require.NoError(t, err)
		requireEnvelope(t, s, r, http.StatusNotFound, "path_not_exact", notRetryable)
	}
	require.Zero(t, s.Payments.Executions(), "no spelling executed")
	require.Empty(t, s.Upstream.Confirms())
	requireRowCounts(t, s, map[string]int{})
}
