package extproc

import (
	"log/slog"
	"strconv"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	"github.com/idemgate/idemgate/extproc/config"
	"github.com/idemgate/idemgate/extproc/envelope"
	"github.com/idemgate/idemgate/extproc/security"
	"github.com/idemgate/idemgate/fingerprint"
	"github.com/idemgate/idemgate/state"
)

// The confirm decisions. A verified confirm asks the store to Acquire its
// fingerprint's nonce; the store's answer decides what becomes of the
// request (answer, with waitForAbandon and leaseExpired). A request let
// through is then settled by what the upstream answered (settlement).
//
//	store answer           upstream outcome  honours  Store call                the client gets
//	                                         keys
//	── answer ──────────────────────────────────────────────────────────────────────────────────────────
//	ACQUIRED               (settlement)      yes      —                         the request goes on, with
//	                                                                            Idempotency-Key: <nonce>
//	                                         no       —                         the request goes on
//	DONE, FAILED           —                 any      —                         the stored result, replayed
//	IN_FLIGHT, held by an  —                 any      Acquire again, once the   per the new answer
//	  attempt of this                                 give-back ended (waited
//	  replica being given                             for once per stream)
//	  back in the background
//	IN_FLIGHT, lease       —                 any      —                         in_progress
//	  running, or over
//	  with attempt > 0
//	IN_FLIGHT, lease over  —                 yes      Takeover                  per its answer, attempt 1
//	                                         no       MarkUnknown               OK: needs_reconciliation;
//	                                                                            NOT_OWNER: per the record now;
//	                                                                            else per the answer; attempt 1
//	UNKNOWN                —                 any      —                         needs_reconciliation
//	PARAM_MISMATCH         —                 any      — (security event)        params_changed
//	NOT_FOUND, attempt<=1  —                 any      Acquire again             per the new answer, attempt + 1
//	NOT_FOUND, attempt>1;  —                 any      —                         internal_error
//	  any other answer
//	── settlement: ACQUIRED, and the reply letting the request through was ─────────────────────────────
//	never sent             —                 any      AbandonUnsent             its loss, or internal_error
//	                                                                            after a panic
//	sent                   done              any      Complete DONE, result     the upstream's answer, as is
//	                       failed            any      Complete FAILED, result   the upstream's answer, as is
//	                       ambiguous         yes      EndLease                  the upstream's answer, as is
//	                                         no       MarkUnknown               the upstream's answer, as is
//	sent; the stream       done, failed      yes      EndLease                  whatever Envoy sends
//	  ended before that      (status only)   no       Complete DONE/FAILED,
//	  answer was whole                                  no body
//	                       none (no status)  yes      EndLease
//	                                         no       MarkUnknown
//
// "Honours keys": the operation names a downstream idempotency header, so
// the upstream executes a re-sent key once and sending it again is safe;
// without one a second send may execute twice, so what nobody can know goes
// to a person (UNKNOWN). attempt counts follow-up calls: 0 for the first
// Acquire, 1 after a Takeover or MarkUnknown, one more per Acquire again of
// a vanished record. The upstream outcome is the operation's outcomes for
// the HTTP status (docs/design.md §3); for an MCP tools/call answered 2xx it
// is the JSON-RPC response's (mcpOutcome), and a 2xx without one is
// ambiguous. A failed Acquire, Takeover or MarkUnknown is answered
// temporarily_unavailable (a claim the failed Acquire or Takeover may have
// written is given back in the background). An expired fingerprint is not
// acquired first: its record is read and, when there is one under the same
// params, answered by the rows of its state; without one the answer is
// fingerprint_expired (expired, in verifyfail.go).

// outcomeClass is how an upstream answer settles a record: the operation's
// config.Outcomes decide (docs/design.md §3's defaults, overridable).
type outcomeClass = config.Outcome

const (
	classNone      = config.OutcomeNone
	classDone      = config.OutcomeDone
	classFailed    = config.OutcomeFailed
	classAmbiguous = config.OutcomeAmbiguous
)

