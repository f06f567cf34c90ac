package chaos

import (
	"bytes"
	"fmt"
	"math/big"
	"sort"
	"time"
)

// Violation is one broken invariant.
type Violation struct {
	// Invariant is which of Check's seven numbered invariants broke (1..7;
	// docs/testing.md's "Chaos run" lists them).
	Invariant int
	Nonce     string
	Detail    string
}

func (v Violation) String() string {
	if v.Nonce == "" {
		return fmt.Sprintf("invariant %d: %s", v.Invariant, v.Detail)
	}
	return fmt.Sprintf("invariant %d: nonce %s: %s", v.Invariant, v.Nonce, v.Detail)
}

// Answer classes of a confirm (see classify).
const (
	ClassResult      = "result"      // the upstream's own answer, passed through
	ClassReplay      = "replay"      // already_completed / already_failed
	ClassInProgress  = "in_progress" // poll the status tool
	ClassReconcile   = "needs_reconciliation"
	ClassUnavailable = "temporarily_unavailable"
	ClassPreview     = "preview_again" // params_changed, fingerprint_expired...: a new preview
	ClassInfra       = "infra"         // a transport error or a reply idemgate did not write
	// ClassApprovalPending: people have not decided yet; confirm again later.
	ClassApprovalPending = "approval_pending"
	// ClassDenied: a person denied it; decided for good, nothing runs.
	ClassDenied  = "approval_denied"
	ClassDeadEnd = "dead_end" // an answer an agent cannot act on
)

// faultSlack widens a fault's window when matching it to calls: a call
// that failed because of a kill ends a little after the kill was logged,
// and one that was in flight started before.
const faultSlack = 750 * time.Millisecond

// classify says what an agent can make of a confirm answer.
func classify(c Call) string {
	if c.Err != "" {
		return ClassInfra
	}
	e := c.Envelope
	if e == nil {
		switch {
		case c.HTTP >= 200 && c.HTTP < 300:
			return ClassResult
		case c.HTTP >= 400 && c.HTTP < 500 && !ambiguousStatus(c.HTTP):
			return ClassResult // a definite failure the upstream answered
		}
		return ClassInfra
	}
	switch e.Status {
	case "already_completed", "already_failed":
		return ClassReplay
	case "in_progress":
		if e.PollWith != "" {
			return ClassInProgress
		}
	case "needs_reconciliation":
		return ClassReconcile
	case "temporarily_unavailable":
		if e.Retryable != nil && *e.Retryable {
			return ClassUnavailable
		}
	case "approval_pending":
		if e.Retryable != nil && *e.Retryable && e.ApprovalID != "" {
			return ClassApprovalPending
		}
	case "approval_denied":
		return ClassDenied
	case "params_changed", "fingerprint_expired", "fingerprint_invalid", "fingerprint_required", "approval_expired":
		if e.PreviewWith != "" {
			return ClassPreview
		}
	}
	return ClassDeadEnd
}

// ambiguousStatus is docs/design.md §3's ambiguous 4xx.
func ambiguousStatus(code int) bool {
	return code == 408 || code == 409 || code == 425 || code == 429
}

// succeeded says the answer tells the agent its transfer was made.
func succeeded(c Call) bool {
	switch c.Kind {
	case KindConfirm:
		if c.Envelope == nil {
			return c.Err == "" && c.HTTP >= 200 && c.HTTP < 300
		}
		return c.Envelope.Status == "already_completed"
	case KindStatus:
		return c.Envelope != nil && c.Envelope.Status == "completed"
	}
	return false
}

