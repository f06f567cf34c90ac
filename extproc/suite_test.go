package extproc

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/fingerprint"
	"github.com/idemgate/idemgate/internal/testutil"
	"github.com/idemgate/idemgate/state"
)

var nonceRE = regexp.MustCompile(`^[0-9a-f]{32}$`)

// claimsOf reads a fingerprint the test was given (the test holds the keys).
func (e *env) claimsOf(t testing.TB, fp, subject, scope string) fingerprint.Claims {
	t.Helper()
	c, err := e.cfg.Keys.Verify(fp, fingerprint.Expect{Subject: subject, Scope: scope, AllowExpired: true}, e.clock.Now())
	require.NoError(t, err)
	return c
}

// holdRecord acquires the fingerprint's record as another gateway would.
func (e *env) holdRecord(t testing.TB, c fingerprint.Claims, scope string, lease time.Duration) state.Answer {
	t.Helper()
	ans, err := e.store.Store.Acquire(t.Context(), state.AcquireRequest{
		Key: c.Nonce, Scope: scope, SubjectTag: c.SubjectTag, ParamHash: c.ParamHash,
		Owner: "other-gateway", Lease: lease, Retention: 72 * time.Hour,
	})
	require.NoError(t, err)
	require.Equal(t, state.OutcomeAcquired, ans.Outcome)
	return ans
}

// recordNow is record for a require.Eventually condition: it never calls
// require (a failure inside the condition would panic the test binary
// after the test returned); a store error reads as not found, and the
// condition polls on.
func (e *env) recordNow(nonce string) (state.Record, bool) {
	rec, found, err := e.store.Store.Get(context.Background(), nonce)
	return rec, found && err == nil
}

func (e *env) record(t testing.TB, nonce string) (state.Record, bool) {
	t.Helper()
	rec, found, err := e.store.Store.Get(t.Context(), nonce)
	require.NoError(t, err)
	return rec, found
}

func requireEnvelope(t testing.TB, res result, httpStatus int, status string, retryable bool) map[string]any {
	t.Helper()
	require.NotNil(t, res.immediate, "expected idemgate to answer itself")
	require.Equal(t, httpStatus, res.status, string(res.body))
	require.Equal(t, "application/json", res.headers["content-type"])
	body := res.json(t)
	require.Equal(t, status, body["status"], string(res.body))
	require.Equal(t, retryable, body["retryable"])
	for _, k := range []string{"meaning", "instruction"} {
		require.NotEmpty(t, body[k], k)
	}
	require.Contains(t, body, "trace_id")
	return body
}

