package tiered_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/state"
	"github.com/idemgate/idemgate/state/statetest"
	"github.com/idemgate/idemgate/state/tiered"
)

func TestApprovalConformance(t *testing.T) {
	e := newEnv(t)
	statetest.RunApprovals(t, func(t *testing.T) statetest.ApprovalStore {
		return newTiered(t, tiered.Options{Redis: newRedis(t, e.redisSrv.Addr), Postgres: newPostgres(t, e.dsn)})
	}, statetest.ApprovalOptions{})
}

// TestApprovedRecordAnswersThroughRedis: after a gated confirm took the
// PostgreSQL path, retries through the tiered Acquire (Redis first) see
// the record PostgreSQL holds — in flight, then the stored result.
func TestApprovedRecordAnswersThroughRedis(t *testing.T) {
	e := newEnv(t)
	s := newTiered(t, tiered.Options{Redis: newRedis(t, e.redisSrv.Addr), Postgres: newPostgres(t, e.dsn)})
	ctx := t.Context()
	key := statetest.NewKey(t)
	a, _, err := s.RequestApproval(ctx, state.ApprovalRequest{
		ID: state.NewApprovalID(), Key: key, Operation: "transfer", Scope: "payments.transfer", SubjectTag: "subj-tag-1",
		Requester: "req", ParamHash: "ph-1", Params: []byte(`{}`), Required: 1, DistinctFromRequester: true,
		ExpiresAt: time.Now().Add(time.Hour),
	})
	require.NoError(t, err)
	_, _, err = s.DecideApproval(ctx, state.Decision{ID: a.ID, Approver: "alice", Approve: true, Reason: "ok"})
	require.NoError(t, err)
	ans, err := s.AcquireApproved(ctx, statetest.AcquireRequest(key, "o1"), a.ID)
	require.NoError(t, err)
	statetest.RequireOutcome(t, state.OutcomeAcquired, *ans.Answer, nil)

	retry, err := s.Acquire(ctx, statetest.AcquireRequest(key, "o2"))
	statetest.RequireOutcome(t, state.OutcomeInFlight, retry, err)
	require.Equal(t, "o1", retry.Record.Owner)

	done, err := s.Complete(ctx, state.Claim{Key: key, Owner: "o1", Fence: 1}, statetest.Done())
	statetest.RequireOutcome(t, state.OutcomeOK, done, err)
	replay, err := s.Acquire(ctx, statetest.AcquireRequest(key, "o3"))
	statetest.RequireOutcome(t, state.OutcomeDone, replay, err)
	statetest.RequireSameResult(t, statetest.SampleResult(), replay.Record.Result)
}