// Check runs every invariant over h and returns the violations, sorted.
func Check(h History) []Violation {
	var out []Violation
	add := func(inv int, nonce, format string, args ...any) {
		out = append(out, Violation{Invariant: inv, Nonce: nonce, Detail: fmt.Sprintf(format, args...)})
	}
	byNonce := map[string][]Call{}
	for _, c := range h.Calls {
		if c.Kind != KindPreview && c.Nonce != "" {
			byNonce[c.Nonce] = append(byNonce[c.Nonce], c)
		}
	}
	upByNonce := map[string][]UpstreamCall{}
	for _, u := range h.Upstream {
		upByNonce[u.Nonce] = append(upByNonce[u.Nonce], u)
	}

	// (1) At most one execution per nonce; exactly one for every nonce a
	// client was told succeeded.
	for _, n := range sortedKeys(h.ExecutionsByKey) {
		if k := h.ExecutionsByKey[n]; k > 1 {
			add(1, n, "executed %d times", k)
		}
	}
	sawSuccess := map[string]bool{}
	for _, c := range h.Calls {
		if succeeded(c) {
			sawSuccess[c.Nonce] = true
		}
	}
	for _, n := range sortedKeys(sawSuccess) {
		if k := h.ExecutionsByKey[n]; k != 1 {
			add(1, n, "a client was told it succeeded, but it executed %d times", k)
		}
	}

	// (2) Every answer is decidable; and every confirmed nonce ends decided.
	for _, c := range h.Calls {
		if c.Kind != KindConfirm {
			continue
		}
		switch cls := classify(c); cls {
		case ClassDeadEnd:
			add(2, c.Nonce, "call %d (pod %d) got a dead end: %d %s", c.ID, c.Pod, c.HTTP, clip(c.Body))
		case ClassInfra:
			if c.Timeout {
				continue // the agent's own deadline: it knows it gave up
			}
			if _, ok := explainingFault(infraFaults(h.Faults), c); !ok {
				add(2, c.Nonce, "call %d (pod %d) got %s with no fault to explain it", c.ID, c.Pod, describe(c))
			}
		case ClassUnavailable:
			if executedDuring(upByNonce[c.Nonce], c) && !overlapsOther(byNonce[c.Nonce], c) {
				add(2, c.Nonce, "call %d answered temporarily_unavailable (nothing executed) but the upstream was called meanwhile", c.ID)
			}
		case ClassPreview:
			if c.Envelope.Status == "params_changed" && !c.Drifted {
				add(2, c.Nonce, "call %d: params_changed for the previewed params", c.ID)
			}
		}
	}
	for _, n := range sortedKeys(byNonce) {
		last, ok := lastDecisive(byNonce[n])
		if !ok {
			continue // only drifted confirms: nothing was ever acquired
		}
		switch cls := classify(last); {
		case last.Kind == KindStatus && last.Envelope != nil && isTerminalStatus(last.Envelope.Status):
		case last.Kind == KindConfirm && (cls == ClassResult || cls == ClassReplay || cls == ClassReconcile || cls == ClassDenied):
		default:
			add(2, n, "never decided: the last answer (call %d) was %s", last.ID, describe(last))
		}
	}

	// (3) Every replay, status result and passed-through success equals the
	// first execution's result byte for byte.
	for _, n := range sortedKeys(byNonce) {
		ref, ok := reference(h, n, upByNonce[n])
		for _, c := range byNonce[n] {
			got, has := resultOf(c)
			if !has {
				continue
			}
			if !ok {
				add(3, n, "call %d carries a result, but the upstream never answered this nonce with one", c.ID)
				continue
			}
			if !bytes.Equal(got, ref) {
				add(3, n, "call %d result %s differs from the first execution's %s", c.ID, clip(got), clip(ref))
			}
		}
	}

	// (4) After the faults stop and leases expire: nothing stuck IN_FLIGHT,
	// every DONE/FAILED row matches the upstream's log.
	if h.RowsAt.Before(h.FaultsEnd.Add(h.InFlightTTL)) {
		add(4, "", "rows read at %s, before the last lease could expire (%s + %s)", h.RowsAt.Format(time.RFC3339Nano), h.FaultsEnd.Format(time.RFC3339Nano), h.InFlightTTL)
	}
	for _, n := range sortedKeys(h.Rows) {
		r := h.Rows[n]
		switch r.State {
		case "IN_FLIGHT":
			if r.LeaseUntil.After(h.RowsAt) {
				add(4, n, "stuck IN_FLIGHT (lease until %s, read at %s)", r.LeaseUntil.Format(time.RFC3339Nano), h.RowsAt.Format(time.RFC3339Nano))
			} else if h.HonoursKeys && h.ExecutionsByKey[n] > 0 {
				// Released or orphaned, and the sweep's confirm (which
				// would re-send the key and complete it) did not.
				add(4, n, "executed, yet its record is still IN_FLIGHT (released, never completed)")
			}
			// With a key-ignoring downstream an expired lease is UNKNOWN
			// (docs/design.md §3): idemgate answers it as
			// needs_reconciliation and marks the row only on the next
			// confirm. It is checked as an UNKNOWN below.
		case "DONE", "FAILED":
			if !rowMatchesUpstream(h, r, upByNonce[n]) {
				add(4, n, "%s row (status %v, body %s) matches nothing the upstream answered", r.State, derefInt(r.ResultStatus), clip(r.ResultBody))
			}
		case "UNKNOWN":
		default:
			add(4, n, "row in unexpected state %q", r.State)
		}
	}
	for _, n := range sortedKeys(h.ExecutionsByKey) {
		if h.ExecutionsByKey[n] == 0 {
			continue
		}
		if r, ok := h.Rows[n]; !ok {
			add(4, n, "executed, but PostgreSQL has no record of it")
		} else if r.State == "FAILED" {
			add(4, n, "executed, but its record says FAILED")
		}
	}

	// (5) Every UNKNOWN traces back to an ambiguous event in the fault log.
	unknown := map[string]bool{}
	for n, r := range h.Rows {
		if r.State == "UNKNOWN" || ExpiredUnmarked(h, r) {
			unknown[n] = true
		}
	}
	for _, c := range h.Calls {
		if c.Envelope != nil && c.Envelope.Status == "needs_reconciliation" {
			unknown[c.Nonce] = true
		}
	}
	for _, n := range sortedKeys(unknown) {
		if _, ok := UnknownCause(h, n); !ok {
			add(5, n, "UNKNOWN with no ambiguous event in the fault log on any of its confirms")
		}
	}

	// (6) Nothing executed without a valid fingerprint for those params.
	attributed := 0
	for _, k := range h.ExecutionsByKey {
		attributed += k
	}
	if h.TotalExecutions != attributed {
		add(6, "", "%d executions, only %d carry a fingerprint's nonce", h.TotalExecutions, attributed)
	}
	for _, n := range sortedKeys(h.ExecutionsByKey) {
		if _, ok := h.Issued[n]; !ok && h.ExecutionsByKey[n] > 0 {
			add(6, n, "executed under a nonce no preview issued")
		}
	}
	for _, u := range h.Upstream {
		is, ok := h.Issued[u.Nonce]
		switch {
		case !ok:
			add(6, u.Nonce, "a confirm reached the upstream with a fingerprint no preview issued (token %s)", clip([]byte(u.Token)))
		case u.Token != is.Token:
			add(6, u.Nonce, "the upstream received token %s, the preview issued %s", clip([]byte(u.Token)), clip([]byte(is.Token)))
		case !sameParams(u.Params, is.Params):
			add(6, u.Nonce, "the upstream received params %+v, the fingerprint binds %+v", u.Params, is.Params)
		case h.HonoursKeys && u.Key != u.Nonce:
			add(6, u.Nonce, "the upstream received Idempotency-Key %q for this fingerprint", u.Key)
		}
	}

	// (7) Human approval (docs/design.md §10).
	checkApprovals(h, upByNonce, add)

	sort.SliceStable(out, func(i, j int) bool {
		if out[i].Invariant != out[j].Invariant {
			return out[i].Invariant < out[j].Invariant
		}
		return out[i].Nonce < out[j].Nonce
	})
	return out
}

