package memory

import (
	"context"
	"errors"
	"math/big"
	"slices"
	"sort"
	"time"

	"github.com/idemgate/idemgate/state"
)

// Approvals live with the records under the one mutex, so AcquireApproved
// creates the record and consumes the approval in one critical section:
// the memory store's transaction. Approvals are kept for the life of the
// process (the demo's); they are few and the audit trail must stay.

var _ state.Approvals = (*Store)(nil)

func cloneApproval(a *state.Approval) state.Approval {
	out := *a
	out.Params = slices.Clone(a.Params)
	out.Rules = slices.Clone(a.Rules)
	out.Events = slices.Clone(a.Events)
	return out
}

// lapse marks an open approval past expires_at EXPIRED (and tells
// OnApprovalLapse). Called with s.mu held.
func (s *Store) lapse(a *state.Approval, now time.Time) {
	if a.State.Open() && !now.Before(a.ExpiresAt) {
		a.State = state.ApprovalExpired
		a.UpdatedAt = now
		a.Events = append(a.Events, state.ApprovalEvent{Kind: state.EventExpired, Actor: "idemgate", At: now})
		if s.onLapse != nil {
			s.onLapse(a.Operation)
		}
	}
}

// OnApprovalLapse sets fn to be told the operation of each approval this
// store marks EXPIRED, once (serve counts them in
// idemgate_approval_transitions_total). fn runs under the store's lock:
// it must not call the store. Set it before use.
func (s *Store) OnApprovalLapse(fn func(operation string)) { s.onLapse = fn }

// RequestApproval implements state.Approvals.
func (s *Store) RequestApproval(ctx context.Context, req state.ApprovalRequest) (state.Approval, bool, error) {
	if err := req.Validate(); err != nil {
		return state.Approval{}, false, err
	}
	now, err := s.begin(ctx, "request approval")
	if err != nil {
		return state.Approval{}, false, err
	}
	defer s.mu.Unlock()
	if id, ok := s.approvalKeys[req.Key]; ok {
		a := s.approvals[id]
		s.lapse(a, now)
		return cloneApproval(a), false, nil
	}
	a := &state.Approval{
		ID: req.ID, Key: req.Key, Operation: req.Operation, Scope: req.Scope, SubjectTag: req.SubjectTag,
		Requester: req.Requester, ParamHash: req.ParamHash, Params: slices.Clone(req.Params), Rules: slices.Clone(req.Rules),
		Required: req.Required, DistinctFromRequester: req.DistinctFromRequester, State: state.ApprovalPending,
		CreatedAt: now, UpdatedAt: now, ExpiresAt: req.ExpiresAt.Truncate(time.Microsecond),
		Events: []state.ApprovalEvent{{Kind: state.EventRequested, Actor: req.Requester, ParamHash: req.ParamHash, At: now}},
	}
	if _, dup := s.approvals[req.ID]; dup {
		return state.Approval{}, false, state.Unavailable("request approval", errDuplicateID)
	}
	s.approvals[a.ID] = a
	s.approvalKeys[a.Key] = a.ID
	s.writeSpends(req.Key, req.Spends, now, false)
	return cloneApproval(a), true, nil
}

// ApprovalByKey implements state.Approvals.
func (s *Store) ApprovalByKey(ctx context.Context, key string) (state.Approval, bool, error) {
	if err := state.ValidKey(key); err != nil {
		return state.Approval{}, false, err
	}
	now, err := s.begin(ctx, "read approval")
	if err != nil {
		return state.Approval{}, false, err
	}
	defer s.mu.Unlock()
	id, ok := s.approvalKeys[key]
	if !ok {
		return state.Approval{}, false, nil
	}
	a := s.approvals[id]
	s.lapse(a, now)
	return cloneApproval(a), true, nil
}

// GetApproval implements state.Approvals.
func (s *Store) GetApproval(ctx context.Context, id string) (state.Approval, bool, error) {
	now, err := s.begin(ctx, "read approval")
	if err != nil {
		return state.Approval{}, false, err
	}
	defer s.mu.Unlock()
	a, ok := s.approvals[id]
	if !ok {
		return state.Approval{}, false, nil
	}
	s.lapse(a, now)
	return cloneApproval(a), true, nil
}

// ListApprovals implements state.Approvals.
func (s *Store) ListApprovals(ctx context.Context, f state.ApprovalFilter) ([]state.Approval, error) {
	now, err := s.begin(ctx, "list approvals")
	if err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	var out []state.Approval
	for _, a := range s.approvals {
		s.lapse(a, now)
		if f.State == "" || a.State == f.State {
			out = append(out, cloneApproval(a))
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if !out[i].CreatedAt.Equal(out[j].CreatedAt) {
			return out[i].CreatedAt.Before(out[j].CreatedAt)
		}
		return out[i].ID < out[j].ID
	})
	if f.Limit > 0 && len(out) > f.Limit {
		out = out[:f.Limit]
	}
	return out, nil
}

// DecideApproval implements state.Approvals.
func (s *Store) DecideApproval(ctx context.Context, d state.Decision) (state.DecisionOutcome, state.Approval, error) {
	if err := d.Validate(); err != nil {
		return "", state.Approval{}, err
	}
	now, err := s.begin(ctx, "decide approval")
	if err != nil {
		return "", state.Approval{}, err
	}
	defer s.mu.Unlock()
	a, ok := s.approvals[d.ID]
	if !ok {
		return state.DecisionNotFound, state.Approval{}, nil
	}
	s.lapse(a, now)
	out := state.DecideOn(a, d, now)
	return out, cloneApproval(a), nil
}

