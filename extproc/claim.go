package extproc

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
