package chaos

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// The checker is only worth its run if it can fail: each test below feeds it
// a synthetic history that breaks one invariant and expects that invariant
// (and only the expected ones) reported. A correct history reports nothing.

var t0 = time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)

func at(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }

const (
	nonceA = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
	nonceB = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"
	tokA   = "tokA.mac"
	tokB   = "tokB.mac"
)

var (
	paramsA = Params{Amount: "12.50", Currency: "EUR", Account: "acct_1"}
	paramsB = Params{Amount: "7", Currency: "USD", Account: "acct_2"}
	bodyA   = []byte(`{"transfer_id":"tr_000001","status":"completed","amount":"12.50"}`)
	bodyB   = []byte(`{"transfer_id":"tr_000002","status":"completed","amount":"7.00"}`)
)

func yes() *bool      { b := true; return &b }
func intp(i int) *int { return &i }

func replayOf(result []byte) *Envelope {
	return &Envelope{Status: "already_completed", Retryable: new(bool), Result: json.RawMessage(result)}
}

// validHistory: nonce A executed once, replayed after a Redis flush;
// nonce B hit PostgreSQL being cut (temporarily_unavailable), then executed
// behind a replica kill and ended UNKNOWN (key-ignoring upstream).
func validHistory() History {
	return History{
		Seed:        1,
		HonoursKeys: false,
		InFlightTTL: 2 * time.Second,
		Issued: map[string]Issued{
			nonceA: {Nonce: nonceA, Token: tokA, Params: paramsA},
			nonceB: {Nonce: nonceB, Token: tokB, Params: paramsB},
		},
		Calls: []Call{
			{ID: 1, Kind: KindPreview, Nonce: nonceA, Token: tokA, Params: paramsA, Start: at(0), End: at(10), HTTP: 200},
			{ID: 2, Kind: KindConfirm, Pod: 0, Nonce: nonceA, Token: tokA, Params: paramsA, Start: at(20), End: at(40), HTTP: 200, Body: bodyA},
			{ID: 3, Kind: KindConfirm, Pod: 1, Nonce: nonceA, Token: tokA, Params: paramsA, Start: at(1000), End: at(1010), HTTP: 200, Replayed: true, Envelope: replayOf(bodyA)},
			{ID: 4, Kind: KindConfirm, Pod: 1, Nonce: nonceA, Params: Params{Amount: "99", Currency: "EUR", Account: "acct_1"}, Drifted: true, Start: at(1100), End: at(1110), HTTP: 422,
				Envelope: &Envelope{Status: "params_changed", PreviewWith: "transfer_preview"}},
			{ID: 5, Kind: KindPreview, Nonce: nonceB, Token: tokB, Params: paramsB, Start: at(0), End: at(10), HTTP: 200},
			{ID: 6, Kind: KindConfirm, Pod: 2, Nonce: nonceB, Token: tokB, Params: paramsB, Start: at(100), End: at(150), HTTP: 503,
				Envelope: &Envelope{Status: "temporarily_unavailable", Retryable: yes()}},
			{ID: 7, Kind: KindConfirm, Pod: 2, Nonce: nonceB, Token: tokB, Params: paramsB, Start: at(2000), End: at(2300), Err: "connection reset"},
			{ID: 8, Kind: KindConfirm, Pod: 0, Nonce: nonceB, Token: tokB, Params: paramsB, Start: at(5000), End: at(5010), HTTP: 409,
				Envelope: &Envelope{Status: "needs_reconciliation", PollWith: "transfer_status"}},
			{ID: 9, Kind: KindStatus, Pod: 0, Nonce: nonceB, Start: at(5100), End: at(5110), HTTP: 200,
				Envelope: &Envelope{Status: "needs_reconciliation"}},
		},
		Faults: []Fault{
			{Kind: FaultFlushAll, At: at(500), Until: at(500), Pod: -1},
			{Kind: FaultPGCut, At: at(90), Until: at(160), Pod: -1},
			{Kind: FaultKillReplica, At: at(2250), Until: at(3000), Pod: 2},
		},
		Upstream: []UpstreamCall{
			{At: at(25), End: at(35), Token: tokA, Nonce: nonceA, Params: paramsA, Status: 200, Body: bodyA},
			{At: at(2100), End: at(2200), Token: tokB, Nonce: nonceB, Params: Params{Amount: "7.00", Currency: "USD", Account: "acct_2"}, Status: 200, Body: bodyB},
		},
		ExecutionsByKey: map[string]int{nonceA: 1, nonceB: 1},
		TotalExecutions: 2,
		Rows: map[string]Row{
			nonceA: {Key: nonceA, State: "DONE", ResultStatus: intp(200), ResultBody: bodyA},
			nonceB: {Key: nonceB, State: "UNKNOWN"},
		},
		FaultsEnd: at(3000),
		RowsAt:    at(9000),
	}
}