// confirmRequest runs the checks of docs/design.md §8 in order: body size,
// JSON syntax, subject, fingerprint present, verify (MAC, version, scope,
// subject, expiry, params), then acquire.
func (ex *exchange) confirmRequest(body []byte, headersOnly bool) (*extprocv3.ProcessingResponse, bool) {
	pb, token, refused := ex.fingerprintRequest(body, envelope.FingerprintRequired)
	if refused != nil {
		return refused, true
	}
	params, selectErr := ex.op.Selector.Select(pb.doc, ex.vars)
	// A confirm never reads the claims' field tags: they are decoded only to
	// name the changed fields of a params_changed.
	expect := fingerprint.Expect{Subject: ex.subject, Scope: ex.op.Scope, OmitFieldTags: true}
	if selectErr == nil {
		expect.Params = &params
	}
	// With unreadable params, the token is still verified first: a forged,
	// foreign or expired fingerprint is the more important answer.
	vs := ex.traceChild(spanVerify)
	claims, err := ex.srv.cfg.Keys.Verify(token, expect, ex.srv.now())
	ex.traceVerified(vs, claims, err)
	if err != nil {
		if reason, _ := fingerprint.ReasonOf(err); reason == fingerprint.ReasonExpired && selectErr == nil {
			return ex.expired(token, expect)
		}
		return ex.verifyFailed(err, claims, false), true
	}
	if selectErr != nil {
		return ex.invalidParams(selectErr, claims), true
	}
	if ex.op.Approval != nil {
		return ex.gatedConfirm(claims, params, headersOnly)
	}
	return ex.acquire(claims, headersOnly)
}

// acquire claims the record for the fingerprint's nonce.
func (ex *exchange) acquire(claims fingerprint.Claims, headersOnly bool) (*extprocv3.ProcessingResponse, bool) {
	span := ex.traceChild(spanAcquire)
	owner := ex.srv.newOwner()
	ans, err := ex.storeAcquire(claims, owner)
	if err != nil {
		ex.traceChildEnd(span, err)
		return ex.storeFailed("acquire", err), true
	}
	defer ex.traceChildEnd(span, nil)
	return ex.answer(ans, claims, owner, headersOnly, 0)
}

// storeAcquire runs one Acquire for owner. When it fails, the claim may
// still have been written (a timeout after the backend committed): it is
// given back in the background so the retry the agent is told to make is
// not answered in_progress for the whole lease.
//
// A terminal record this replica has read before is answered from memory
// (knownTerminal).
func (ex *exchange) storeAcquire(claims fingerprint.Claims, owner string) (state.Answer, error) {
	if rec, ok := ex.knownTerminal(claims); ok {
		return state.Answer{Outcome: state.OutcomeOf(rec.State), Record: rec}, nil
	}
	ttl := ex.srv.cfg.TTL
	ctx, cancel := ex.srv.storeContext(ex.ctx)
	ans, err := ex.srv.store.Acquire(ctx, state.AcquireRequest{
		Key: claims.Nonce, Scope: ex.op.Scope, SubjectTag: claims.SubjectTag, ParamHash: claims.ParamHash,
		Owner: owner, Lease: ttl.InFlight, Retention: ttl.Terminal, FingerprintExpiry: claims.ExpiresAt(),
	})
	cancel()
	if mayHaveWritten(err) {
		ex.srv.abandons.pursue(ex.ctx, state.Claim{Key: claims.Nonce, Owner: owner, Fence: 1}, ex.op.Name)
	}
	if err == nil && (ans.Outcome == state.OutcomeDone || ans.Outcome == state.OutcomeFailed) {
		ex.keepTerminal(ans.Record)
	}
	return ans, err
}

// knownTerminal returns the terminal record this replica read before for
// the token's nonce: it cannot have changed. The memory answers only when
// scope, subject tag and param hash all match, stricter than the stores
// (which compare the param hash); anything else goes to the store, which
// answers it.
func (ex *exchange) knownTerminal(claims fingerprint.Claims) (state.Record, bool) {
	rec, ok := ex.srv.terminals.Get(claims.Nonce, ex.srv.now())
	if !ok || rec.Scope != ex.op.Scope || rec.SubjectTag != claims.SubjectTag || rec.ParamHash != claims.ParamHash {
		return state.Record{}, false
	}
	ex.srv.metrics.terminalHits.Inc()
	return rec, true
}

// keepTerminal keeps rec in the replica's memory if it is terminal.
func (ex *exchange) keepTerminal(rec state.Record) {
	if ex.srv.terminals.Put(rec, ex.srv.now()) {
		ex.srv.metrics.terminalKept.Inc()
	}
}

