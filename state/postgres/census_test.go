package postgres

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/state"
	"github.com/idemgate/idemgate/state/statetest"
)

// TestCensusCountsWhatWaits: IN_FLIGHT records (and of those the ones
// whose lease ended), UNKNOWN records and pending approvals with the oldest
// one's share of its TTL; terminal records and decided approvals are not
// counted.
func TestCensusCountsWhatWaits(t *testing.T) {
	s := newStore(t, newDatabase(t))
	ctx := t.Context()
	c, err := s.Census(ctx)
	require.NoError(t, err)
	require.Equal(t, Census{}, c, "an empty database")

	acquire := func(lease time.Duration) state.Claim {
		key := statetest.NewKey(t)
		ans, err := s.Acquire(ctx, state.AcquireRequest{Key: key, Scope: "payments.transfer", SubjectTag: "tag", ParamHash: "ph",
			Owner: "o", Lease: lease, Retention: time.Hour})
		require.NoError(t, err)
		require.Equal(t, state.OutcomeAcquired, ans.Outcome)
		return state.Claim{Key: key, Owner: "o", Fence: ans.Record.Fence}
	}
	acquire(time.Hour) // in flight, lease running
	ended := acquire(time.Hour)
	ans, err := s.EndLease(ctx, ended) // in flight, lease ended
	require.NoError(t, err)
	require.Equal(t, state.OutcomeOK, ans.Outcome)
	unknown := acquire(time.Hour)
	ans, err = s.MarkUnknown(ctx, unknown)
	require.NoError(t, err)
	require.Equal(t, state.OutcomeOK, ans.Outcome)
	done := acquire(time.Hour)
	ans, err = s.Complete(ctx, done, state.Completion{State: state.Done, Result: state.Result{Status: 201, Body: []byte(`{}`)}, Retention: time.Hour})
	require.NoError(t, err)
	require.Equal(t, state.OutcomeOK, ans.Outcome)

	// A pending approval a quarter into its TTL, and one decided.
	_, created, err := s.RequestApproval(ctx, state.ApprovalRequest{
		ID: state.NewApprovalID(), Key: statetest.NewKey(t), Operation: "transfer", Scope: "payments.transfer", SubjectTag: "tag",
		Requester: "req", ParamHash: "ph", Params: []byte(`{"amount":"1500.00"}`), Rules: []string{"amount >= 1000.00"},
		Required: 1, DistinctFromRequester: true, ExpiresAt: time.Now().Add(time.Hour),
	})
	require.NoError(t, err)
	require.True(t, created)
	_, err = s.Pool().Exec(ctx, `UPDATE approval SET created_at = now() - interval '20 minutes', expires_at = now() + interval '60 minutes'`)
	require.NoError(t, err)
	approvedFor(t, s, statetest.NewKey(t))

	c, err = s.Census(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(2), c.InFlight)
	require.Equal(t, int64(1), c.InFlightLeaseEnded)
	require.Equal(t, int64(1), c.Unknown)
	require.Equal(t, int64(1), c.PendingApprovals)
	require.InDelta(t, 0.25, c.OldestPendingShare, 0.01)
}
