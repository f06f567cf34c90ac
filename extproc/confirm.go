package extproc

import (
	"errors"
	"log/slog"
	"strconv"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/idemgate/idemgate/extproc/config"
	"github.com/idemgate/idemgate/extproc/envelope"
	"github.com/idemgate/idemgate/extproc/security"
	"github.com/idemgate/idemgate/fingerprint"
	"github.com/idemgate/idemgate/state"
)

// outcomeClass is how an upstream answer settles a record: the operation's
// config.Outcomes decide (DESIGN section 3's defaults, overridable).
type outcomeClass = config.Outcome

const (
	classNone      = config.OutcomeNone
	classDone      = config.OutcomeDone
	classFailed    = config.OutcomeFailed
	classAmbiguous = config.OutcomeAmbiguous
)

// confirmRequest runs the checks of DESIGN section 8 in order: body size,
// JSON syntax, subject, fingerprint present, verify (MAC, version, scope,
// subject, expiry, params), then acquire.
func (ex *exchange) confirmRequest(body []byte, headersOnly bool) (*extprocv3.ProcessingResponse, bool) {
	pb, token, refused := ex.fingerprintRequest(body, envelope.FingerprintRequired)
	if refused != nil {
		return refused, true
	}
	params, selectErr := ex.op.Selector.Select(pb.doc, ex.vars)
	expect := fingerprint.Expect{Subject: ex.subject, Scope: ex.op.Scope}
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
			return ex.expired(token, expect, headersOnly)
		}
		return ex.verifyFailed(err, claims, false), true
	}
	if selectErr != nil {
		return ex.invalidParams(selectErr, claims), true
	}
	return ex.acquire(claims, headersOnly)
}

// expired answers a confirm whose fingerprint is past its expiry. It can no
// longer start anything, but an agent that comes back late (a stalled
// workflow, a compacted context) must learn what its earlier confirm did,
// not be told "nothing was executed, confirm again" — that is how a second
// payment happens, and it is what ttl.terminal outliving ttl.fingerprint is
// for. So the rest of the token is verified as usual (MAC, scope, subject,
// params) and the record decides: a terminal record is replayed, one in
// flight or unknown is answered as such; only when nothing was ever
// acquired is the answer fingerprint_expired. This departs from DESIGN
// section 8's order (expiry before the store) on purpose.
func (ex *exchange) expired(token string, expect fingerprint.Expect, headersOnly bool) (*extprocv3.ProcessingResponse, bool) {
	expect.AllowExpired = true
	claims, err := ex.srv.cfg.Keys.Verify(token, expect, ex.srv.now())
	if err != nil {
		return ex.verifyFailed(err, claims, false), true
	}
	// On a store failure "expired, nothing was executed" may be false: the
	// answer is temporarily_unavailable, nothing definite.
	rec, found, failed := ex.readRecord(claims.Nonce)
	if failed != nil {
		return failed, true
	}
	if !found {
		return ex.envelope(envelope.FingerprintExpired, 0, envelope.Extra{}), true
	}
	if rec.ParamHash != claims.ParamHash {
		ex.securityEvent(security.ReasonStoreParamMismatch, claims, nil)
		return ex.envelope(envelope.ParamsChanged, 0, envelope.Extra{}), true
	}
	return ex.answer(state.Answer{Outcome: state.OutcomeOf(rec.State), Record: rec}, claims, ex.srv.newOwner(), headersOnly, 0)
}

