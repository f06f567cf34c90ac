package state

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"math/big"
	"strings"
	"time"
)

// Approvals (docs/design.md §10) are people's consent to one gated confirm:
// bound to its nonce, scope, parameter hash and subject, decided by
// approvers, and consumed by the execution itself.
//
//	(absent) --RequestApproval--------------------------> PENDING
//	PENDING  --DecideApproval approve (required distinct
//	            approvers reached)-----------------------> APPROVED
//	PENDING  --DecideApproval deny (anyone allowed)------> DENIED
//	PENDING | APPROVED --expires_at passes (seen by any
//	            call)------------------------------------> EXPIRED
//	APPROVED --AcquireApproved: in the same transaction
//	            that creates the IN_FLIGHT record--------> CONSUMED
//
// DENIED, EXPIRED and CONSUMED are final. A FAILED or UNKNOWN execution
// does not free a CONSUMED approval. Every transition appends an
// ApprovalEvent; events are never changed or deleted.

// ApprovalState is where an approval is.
type ApprovalState string

const (
	ApprovalPending  ApprovalState = "PENDING"
	ApprovalApproved ApprovalState = "APPROVED"
	ApprovalDenied   ApprovalState = "DENIED"
	ApprovalExpired  ApprovalState = "EXPIRED"
	ApprovalConsumed ApprovalState = "CONSUMED"
)

// Open reports whether the approval may still change (PENDING or APPROVED).
func (s ApprovalState) Open() bool { return s == ApprovalPending || s == ApprovalApproved }

// Event kinds of the audit trail.
const (
	EventRequested = "requested"
	EventNotified  = "notified"
	EventApproved  = "approved"
	EventDenied    = "denied"
	EventExpired   = "expired"
	EventConsumed  = "consumed"
)

// ApprovalEvent is one append-only audit row.
type ApprovalEvent struct {
	Kind   string
	Actor  string
	Reason string
	// ParamHash is the hash of the params the actor was shown (decisions).
	ParamHash string
	At        time.Time
	// ACR, AMR and AuthTime are how the deciding person authenticated, as
	// their token said (docs/design.md §13); empty and zero otherwise.
	ACR      string
	AMR      []string
	AuthTime time.Time
}

// Approval is one approval request with its audit trail.
type Approval struct {
	ID         string
	Key        string // the nonce of the fingerprint it approves
	Operation  string
	Scope      string
	SubjectTag string
	// Requester is the subject that confirmed (who may not approve when
	// DistinctFromRequester).
	Requester string
	ParamHash string
	// Params is the canonical bound params as a JSON object: what the
	// approver is shown.
	Params []byte
	// Rules are the rules that fired, as text.
	Rules                 []string
	Required              int
	DistinctFromRequester bool
	State                 ApprovalState
	CreatedAt             time.Time
	UpdatedAt             time.Time
	ExpiresAt             time.Time
	// Events is the audit trail, oldest first.
	Events []ApprovalEvent
}

// Approvers returns the distinct subjects that approved, in order.
func (a *Approval) Approvers() []string {
	var out []string
	seen := map[string]bool{}
	for _, e := range a.Events {
		if e.Kind == EventApproved && !seen[e.Actor] {
			seen[e.Actor] = true
			out = append(out, e.Actor)
		}
	}
	return out
}

// ApprovalRequest creates the approval of one gated confirm.
type ApprovalRequest struct {
	ID                    string // NewApprovalID
	Key                   string
	Operation             string
	Scope                 string
	SubjectTag            string
	Requester             string
	ParamHash             string
	Params                []byte
	Rules                 []string
	Required              int
	DistinctFromRequester bool
	// ExpiresAt is the fingerprint's exp: an approval never outlives the
	// token it approves.
	ExpiresAt time.Time
	// Spends are what the confirm adds to its operation's daily_total
	// budgets: written with the approval (a PENDING or APPROVED approval
	// counts toward them), moved to the day of the execution when it is
	// consumed.
	Spends []Spend
}

// Spend is what one confirm adds to a daily_total budget (docs/design.md
// §10): the sum over a UTC day of its nonces whose record is IN_FLIGHT, DONE
// or UNKNOWN, or, without a record, whose approval is PENDING or APPROVED.
type Spend struct {
	Operation string
	// Budget names the budget within the operation: the subject tag and
	// the values of the rule's per params (opaque to the store).
	Budget string
	// Amount is the confirm's exact decimal; Over the budget's limit
	// (exceeded when the day's total is strictly greater).
	Amount string
	Over   string
}

