package chaos

import (
	"fmt"
	"sort"
	"strings"
	"time"
)

// Report renders what a run did and found: confirms, faults by kind,
// executions, answers by status, UNKNOWNs and their causes, violations, and
// the command that reruns it.
func Report(h History, vs []Violation, opts Options, took time.Duration) string {
	var b strings.Builder
	fmt.Fprintf(&b, "chaos run: seed %d, %s of load (%s total), %d pods, %d agents, %s, ttl.in_flight %s\n",
		h.Seed, opts.Duration, took.Round(time.Second), opts.Pods, opts.Agents, mode(h.HonoursKeys), opts.InFlightTTL)

	kinds := map[string]int{}
	answers := map[string]int{}
	statusAnswers := map[string]int{}
	for _, c := range h.Calls {
		kinds[c.Kind]++
		switch c.Kind {
		case KindConfirm:
			answers[answerName(c)]++
		case KindStatus:
			statusAnswers[answerName(c)]++
		}
	}
	fmt.Fprintf(&b, "calls: %d previews (%d fingerprints issued), %d confirms, %d status polls\n",
		kinds[KindPreview], len(h.Issued), kinds[KindConfirm], kinds[KindStatus])
	fmt.Fprintf(&b, "confirm answers: %s\n", counts(answers))
	fmt.Fprintf(&b, "status answers:  %s\n", counts(statusAnswers))

	faults := map[string]int{}
	for _, f := range h.Faults {
		faults[f.Kind]++
	}
	fmt.Fprintf(&b, "faults (%d): %s\n", len(h.Faults), counts(faults))

	multi := 0
	for _, k := range h.ExecutionsByKey {
		if k > 1 {
			multi++
		}
	}
	fmt.Fprintf(&b, "upstream: %d confirms reached it, %d executions over %d nonces (%d nonces more than once)\n",
		len(h.Upstream), h.TotalExecutions, len(h.ExecutionsByKey), multi)

	states := map[string]int{}
	for _, r := range h.Rows {
		states[r.State]++
	}
	fmt.Fprintf(&b, "PostgreSQL rows: %s\n", counts(states))

	unknown := map[string]bool{}
	unmarked := 0
	for n, r := range h.Rows {
		if r.State == "UNKNOWN" {
			unknown[n] = true
		}
		if ExpiredUnmarked(h, r) {
			unknown[n] = true
			unmarked++
		}
	}
	causes := map[string]int{}
	for n := range unknown {
		if f, ok := UnknownCause(h, n); ok {
			causes[f.Kind]++
		} else {
			causes["(none)"]++
		}
	}
	fmt.Fprintf(&b, "UNKNOWN records: %d (%d of them IN_FLIGHT rows with an expired lease, not yet marked); causes: %s\n", len(unknown), unmarked, counts(causes))

	apStates := map[string]int{}
	for _, a := range h.Approvals {
		apStates[a.State]++
	}
	decisions := map[string]int{}
	for _, d := range h.Decisions {
		name := d.Kind
		if d.Self {
			name = "self_" + name
			if d.StepUp {
				name = "stepped_up_" + name
			}
		}
		switch {
		case d.Err != "":
			name += ":error"
		case d.Error != "":
			name += ":" + d.Error
		default:
			name += fmt.Sprintf(":%d", d.HTTP)
		}
		decisions[name]++
	}
	fmt.Fprintf(&b, "approvals (amount >= %s, %d distinct approvers): %d; %s\n", h.ApprovalAtLeast, h.ApprovalRequired, len(h.Approvals), counts(apStates))
	fmt.Fprintf(&b, "approver decisions: %s\n", counts(decisions))

	fmt.Fprintf(&b, "violations: %d\n", len(vs))
	for i, v := range vs {
		if i == 30 {
			fmt.Fprintf(&b, "  … %d more\n", len(vs)-i)
			break
		}
		fmt.Fprintf(&b, "  %s\n", v)
	}
	fmt.Fprintf(&b, "rerun: %s\n", opts.Rerun)
	return b.String()
}

