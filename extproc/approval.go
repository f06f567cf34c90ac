package extproc

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"strings"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	"github.com/idemgate/idemgate/extproc/envelope"
	"github.com/idemgate/idemgate/fingerprint"
	"github.com/idemgate/idemgate/state"
)

// Confirms that need people's approval (docs/design.md §10). For an
// operation with an approval block, a verified confirm (fingerprint, scope,
// subject and params all checked) is decided in this order:
//
//	the nonce's approval   rules    record   answer
//	PENDING                —        —        approval_pending (202), same id every time
//	DENIED                 —        —        approval_denied (403)
//	EXPIRED (lapsed)       —        —        approval_expired (410)
//	APPROVED               —        —        AcquireApproved: the IN_FLIGHT record is
//	                                         created and the approval CONSUMED in one
//	                                         transaction, then as an ACQUIRED answer
//	CONSUMED               —        —        Acquire (section 3 answers: replay,
//	                                         in_progress, needs_reconciliation)
//	none                   none     —        Acquire, as for any operation
//	none                   fired    exists   Acquire (a record answers, whatever the
//	                                         rules say now)
//	none                   fired    none     the approval is created PENDING, bound to
//	                                         the nonce, scope, param hash and subject:
//	                                         approval_pending
//
// The approval is read first even when no rule fires, so a denied
// approval stays denied after the rules change. Any store failure is
// temporarily_unavailable; a gated confirm never reaches the upstream
// without the approval it consumed.

// errNoApprovalStore is why a gated confirm is refused without a store
// that keeps approvals (Redis alone).
var errNoApprovalStore = errors.New("approvals need PostgreSQL (or the memory store); this store keeps none")

// gatedConfirm decides a verified confirm of an operation with approval.
func (ex *exchange) gatedConfirm(claims fingerprint.Claims, params fingerprint.Params, headersOnly bool) (*extprocv3.ProcessingResponse, bool) {
	approvals := ex.srv.approvals
	budgeted := ex.op.Approval.HasDailyTotal()
	if approvals == nil {
		// No approval can exist without a store that keeps them: only a
		// confirm that needs one (or whose budget cannot be judged) is
		// refused.
		if budgeted || len(ex.firedRules(params)) > 0 {
			return ex.storeFailed("approval", errNoApprovalStore), true
		}
		return ex.acquire(claims, headersOnly)
	}
	ctx, cancel := ex.srv.storeContext(ex.ctx)
	a, found, err := approvals.ApprovalByKey(ctx, claims.Nonce)
	cancel()
	if err != nil {
		return ex.storeFailed("approval", err), true
	}
	if refused := ex.mcpCheckState(claims, a, found); refused != nil {
		return refused, true
	}
	if found {
		return ex.byApproval(a, claims, headersOnly, 0)
	}
	fired := ex.firedRules(params)
	spends, spendRules, unjudged := ex.spends(params)
	// An amount too large or small for plain digits is not summed: its
	// rule needs approval.
	fired = append(fired, unjudged...)
	switch {
	case len(fired) == 0 && !budgeted:
		return ex.acquire(claims, headersOnly)
	case len(fired) == 0:
		// Within today's budgets the record is created with its spends;
		// past one, the confirm needs approval.
		owner := ex.srv.newOwner()
		ttl := ex.srv.cfg.TTL
		ctx, cancel := ex.srv.storeContext(ex.ctx)
		ans, err := approvals.AcquireWithinBudget(ctx, state.AcquireRequest{
			Key: claims.Nonce, Scope: ex.op.Scope, SubjectTag: claims.SubjectTag, ParamHash: claims.ParamHash,
			Owner: owner, Lease: ttl.InFlight, Retention: ttl.Terminal, FingerprintExpiry: claims.ExpiresAt(),
		}, spends)
		cancel()
		if mayHaveWritten(err) {
			ex.srv.abandons.pursue(ex.ctx, state.Claim{Key: claims.Nonce, Owner: owner, Fence: 1}, ex.op.Name)
		}
		if err != nil {
			return ex.storeFailed("acquire_within_budget", err), true
		}
		if len(ans.Exceeded) == 0 {
			return ex.answer(*ans.Answer, claims, owner, headersOnly, 0)
		}
		for _, i := range ans.Exceeded {
			fired = append(fired, spendRules[i])
		}
	default:
		if _, exists, failed := ex.readRecord(claims.Nonce); failed != nil {
			return failed, true
		} else if exists {
			return ex.acquire(claims, headersOnly)
		}
	}
	ap := ex.op.Approval
	ctx, cancel = ex.srv.storeContext(ex.ctx)
	a, created, err := approvals.RequestApproval(ctx, state.ApprovalRequest{
		ID: state.NewApprovalID(), Key: claims.Nonce, Operation: ex.op.Name, Scope: ex.op.Scope,
		SubjectTag: claims.SubjectTag, Requester: ex.subject, ParamHash: claims.ParamHash,
		Params: params.Canonical, Rules: fired, Required: ap.Required, DistinctFromRequester: ap.DistinctFromRequester,
		ExpiresAt: claims.ExpiresAt(), Spends: spends,
	})
	cancel()
	if err != nil {
		return ex.storeFailed("request_approval", err), true
	}
	if created {
		ex.logger().Info("confirm needs approval", "approval_id", a.ID, "rules", fired)
		ex.srv.metrics.approvals.WithLabelValues(ex.op.Name, "requested").Inc()
		ex.traceApproval("requested", a.ID)
		if ex.srv.notifier != nil {
			ex.srv.notifier.Requested(a, ex.op)
		}
	}
	return ex.byApproval(a, claims, headersOnly, 0)
}