// verifyFailed answers a rejected fingerprint and reports security events.
func (ex *exchange) verifyFailed(err error, claims fingerprint.Claims, statusRoute bool) *extprocv3.ProcessingResponse {
	invalid := envelope.FingerprintInvalid
	if statusRoute {
		invalid = envelope.StatusFingerprintInvalid
	}
	reason, _ := fingerprint.ReasonOf(err)
	switch reason {
	case fingerprint.ReasonExpired:
		return ex.envelope(envelope.FingerprintExpired, 0, envelope.Extra{})
	case fingerprint.ReasonWrongSubject:
		ex.securityEvent(security.ReasonSubjectMismatch, claims, nil)
		return ex.envelope(envelope.FingerprintSubjectMismatch, 0, envelope.Extra{})
	case fingerprint.ReasonParamsChanged:
		var ve *fingerprint.VerifyError
		var changed []string
		if errors.As(err, &ve) {
			changed = ve.ChangedFields
		}
		ex.securityEvent(security.ReasonParamsChanged, claims, changed)
		return ex.envelope(envelope.ParamsChanged, 0, envelope.Extra{ChangedFields: changed})
	case fingerprint.ReasonBadMAC:
		ex.securityEvent(security.ReasonBadMAC, claims, nil)
	case fingerprint.ReasonUnknownKey:
		ex.securityEvent(security.ReasonUnknownKey, claims, nil)
	}
	if ex.logEnabled(slog.LevelDebug) {
		ex.logger().Debug("fingerprint rejected", "reason", string(reason))
	}
	return ex.envelope(invalid, 0, envelope.Extra{})
}

// securityEvent reports reason with the presenting subject's keyed tag (never
// the subject itself) and the nonce when the MAC verified.
func (ex *exchange) securityEvent(reason string, claims fingerprint.Claims, changed []string) {
	ex.report(security.Event{Reason: reason, ChangedFields: changed}, claims)
}