// answerName names an answer for the tallies: the envelope's status, the
// upstream's HTTP status, or the transport error's class.
func answerName(c Call) string {
	switch {
	case c.Timeout:
		return "client_timeout"
	case c.Err != "":
		return "transport_error"
	case c.Envelope != nil:
		return c.Envelope.Status
	case c.HTTP >= 200 && c.HTTP < 300:
		return fmt.Sprintf("executed_%d", c.HTTP)
	}
	return fmt.Sprintf("http_%d", c.HTTP)
}

func counts(m map[string]int) string {
	if len(m) == 0 {
		return "none"
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s=%d", k, m[k])
	}
	return strings.Join(parts, " ")
}

// Timeline lists everything the history holds about one nonce, in time
// order: the agents' calls, the upstream's log, the faults logged for it
// or on a pod it used while it was in flight, and its final row.
func Timeline(h History, nonce string) string {
	type line struct {
		at   time.Time
		text string
	}
	var ls []line
	pods := map[int]bool{}
	var first, last time.Time
	for _, c := range h.Calls {
		if c.Nonce != nonce {
			continue
		}
		pods[c.Pod] = true
		if first.IsZero() || c.Start.Before(first) {
			first = c.Start
		}
		if c.End.After(last) {
			last = c.End
		}
		ls = append(ls, line{c.Start, fmt.Sprintf("call %d agent %d %s pod %d drifted=%v → %s after %s", c.ID, c.Agent, c.Kind, c.Pod, c.Drifted, describe(c), c.End.Sub(c.Start).Round(time.Millisecond))})
	}
	for _, u := range h.Upstream {
		if u.Nonce == nonce {
			ls = append(ls, line{u.At, fmt.Sprintf("upstream got key %q fault %q → %d %s (after %s)", u.Key, u.Fault, u.Status, clip(u.Body), u.End.Sub(u.At).Round(time.Millisecond))})
		}
	}
	for _, f := range h.Faults {
		hit := f.Nonce == nonce || f.Nonce == "" && (f.Pod < 0 || pods[f.Pod]) && f.At.Before(last.Add(faultSlack)) && first.Before(f.Until.Add(faultSlack))
		if hit {
			ls = append(ls, line{f.At, fmt.Sprintf("fault %s pod %d until +%s: %s", f.Kind, f.Pod, f.Until.Sub(f.At).Round(time.Millisecond), f.Detail)})
		}
	}
	sort.SliceStable(ls, func(i, j int) bool { return ls[i].at.Before(ls[j].at) })
	var b strings.Builder
	fmt.Fprintf(&b, "timeline of %s (executions %d):\n", nonce, h.ExecutionsByKey[nonce])
	for _, l := range ls {
		fmt.Fprintf(&b, "  %s %s\n", l.at.Format("15:04:05.000"), l.text)
	}
	if r, ok := h.Rows[nonce]; ok {
		fmt.Fprintf(&b, "  row: %s status %v body %s\n", r.State, derefInt(r.ResultStatus), clip(r.ResultBody))
	}
	return b.String()
}

// FaultLog lists every fault with its time and window, as injected.
func FaultLog(h History) string {
	var b strings.Builder
	fmt.Fprintf(&b, "fault log (%d):\n", len(h.Faults))
	for _, f := range h.Faults {
		target := "shared"
		if f.Pod >= 0 {
			target = fmt.Sprintf("pod %d", f.Pod)
		}
		if f.Nonce != "" {
			target = "nonce " + f.Nonce
		}
		fmt.Fprintf(&b, "  %s +%-7s %-28s %-38s %s\n", f.At.Format("15:04:05.000"), f.Until.Sub(f.At).Round(time.Millisecond), f.Kind, target, f.Detail)
	}
	return b.String()
}