// Validate checks a Spend's decimals.
func (sp Spend) Validate() error {
	if sp.Operation == "" || sp.Budget == "" {
		return fmt.Errorf("%w: a spend needs an operation and a budget", ErrInvalidArgument)
	}
	if _, ok := ParseAmount(sp.Amount); !ok {
		return fmt.Errorf("%w: spend amount %q is not a decimal", ErrInvalidArgument, sp.Amount)
	}
	if _, ok := ParseAmount(sp.Over); !ok {
		return fmt.Errorf("%w: spend limit %q is not a decimal", ErrInvalidArgument, sp.Over)
	}
	return nil
}

// ParseAmount reads a plain decimal ("-12.50", no exponent) exactly.
func ParseAmount(s string) (*big.Rat, bool) {
	if s == "" {
		return nil, false
	}
	for i, c := range s {
		if !(c >= '0' && c <= '9' || c == '.' || (c == '-' && i == 0)) {
			return nil, false
		}
	}
	return new(big.Rat).SetString(s)
}

// BudgetAnswer is the answer of AcquireWithinBudget: Exceeded lists the
// indexes of the spends whose budget this confirm would take past its
// limit (nothing was written; the confirm needs approval), else Answer is
// what Acquire answered.
type BudgetAnswer struct {
	Answer   *Answer
	Exceeded []int
}

// Validate checks an ApprovalRequest.
func (r ApprovalRequest) Validate() error {
	if err := ValidKey(r.Key); err != nil {
		return err
	}
	switch {
	case !validApprovalID(r.ID):
		return fmt.Errorf("%w: approval id %q is not apr_ and 32 hex characters", ErrInvalidArgument, r.ID)
	case r.Requester == "":
		return fmt.Errorf("%w: requester is empty", ErrInvalidArgument)
	case r.ParamHash == "":
		return fmt.Errorf("%w: param hash is empty", ErrInvalidArgument)
	case r.Required < 1:
		return fmt.Errorf("%w: required must be positive", ErrInvalidArgument)
	case r.ExpiresAt.IsZero():
		return fmt.Errorf("%w: expires_at is zero", ErrInvalidArgument)
	}
	for _, sp := range r.Spends {
		if err := sp.Validate(); err != nil {
			return err
		}
	}
	return nil
}

// NewApprovalID returns a fresh opaque approval id ("apr_" and 32 hex
// characters; not derived from the nonce).
func NewApprovalID() string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err) // crypto/rand does not fail on supported platforms
	}
	return "apr_" + hex.EncodeToString(b[:])
}

func validApprovalID(id string) bool {
	rest, ok := strings.CutPrefix(id, "apr_")
	return ok && ValidKey(rest) == nil
}

// Decision is an approver's approve or deny.
type Decision struct {
	ID       string
	Approver string // the verified subject, or an operator's --as
	Approve  bool
	Reason   string
	// StepUp: the approver is the requester and authenticated strongly and
	// recently enough for the operation's requester_step_up (checked by
	// the approvers' API); their approval then counts although
	// DistinctFromRequester (docs/design.md §13).
	StepUp bool
	// ACR, AMR and AuthTime are recorded with the decision.
	ACR      string
	AMR      []string
	AuthTime time.Time
}

// Validate checks a Decision.
func (d Decision) Validate() error {
	switch {
	case !validApprovalID(d.ID):
		return fmt.Errorf("%w: approval id %q is not apr_ and 32 hex characters", ErrInvalidArgument, d.ID)
	case d.Approver == "":
		return fmt.Errorf("%w: approver is empty", ErrInvalidArgument)
	case strings.TrimSpace(d.Reason) == "":
		return fmt.Errorf("%w: reason is empty", ErrInvalidArgument)
	}
	return nil
}

// DecisionOutcome is the answer to DecideApproval.
type DecisionOutcome string

const (
	// DecisionRecorded: the decision was recorded (the state may have moved).
	DecisionRecorded DecisionOutcome = "RECORDED"
	// DecisionRepeated: this approver had already approved; it counts once.
	DecisionRepeated DecisionOutcome = "REPEATED"
	// DecisionSelfApproval: the requester may not approve its own confirm.
	DecisionSelfApproval DecisionOutcome = "SELF_APPROVAL"
	// DecisionNotPending: the approval is APPROVED, DENIED, EXPIRED or
	// CONSUMED (an approval that lapsed just now is marked EXPIRED).
	DecisionNotPending DecisionOutcome = "NOT_PENDING"
	// DecisionNotFound: no approval has that id.
	DecisionNotFound DecisionOutcome = "NOT_FOUND"
)

// ApprovalFilter selects approvals to list ("" State: every state).
type ApprovalFilter struct {
	State ApprovalState
	Limit int
}