// spends are what this confirm adds to the operation's daily_total
// budgets, with the text of each one's rule (rules[i] is spends[i]'s).
// A budget is the subject (hashed) and the canonical values of the rule's
// per params; an absent amount adds 0. unjudged names the rules whose
// amount is written with an exponent (beyond plain digits): they are not
// summed, the confirm needs approval.
func (ex *exchange) spends(params fingerprint.Params) (out []state.Spend, rules, unjudged []string) {
	subject := sha256.Sum256([]byte(ex.subject))
	for _, r := range ex.op.Approval.Rules {
		if r.DailyTotal == nil {
			continue
		}
		amount := "0"
		if v := fieldValue(params, r.Param); v != "null" {
			plain, ok := plainDecimal(v)
			if !ok {
				unjudged = append(unjudged, r.Text)
				continue
			}
			amount = plain
		}
		per := make([]string, 0, len(r.DailyTotal.Per))
		for _, p := range r.DailyTotal.Per {
			per = append(per, p+"="+fieldValue(params, p))
		}
		rules = append(rules, r.Text)
		out = append(out, state.Spend{
			Operation: ex.op.Name,
			Budget:    r.Param + "\n" + hex.EncodeToString(subject[:]) + "\n" + strings.Join(per, "\n"),
			Amount:    amount, Over: r.DailyTotal.Over,
		})
	}
	return out, rules, unjudged
}

// fieldValue is the canonical JSON of the bound param at path ("null" when
// absent).
func fieldValue(params fingerprint.Params, path string) string {
	for _, f := range params.Fields {
		if f.Path == path {
			return string(f.Canonical)
		}
	}
	return "null"
}

// plainDecimal reads a canonical decimal written in plain digits ("-12.5");
// one with an exponent (the canonical form of very large or very small
// values) is not accepted, so no arithmetic ever expands it.
func plainDecimal(s string) (string, bool) {
	s = strings.Trim(s, `"`)
	if _, ok := state.ParseAmount(s); !ok {
		return "", false
	}
	return s, true
}

// byApproval answers from the nonce's approval. attempt bounds the
// re-reads after AcquireApproved found the approval changed under it.
func (ex *exchange) byApproval(a state.Approval, claims fingerprint.Claims, headersOnly bool, attempt int) (*extprocv3.ProcessingResponse, bool) {
	x := envelope.Extra{ApprovalID: a.ID}
	switch a.State {
	case state.ApprovalPending:
		if resp := ex.mcpInputRequest(a, claims); resp != nil {
			return resp, true
		}
		x.ApprovalURL = ex.op.Approval.ApprovalURL(a.ID)
		return ex.envelope(envelope.ApprovalPending, 0, x), true
	case state.ApprovalDenied:
		return ex.envelope(envelope.ApprovalDenied, 0, x), true
	case state.ApprovalExpired:
		return ex.envelope(envelope.ApprovalExpired, 0, x), true
	case state.ApprovalConsumed:
		return ex.acquire(claims, headersOnly)
	case state.ApprovalApproved:
		if a.Key != claims.Nonce || a.ParamHash != claims.ParamHash {
			// Cannot happen through ApprovalByKey with verified params;
			// never execute on it.
			ex.logger().Error("approval does not match the confirm", "approval_id", a.ID)
			return ex.envelope(envelope.InternalError, 0, envelope.Extra{}), true
		}
		if attempt > 0 {
			break
		}
		return ex.acquireApproved(a, claims, headersOnly)
	}
	ex.logger().Error("unexpected approval state", "approval_id", a.ID, "state", string(a.State))
	return ex.envelope(envelope.InternalError, 0, envelope.Extra{}), true
}