// runSuite covers docs/design.md §4 and §5 over d: every row of the envelope
// table, every status-route answer, replays, header-only fingerprints,
// Idempotency-Key overwrite, streams cut after ACQUIRED, concurrency.
func runSuite(t *testing.T, e *env, d dialer) {
	const alice, bob = "user-alice", "user-bob"
	confirm := func(subject string, body []byte, extra ...header) httpRequest {
		return post("/v1/transfers/confirm", subject, body, extra...)
	}
	status := func(subject, fp string) httpRequest {
		return post("/v1/transfers/status", subject, []byte(fmt.Sprintf(`{"fingerprint":%q}`, fp)))
	}

	t.Run("preview injects a signed fingerprint and writes nothing", func(t *testing.T) {
		before := e.store.Total()
		res := do(t, d, post("/v1/transfers/preview", alice, transferBody(`"100.00"`, "EUR", "DE89", "")), previewOK)
		require.Nil(t, res.immediate)
		require.Equal(t, 200, res.status)
		body := res.json(t)
		fp := body["fingerprint"].(string)
		require.Equal(t, fp, res.headers["idempotency-fingerprint"])
		require.Equal(t, e.clock.Now().Add(15*time.Minute).Format(time.RFC3339), body["fingerprint_expires_at"])
		require.Equal(t, map[string]any{"fee": "0.50"}, body["quote"], "upstream fields kept")
		require.Equal(t, fmt.Sprint(len(res.body)), res.headers["content-length"])
		require.Equal(t, 4, res.replies, "one reply per message")
		c := e.claimsOf(t, fp, alice, "payments.transfer")
		require.Regexp(t, nonceRE, c.Nonce)
		require.Equal(t, before, e.store.Total(), "preview makes no store call")
	})

	t.Run("preview non-2xx passes through without asking for the body", func(t *testing.T) {
		res := do(t, d, post("/v1/transfers/preview", alice, transferBody(`1`, "EUR", "DE89", "")), func(map[string]string, []byte) upstreamReply {
			return upstreamReply{status: 400, headers: []header{{"content-type", "application/json"}}, body: []byte(`{"error":"bad payee"}`)}
		})
		require.Nil(t, res.immediate)
		require.Equal(t, 400, res.status)
		require.Equal(t, `{"error":"bad payee"}`, string(res.body))
		require.Empty(t, res.headers["idempotency-fingerprint"])
		require.Equal(t, 3, res.replies, "no response body message after mode_override NONE")
	})

	t.Run("preview of a non-object body sets the header only", func(t *testing.T) {
		res := do(t, d, post("/v1/transfers/preview", alice, transferBody(`1`, "EUR", "DE89", "")), func(map[string]string, []byte) upstreamReply {
			return upstreamReply{status: 200, headers: []header{{"content-type", "application/json"}}, body: []byte(`[1,2]`)}
		})
		require.Equal(t, `[1,2]`, string(res.body))
		e.claimsOf(t, res.headers["idempotency-fingerprint"], alice, "payments.transfer")
		require.Contains(t, e.logs.String(), "not a JSON object")
	})

	t.Run("preview of a body some parsers read two ways sets the header only", func(t *testing.T) {
		// Stricter than the json.Valid check before internal/jsonx: the
		// fingerprint is not spliced into an object with a duplicate key.
		body := `{"quote":{"fee":"0.50"},"quote":{"fee":"0.00"}}`
		res := do(t, d, post("/v1/transfers/preview", alice, transferBody(`1`, "EUR", "DE89", "")), func(map[string]string, []byte) upstreamReply {
			return upstreamReply{status: 200, headers: []header{{"content-type", "application/json"}}, body: []byte(body)}
		})
		require.Equal(t, body, string(res.body))
		e.claimsOf(t, res.headers["idempotency-fingerprint"], alice, "payments.transfer")
		require.Contains(t, e.logs.String(), "duplicate object key")
	})

	t.Run("subject_required", func(t *testing.T) {
		res := do(t, d, post("/v1/transfers/preview", "", transferBody(`1`, "EUR", "DE89", "")), neverCalled(t))
		requireEnvelope(t, res, 401, "subject_required", false)
		res = do(t, d, confirm("", transferBody(`1`, "EUR", "DE89", "x")), neverCalled(t))
		requireEnvelope(t, res, 401, "subject_required", false)
	})

	t.Run("confirm runs once with the nonce as Idempotency-Key, then replays", func(t *testing.T) {
		p := newPayments()
		fp := preview(t, d, alice, `"100.00"`)
		nonce := e.claimsOf(t, fp, alice, "payments.transfer").Nonce
		// 100 == "100.00" with type decimal; memo is not bound.
		res := do(t, d, confirm(alice, transferBody(`100`, "EUR", "DE89", fp), header{"idempotency-key", "client-made-up"}), p.handle)
		require.Nil(t, res.immediate)
		require.Equal(t, nonce, res.upstreamHdrs["idempotency-key"], "client value overwritten by the nonce")
		require.Equal(t, 201, res.status)
		require.Equal(t, `{"transfer_id":"tr_1","state":"executed"}`, string(res.body), "upstream answer reaches the client unchanged")
		require.Equal(t, 1, p.Executions())
		require.Eventually(t, func() bool { rec, _ := e.recordNow(nonce); return rec.State == state.Done }, 5*time.Second, 10*time.Millisecond)

		res = do(t, d, confirm(alice, transferBody(`100.0`, "EUR", "DE89", fp)), neverCalled(t))
		body := requireEnvelope(t, res, 201, "already_completed", false)
		require.Equal(t, "tr_1", body["result_ref"])
		require.Equal(t, map[string]any{"transfer_id": "tr_1", "state": "executed"}, body["result"])
		require.Equal(t, "true", res.headers["idempotent-replayed"])
		require.Equal(t, nonce, res.headers["idempotency-key"])
		require.Equal(t, "req-_v1_transfers_confirm", body["trace_id"])
		require.Equal(t, 1, p.Executions())
	})

	t.Run("already_failed replays a definite 4xx", func(t *testing.T) {
		p := newPayments()
		p.next = func(int) upstreamReply {
			return upstreamReply{status: 422, headers: []header{{"content-type", "application/json"}}, body: []byte(`{"error":"insufficient_funds"}`)}
		}
		fp := preview(t, d, alice, `5`)
		res := do(t, d, confirm(alice, transferBody(`5`, "EUR", "DE89", fp)), p.handle)
		require.Equal(t, 422, res.status)
		res = do(t, d, confirm(alice, transferBody(`5`, "EUR", "DE89", fp)), neverCalled(t))
		body := requireEnvelope(t, res, 422, "already_failed", false)
		require.Equal(t, map[string]any{"error": "insufficient_funds"}, body["result"])
		require.Equal(t, e.claimsOf(t, fp, alice, "payments.transfer").Nonce, body["result_ref"], "no transfer_id: the nonce")
		require.Equal(t, 1, p.Executions())
	})

	t.Run("replay raw returns the original bytes", func(t *testing.T) {
		p := newPayments()
		p.next = func(int) upstreamReply {
			return upstreamReply{status: 202, headers: []header{{"content-type", "text/plain; charset=utf-8"}, {"location", "/v1/payouts/po_9"}, {"set-cookie", "s=1"}}, body: []byte("payout po_9 accepted\n")}
		}
		res := do(t, d, post("/v1/accounts/acc-7/payouts/preview", alice, []byte(`{"amount":12}`)), previewOK)
		fp := res.json(t)["fingerprint"].(string)
		res = do(t, d, post("/v1/accounts/acc-7/payouts/confirm", alice, []byte(fmt.Sprintf(`{"amount":12,"fingerprint":%q}`, fp))), p.handle)
		require.Equal(t, 202, res.status)
		require.NotContains(t, res.upstreamHdrs, "idempotency-key", "downstream_idempotency_header is empty")
		res = do(t, d, post("/v1/accounts/acc-7/payouts/confirm", alice, []byte(fmt.Sprintf(`{"amount":12,"fingerprint":%q}`, fp))), neverCalled(t))
		require.NotNil(t, res.immediate)
		require.Equal(t, 202, res.status)
		require.Equal(t, "payout po_9 accepted\n", string(res.body))
		require.Equal(t, "text/plain; charset=utf-8", res.headers["content-type"])
		require.Equal(t, "/v1/payouts/po_9", res.headers["location"])
		require.NotContains(t, res.headers, "set-cookie", "not on the allow-list")
		require.Equal(t, "true", res.headers["idempotent-replayed"])
		require.Equal(t, e.claimsOf(t, fp, alice, "payments.payout").Nonce, res.headers["idempotency-key"])
		// A different path variable is a different payout.
		res = do(t, d, post("/v1/accounts/acc-8/payouts/confirm", alice, []byte(fmt.Sprintf(`{"amount":12,"fingerprint":%q}`, fp))), neverCalled(t))
		body := requireEnvelope(t, res, 422, "params_changed", false)
		require.Equal(t, []any{"path.account"}, body["changed_fields"])
	})

	t.Run("in_progress while another owner holds the record", func(t *testing.T) {
		fp := preview(t, d, alice, `7`)
		e.holdRecord(t, e.claimsOf(t, fp, alice, "payments.transfer"), "payments.transfer", time.Hour)
		res := do(t, d, confirm(alice, transferBody(`7`, "EUR", "DE89", fp)), neverCalled(t))
		body := requireEnvelope(t, res, 409, "in_progress", false)
		require.Equal(t, "transfer_status", body["poll_with"])
		require.Equal(t, float64(2000), body["poll_after_ms"])
		require.Equal(t, "2", res.headers["retry-after"])
		require.Contains(t, body["instruction"], "Do not call this tool again")

		res = do(t, d, status(alice, fp), neverCalled(t))
		body = requireEnvelope(t, res, 200, "in_progress", true)
		require.Equal(t, "transfer_status", body["poll_with"])
	})

	t.Run("needs_reconciliation for an UNKNOWN record", func(t *testing.T) {
		fp := preview(t, d, alice, `8`)
		c := e.claimsOf(t, fp, alice, "payments.transfer")
		ans := e.holdRecord(t, c, "payments.transfer", time.Hour)
		_, err := e.store.Store.MarkUnknown(t.Context(), state.Claim{Key: c.Nonce, Owner: "other-gateway", Fence: ans.Record.Fence})
		require.NoError(t, err)
		res := do(t, d, confirm(alice, transferBody(`8`, "EUR", "DE89", fp)), neverCalled(t))
		body := requireEnvelope(t, res, 409, "needs_reconciliation", false)
		require.Equal(t, "transfer_status", body["poll_with"])
		res = do(t, d, status(alice, fp), neverCalled(t))
		requireEnvelope(t, res, 200, "needs_reconciliation", false)
	})

	t.Run("fingerprint_required", func(t *testing.T) {
		res := do(t, d, confirm(alice, transferBody(`1`, "EUR", "DE89", "")), neverCalled(t))
		body := requireEnvelope(t, res, 400, "fingerprint_required", false)
		require.Equal(t, "transfer_preview", body["preview_with"])
		res = do(t, d, post("/v1/transfers/status", alice, []byte(`{}`)), neverCalled(t))
		requireEnvelope(t, res, 400, "fingerprint_required", false)
	})

	t.Run("fingerprint_invalid", func(t *testing.T) {
		fp := preview(t, d, alice, `9`)
		parts := strings.Split(fp, ".")
		mac := []byte(parts[1])
		if mac[0] == 'A' {
			mac[0] = 'B'
		} else {
			mac[0] = 'A'
		}
		payoutFP := do(t, d, post("/v1/accounts/acc-7/payouts/preview", alice, []byte(`{"amount":9}`)), previewOK).json(t)["fingerprint"].(string)
		for name, token := range map[string]string{
			"garbage":       "not-a-fingerprint",
			"tampered mac":  parts[0] + "." + string(mac),
			"other scope":   payoutFP,
			"not a string":  "",
			"trailing junk": fp + "x",
		} {
			body := transferBody(`9`, "EUR", "DE89", token)
			if name == "not a string" {
				body = []byte(`{"amount":9,"currency":"EUR","payee":{"account_id":"DE89"},"fingerprint":12}`)
			}
			res := do(t, d, confirm(alice, body), neverCalled(t))
			b := requireEnvelope(t, res, 400, "fingerprint_invalid", false)
			require.Equal(t, "transfer_preview", b["preview_with"], name)
		}
		require.Contains(t, e.logs.String(), "event=security_alert reason=bad_mac operation=transfer")
	})

	t.Run("fingerprint_expired", func(t *testing.T) {
		fp := preview(t, d, alice, `10`)
		e.clock.Advance(15*time.Minute + time.Second)
		res := do(t, d, confirm(alice, transferBody(`10`, "EUR", "DE89", fp)), neverCalled(t))
		body := requireEnvelope(t, res, 410, "fingerprint_expired", false)
		require.Equal(t, "transfer_preview", body["preview_with"])
		// The status tool may still ask with an expired fingerprint.
		res = do(t, d, status(alice, fp), neverCalled(t))
		requireEnvelope(t, res, 200, "not_started", false)
	})

	t.Run("an expired fingerprint whose confirm already ran is replayed, not refused", func(t *testing.T) {
		// An agent that comes back after ttl.fingerprint must learn what its
		// confirm did; "expired, nothing was executed" would send it to a
		// second preview and a second payment.
		p := newPayments()
		fp := preview(t, d, alice, `13`)
		nonce := e.claimsOf(t, fp, alice, "payments.transfer").Nonce
		res := do(t, d, confirm(alice, transferBody(`13`, "EUR", "DE89", fp)), p.handle)
		require.Equal(t, 201, res.status)
		require.Eventually(t, func() bool { rec, _ := e.recordNow(nonce); return rec.State == state.Done }, 5*time.Second, 10*time.Millisecond)
		e.clock.Advance(15*time.Minute + time.Second)

		res = do(t, d, confirm(alice, transferBody(`13`, "EUR", "DE89", fp)), neverCalled(t))
		body := requireEnvelope(t, res, 201, "already_completed", false)
		require.Equal(t, "tr_1", body["result_ref"])
		require.Equal(t, 1, p.Executions())
		// Expired is still expired for anything else: other params, another user.
		res = do(t, d, confirm(alice, transferBody(`14`, "EUR", "DE89", fp)), neverCalled(t))
		requireEnvelope(t, res, 422, "params_changed", false)
		res = do(t, d, confirm(bob, transferBody(`13`, "EUR", "DE89", fp)), neverCalled(t))
		requireEnvelope(t, res, 403, "fingerprint_subject_mismatch", false)
	})

	t.Run("fingerprint_subject_mismatch is a security event", func(t *testing.T) {
		fp := preview(t, d, alice, `11`)
		res := do(t, d, confirm(bob, transferBody(`11`, "EUR", "DE89", fp)), neverCalled(t))
		body := requireEnvelope(t, res, 403, "fingerprint_subject_mismatch", false)
		require.NotContains(t, body, "preview_with")
		nonce := e.claimsOf(t, fp, alice, "payments.transfer").Nonce
		require.Contains(t, e.logs.String(), "event=security_alert reason=fingerprint_subject_mismatch operation=transfer nonce="+nonce)
		require.NotContains(t, e.logs.String(), bob, "the raw subject is never logged")
		res = do(t, d, status(bob, fp), neverCalled(t))
		requireEnvelope(t, res, 403, "fingerprint_subject_mismatch", false)
	})

	t.Run("params_changed names the fields and raises a security alert", func(t *testing.T) {
		fp := preview(t, d, alice, `"12.00"`)
		res := do(t, d, confirm(alice, transferBody(`1200`, "EUR", "DE89", fp)), neverCalled(t))
		body := requireEnvelope(t, res, 422, "params_changed", false)
		require.Equal(t, []any{"amount"}, body["changed_fields"])
		require.Equal(t, "transfer_preview", body["preview_with"])
		nonce := e.claimsOf(t, fp, alice, "payments.transfer").Nonce
		line := ""
		for _, l := range strings.Split(e.logs.String(), "\n") {
			if strings.Contains(l, "event=security_alert") && strings.Contains(l, nonce) {
				line = l
			}
		}
		require.Contains(t, line, `msg="event=security_alert" event=security_alert reason=params_changed operation=transfer nonce=`+nonce+" subject_tag=")
		require.Contains(t, line, "trace_id=req-_v1_transfers_confirm")
		require.Contains(t, line, "changed_fields=[amount]")
	})

	t.Run("invalid_params", func(t *testing.T) {
		fp := preview(t, d, alice, `13`)
		res := do(t, d, confirm(alice, transferBody(`"13 EUR"`, "EUR", "DE89", fp)), neverCalled(t))
		body := requireEnvelope(t, res, 400, "invalid_params", false)
		require.Contains(t, body["detail"], `param "amount"`)
	})

	t.Run("temporarily_unavailable never fails open", func(t *testing.T) {
		fp := preview(t, d, alice, `14`)
		e.store.fail.Store(true)
		res := do(t, d, confirm(alice, transferBody(`14`, "EUR", "DE89", fp)), neverCalled(t))
		e.store.fail.Store(false)
		body := requireEnvelope(t, res, 503, "temporarily_unavailable", true)
		require.Equal(t, float64(1000), body["retry_after_ms"])
		require.Equal(t, "1", res.headers["retry-after"])

		e.store.fail.Store(true)
		res = do(t, d, status(alice, fp), neverCalled(t))
		e.store.fail.Store(false)
		body = requireEnvelope(t, res, 503, "temporarily_unavailable", true)
		require.Contains(t, body["instruction"], "transfer_status")

		// After the outage the same call goes through.
		p := newPayments()
		res = do(t, d, confirm(alice, transferBody(`14`, "EUR", "DE89", fp)), p.handle)
		require.Equal(t, 201, res.status)
	})

	t.Run("request_too_large and invalid_json", func(t *testing.T) {
		big := []byte(`{"amount":1,"memo":"` + strings.Repeat("x", 5000) + `"}`)
		res := do(t, d, confirm(alice, big), neverCalled(t))
		requireEnvelope(t, res, 413, "request_too_large", false)
		res = do(t, d, confirm(alice, []byte(`{"amount":1,`)), neverCalled(t))
		body := requireEnvelope(t, res, 400, "invalid_json", false)
		require.Contains(t, body["detail"], "invalid JSON at offset")
		deep := []byte(strings.Repeat("[", 40) + strings.Repeat("]", 40))
		res = do(t, d, confirm(alice, deep), neverCalled(t))
		requireEnvelope(t, res, 400, "invalid_json", false)
		// The order of checks: JSON syntax before the subject.
		res = do(t, d, confirm("", []byte(`{`)), neverCalled(t))
		requireEnvelope(t, res, 400, "invalid_json", false)
	})

	t.Run("fingerprint in the header, body without the field", func(t *testing.T) {
		p := newPayments()
		fp := preview(t, d, alice, `15`)
		res := do(t, d, confirm(alice, transferBody(`15`, "EUR", "DE89", ""), header{"idempotency-fingerprint", fp}), p.handle)
		require.Equal(t, 201, res.status)
		require.Equal(t, 1, p.Executions())
	})

	t.Run("headers-only confirm and status (end_of_stream on request headers)", func(t *testing.T) {
		p := newPayments()
		res := do(t, d, httpRequest{method: "POST", path: "/v1/orders/o-1/cancel/preview", headers: []header{{"x-idemgate-subject", alice}}}, previewOK)
		fp := res.headers["idempotency-fingerprint"]
		require.NotEmpty(t, fp)
		get := func(path string) httpRequest {
			return httpRequest{method: "GET", path: path, headers: []header{{"x-idemgate-subject", alice}, {"idempotency-fingerprint", fp}}}
		}
		res = do(t, d, get("/v1/orders/o-1/cancel/status"), neverCalled(t))
		requireEnvelope(t, res, 200, "not_started", false)
		cancel := httpRequest{method: "POST", path: "/v1/orders/o-1/cancel", headers: []header{{"x-idemgate-subject", alice}, {"idempotency-fingerprint", fp}}}
		res = do(t, d, cancel, p.handle)
		require.Equal(t, 201, res.status)
		require.Equal(t, e.claimsOf(t, fp, alice, "orders.cancel").Nonce, res.upstreamHdrs["idempotency-key"])
		require.Equal(t, 3, res.replies, "request headers, response headers, response body")
		res = do(t, d, get("/v1/orders/o-1/cancel/status?verbose=1"), neverCalled(t))
		body := requireEnvelope(t, res, 200, "completed", false)
		require.Equal(t, float64(201), body["result_status"])
		res = do(t, d, cancel, neverCalled(t))
		requireEnvelope(t, res, 201, "already_completed", false)
		res = do(t, d, httpRequest{method: "POST", path: "/v1/orders/o-2/cancel", headers: cancel.headers}, neverCalled(t))
		requireEnvelope(t, res, 422, "params_changed", false)
	})

	t.Run("upstream reset after ACQUIRED: released, retry re-sends the same key", func(t *testing.T) {
		p := newPayments()
		lost := true
		p.next = func(int) upstreamReply {
			return upstreamReply{status: 201, headers: []header{{"content-type", "application/json"}}, body: []byte(`{"transfer_id":"tr_lost"}`)}
		}
		fp := preview(t, d, alice, `16`)
		nonce := e.claimsOf(t, fp, alice, "payments.transfer").Nonce
		var keys []string
		upstream := func(h map[string]string, b []byte) upstreamReply {
			keys = append(keys, h["idempotency-key"])
			r := p.handle(h, b) // executes (once per key)
			if lost {
				lost = false
				return upstreamReply{reset: true} // the answer never comes back
			}
			return r
		}
		res := do(t, d, confirm(alice, transferBody(`16`, "EUR", "DE89", fp)), upstream)
		require.Equal(t, 504, res.status)
		require.Eventually(t, func() bool {
			rec, _ := e.recordNow(nonce)
			return rec.State == state.InFlight && rec.LeaseExpired
		}, 5*time.Second, 10*time.Millisecond, "released at once, not left for the lease")
		res = do(t, d, confirm(alice, transferBody(`16`, "EUR", "DE89", fp)), upstream)
		require.Equal(t, 201, res.status)
		require.Equal(t, []string{nonce, nonce}, keys, "the retry took over and re-sent the same key")
		require.Equal(t, 1, p.Executions(), "the downstream deduplicated it")
		require.Eventually(t, func() bool { rec, _ := e.recordNow(nonce); return rec.State == state.Done }, 5*time.Second, 10*time.Millisecond)
	})

	t.Run("upstream 503: released at response headers, body not requested", func(t *testing.T) {
		calls := 0
		upstream := func(map[string]string, []byte) upstreamReply {
			calls++
			if calls == 1 {
				return upstreamReply{status: 503, headers: []header{{"content-type", "text/plain"}}, body: []byte("busy")}
			}
			return upstreamReply{status: 201, body: []byte(`{"transfer_id":"tr_ok"}`)}
		}
		fp := preview(t, d, alice, `17`)
		res := do(t, d, confirm(alice, transferBody(`17`, "EUR", "DE89", fp)), upstream)
		require.Equal(t, 503, res.status)
		require.Equal(t, "busy", string(res.body), "the upstream answer reaches the client unchanged")
		require.Equal(t, 3, res.replies)
		res = do(t, d, confirm(alice, transferBody(`17`, "EUR", "DE89", fp)), upstream)
		require.Equal(t, 201, res.status, "the released record is taken over by the retry")
		require.Equal(t, 2, calls)
	})

	t.Run("downstream ignoring keys: a cut stream is marked UNKNOWN", func(t *testing.T) {
		res := do(t, d, post("/v1/accounts/acc-9/payouts/preview", alice, []byte(`{"amount":3}`)), previewOK)
		fp := res.json(t)["fingerprint"].(string)
		nonce := e.claimsOf(t, fp, alice, "payments.payout").Nonce
		body := []byte(fmt.Sprintf(`{"amount":3,"fingerprint":%q}`, fp))
		res = do(t, d, post("/v1/accounts/acc-9/payouts/confirm", alice, body), func(map[string]string, []byte) upstreamReply { return upstreamReply{reset: true} })
		require.Equal(t, 504, res.status)
		require.Eventually(t, func() bool { rec, _ := e.recordNow(nonce); return rec.State == state.Unknown }, 5*time.Second, 10*time.Millisecond)
		res = do(t, d, post("/v1/accounts/acc-9/payouts/confirm", alice, body), neverCalled(t))
		b := requireEnvelope(t, res, 409, "needs_reconciliation", false)
		require.Equal(t, "payout_status", b["poll_with"])
		res = do(t, d, post("/v1/accounts/acc-9/payouts/status", alice, body), neverCalled(t))
		requireEnvelope(t, res, 200, "needs_reconciliation", false)
	})

	t.Run("status route answers every state", func(t *testing.T) {
		// completed, with the stored result
		p := newPayments()
		fp := preview(t, d, alice, `18`)
		do(t, d, confirm(alice, transferBody(`18`, "EUR", "DE89", fp)), p.handle)
		res := do(t, d, status(alice, fp), neverCalled(t))
		body := requireEnvelope(t, res, 200, "completed", false)
		require.Equal(t, "tr_1", body["result_ref"])
		require.Equal(t, map[string]any{"transfer_id": "tr_1", "state": "executed"}, body["result"])
		require.Equal(t, float64(201), body["result_status"])
		// failed
		p.next = func(int) upstreamReply { return upstreamReply{status: 400, body: []byte(`{"error":"closed account"}`)} }
		fp = preview(t, d, alice, `19`)
		do(t, d, confirm(alice, transferBody(`19`, "EUR", "DE89", fp)), p.handle)
		res = do(t, d, status(alice, fp), neverCalled(t))
		body = requireEnvelope(t, res, 200, "failed", false)
		require.Equal(t, map[string]any{"error": "closed account"}, body["result"])
		// not_started, and the header form
		fp = preview(t, d, alice, `20`)
		res = do(t, d, post("/v1/transfers/status", alice, []byte(`{}`), header{"idempotency-fingerprint", fp}), neverCalled(t))
		requireEnvelope(t, res, 200, "not_started", false)
		// interrupted: released lease on a downstream that honours keys
		c := e.claimsOf(t, fp, alice, "payments.transfer")
		ans := e.holdRecord(t, c, "payments.transfer", time.Hour)
		_, err := e.store.Store.EndLease(t.Context(), state.Claim{Key: c.Nonce, Owner: "other-gateway", Fence: ans.Record.Fence})
		require.NoError(t, err)
		res = do(t, d, status(alice, fp), neverCalled(t))
		body = requireEnvelope(t, res, 200, "not_started", false)
		require.Contains(t, body["meaning"], "interrupted")
		// invalid
		res = do(t, d, status(alice, "nope"), neverCalled(t))
		requireEnvelope(t, res, 400, "fingerprint_invalid", false)
	})

	t.Run("64 concurrent confirms of one fingerprint execute once", func(t *testing.T) {
		p := newPayments()
		slow := func(h map[string]string, b []byte) upstreamReply {
			time.Sleep(50 * time.Millisecond)
			return p.handle(h, b)
		}
		fp := preview(t, d, alice, `21`)
		var mu sync.Mutex
		statuses := map[string]int{}
		var wg sync.WaitGroup
		for i := 0; i < 64; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				t := testutil.OffTestGoroutine(t)
				res := do(t, d, confirm(alice, transferBody(`21`, "EUR", "DE89", fp)), slow)
				key := "executed"
				if res.immediate != nil {
					key = res.json(t)["status"].(string)
				}
				mu.Lock()
				statuses[key]++
				mu.Unlock()
			}()
		}
		wg.Wait()
		require.Equal(t, 1, p.Executions())
		require.Equal(t, 1, statuses["executed"], statuses)
		require.Equal(t, 63, statuses["in_progress"]+statuses["already_completed"], statuses)
	})

	t.Run("unknown routes pass through untouched", func(t *testing.T) {
		s := d.open(t)
		defer s.Close()
		require.NoError(t, s.Send(passThroughRequest("/v1/balance")))
		resp, err := s.Recv()
		require.NoError(t, err)
		require.NotNil(t, resp.GetRequestHeaders())
		require.Nil(t, resp.GetRequestHeaders().GetResponse().GetHeaderMutation())
		require.Equal(t, passThroughMode.String(), resp.GetModeOverride().String())
		_, err = s.Recv()
		require.ErrorContains(t, err, "EOF", "the stream is closed with OK")
	})
}