// answer turns a store answer into the reply. attempt bounds the follow-up
// calls (takeover, mark-unknown, re-acquire of a vanished record) to one.
func (ex *exchange) answer(ans state.Answer, claims fingerprint.Claims, owner string, headersOnly bool, attempt int) (*extprocv3.ProcessingResponse, bool) {
	nonce := claims.Nonce
	switch ans.Outcome {
	case state.OutcomeAcquired:
		ex.holdClaim(state.Claim{Key: nonce, Owner: owner, Fence: ans.Record.Fence})
		mut, err := ex.forwardHeaders(claims, ans.Record.Fence)
		if err != nil {
			// Never forward unattested; the claim is given back unsent.
			ex.logger().Error("failed to sign the attestation", "error", err)
			return ex.envelope(envelope.InternalError, 0, envelope.Extra{}), true
		}
		ex.decision("acquired")
		if headersOnly {
			return requestHeadersReply(mut, nil), false
		}
		return requestBodyReply(mut), false

	case state.OutcomeDone, state.OutcomeFailed:
		return ex.replay(ans.Record, nonce), true

	case state.OutcomeInFlight:
		if ex.waitForAbandon(ans.Record) {
			// The holder was this replica's own failed attempt at this
			// very confirm, given back in the meantime: ask again.
			again, err := ex.storeAcquire(claims, owner)
			if err != nil {
				return ex.storeFailed("acquire", err), true
			}
			return ex.answer(again, claims, owner, headersOnly, attempt)
		}
		if !ans.Record.LeaseExpired || attempt > 0 {
			return ex.envelope(envelope.InProgress, 0, envelope.Extra{}), true
		}
		return ex.leaseExpired(ans.Record, claims, owner, headersOnly)

	case state.OutcomeUnknown:
		return ex.envelope(envelope.NeedsReconciliation, 0, envelope.Extra{}), true

	case state.OutcomeParamMismatch:
		// The MAC verified, yet the store holds this nonce under other
		// params: a forged token under a leaked key, or a bug. Never run it.
		ex.securityEvent(security.ReasonStoreParamMismatch, claims, nil)
		return ex.envelope(envelope.ParamsChanged, 0, envelope.Extra{}), true

	case state.OutcomeNotFound:
		if attempt <= 1 {
			// The record vanished between two calls (it expired, or a
			// takeover found nothing): start over, once.
			again, err := ex.storeAcquire(claims, owner)
			if err != nil {
				return ex.storeFailed("acquire", err), true
			}
			return ex.answer(again, claims, owner, headersOnly, attempt+1)
		}
	}
	ex.logger().Error("unexpected store answer", "outcome", string(ans.Outcome))
	return ex.envelope(envelope.InternalError, 0, envelope.Extra{}), true
}

// waitForAbandon reports whether rec is held by one of this replica's own
// failed attempts at the same confirm whose claim is being given back in
// the background (an agent retrying at once after temporarily_unavailable),
// after waiting (bounded by store.timeout) for that to finish. It waits at
// most once per stream.
func (ex *exchange) waitForAbandon(rec state.Record) bool {
	if ex.waitedAbandon || !ex.srv.ownOwner(rec.Owner) {
		return false
	}
	ex.waitedAbandon = true
	ctx, cancel := ex.srv.storeContext(ex.ctx)
	defer cancel()
	return ex.srv.abandons.wait(ctx, rec.Key, rec.Owner)
}

// leaseExpired handles an IN_FLIGHT record whose owner's lease ran out (its
// process died, or it outlived ttl.in_flight). A downstream that honours
// idempotency keys makes a re-send safe: take over and send the same key. A
// downstream that does not may already have executed: mark UNKNOWN.
func (ex *exchange) leaseExpired(rec state.Record, claims fingerprint.Claims, owner string, headersOnly bool) (*extprocv3.ProcessingResponse, bool) {
	ctx, cancel := ex.srv.storeContext(ex.ctx)
	defer cancel()
	if ex.op.HonoursKeys() {
		ans, err := ex.srv.store.Takeover(ctx, state.TakeoverRequest{Key: rec.Key, NewOwner: owner, Fence: rec.Fence, Lease: ex.srv.cfg.TTL.InFlight})
		if err != nil {
			if mayHaveWritten(err) {
				// The takeover may have landed: its lease is ended again
				// (an earlier attempt may have executed, so the record stays).
				ex.srv.abandons.pursue(ex.ctx, state.Claim{Key: rec.Key, Owner: owner, Fence: rec.Fence + 1}, ex.op.Name)
			}
			return ex.storeFailed("takeover", err), true
		}
		if ans.Outcome == state.OutcomeAcquired && ex.logEnabled(slog.LevelInfo) {
			ex.logger().Info("took over an expired lease; re-sending the same idempotency key", "previous_owner", rec.Owner, "fence", ans.Record.Fence)
		}
		return ex.answer(ans, claims, owner, headersOnly, 1)
	}
	ans, err := ex.srv.store.MarkUnknown(ctx, state.Claim{Key: rec.Key, Owner: owner, Fence: rec.Fence})
	if err != nil {
		return ex.storeFailed("mark_unknown", err), true
	}
	switch ans.Outcome {
	case state.OutcomeOK:
		ex.logger().Warn("expired lease on a downstream that ignores idempotency keys: record marked UNKNOWN for reconciliation", "previous_owner", rec.Owner)
		ex.srv.metrics.settlements.WithLabelValues(ex.op.Name, "marked_unknown").Inc()
		return ex.envelope(envelope.NeedsReconciliation, 0, envelope.Extra{}), true
	case state.OutcomeNotOwner:
		// Someone else moved the record first; answer from what is there now.
		return ex.answer(state.Answer{Outcome: state.OutcomeOf(ans.Record.State), Record: ans.Record}, claims, owner, headersOnly, 1)
	}
	return ex.answer(ans, claims, owner, headersOnly, 1)
}