// ExpiredUnmarked says r is an IN_FLIGHT row whose lease ran out under a
// key-ignoring downstream: UNKNOWN by docs/design.md §3, though PostgreSQL
// still says IN_FLIGHT because nobody confirmed it since.
func ExpiredUnmarked(h History, r Row) bool {
	return !h.HonoursKeys && r.State == "IN_FLIGHT" && !r.LeaseUntil.After(h.RowsAt)
}

// UnknownCause returns the ambiguous fault that explains an UNKNOWN nonce:
// one logged for that nonce, or one that hit the pod (or the shared
// PostgreSQL) while one of its confirms was in flight.
func UnknownCause(h History, nonce string) (Fault, bool) {
	ambiguous := ambiguousFaults(h.Faults)
	for _, c := range h.Calls {
		if c.Nonce != nonce || c.Kind != KindConfirm {
			continue
		}
		// Only a confirm that may have been acquired and let through can
		// leave its outcome unknown; one refused up front cannot.
		if cls := classify(c); cls != ClassInfra && cls != ClassResult {
			continue
		}
		if f, ok := explainingFault(ambiguous, c); ok {
			return f, true
		}
	}
	for _, f := range ambiguous {
		if f.Nonce == nonce {
			return f, true
		}
	}
	return Fault{}, false
}