// acquireApproved creates the record and consumes the approval together.
func (ex *exchange) acquireApproved(a state.Approval, claims fingerprint.Claims, headersOnly bool) (*extprocv3.ProcessingResponse, bool) {
	span := ex.traceChild(spanAcquire)
	owner := ex.srv.newOwner()
	ttl := ex.srv.cfg.TTL
	ctx, cancel := ex.srv.storeContext(ex.ctx)
	ans, err := ex.srv.approvals.AcquireApproved(ctx, state.AcquireRequest{
		Key: claims.Nonce, Scope: ex.op.Scope, SubjectTag: claims.SubjectTag, ParamHash: claims.ParamHash,
		Owner: owner, Lease: ttl.InFlight, Retention: ttl.Terminal, FingerprintExpiry: claims.ExpiresAt(),
	}, a.ID)
	cancel()
	if mayHaveWritten(err) {
		// The transaction may have committed: give the fresh claim back
		// unsent (the approval stays consumed; the next retry acquires
		// the record afresh, the one execution it approved).
		ex.srv.abandons.pursue(ex.ctx, state.Claim{Key: claims.Nonce, Owner: owner, Fence: 1}, ex.op.Name)
	}
	if err != nil {
		ex.traceChildEnd(span, err)
		return ex.storeFailed("acquire_approved", err), true
	}
	defer ex.traceChildEnd(span, nil)
	if ans.Answer == nil {
		// The approval changed since it was read (lapsed, or consumed by a
		// concurrent retry): answer by what it is now.
		return ex.byApproval(ans.Approval, claims, headersOnly, 1)
	}
	if ans.Answer.Outcome == state.OutcomeAcquired {
		ex.logger().Info("approval consumed by the execution", "approval_id", a.ID)
		ex.srv.metrics.approvals.WithLabelValues(ex.op.Name, "consumed").Inc()
		ex.traceApproval("consumed", a.ID)
	}
	return ex.answer(*ans.Answer, claims, owner, headersOnly, 0)
}

// firedRules lists the approval rules the bound params fire, as text.
func (ex *exchange) firedRules(params fingerprint.Params) []string {
	var fired []string
	for i := range ex.op.Approval.Rules {
		r := &ex.op.Approval.Rules[i]
		for _, f := range params.Fields {
			if f.Path == r.Param && r.Matches(string(f.Canonical)) {
				fired = append(fired, r.Text)
				break
			}
		}
	}
	return fired
}

// approvalAnswerAfterExpiry answers an expired confirm whose nonce has no
// record from its approval, if it has one: a lapsed (or still open)
// approval is approval_expired, a denied one approval_denied. ok is false
// when there is none (or the store keeps none).
func (ex *exchange) approvalAnswerAfterExpiry(nonce string) (resp *extprocv3.ProcessingResponse, ok bool) {
	if ex.op.Approval == nil || ex.srv.approvals == nil {
		return nil, false
	}
	ctx, cancel := ex.srv.storeContext(ex.ctx)
	a, found, err := ex.srv.approvals.ApprovalByKey(ctx, nonce)
	cancel()
	if err != nil {
		return ex.storeFailed("approval", err), true
	}
	if !found || a.State == state.ApprovalConsumed {
		return nil, false
	}
	if a.State == state.ApprovalDenied {
		return ex.envelope(envelope.ApprovalDenied, 0, envelope.Extra{ApprovalID: a.ID}), true
	}
	return ex.envelope(envelope.ApprovalExpired, 0, envelope.Extra{ApprovalID: a.ID}), true
}

// approvalStatus answers the status route for a gated nonce without a
// record. ok is false when it has no approval either.
func (ex *exchange) approvalStatus(nonce string) (resp *extprocv3.ProcessingResponse, ok bool) {
	if ex.op.Approval == nil || ex.srv.approvals == nil {
		return nil, false
	}
	ctx, cancel := ex.srv.storeContext(ex.ctx)
	a, found, err := ex.srv.approvals.ApprovalByKey(ctx, nonce)
	cancel()
	if err != nil {
		return ex.storeFailed("approval", err), true
	}
	if !found {
		return nil, false
	}
	x := envelope.Extra{ApprovalID: a.ID}
	switch a.State {
	case state.ApprovalPending:
		x.ApprovalURL = ex.op.Approval.ApprovalURL(a.ID)
		return ex.envelope(envelope.StatusApprovalPending, 0, x), true
	case state.ApprovalApproved:
		return ex.envelope(envelope.StatusApprovalGranted, 0, x), true
	case state.ApprovalDenied:
		return ex.envelope(envelope.StatusApprovalDenied, 0, x), true
	case state.ApprovalExpired:
		return ex.envelope(envelope.StatusApprovalExpired, 0, x), true
	}
	return nil, false // CONSUMED: the record (or its absence) answers
}
