package approvalapi

import (
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/idemgate/idemgate/extproc/approver"
	"github.com/idemgate/idemgate/extproc/config"
	"github.com/idemgate/idemgate/extproc/security"
	"github.com/idemgate/idemgate/state"
)

// Step-up by the requester (docs/design.md §13): with the operation's
// approvers.requester_step_up, the requester's own approval counts when
// their token's acr is listed (or its amr holds a listed method) and its
// auth_time is at most max_auth_age old. A requester's token that falls
// short is answered 401 with the RFC 9470 challenge, so that the SSO proxy
// or the agent's client authenticates the person again; nothing is
// decided. Denying (cancelling) never needs step-up.

// ReasonStepUpRequired: the requester tried to approve with a token that
// is not strong or fresh enough.
const ReasonStepUpRequired = "approval_step_up_required"

// stepUpLeeway is how far in the future an auth_time may lie (clock skew).
const stepUpLeeway = 60 * time.Second

// stepUpNeed is what the requester's token lacks.
type stepUpNeed struct{ rule *config.StepUpSettings }

// describe says what is needed, for the person.
func (n *stepUpNeed) describe() string {
	var parts []string
	if len(n.rule.ACR) > 0 {
		parts = append(parts, "acr "+strings.Join(n.rule.ACR, " or "))
	}
	if len(n.rule.AMR) > 0 {
		parts = append(parts, "amr "+strings.Join(n.rule.AMR, " or "))
	}
	return strings.Join(parts, ", or ") + ", within the last " + n.rule.MaxAuthAge.String()
}

// challenge is the RFC 9470 WWW-Authenticate value. The values were
// checked by config to need no escaping.
func (n *stepUpNeed) challenge() string {
	c := `Bearer error="insufficient_user_authentication", error_description="approving your own operation needs a stronger or more recent authentication"`
	if len(n.rule.ACR) > 0 {
		c += `, acr_values="` + strings.Join(n.rule.ACR, " ") + `"`
	}
	return c + ", max_age=" + strconv.FormatInt(int64(n.rule.MaxAuthAge/time.Second), 10)
}

// stepUp reports whether step-up applies to who deciding a (the requester,
// under four eyes, with requester_step_up configured) and whether their
// token satisfies it.
func (h *Handler) stepUp(a *state.Approval, who approver.Claims) (applies, strong bool, need *stepUpNeed) {
	op := h.ops[a.Operation]
	if op == nil || op.Approval.StepUp == nil || !a.DistinctFromRequester || who.Subject != a.Requester {
		return false, false, nil
	}
	rule := op.Approval.StepUp
	return true, strongEnough(rule, who, h.now()), &stepUpNeed{rule: rule}
}

// stepUpFor is what a requester's token lacks to approve a, or nil.
func (h *Handler) stepUpFor(a *state.Approval, who approver.Claims) *stepUpNeed {
	if applies, strong, need := h.stepUp(a, who); applies && !strong {
		return need
	}
	return nil
}

func strongEnough(rule *config.StepUpSettings, who approver.Claims, now time.Time) bool {
	listed := who.ACR != "" && contains(rule.ACR, who.ACR)
	for _, m := range who.AMR {
		listed = listed || contains(rule.AMR, m)
	}
	if !listed {
		return false
	}
	// A token without auth_time has it zero: far older than any
	// max_auth_age (Sub saturates).
	age := now.Sub(who.AuthTime)
	return age <= rule.MaxAuthAge && age >= -stepUpLeeway
}

func contains(list []string, v string) bool {
	for _, x := range list {
		if x == v {
			return true
		}
	}
	return false
}

// decision is who's decision on a, carrying how they authenticated; need
// is set (and nothing may be decided) when it is a requester's approval
// that needs step-up first.
func (h *Handler) decision(a *state.Approval, who approver.Claims, approve bool, reason string) (state.Decision, *stepUpNeed) {
	d := state.Decision{ID: a.ID, Approver: who.Subject, Approve: approve, Reason: reason, ACR: who.ACR, AMR: who.AMR, AuthTime: who.AuthTime}
	if !approve {
		return d, nil
	}
	applies, strong, need := h.stepUp(a, who)
	if applies && !strong {
		return d, need
	}
	d.StepUp = applies
	return d, nil
}

// askStepUp sets the RFC 9470 challenge and, for a decision, reports it.
func (h *Handler) askStepUp(w http.ResponseWriter, r *http.Request, a *state.Approval, need *stepUpNeed) {
	w.Header().Set("WWW-Authenticate", need.challenge())
	if r.Method == http.MethodPost {
		h.report(r, security.Event{Reason: ReasonStepUpRequired, Operation: a.Operation, Nonce: a.Key, SubjectTag: a.SubjectTag})
	}
}

func (h *Handler) now() time.Time {
	if h.opts.Now != nil {
		return h.opts.Now()
	}
	return time.Now()
}