// requireOnly checks that the violations are exactly of the invariants
// wanted (each at least once), mentioning the nonce given.
func requireOnly(t *testing.T, h History, nonce string, want ...int) {
	t.Helper()
	vs := Check(h)
	got := map[int]bool{}
	for _, v := range vs {
		got[v.Invariant] = true
		if nonce != "" && v.Nonce != nonce && v.Nonce != "" {
			t.Errorf("violation names nonce %s, want %s: %s", v.Nonce, nonce, v)
		}
	}
	wanted := map[int]bool{}
	for _, w := range want {
		if w == 0 {
			continue // requireOnly(t, h, "", 0): no violation at all
		}
		wanted[w] = true
		if !got[w] {
			t.Errorf("invariant %d not reported; got %v", w, vs)
		}
	}
	for inv := range got {
		if !wanted[inv] {
			t.Errorf("unexpected invariant %d reported: %v", inv, vs)
		}
	}
}

func TestCheckerPassesAValidHistory(t *testing.T) {
	if vs := Check(validHistory()); len(vs) != 0 {
		t.Fatalf("a valid history reported %d violations: %v", len(vs), vs)
	}
	h := validHistory()
	h.HonoursKeys = true
	h.StoredResult = map[string][]byte{nonceA: bodyA, nonceB: bodyB}
	h.Upstream[0].Key, h.Upstream[1].Key = nonceA, nonceB
	h.Rows[nonceB] = Row{Key: nonceB, State: "DONE", ResultStatus: intp(200), ResultBody: bodyB}
	h.Calls[7] = Call{ID: 8, Kind: KindConfirm, Pod: 0, Nonce: nonceB, Start: at(5000), End: at(5010), HTTP: 200, Envelope: replayOf(bodyB)}
	h.Calls = h.Calls[:8]
	if vs := Check(h); len(vs) != 0 {
		t.Fatalf("a valid key-honouring history reported %d violations: %v", len(vs), vs)
	}
}

func TestInvariant1TwoExecutions(t *testing.T) {
	h := validHistory()
	h.ExecutionsByKey[nonceA] = 2
	h.TotalExecutions = 3
	requireOnly(t, h, nonceA, 1)
}

func TestInvariant1SuccessWithoutExecution(t *testing.T) {
	h := validHistory()
	// The client was told B completed, yet nothing executed under B.
	h.Calls = append(h.Calls, Call{ID: 10, Kind: KindStatus, Nonce: nonceB, Start: at(6000), End: at(6010), HTTP: 200, Envelope: &Envelope{Status: "completed"}})
	h.ExecutionsByKey[nonceB] = 0
	h.TotalExecutions = 1
	vs := Check(h)
	found := false
	for _, v := range vs {
		if v.Invariant == 1 && v.Nonce == nonceB && strings.Contains(v.Detail, "executed 0 times") {
			found = true
		}
	}
	if !found {
		t.Fatalf("a success with no execution was not reported: %v", vs)
	}
}

func TestInvariant2DeadEnd(t *testing.T) {
	h := validHistory()
	h.Calls[2].Envelope = &Envelope{Status: "internal_error"}
	h.Calls[2].HTTP = 500
	h.Calls[2].Replayed = false
	requireOnly(t, h, nonceA, 2)
}

func TestInvariant2InProgressWithoutPollTool(t *testing.T) {
	h := validHistory()
	h.Calls = append(h.Calls, Call{ID: 10, Kind: KindConfirm, Pod: 1, Nonce: nonceA, Start: at(1200), End: at(1210), HTTP: 409, Envelope: &Envelope{Status: "in_progress"}})
	requireOnly(t, h, nonceA, 2)
}

func TestInvariant2UnavailableWhileExecuting(t *testing.T) {
	h := validHistory()
	// "Nothing was executed", yet the upstream got B during that answer.
	h.Upstream = append(h.Upstream, UpstreamCall{At: at(120), End: at(130), Token: tokB, Nonce: nonceB, Params: paramsB, Status: 200, Body: bodyB})
	h.ExecutionsByKey[nonceB] = 1
	requireOnly(t, h, nonceB, 2)
}

func TestInvariant2UnexplainedInfraError(t *testing.T) {
	h := validHistory()
	h.Faults = h.Faults[:2] // no replica kill explains the reset of call 7 (nor B's UNKNOWN)
	requireOnly(t, h, nonceB, 2, 5)
}

