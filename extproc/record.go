package extproc

import (
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	"github.com/idemgate/idemgate/extproc/config"
	"github.com/idemgate/idemgate/extproc/envelope"
	"github.com/idemgate/idemgate/state"
)

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
