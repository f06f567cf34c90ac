package extproc

import (
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	"github.com/idemgate/idemgate/extproc/envelope"
	"github.com/idemgate/idemgate/fingerprint"
	"github.com/idemgate/idemgate/state"
)

// statusRequest answers the status route itself (docs/design.md §4): the
// fingerprint's MAC, scope and subject are verified (an expired fingerprint
// may still ask), the record is read, and the answer is HTTP 200 with
// status not_started | in_progress | completed | failed |
// needs_reconciliation and the stored result when terminal.
func (ex *exchange) statusRequest(body []byte, _ bool) (*extprocv3.ProcessingResponse, bool) {
	_, token, refused := ex.fingerprintRequest(body, envelope.StatusFingerprintRequired)
	if refused != nil {
		return refused, true
	}
	vs := ex.traceChild(spanVerify)
	claims, err := ex.srv.cfg.Keys.Verify(token, fingerprint.Expect{Subject: ex.subject, Scope: ex.op.Scope, AllowExpired: true}, ex.srv.now())
	ex.traceVerified(vs, claims, err)
	if err != nil {
		return ex.verifyFailed(err, claims, true), true
	}
	rec, found, failed := ex.readRecord(claims.Nonce)
	if failed != nil {
		return failed, true
	}
	if !found {
		if resp, ok := ex.approvalStatus(claims.Nonce); ok {
			return resp, true
		}
		return ex.envelope(envelope.StatusNotStarted, 0, envelope.Extra{}), true
	}
	switch rec.State {
	case state.InFlight:
		if !rec.LeaseExpired {
			return ex.envelope(envelope.StatusInProgress, 0, envelope.Extra{}), true
		}
		// The owner is gone (its lease ran out with no settlement).
		if ex.op.HonoursKeys() {
			return ex.envelope(envelope.StatusInterrupted, 0, envelope.Extra{}), true
		}
		return ex.envelope(envelope.StatusNeedsReconciliation, 0, envelope.Extra{}), true
	case state.Done, state.Failed:
		msg := envelope.StatusCompleted
		if rec.State == state.Failed {
			msg = envelope.StatusFailed
		}
		res := rec.Result
		if res == nil {
			res = &state.Result{}
		}
		return ex.envelope(msg, 0, envelope.Extra{
			HasResult: true, ResultRef: ex.resultRef(res, claims.Nonce), Result: res.Body, ResultStatus: res.Status,
		}), true
	default: // UNKNOWN
		return ex.envelope(envelope.StatusNeedsReconciliation, 0, envelope.Extra{}), true
	}
}