func TestInvariant2NeverDecided(t *testing.T) {
	h := validHistory()
	h.Calls = h.Calls[:7] // B's last answer is the reset
	h.Rows[nonceB] = Row{Key: nonceB, State: "DONE", ResultStatus: intp(200), ResultBody: bodyB}
	requireOnly(t, h, nonceB, 2)
}

func TestInvariant3ReplayDiffers(t *testing.T) {
	h := validHistory()
	h.Calls[2].Envelope = replayOf([]byte(`{"transfer_id":"tr_000001","status":"completed","amount":"12.5"}`))
	requireOnly(t, h, nonceA, 3)
}

func TestInvariant3ReplayOfNothing(t *testing.T) {
	h := validHistory()
	h.Calls[7].Envelope = replayOf(bodyB)
	h.Calls[7].HTTP = 200
	h.Calls[8].Envelope = &Envelope{Status: "completed", Result: bodyB}
	h.Upstream[1].Status, h.Upstream[1].Body = 0, nil // reset: the upstream wrote no answer
	h.Rows[nonceB] = Row{Key: nonceB, State: "DONE", ResultStatus: intp(200), ResultBody: bodyB}
	requireOnly(t, h, nonceB, 3, 4)
}

func TestInvariant4StuckInFlight(t *testing.T) {
	h := validHistory()
	h.Rows[nonceB] = Row{Key: nonceB, State: "IN_FLIGHT", LeaseUntil: at(20000)}
	requireOnly(t, h, nonceB, 4)
}

func TestInvariant4RowDisagreesWithUpstream(t *testing.T) {
	h := validHistory()
	h.Rows[nonceA] = Row{Key: nonceA, State: "DONE", ResultStatus: intp(200), ResultBody: bodyB}
	requireOnly(t, h, nonceA, 4)
}

func TestInvariant4ReadTooEarly(t *testing.T) {
	h := validHistory()
	h.RowsAt = at(3500)
	requireOnly(t, h, "", 4)
}

func TestInvariant4ExecutedWithoutRow(t *testing.T) {
	h := validHistory()
	delete(h.Rows, nonceA)
	requireOnly(t, h, nonceA, 4)
}

func TestInvariant5UnknownWithoutCause(t *testing.T) {
	h := validHistory()
	// Replace the kill by a restart alone: it explains call 7's reset for
	// (2), but a restart cannot leave an outcome unknown.
	h.Faults[2] = Fault{Kind: FaultRestartReplica, At: at(2250), Until: at(3000), Pod: 2}
	requireOnly(t, h, nonceB, 5)
}

func TestInvariant6UnissuedFingerprint(t *testing.T) {
	h := validHistory()
	h.Upstream = append(h.Upstream, UpstreamCall{At: at(3000), Token: "forged.mac", Nonce: "cccccccccccccccccccccccccccccccc", Params: paramsA, Status: 200, Body: bodyA})
	h.ExecutionsByKey["cccccccccccccccccccccccccccccccc"] = 1
	h.TotalExecutions = 3
	requireOnly(t, h, "cccccccccccccccccccccccccccccccc", 4, 6) // and no row for it
}

func TestInvariant6ParamsDiffer(t *testing.T) {
	h := validHistory()
	h.Upstream[0].Params.Amount = "125.0"
	requireOnly(t, h, nonceA, 6)
}

func TestInvariant6UnattributedExecution(t *testing.T) {
	h := validHistory()
	h.TotalExecutions = 3 // one execution carried no nonce at all
	requireOnly(t, h, "", 6)
}

func TestInvariant6WrongKey(t *testing.T) {
	h := validHistory()
	h.HonoursKeys = true
	h.StoredResult = map[string][]byte{nonceA: bodyA, nonceB: bodyB}
	h.Upstream[0].Key = nonceA
	h.Upstream[1].Key = nonceA // B's confirm carried A's key
	requireOnly(t, h, nonceB, 6)
}

func TestInvariant5ExpiredLeaseWithoutCause(t *testing.T) {
	h := validHistory()
	// Key-ignoring: an IN_FLIGHT row whose lease ran out is UNKNOWN, and
	// needs a cause like one.
	h.Rows[nonceB] = Row{Key: nonceB, State: "IN_FLIGHT", LeaseUntil: at(4000)}
	requireOnly(t, h, "", 0)
	h.Faults[2] = Fault{Kind: FaultRestartReplica, At: at(2250), Until: at(3000), Pod: 2}
	requireOnly(t, h, nonceB, 5)
}