// confirmResponseHeaders records what the upstream answered. An ambiguous
// status is settled at once and the body is not requested; a bodiless
// answer is completed here; otherwise the body follows.
func (ex *exchange) confirmResponseHeaders(h *extprocv3.HttpHeaders) (*extprocv3.ProcessingResponse, bool) {
	if ex.claimPhase != claimLetThrough {
		// Only a request idemgate let through has an answer to record.
		return responseHeadersReply(nil, nil), false
	}
	ex.respStatus = responseStatus(h)
	ex.respClass = ex.op.Outcomes.Classify(ex.respStatus)
	ex.traceUpstreamAnswered()
	for _, hv := range h.GetHeaders().GetHeaders() {
		if storedResponseHeaders[hv.GetKey()] {
			v := string(hv.GetRawValue())
			if v == "" {
				v = hv.GetValue()
			}
			ex.respHeaders = append(ex.respHeaders, state.Header{Name: hv.GetKey(), Value: v})
		}
	}
	if ex.respClass == classAmbiguous {
		ex.settle(true, nil, "upstream answered "+strconv.Itoa(ex.respStatus))
		return responseHeadersReply(nil, noResponseBodyMode), true
	}
	if h.GetEndOfStream() {
		ex.settle(true, nil, "")
		return responseHeadersReply(nil, nil), true
	}
	return responseHeadersReply(nil, nil), false
}

// confirmResponseBody records the result. The upstream response always
// reaches the client unchanged, whatever the store says.
func (ex *exchange) confirmResponseBody(body []byte) (*extprocv3.ProcessingResponse, bool) {
	if ex.claimPhase != claimLetThrough {
		return responseBodyReply(nil, nil, false), false
	}
	ex.settle(true, body, "")
	return responseBodyReply(nil, nil, false), true
}

// storeCall is the Store call that settles a claim.
type storeCall uint8

const (
	callNone storeCall = iota
	callCompleteDone
	callCompleteFailed
	callEndLease
	callMarkUnknown
	callAbandonUnsent
)

func (c storeCall) String() string {
	switch c {
	case callCompleteDone:
		return "Complete DONE"
	case callCompleteFailed:
		return "Complete FAILED"
	case callEndLease:
		return "EndLease"
	case callMarkUnknown:
		return "MarkUnknown"
	case callAbandonUnsent:
		return "AbandonUnsent"
	}
	return "none"
}

// settlement is the settlement half of the table above: the Store call that
// settles a claim in phase, given the upstream's outcome class, whether its
// answer was seen whole (its body, or headers that end the stream) and
// whether the downstream honours keys. A claim not held needs none.
func settlement(phase claimPhase, class outcomeClass, whole, honoursKeys bool) storeCall {
	endLease := callMarkUnknown
	if honoursKeys {
		endLease = callEndLease
	}
	complete := callCompleteDone
	if class == classFailed {
		complete = callCompleteFailed
	}
	switch {
	case phase == claimPending:
		// Never sent: the upstream was not contacted.
		return callAbandonUnsent
	case phase != claimLetThrough:
		return callNone
	case class == classAmbiguous:
		// Sent, ambiguous: nobody can know whether it executed.
		return endLease
	case whole:
		// Sent, done or failed.
		return complete
	case class == classNone, honoursKeys:
		// The stream ended first. Without a status nothing is known; with
		// one, a downstream that honours keys is simply asked again by the
		// next retry (same key).
		return endLease
	default:
		// The status said done or failed but the body never arrived. A
		// downstream that ignores keys cannot be asked again; record what
		// is known rather than leave it UNKNOWN.
		return complete
	}
}