// report fills in e's operation, nonce, subject tag and trace id and reports it.
func (ex *exchange) report(e security.Event, claims fingerprint.Claims) {
	keys := ex.srv.cfg.Keys
	tag, err := keys.SubjectTag(claims.KeyID, ex.subject)
	if err != nil {
		tag, _ = keys.SubjectTag(keys.ActiveKeyID(), ex.subject)
	}
	e.Operation, e.Nonce, e.SubjectTag, e.TraceID = ex.op.Name, claims.Nonce, tag, ex.traceID
	ex.traceSecurity(e.Reason)
	ex.srv.security.Report(ex.ctx, e)
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
func (ex *exchange) storeAcquire(claims fingerprint.Claims, owner string) (state.Answer, error) {
	ttl := ex.srv.cfg.TTL
	ctx, cancel := ex.srv.storeContext(ex.ctx)
	ans, err := ex.srv.store.Acquire(ctx, state.AcquireRequest{
		Key: claims.Nonce, Scope: ex.op.Scope, SubjectTag: claims.SubjectTag, ParamHash: claims.ParamHash,
		Owner: owner, Lease: ttl.InFlight, Retention: ttl.Terminal,
	})
	cancel()
	if mayHaveWritten(err) {
		ex.srv.abandons.pursue(ex.ctx, state.Claim{Key: claims.Nonce, Owner: owner, Fence: 1}, ex.op.Name)
	}
	return ans, err
}

// answer turns a store answer into the reply. attempt bounds the follow-up
// calls (takeover, mark-unknown, re-acquire of a vanished record) to one.
func (ex *exchange) answer(ans state.Answer, claims fingerprint.Claims, owner string, headersOnly bool, attempt int) (*extprocv3.ProcessingResponse, bool) {
	nonce := claims.Nonce
	switch ans.Outcome {
	case state.OutcomeAcquired:
		ex.claim = state.Claim{Key: nonce, Owner: owner, Fence: ans.Record.Fence}
		ex.pendingAcquired = true
		var mut *extprocv3.HeaderMutation
		if h := ex.op.DownstreamHeader; h != "" {
			// Overwrite (append unset) whatever key the client sent: the
			// nonce is the only idempotency key the upstream may see, and
			// Envoy's own retries keep it.
			mut = &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{setHeader(h, []byte(nonce))}}
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

// readRecord reads the record of nonce; a store failure comes back as the
// temporarily_unavailable answer to give.
func (ex *exchange) readRecord(nonce string) (state.Record, bool, *extprocv3.ProcessingResponse) {
	ctx, cancel := ex.srv.storeContext(ex.ctx)
	defer cancel()
	rec, found, err := ex.srv.store.Get(ctx, nonce)
	if err != nil {
		return rec, false, ex.storeFailed("get", err)
	}
	return rec, found, nil
}

// storeFailed answers temporarily_unavailable: nothing was executed, retry
// the same call. Never fail open.
func (ex *exchange) storeFailed(op string, err error) *extprocv3.ProcessingResponse {
	ex.logger().Warn("store call failed; answering temporarily_unavailable", "store_op", op, "kind", storeErrorKind(err), "error", err)
	ex.traceStoreFailed(op, err)
	if ex.kind == config.KindStatus {
		return ex.envelope(envelope.StatusTemporarilyUnavailable, 0, envelope.Extra{})
	}
	return ex.envelope(envelope.TemporarilyUnavailable, 0, envelope.Extra{})
}

// replay answers DONE/FAILED with the stored result: an envelope with the
// original status and body, or (replay: raw) the original status, headers
// and body byte for byte. Both carry Idempotent-Replayed and Idempotency-Key.
func (ex *exchange) replay(rec state.Record, nonce string) *extprocv3.ProcessingResponse {
	res := rec.Result
	if res == nil {
		res = &state.Result{}
	}
	msg := envelope.AlreadyCompleted
	if rec.State == state.Failed {
		msg = envelope.AlreadyFailed
	}
	marks := []*corev3.HeaderValueOption{replayedTrue, setHeader(hdrIdemKey, []byte(nonce))}
	if ex.op.Replay == config.ReplayRaw {
		headers := make([]*corev3.HeaderValueOption, 0, len(res.Headers)+len(marks))
		seen := make(map[string]bool, len(res.Headers))
		for _, h := range res.Headers {
			name := lowerASCII(h.Name)
			opt := setHeader(name, []byte(h.Value))
			if seen[name] {
				//lint:ignore SA1019 ext_proc's header mutations honour the deprecated append flag; it is what Envoy 1.40 reads there
				opt.Append = wrapperspb.Bool(true) // repeated header: add, do not overwrite
			}
			seen[name] = true
			headers = append(headers, opt)
		}
		headers = append(headers, marks...)
		spec, _ := envelope.SpecOf(msg)
		ex.decision(spec.Status)
		return immediate(res.Status, headers, res.Body, "idemgate_"+spec.Status+"_raw")
	}
	return ex.envelope(msg, res.Status, envelope.Extra{HasResult: true, ResultRef: ex.resultRef(res, nonce), Result: res.Body}, marks...)
}

// resultRef is the reference a replay or status answer names the result by:
// the one recorded with it at completion, else (a result settled by a
// person, or recorded before refs were) read from the stored body now.
func (ex *exchange) resultRef(res *state.Result, nonce string) string {
	if len(ex.op.ResultRef) == 0 {
		return nonce
	}
	if res.Ref != "" {
		return res.Ref
	}
	return ex.readResultRef(res.Body, nonce)
}

// recordedRef is the Ref stored with a result at completion: the body is
// parsed once here rather than on every replay. Empty when the operation
// names no result_ref (the nonce needs no recording).
func (ex *exchange) recordedRef(body []byte, nonce string) string {
	if len(ex.op.ResultRef) == 0 {
		return ""
	}
	return ex.readResultRef(body, nonce)
}

// readResultRef reads the configured result_ref path from body; the nonce
// when it is not found.
func (ex *exchange) readResultRef(body []byte, nonce string) string {
	if len(body) == 0 {
		return nonce
	}
	doc, err := fingerprint.ParseJSON(body, ex.srv.cfg.Limits.MaxJSONDepth)
	if err != nil {
		return nonce
	}
	v := doc
	for _, seg := range ex.op.ResultRef {
		switch node := v.(type) {
		case map[string]any:
			v = node[seg]
		case []any:
			i, err := strconv.Atoi(seg)
			if err != nil || i < 0 || i >= len(node) {
				return nonce
			}
			v = node[i]
		default:
			return nonce
		}
	}
	switch s := v.(type) {
	case string:
		if s != "" {
			return s
		}
	case interface{ String() string }: // json.Number
		return s.String()
	case bool:
		return strconv.FormatBool(s)
	}
	return nonce
}

func lowerASCII(s string) string {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c >= 'A' && c <= 'Z' {
			b := []byte(s)
			for j := i; j < len(b); j++ {
				if b[j] >= 'A' && b[j] <= 'Z' {
					b[j] += 'a' - 'A'
				}
			}
			return string(b)
		}
	}
	return s
}

// confirmResponseHeaders records what the upstream answered. An ambiguous
// status is settled at once and the body is not requested; a bodiless
// answer is completed here; otherwise the body follows.
func (ex *exchange) confirmResponseHeaders(h *extprocv3.HttpHeaders) (*extprocv3.ProcessingResponse, bool) {
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
		ex.settleAmbiguous("upstream answered " + strconv.Itoa(ex.respStatus))
		return responseHeadersReply(nil, noResponseBodyMode), true
	}
	if h.GetEndOfStream() {
		ex.complete(nil)
		return responseHeadersReply(nil, nil), true
	}
	return responseHeadersReply(nil, nil), false
}

// confirmResponseBody records the result. The upstream response always
// reaches the client unchanged, whatever the store says.
func (ex *exchange) confirmResponseBody(body []byte) (*extprocv3.ProcessingResponse, bool) {
	if !ex.settled {
		ex.complete(body)
	}
	return responseBodyReply(nil, nil, false), true
}

// complete writes DONE or FAILED with the upstream result.
func (ex *exchange) complete(body []byte) {
	ex.settled = true
	st, result := state.Done, "done"
	if ex.respClass == classFailed {
		st, result = state.Failed, "failed"
	}
	span := ex.traceChild(spanComplete)
	ctx, cancel := ex.srv.storeContext(ex.ctx)
	ans, err := ex.srv.store.Complete(ctx, ex.claim, state.Completion{
		State:     st,
		Result:    state.Result{Status: ex.respStatus, Headers: ex.respHeaders, Body: body, Ref: ex.recordedRef(body, ex.claim.Key)},
		Retention: ex.srv.cfg.TTL.Terminal,
	})
	cancel()
	ex.traceChildEnd(span, err)
	switch {
	case err != nil:
		ex.srv.metrics.settlements.WithLabelValues(ex.op.Name, "error").Inc()
		ex.logger().Error("failed to record the upstream result; the record stays IN_FLIGHT until its lease ends", "error", err, "upstream_status", ex.respStatus)
	case ans.Outcome == state.OutcomeOK:
		ex.srv.metrics.settlements.WithLabelValues(ex.op.Name, result).Inc()
	case ans.Outcome == state.OutcomeNotOwner:
		// A late answer after a takeover: the record belongs to someone
		// else now and is left alone; this client still gets its response.
		ex.srv.metrics.notOwner.WithLabelValues(ex.op.Name).Inc()
		ex.srv.metrics.settlements.WithLabelValues(ex.op.Name, "not_owner").Inc()
		ex.logger().Warn("completion refused: the record has a new owner (lease expired and taken over)", "fence", ex.claim.Fence, "upstream_status", ex.respStatus)
	default:
		ex.logger().Error("unexpected store answer to complete", "outcome", string(ans.Outcome))
	}
}

// settleAmbiguous settles an outcome nobody can know: EndLease (the next
// retry takes over and re-sends the same key) when the downstream honours
// keys, else MarkUnknown (a person reconciles).
func (ex *exchange) settleAmbiguous(why string) {
	ex.settled = true
	span := ex.traceChild(spanSettle)
	ctx, cancel := ex.srv.storeContext(ex.ctx)
	defer cancel()
	var (
		ans    state.Answer
		err    error
		action string
	)
	if ex.op.HonoursKeys() {
		action = "released"
		ans, err = ex.srv.store.EndLease(ctx, ex.claim)
	} else {
		action = "marked_unknown"
		ans, err = ex.srv.store.MarkUnknown(ctx, ex.claim)
	}
	ex.traceSettled(span, action, err)
	ex.logSettlement(action, why, ans, err)
}

// abandonUnsent gives the claim back when the reply that would have let the
// request through never reached Envoy: the upstream was not contacted, so a
// fresh claim is deleted and the retry acquires afresh, whatever the
// downstream does with keys (EndLease would make a downstream that ignores
// keys end up needs_reconciliation for a call that never happened). A claim
// made by a takeover keeps its record and only ends its lease: the earlier
// attempt may have executed.
func (ex *exchange) abandonUnsent() {
	ex.settled = true
	ex.pendingAcquired = false
	span := ex.traceChild(spanSettle)
	ctx, cancel := ex.srv.storeContext(ex.ctx)
	defer cancel()
	ans, err := ex.srv.store.AbandonUnsent(ctx, ex.claim)
	if mayHaveWritten(err) {
		ex.srv.abandons.pursue(ex.ctx, ex.claim, ex.op.Name)
	}
	ex.traceSettled(span, "abandoned", err)
	ex.logSettlement("abandoned", "the reply letting the request through was not sent", ans, err)
}

func (ex *exchange) logSettlement(action, why string, ans state.Answer, err error) {
	switch {
	case err != nil:
		ex.srv.metrics.settlements.WithLabelValues(ex.op.Name, "error").Inc()
		ex.logger().Error("failed to settle the record; it stays IN_FLIGHT until its lease ends", "action", action, "why", why, "error", err)
	case ans.Outcome == state.OutcomeOK:
		ex.srv.metrics.settlements.WithLabelValues(ex.op.Name, action).Inc()
		if ex.logEnabled(slog.LevelInfo) {
			ex.logger().Info("settled the record", "action", action, "why", why)
		}
	case ans.Outcome == state.OutcomeNotOwner:
		ex.srv.metrics.notOwner.WithLabelValues(ex.op.Name).Inc()
		ex.srv.metrics.settlements.WithLabelValues(ex.op.Name, "not_owner").Inc()
		ex.logger().Warn("could not settle: the record has a new owner", "action", action, "why", why)
	default:
		ex.logger().Warn("unexpected store answer while settling", "action", action, "outcome", string(ans.Outcome))
	}
}

// replySent is called after a reply went out.
func (ex *exchange) replySent() {
	if ex.pendingAcquired {
		ex.pendingAcquired = false
		ex.acquired = true
		ex.traceUpstreamStart()
	}
}

// replyFailed is called when a reply could not be sent.
func (ex *exchange) replyFailed() {
	if ex.pendingAcquired && !ex.settled {
		ex.abandonUnsent()
	}
}

// finish settles a record this stream still holds when the stream ends: the
// request was let through but no response phase completed. Envoy 1.40 runs
// most of its own local replies (the router's 504 and 503) through the
// response phase, where confirmResponseHeaders classifies them; the 500 for
// a response over the buffer limit does not, and a cancelled stream ends
// here too (docs/design.md section 4).
func (ex *exchange) finish() {
	switch {
	case ex.settled:
	case ex.pendingAcquired:
		ex.abandonUnsent()
	case ex.acquired && ex.respClass != classNone && ex.respClass != classAmbiguous && !ex.op.HonoursKeys():
		// The status said DONE/FAILED but the body never arrived. A
		// downstream that ignores keys cannot be asked again; record what
		// is known rather than leave it UNKNOWN.
		ex.complete(nil)
	case ex.acquired:
		ex.settleAmbiguous("the stream ended before the upstream response was recorded")
	}
}
