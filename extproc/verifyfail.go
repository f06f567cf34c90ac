package extproc

import (
	"errors"
	"log/slog"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	"github.com/idemgate/idemgate/extproc/envelope"
	"github.com/idemgate/idemgate/extproc/security"
	"github.com/idemgate/idemgate/fingerprint"
	"github.com/idemgate/idemgate/state"
)

// expired answers a confirm whose fingerprint is past its expiry. It can no
// longer start anything, but an agent that comes back late (a stalled
// workflow, a compacted context) must learn what its earlier confirm did,
// not be told "nothing was executed, confirm again" — that is how a second
// payment happens, and it is what ttl.terminal outliving ttl.fingerprint is
// for. So the rest of the token is verified as usual (MAC, scope, subject,
// params) and the record decides: a terminal record is replayed, one in
// flight or unknown is answered as such; only when nothing was ever
// acquired is the answer fingerprint_expired. This departs from docs/design.md
// §8's order (expiry before the store) on purpose.
//
// The record is only read, never claimed: an expired token starts nothing,
// whatever the record says ("refused from exp + 1s"). The confirm path's
// answer() would acquire again after an abandoned first attempt or a record
// that vanished, and take over an expired lease — each a first execution
// after exp. See expiredAnswer.
func (ex *exchange) expired(token string, expect fingerprint.Expect) (*extprocv3.ProcessingResponse, bool) {
	expect.AllowExpired = true
	claims, err := ex.srv.cfg.Keys.Verify(token, expect, ex.srv.now())
	if err != nil {
		return ex.verifyFailed(err, claims, false), true
	}
	// A terminal record read before is answered from memory, as for an
	// unexpired token: an agent that keeps replaying after the expiry is
	// not a store read each time.
	if rec, ok := ex.knownTerminal(claims); ok {
		return ex.replay(rec, claims.Nonce), true
	}
	// On a store failure "expired, nothing was executed" may be false: the
	// answer is temporarily_unavailable, nothing definite.
	rec, found, failed := ex.readRecord(claims.Nonce)
	if failed != nil {
		return failed, true
	}
	if !found {
		if resp, ok := ex.approvalAnswerAfterExpiry(claims.Nonce); ok {
			return resp, true
		}
		return ex.envelope(envelope.FingerprintExpired, 0, envelope.Extra{}), true
	}
	if rec.ParamHash != claims.ParamHash {
		ex.securityEvent(security.ReasonStoreParamMismatch, claims, nil)
		return ex.envelope(envelope.ParamsChanged, 0, envelope.Extra{}), true
	}
	ex.keepTerminal(rec)
	return ex.expiredAnswer(rec, claims), true
}

// expiredAnswer answers an expired confirm from its record without any
// call that could let the request through (Acquire, Takeover).
func (ex *exchange) expiredAnswer(rec state.Record, claims fingerprint.Claims) *extprocv3.ProcessingResponse {
	switch rec.State {
	case state.Done, state.Failed:
		return ex.replay(rec, claims.Nonce)
	case state.Unknown:
		return ex.envelope(envelope.NeedsReconciliation, 0, envelope.Extra{})
	case state.InFlight:
		if !rec.LeaseExpired {
			return ex.envelope(envelope.InProgress, 0, envelope.Extra{})
		}
		// The owner's lease ran out and no token that could re-send the
		// request exists any more: no one will ever take this claim over.
		// Marking it UNKNOWN (which sends nothing) puts it in front of a
		// person, as for a downstream that ignores keys.
		ctx, cancel := ex.srv.storeContext(ex.ctx)
		defer cancel()
		ans, err := ex.srv.store.MarkUnknown(ctx, state.Claim{Key: rec.Key, Owner: rec.Owner, Fence: rec.Fence})
		if err != nil {
			return ex.storeFailed("mark_unknown", err)
		}
		switch {
		case ans.Outcome == state.OutcomeOK:
			ex.logger().Warn("expired fingerprint met an abandoned claim: record marked UNKNOWN for reconciliation", "previous_owner", rec.Owner)
			ex.srv.metrics.settlements.WithLabelValues(ex.op.Name, "marked_unknown").Inc()
			return ex.envelope(envelope.NeedsReconciliation, 0, envelope.Extra{})
		case ans.Outcome == state.OutcomeNotOwner && ans.Record.Key != "" && ans.Record.State != state.InFlight:
			// Someone moved it first: answer from what is there now.
			return ex.expiredAnswer(ans.Record, claims)
		case ans.Outcome == state.OutcomeNotFound:
			return ex.envelope(envelope.FingerprintExpired, 0, envelope.Extra{})
		}
		return ex.envelope(envelope.InProgress, 0, envelope.Extra{})
	}
	ex.logger().Error("unexpected record state", "state", string(rec.State))
	return ex.envelope(envelope.InternalError, 0, envelope.Extra{})
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