// explainingFault finds one of faults that explains what call c got: one
// logged for its nonce, on its pod, or on a shared part, during its window.
func explainingFault(faults []Fault, c Call) (Fault, bool) {
	for _, f := range faults {
		if f.Nonce != "" && f.Nonce != c.Nonce || f.Nonce == "" && f.Pod >= 0 && f.Pod != c.Pod {
			continue
		}
		if f.At.Add(-faultSlack).Before(c.End) && c.Start.Before(f.Until.Add(faultSlack)) {
			return f, true
		}
	}
	return Fault{}, false
}

// ambiguousFaults are the faults that can leave an outcome unknown.
func ambiguousFaults(faults []Fault) []Fault {
	var out []Fault
	for _, f := range faults {
		if f.Ambiguous() {
			out = append(out, f)
		}
	}
	return out
}

// infraFaults are the faults that may take an answer out of idemgate's
// hands: its process or its Envoy gone, the upstream failing the
// connection or the agent giving up. Redis and PostgreSQL faults may not:
// idemgate must answer those itself (temporarily_unavailable at worst).
func infraFaults(faults []Fault) []Fault {
	var out []Fault
	for _, f := range faults {
		switch f.Kind {
		case FaultKillReplica, FaultRestartReplica, FaultEnvoyRestart, FaultUpstreamSlow,
			FaultUpstreamReset, FaultUpstream5xx, FaultClientTimeout:
			out = append(out, f)
		}
	}
	return out
}

// executedDuring says the upstream received a confirm of c's nonce while c
// was waiting for its answer.
func executedDuring(ups []UpstreamCall, c Call) bool {
	for _, u := range ups {
		if !u.At.Before(c.Start) && !u.At.After(c.End) {
			return true
		}
	}
	return false
}

// overlapsOther says another confirm of the same nonce was in flight during c.
func overlapsOther(calls []Call, c Call) bool {
	for _, o := range calls {
		if o.ID != c.ID && o.Kind == KindConfirm && o.Start.Before(c.End) && c.Start.Before(o.End) {
			return true
		}
	}
	return false
}

// lastDecisive is the last confirm or status answer of a nonce that says
// something about its record (drifted confirms never touch it).
func lastDecisive(calls []Call) (Call, bool) {
	var last Call
	found := false
	for _, c := range calls {
		if c.Drifted || (c.Kind != KindConfirm && c.Kind != KindStatus) {
			continue
		}
		if !found || c.End.After(last.End) {
			last, found = c, true
		}
	}
	return last, found
}

