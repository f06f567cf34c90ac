package tiered

import (
	"context"
	"errors"

	"github.com/idemgate/idemgate/state"
)

// Approvals live in PostgreSQL only (docs/design.md §10): a gated confirm
// takes the PostgreSQL path, where the IN_FLIGHT record is inserted and
// the approval consumed in one transaction. Redis learns of the record
// the way it learns of any record it lost: the next Acquire's claim meets
// PostgreSQL's row, which decides (and Complete writes PostgreSQL first).

var _ state.Approvals = (*Store)(nil)

var errNoApprovals = errors.New("the PostgreSQL store keeps no approvals")

func (s *Store) approvals(op string) (state.Approvals, error) {
	if a, ok := s.pg.(state.Approvals); ok {
		return a, nil
	}
	return nil, state.Unavailable(op, errNoApprovals)
}

// RequestApproval implements state.Approvals on PostgreSQL.
func (s *Store) RequestApproval(ctx context.Context, req state.ApprovalRequest) (state.Approval, bool, error) {
	a, err := s.approvals("request approval")
	if err != nil {
		return state.Approval{}, false, err
	}
	return a.RequestApproval(ctx, req)
}

// ApprovalByKey implements state.Approvals on PostgreSQL.
func (s *Store) ApprovalByKey(ctx context.Context, key string) (state.Approval, bool, error) {
	a, err := s.approvals("read approval")
	if err != nil {
		return state.Approval{}, false, err
	}
	return a.ApprovalByKey(ctx, key)
}

// GetApproval implements state.Approvals on PostgreSQL.
func (s *Store) GetApproval(ctx context.Context, id string) (state.Approval, bool, error) {
	a, err := s.approvals("read approval")
	if err != nil {
		return state.Approval{}, false, err
	}
	return a.GetApproval(ctx, id)
}

// ListApprovals implements state.Approvals on PostgreSQL.
func (s *Store) ListApprovals(ctx context.Context, f state.ApprovalFilter) ([]state.Approval, error) {
	a, err := s.approvals("list approvals")
	if err != nil {
		return nil, err
	}
	return a.ListApprovals(ctx, f)
}

// DecideApproval implements state.Approvals on PostgreSQL.
func (s *Store) DecideApproval(ctx context.Context, d state.Decision) (state.DecisionOutcome, state.Approval, error) {
	a, err := s.approvals("decide approval")
	if err != nil {
		return "", state.Approval{}, err
	}
	return a.DecideApproval(ctx, d)
}

// AcquireApproved implements state.Approvals on PostgreSQL alone: the
// record and the consumption are one PostgreSQL transaction, which a
// Redis claim first could not join.
func (s *Store) AcquireApproved(ctx context.Context, req state.AcquireRequest, approvalID string) (state.ApprovedAnswer, error) {
	a, err := s.approvals("acquire approved")
	if err != nil {
		return state.ApprovedAnswer{}, err
	}
	return a.AcquireApproved(ctx, req, approvalID)
}

// RecordNotified implements state.Approvals on PostgreSQL.
func (s *Store) RecordNotified(ctx context.Context, id, actor string) (bool, error) {
	a, err := s.approvals("record notified")
	if err != nil {
		return false, err
	}
	return a.RecordNotified(ctx, id, actor)
}

// AcquireWithinBudget implements state.Approvals on PostgreSQL alone.
func (s *Store) AcquireWithinBudget(ctx context.Context, req state.AcquireRequest, spends []state.Spend) (state.BudgetAnswer, error) {
	a, err := s.approvals("acquire within budget")
	if err != nil {
		return state.BudgetAnswer{}, err
	}
	return a.AcquireWithinBudget(ctx, req, spends)
}