// AcquireApproved implements state.Approvals.
func (s *Store) AcquireApproved(ctx context.Context, req state.AcquireRequest, approvalID string) (state.ApprovedAnswer, error) {
	if err := req.Validate(); err != nil {
		return state.ApprovedAnswer{}, err
	}
	now, err := s.begin(ctx, "acquire approved")
	if err != nil {
		return state.ApprovedAnswer{}, err
	}
	defer s.mu.Unlock()
	a, ok := s.approvals[approvalID]
	if !ok {
		return state.ApprovedAnswer{}, nil
	}
	s.lapse(a, now)
	if !state.Grants(a, req) {
		return state.ApprovedAnswer{Approval: cloneApproval(a)}, nil
	}
	ans := s.acquireLocked(req, now)
	if ans.Outcome == state.OutcomeAcquired {
		// The execution counts on its own day.
		for k, sp := range s.spends {
			if k.key == req.Key {
				sp.day = utcDay(now)
			}
		}
		a.State = state.ApprovalConsumed
		a.UpdatedAt = now
		a.Events = append(a.Events, state.ApprovalEvent{Kind: state.EventConsumed, Actor: req.Owner, ParamHash: req.ParamHash, At: now})
	}
	return state.ApprovedAnswer{Approval: cloneApproval(a), Answer: &ans}, nil
}

var errDuplicateID = errors.New("approval id already used")

// RecordNotified implements state.Approvals.
func (s *Store) RecordNotified(ctx context.Context, id, actor string) (bool, error) {
	now, err := s.begin(ctx, "record notified")
	if err != nil {
		return false, err
	}
	defer s.mu.Unlock()
	a, ok := s.approvals[id]
	if !ok {
		return false, nil
	}
	a.Events = append(a.Events, state.ApprovalEvent{Kind: state.EventNotified, Actor: actor, At: now})
	return true, nil
}

type spendKey struct{ key, budget string }

type spend struct {
	operation string
	day       string
	amount    *big.Rat
}

func utcDay(t time.Time) string { return t.UTC().Format(time.DateOnly) }

// writeSpends records what key adds to its budgets; moveDay puts existing
// rows on today (an execution counts on its own day).
func (s *Store) writeSpends(key string, spends []state.Spend, now time.Time, moveDay bool) {
	for _, sp := range spends {
		k := spendKey{key, sp.Budget}
		if old, ok := s.spends[k]; ok {
			if moveDay {
				old.day = utcDay(now)
			}
			continue
		}
		amount, _ := state.ParseAmount(sp.Amount)
		s.spends[k] = &spend{operation: sp.Operation, day: utcDay(now), amount: amount}
	}
}

// counts reports whether key's spends count: its record is IN_FLIGHT, DONE
// or UNKNOWN, or without a record its approval is PENDING or APPROVED.
func (s *Store) counts(key string, now time.Time) bool {
	if rec, ok := s.records[key]; ok && now.Before(rec.ExpiresAt) {
		return rec.State != state.Failed
	}
	id, ok := s.approvalKeys[key]
	if !ok {
		return false
	}
	a := s.approvals[id]
	s.lapse(a, now)
	return a.State.Open()
}

// total is today's sum of budget in operation.
func (s *Store) total(operation, budget string, now time.Time) *big.Rat {
	sum := new(big.Rat)
	today := utcDay(now)
	for k, sp := range s.spends {
		if k.budget == budget && sp.operation == operation && sp.day == today && s.counts(k.key, now) {
			sum.Add(sum, sp.amount)
		}
	}
	return sum
}

// AcquireWithinBudget implements state.Approvals.
func (s *Store) AcquireWithinBudget(ctx context.Context, req state.AcquireRequest, spends []state.Spend) (state.BudgetAnswer, error) {
	if err := req.Validate(); err != nil {
		return state.BudgetAnswer{}, err
	}
	for _, sp := range spends {
		if err := sp.Validate(); err != nil {
			return state.BudgetAnswer{}, err
		}
	}
	now, err := s.begin(ctx, "acquire within budget")
	if err != nil {
		return state.BudgetAnswer{}, err
	}
	defer s.mu.Unlock()
	if rec := s.lookup(req.Key, now); rec != nil {
		ans := s.acquireLocked(req, now)
		return state.BudgetAnswer{Answer: &ans}, nil
	}
	var exceeded []int
	for i, sp := range spends {
		amount, _ := state.ParseAmount(sp.Amount)
		over, _ := state.ParseAmount(sp.Over)
		if sum := s.total(sp.Operation, sp.Budget, now); sum.Add(sum, amount).Cmp(over) > 0 {
			exceeded = append(exceeded, i)
		}
	}
	if len(exceeded) > 0 {
		return state.BudgetAnswer{Exceeded: exceeded}, nil
	}
	ans := s.acquireLocked(req, now)
	if ans.Outcome == state.OutcomeAcquired {
		s.writeSpends(req.Key, spends, now, true)
	}
	return state.BudgetAnswer{Answer: &ans}, nil
}