func isTerminalStatus(s string) bool {
	return s == "completed" || s == "failed" || s == "needs_reconciliation" || s == "approval_denied"
}

// resultOf is the upstream result a call carries: a passed-through 2xx/4xx
// body, a replay's result, or the status tool's stored result.
func resultOf(c Call) ([]byte, bool) {
	if c.Err != "" {
		return nil, false
	}
	if c.Envelope == nil {
		if c.Kind == KindConfirm && classify(c) == ClassResult {
			return c.Body, true
		}
		return nil, false
	}
	switch c.Envelope.Status {
	case "already_completed", "already_failed", "completed", "failed":
		if len(c.Envelope.Result) > 0 {
			return c.Envelope.Result, true
		}
	}
	return nil, false
}

// reference is the first execution's result of a nonce: what a
// key-honouring payments stored under it, otherwise the first definite
// answer the upstream wrote for it.
func reference(h History, nonce string, ups []UpstreamCall) ([]byte, bool) {
	if h.HonoursKeys {
		if b, ok := h.StoredResult[nonce]; ok {
			return b, true
		}
	}
	for _, u := range ups {
		if u.Status >= 200 && u.Status < 300 || u.Status >= 400 && u.Status < 500 && !ambiguousStatus(u.Status) {
			return u.Body, true
		}
	}
	return nil, false
}

func rowMatchesUpstream(h History, r Row, ups []UpstreamCall) bool {
	if r.ResultStatus == nil {
		return false
	}
	st := *r.ResultStatus
	if r.State == "DONE" && (st < 200 || st >= 300) || r.State == "FAILED" && st < 300 {
		return false
	}
	if h.HonoursKeys && r.State == "DONE" {
		b, ok := h.StoredResult[r.Key]
		return ok && bytes.Equal(b, r.ResultBody) && h.ExecutionsByKey[r.Key] == 1
	}
	for _, u := range ups {
		if u.Status == st && bytes.Equal(u.Body, r.ResultBody) {
			return true
		}
	}
	return false
}

// sameParams compares bound params the way the operation binds them:
// amount as a decimal, the rest byte for byte.
func sameParams(a, b Params) bool {
	if a.Currency != b.Currency || a.Account != b.Account {
		return false
	}
	x, okx := new(big.Rat).SetString(a.Amount)
	y, oky := new(big.Rat).SetString(b.Amount)
	return okx && oky && x.Cmp(y) == 0
}

func describe(c Call) string {
	if c.Err != "" {
		return "error " + c.Err
	}
	if c.Envelope != nil {
		return fmt.Sprintf("%d %s", c.HTTP, c.Envelope.Status)
	}
	return fmt.Sprintf("%d %s", c.HTTP, clip(c.Body))
}

func clip(b []byte) string {
	const max = 160
	if len(b) > max {
		return string(b[:max]) + "…"
	}
	return string(b)
}

