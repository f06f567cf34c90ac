package extproc

import "github.com/idemgate/idemgate/state"

// claimPhase is how far a stream has got with the claim it holds on a
// record. Only a confirm (over HTTP or as an MCP tools/call) ever claims;
// every other stream stays at claimNone. The phase moves forward only, and
// only in this file:
//
//	claimNone ──store answers ACQUIRED (holdClaim)──▶ claimPending
//	claimPending ──the reply letting the request through went out (replySent)──▶ claimLetThrough
//	claimPending ──that reply was never sent: send failed, panic, stream ended (settle)──▶ claimSettled
//	claimLetThrough ──the upstream's answer recorded, or the stream ended (settle)──▶ claimSettled
//
// Which Store call each way into claimSettled makes is the decision table
// at the top of confirm.go (settlement).
type claimPhase uint8

const (
	// claimNone: no claim (not a confirm, or not acquired).
	claimNone claimPhase = iota
	// claimPending: the store granted the claim and the reply that lets
	// the request through is about to be sent. If it is never sent the
	// upstream was never contacted.
	claimPending
	// claimLetThrough: that reply went out; the upstream may have been
	// called.
	claimLetThrough
	// claimSettled: this stream made its settling Store call (whatever the
	// store answered); it touches the record no more.
	claimSettled
)

func (p claimPhase) String() string {
	switch p {
	case claimPending:
		return "pending"
	case claimLetThrough:
		return "let_through"
	case claimSettled:
		return "settled"
	}
	return "none"
}

// held reports whether the stream still holds a claim it must settle.
func (p claimPhase) held() bool {
	return p == claimPending || p == claimLetThrough
}

// holdClaim records the claim the store just granted this stream.
func (ex *exchange) holdClaim(c state.Claim) {
	ex.claim = c
	ex.claimPhase = claimPending
}

// replySent is called after a reply went out.
func (ex *exchange) replySent() {
	if ex.claimPhase == claimPending {
		ex.claimPhase = claimLetThrough
		ex.traceUpstreamStart()
	}
}

// replyFailed is called when a reply could not be sent, or was replaced by
// another (a recovered panic): a pending claim's request never reached the
// upstream.
func (ex *exchange) replyFailed() {
	if ex.claimPhase == claimPending {
		ex.settle(false, nil, "")
	}
}

// finish settles a record this stream still holds when the stream ends: the
// request was let through but no response phase completed. Envoy 1.40 runs
// most of its own local replies (the router's 504 and 503) through the
// response phase, where confirmResponseHeaders classifies them; the 500 for
// a response over the buffer limit does not, and a cancelled stream ends
// here too (docs/design.md §4).
func (ex *exchange) finish() {
	ex.settle(false, nil, "the stream ended before the upstream response was recorded")
}

// settle makes the Store call that settles the claim this stream holds, as
// settlement decides from the upstream's outcome so far. whole says the
// upstream's answer was seen to its end (its body, or headers that end the
// stream); body is the result to record; why is logged with a EndLease or
// MarkUnknown.
func (ex *exchange) settle(whole bool, body []byte, why string) {
	if !ex.claimPhase.held() {
		return
	}
	call := settlement(ex.claimPhase, ex.respClass, whole, ex.op.HonoursKeys())
	ex.claimPhase = claimSettled
	switch call {
	case callCompleteDone, callCompleteFailed:
		ex.complete(call, body)
	case callEndLease, callMarkUnknown:
		ex.endLease(call, why)
	case callAbandonUnsent:
		ex.abandonUnsent()
	}
}