func TestInvariant4ExpiredLeaseLeftWithHonouringUpstream(t *testing.T) {
	h := validHistory()
	h.HonoursKeys = true
	h.StoredResult = map[string][]byte{nonceA: bodyA, nonceB: bodyB}
	h.Upstream[0].Key, h.Upstream[1].Key = nonceA, nonceB
	h.Calls = h.Calls[:7]
	h.Calls = append(h.Calls, Call{ID: 8, Kind: KindStatus, Pod: 0, Nonce: nonceB, Start: at(5000), End: at(5010), HTTP: 200, Envelope: &Envelope{Status: "completed", Result: bodyB}})
	// Executed, released, and left IN_FLIGHT although the key would let a
	// confirm complete it.
	h.Rows[nonceB] = Row{Key: nonceB, State: "IN_FLIGHT", LeaseUntil: at(4000)}
	requireOnly(t, h, nonceB, 4)
}

func TestInvariant2InfraErrorDuringAStoreFault(t *testing.T) {
	h := validHistory()
	// An Envoy 500 while only PostgreSQL was cut: idemgate should have
	// answered temporarily_unavailable itself.
	h.Calls = append(h.Calls, Call{ID: 10, Kind: KindConfirm, Pod: 1, Nonce: nonceA, Start: at(95), End: at(150), HTTP: 500, Body: []byte("ext_proc error")})
	requireOnly(t, h, nonceA, 2)
}

func TestInvariant2NonceFaultExplainsOnlyItsOwnWindow(t *testing.T) {
	h := validHistory()
	// The reset of call 7 (2000–2300 ms) with only an upstream fault on B
	// long before it: not an explanation.
	h.Faults[2] = Fault{Kind: FaultUpstreamReset, At: at(100), Until: at(100), Pod: -1, Nonce: nonceB}
	vs := Check(h)
	found := false
	for _, v := range vs {
		if v.Invariant == 2 && v.Nonce == nonceB && strings.Contains(v.Detail, "call 7") {
			found = true
		}
	}
	if !found {
		t.Fatalf("an upstream fault outside the call's window explained it: %v", vs)
	}
}

// gatedHistory is validHistory with approval: A (12.50) is at least the
// threshold, was pending once, approved by two people other than its
// requester, consumed just before its one upstream call; B (7) needs none.
func gatedHistory() History {
	h := validHistory()
	h.ApprovalAtLeast, h.ApprovalRequired = "10.00", 2
	h.Calls = append(h.Calls, Call{ID: 10, Kind: KindConfirm, Pod: 0, Nonce: nonceA, Token: tokA, Params: paramsA, Start: at(12), End: at(14), HTTP: 202,
		Envelope: &Envelope{Status: "approval_pending", Retryable: yes(), PollWith: "transfer_status", ApprovalID: "apr_a"}})
	h.Approvals = []ApprovalRow{{
		ID: "apr_a", Key: nonceA, Operation: "transfer", Requester: "alice", State: "CONSUMED", Required: 2,
		Events: []ApprovalEvent{
			{Kind: "requested", Actor: "alice", At: at(13)},
			{Kind: "approved", Actor: "bob", At: at(15)},
			{Kind: "approved", Actor: "carol", At: at(16)},
			{Kind: "consumed", Actor: "alice", At: at(22)},
		},
	}}
	h.Decisions = []Decision{
		{At: at(14), Approver: "alice", ApprovalID: "apr_a", Kind: DecideApprove, Self: true, HTTP: 403, Error: "approval_forbidden"},
		{At: at(15), Approver: "bob", ApprovalID: "apr_a", Kind: DecideApprove, HTTP: 200},
		{At: at(16), Approver: "carol", ApprovalID: "apr_a", Kind: DecideApprove, HTTP: 200},
	}
	return h
}

func TestInvariant7GatedHistoryPasses(t *testing.T) {
	requireOnly(t, gatedHistory(), "", 0)
	// A denied approval whose nonce never ran is a decided end.
	h := gatedHistory()
	h.Approvals = append(h.Approvals, ApprovalRow{ID: "apr_b", Key: nonceB, Requester: "alice", State: "DENIED", Required: 2,
		Events: []ApprovalEvent{{Kind: "requested"}, {Kind: "denied", Actor: "bob"}}})
	h.Upstream = h.Upstream[:1]
	h.ExecutionsByKey, h.TotalExecutions = map[string]int{nonceA: 1}, 1
	h.Rows = map[string]Row{nonceA: h.Rows[nonceA]}
	h.Calls = append(h.Calls[:6], Call{ID: 7, Kind: KindConfirm, Pod: 2, Nonce: nonceB, Token: tokB, Params: paramsB, Start: at(2000), End: at(2010), HTTP: 403,
		Envelope: &Envelope{Status: "approval_denied", Retryable: new(bool)}})
	requireOnly(t, h, "", 0)
}