func derefInt(p *int) any {
	if p == nil {
		return nil
	}
	return *p
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// checkApprovals is invariant 7: a gated nonce (its previewed amount at
// least h.ApprovalAtLeast) reaches the upstream only with exactly one
// approval, CONSUMED before the call, approved by at least the configured
// number of distinct approvers, the requester among them only with step-up
// recorded (acr StepUpACR, auth_time at most StepUpMaxAge before the
// decision), and denied by nobody; a denied approval never runs; an
// approval is consumed at most once, for its own nonce; idemgate refuses
// every self-approval without step-up.
func checkApprovals(h History, upByNonce map[string][]UpstreamCall, add func(int, string, string, ...any)) {
	if h.ApprovalAtLeast == "" {
		return
	}
	threshold, ok := new(big.Rat).SetString(h.ApprovalAtLeast)
	if !ok {
		add(7, "", "unreadable approval threshold %q", h.ApprovalAtLeast)
		return
	}
	byKey := map[string][]ApprovalRow{}
	for _, a := range h.Approvals {
		byKey[a.Key] = append(byKey[a.Key], a)
		approvers := map[string]bool{}
		consumed, denied := 0, false
		for _, e := range a.Events {
			switch e.Kind {
			case "approved":
				approvers[e.Actor] = true
				if e.Actor == a.Requester && !steppedUp(e) {
					add(7, a.Key, "approval %s was approved by its requester %s without step-up (acr %q, auth_time %v)", a.ID, a.Requester, e.ACR, e.AuthTime)
				}
			case "denied":
				denied = true
			case "consumed":
				consumed++
			}
		}
		if consumed > 1 {
			add(7, a.Key, "approval %s was consumed %d times", a.ID, consumed)
		}
		if (a.State == "CONSUMED") != (consumed == 1) {
			add(7, a.Key, "approval %s is %s with %d consumed events", a.ID, a.State, consumed)
		}
		if denied && (a.State == "CONSUMED" || a.State == "APPROVED") {
			add(7, a.Key, "approval %s was denied, yet it is %s", a.ID, a.State)
		}
		if (a.State == "CONSUMED" || a.State == "APPROVED") && len(approvers) < a.Required {
			add(7, a.Key, "approval %s is %s with %d distinct approvers, %d required", a.ID, a.State, len(approvers), a.Required)
		}
		if denied && len(upByNonce[a.Key]) > 0 {
			add(7, a.Key, "approval %s was denied, yet its nonce reached the upstream %d times", a.ID, len(upByNonce[a.Key]))
		}
	}
	for _, n := range sortedKeys(byKey) {
		if k := len(byKey[n]); k > 1 {
			add(7, n, "%d approvals for one nonce", k)
		}
	}
	executed := map[string]bool{}
	for n := range upByNonce {
		executed[n] = true
	}
	for n, k := range h.ExecutionsByKey {
		if k > 0 {
			executed[n] = true
		}
	}
	for _, n := range sortedKeys(executed) {
		is, ok := h.Issued[n]
		if !ok {
			continue // invariant 6
		}
		amount, ok := new(big.Rat).SetString(is.Params.Amount)
		if !ok || amount.Cmp(threshold) < 0 {
			continue
		}
		as := byKey[n]
		if len(as) != 1 {
			add(7, n, "a gated transfer (amount %s) reached the upstream with %d approvals", is.Params.Amount, len(as))
			continue
		}
		a := as[0]
		if a.State != "CONSUMED" {
			add(7, n, "a gated transfer reached the upstream, but its approval %s is %s", a.ID, a.State)
			continue
		}
		if a.Required < h.ApprovalRequired {
			add(7, n, "approval %s required %d approvers, the run configured %d", a.ID, a.Required, h.ApprovalRequired)
		}
		var consumedAt time.Time
		for _, e := range a.Events {
			if e.Kind == "consumed" {
				consumedAt = e.At
			}
		}
		for _, u := range upByNonce[n] {
			if u.At.Before(consumedAt) {
				add(7, n, "the upstream was called at %s, before approval %s was consumed at %s", u.At.Format(time.RFC3339Nano), a.ID, consumedAt.Format(time.RFC3339Nano))
			}
		}
	}
	for _, d := range h.Decisions {
		if d.Self && !d.StepUp && d.Kind == DecideApprove && d.HTTP >= 200 && d.HTTP < 300 {
			add(7, "", "approval %s: its requester %s approved it without step-up (HTTP %d)", d.ApprovalID, d.Approver, d.HTTP)
		}
	}
}

// steppedUp reports whether an approved event records the run's step-up:
// the listed acr and an auth_time recent enough when it was decided.
func steppedUp(e ApprovalEvent) bool {
	if e.ACR != StepUpACR || e.AuthTime == nil {
		return false
	}
	age := e.At.Sub(*e.AuthTime)
	return age <= StepUpMaxAge && age >= -time.Minute
}
