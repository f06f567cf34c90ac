package extproc

import (
	"log/slog"

	"github.com/idemgate/idemgate/state"
)

// The Store calls that settle a stream's claim. settle (claim.go) makes the
// one settlement (confirm.go) picks.

// complete writes DONE (callCompleteDone) or FAILED (callCompleteFailed)
// with the upstream result.
func (ex *exchange) complete(call storeCall, body []byte) {
	st, result := state.Done, "done"
	if call == callCompleteFailed {
		st, result = state.Failed, "failed"
	}
	span := ex.traceChild(spanComplete)
	ctx, cancel := ex.srv.storeContext(ex.ctx)
	completion := state.Completion{
		State:     st,
		Result:    state.Result{Status: ex.respStatus, Headers: ex.respHeaders, Body: body, Ref: ex.recordedRef(body, ex.claim.Key)},
		Retention: ex.srv.cfg.TTL.Terminal,
	}
	ans, err := ex.srv.store.Complete(ctx, ex.claim, completion)
	cancel()
	ex.traceChildEnd(span, err)
	switch {
	case err != nil:
		ex.logger().Error("failed to record the upstream result; retrying in the background (the record stays IN_FLIGHT until one lands)", "error", err, "upstream_status", ex.respStatus)
		// The body is the stream's buffer, reused once the stream ends.
		completion.Result.Body = append([]byte(nil), body...)
		op, log := ex.op.Name, ex.logger()
		ex.srv.abandons.completeLater(ex.ctx, ex.claim, completion, func(r string) {
			ex.srv.metrics.settlements.WithLabelValues(op, r).Inc()
			if r == "error" {
				log.Error("could not record the upstream result; the record stays IN_FLIGHT until its lease ends and a retry takes it over", "upstream_status", completion.Result.Status)
			}
		})
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

// endLease settles an outcome nobody can know: EndLease (callEndLease: the
// next retry takes over and re-sends the same key, for a downstream that
// honours keys) or MarkUnknown (callMarkUnknown: a person reconciles).
func (ex *exchange) endLease(call storeCall, why string) {
	span := ex.traceChild(spanSettle)
	ctx, cancel := ex.srv.storeContext(ex.ctx)
	defer cancel()
	var (
		ans    state.Answer
		err    error
		action string
	)
	if call == callEndLease {
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