func TestInvariant7GatedExecutionWithoutApproval(t *testing.T) {
	h := gatedHistory()
	h.Approvals = nil
	requireOnly(t, h, nonceA, 7)
}

func TestInvariant7TooFewApprovers(t *testing.T) {
	h := gatedHistory()
	h.Approvals[0].Events = append(h.Approvals[0].Events[:2], h.Approvals[0].Events[3])
	requireOnly(t, h, nonceA, 7)
	// The same approver twice is one approver.
	h = gatedHistory()
	h.Approvals[0].Events[2].Actor = "bob"
	requireOnly(t, h, nonceA, 7)
}

func TestInvariant7ApprovedByTheRequester(t *testing.T) {
	h := gatedHistory()
	h.Approvals[0].Events[2].Actor = "alice"
	requireOnly(t, h, nonceA, 7)
	// idemgate accepted the requester's approve.
	h = gatedHistory()
	h.Decisions[0].HTTP, h.Decisions[0].Error = 200, ""
	requireOnly(t, h, "", 7)
}

// TestInvariant7RequesterStepUp (docs/design.md §13): the requester's
// approval counts when it recorded the step-up, and is a violation when
// the acr is another or the authentication was too old.
func TestInvariant7RequesterStepUp(t *testing.T) {
	stepped := func(acr string, age time.Duration) History {
		h := gatedHistory()
		e := &h.Approvals[0].Events[2]
		authTime := e.At.Add(-age)
		e.Actor, e.ACR, e.AuthTime = "alice", acr, &authTime
		h.Decisions[2] = Decision{At: at(16), Approver: "alice", ApprovalID: "apr_a", Kind: DecideApprove, Self: true, StepUp: true, HTTP: 200}
		return h
	}
	requireOnly(t, stepped(StepUpACR, time.Minute), "", 0)
	requireOnly(t, stepped("urn:other", time.Minute), nonceA, 7)
	requireOnly(t, stepped(StepUpACR, StepUpMaxAge+time.Minute), nonceA, 7)
	h := stepped(StepUpACR, time.Minute)
	h.Approvals[0].Events[2].AuthTime = nil
	requireOnly(t, h, nonceA, 7)
	// A stepped-up decision the API refused is no violation either.
	h = gatedHistory()
	h.Decisions = append(h.Decisions, Decision{At: at(17), Approver: "alice", ApprovalID: "apr_a", Kind: DecideApprove, Self: true, StepUp: true, HTTP: 409})
	requireOnly(t, h, "", 0)
}

func TestInvariant7ExecutedBeforeConsumed(t *testing.T) {
	h := gatedHistory()
	h.Approvals[0].Events[3].At = at(30) // after the upstream call at 25
	requireOnly(t, h, nonceA, 7)
}

func TestInvariant7NotConsumed(t *testing.T) {
	h := gatedHistory()
	h.Approvals[0].State = "APPROVED"
	h.Approvals[0].Events = h.Approvals[0].Events[:3]
	requireOnly(t, h, nonceA, 7)
}

func TestInvariant7DeniedExecuted(t *testing.T) {
	h := gatedHistory()
	h.Approvals[0].State = "DENIED"
	h.Approvals[0].Events = append(h.Approvals[0].Events[:1], ApprovalEvent{Kind: "denied", Actor: "bob"})
	requireOnly(t, h, nonceA, 7)
}

func TestInvariant7ConsumedTwice(t *testing.T) {
	h := gatedHistory()
	h.Approvals[0].Events = append(h.Approvals[0].Events, ApprovalEvent{Kind: "consumed", Actor: "alice", At: at(24)})
	requireOnly(t, h, nonceA, 7)
	// Or one approval row per nonce twice over: two approvals of one nonce.
	h = gatedHistory()
	second := h.Approvals[0]
	second.ID = "apr_a2"
	h.Approvals = append(h.Approvals, second)
	requireOnly(t, h, nonceA, 7)
}

func TestApprovalAnswersAreDecidable(t *testing.T) {
	// approval_pending is a retry later, not a dead end (invariant 2);
	// one without its approval_id is.
	h := gatedHistory()
	h.Calls[len(h.Calls)-1].Envelope.ApprovalID = ""
	requireOnly(t, h, nonceA, 2)
}