// ApprovedAnswer is the answer of AcquireApproved: Approval as it is after
// the call, and, when the approval allowed it, the Acquire answer.
// Acquired is true only when the record was created and the approval
// consumed together.
type ApprovedAnswer struct {
	Approval Approval
	// Answer is set when the approval was APPROVED for this nonce and
	// param hash: ACQUIRED (the approval is now CONSUMED) or what is
	// already there (the approval is left as it was).
	Answer *Answer
}

// Approvals is implemented by the stores that keep approvals: postgres
// (the truth), memory (one process) and tiered (its PostgreSQL).
type Approvals interface {
	// RequestApproval creates the approval of req.Key as PENDING (with a
	// requested event), or returns the one that exists for that nonce
	// (created false), whatever its state. One approval per nonce.
	RequestApproval(ctx context.Context, req ApprovalRequest) (a Approval, created bool, err error)

	// ApprovalByKey reads the approval of a nonce. An open approval past
	// its expires_at is returned EXPIRED (and stored so).
	ApprovalByKey(ctx context.Context, key string) (Approval, bool, error)

	// GetApproval reads an approval by id, lapsing it like ApprovalByKey.
	GetApproval(ctx context.Context, id string) (Approval, bool, error)

	// ListApprovals lists approvals, oldest first, lapsing them likewise.
	ListApprovals(ctx context.Context, f ApprovalFilter) ([]Approval, error)

	// DecideApproval records an approve or deny on a PENDING approval. A
	// deny by anyone (the requester too: a cancel) makes it DENIED; an
	// approve by the requester when DistinctFromRequester is refused
	// (SELF_APPROVAL); an approver counts once; Required distinct
	// approvers make it APPROVED.
	DecideApproval(ctx context.Context, d Decision) (DecisionOutcome, Approval, error)

	// AcquireApproved is Acquire for a gated confirm: in one atomic step
	// it checks that approvalID is APPROVED, unexpired and for req.Key and
	// req.ParamHash, creates the IN_FLIGHT record and marks the approval
	// CONSUMED. If any check fails nothing is written (a lapsed approval
	// is marked EXPIRED) and Answer is nil; if a record already exists the
	// approval is left as it was and Answer says what is there.
	AcquireApproved(ctx context.Context, req AcquireRequest, approvalID string) (ApprovedAnswer, error)

	// AcquireWithinBudget is Acquire for a confirm of an operation with
	// daily_total rules that needs no approval otherwise: atomically, and
	// serialised per budget, it answers what exists when the nonce has a
	// record; else it sums today's budgets (UTC, the store's clock) with
	// the spends and, when none is exceeded, creates the IN_FLIGHT record
	// and writes the spends; when one is, it writes nothing.
	AcquireWithinBudget(ctx context.Context, req AcquireRequest, spends []Spend) (BudgetAnswer, error)

	// RecordNotified appends a notified event (actor: who was told) to an
	// approval; its state does not change. found is false for an unknown id.
	RecordNotified(ctx context.Context, id, actor string) (found bool, err error)
}

// Grants reports whether a (already lapsed if due) lets req execute: it is
// APPROVED, for req's nonce and parameter hash. Backends call it inside
// the step that consumes the approval.
func Grants(a *Approval, req AcquireRequest) bool {
	return a.State == ApprovalApproved && a.Key == req.Key && a.ParamHash == req.ParamHash
}

// DecideOn applies d to a (already lapsed if due) at now, appending the
// event: the rules of DecideApproval, shared by the backends that keep an
// approval in memory while they decide (memory; PostgreSQL under a row
// lock).
func DecideOn(a *Approval, d Decision, now time.Time) DecisionOutcome {
	if a.State != ApprovalPending {
		if d.Approve && a.State == ApprovalApproved && slicesContains(a.Approvers(), d.Approver) {
			return DecisionRepeated
		}
		return DecisionNotPending
	}
	if !d.Approve {
		a.State = ApprovalDenied
		a.UpdatedAt = now
		a.Events = append(a.Events, decisionEvent(EventDenied, a, d, now))
		return DecisionRecorded
	}
	if a.DistinctFromRequester && d.Approver == a.Requester && !d.StepUp {
		return DecisionSelfApproval
	}
	if slicesContains(a.Approvers(), d.Approver) {
		return DecisionRepeated
	}
	a.Events = append(a.Events, decisionEvent(EventApproved, a, d, now))
	a.UpdatedAt = now
	if len(a.Approvers()) >= a.Required {
		a.State = ApprovalApproved
	}
	return DecisionRecorded
}

func decisionEvent(kind string, a *Approval, d Decision, now time.Time) ApprovalEvent {
	return ApprovalEvent{Kind: kind, Actor: d.Approver, Reason: d.Reason, ParamHash: a.ParamHash, At: now,
		ACR: d.ACR, AMR: append([]string(nil), d.AMR...), AuthTime: d.AuthTime}
}

func slicesContains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}
