package postgres

import (
	"context"

	"github.com/idemgate/idemgate/state"
)

// Census counts what may need a person: the records not terminal, and the
// pending approvals with how far the oldest is into its TTL. Monitoring
// reads it (idemgate_store_records, idemgate_approvals_pending); every
// replica sees the same numbers, PostgreSQL being the truth.
type Census struct {
	// InFlight counts IN_FLIGHT records, InFlightLeaseEnded those of them
	// whose lease has ended (no owner is working on them: a retry takes
	// them over, or nobody comes back), Unknown the UNKNOWN records (a
	// person reconciles each: idemgate ops resolve).
	InFlight, InFlightLeaseEnded, Unknown int64
	// PendingApprovals counts approvals waiting for a decision;
	// OldestPendingShare is the largest (now - created) / (expires -
	// created) among them: 0.5 is half its TTL gone, 1 or more expired and
	// not yet marked so.
	PendingApprovals   int64
	OldestPendingShare float64
}

// Census reads the counts. Both queries read only the rows they count, by
// the (state, updated_at) and (state, created_at) indexes, never the
// terminal records.
func (s *Store) Census(ctx context.Context) (Census, error) {
	var c Census
	err := s.pool.QueryRow(ctx, `SELECT
  count(*) FILTER (WHERE state = 'IN_FLIGHT'),
  count(*) FILTER (WHERE state = 'IN_FLIGHT' AND lease_until <= now()),
  count(*) FILTER (WHERE state = 'UNKNOWN')
FROM idempotency_record WHERE state IN ('IN_FLIGHT', 'UNKNOWN')`).Scan(&c.InFlight, &c.InFlightLeaseEnded, &c.Unknown)
	if err != nil {
		return Census{}, state.Unavailable("census of records", err)
	}
	err = s.pool.QueryRow(ctx, `SELECT count(*),
  coalesce(max(extract(epoch FROM now() - created_at) / nullif(extract(epoch FROM expires_at - created_at), 0)), 0)::float8
FROM approval WHERE state = 'PENDING'`).Scan(&c.PendingApprovals, &c.OldestPendingShare)
	if err != nil {
		return Census{}, state.Unavailable("census of approvals", err)
	}
	return c, nil
}
