package postgres

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/state"
	"github.com/idemgate/idemgate/state/statetest"
)

func approvedFor(t *testing.T, s *Store, key string) state.Approval {
	t.Helper()
	a, created, err := s.RequestApproval(t.Context(), state.ApprovalRequest{
		ID: state.NewApprovalID(), Key: key, Operation: "transfer", Scope: "payments.transfer", SubjectTag: "subj-tag-1",
		Requester: "req", ParamHash: "ph-1", Params: []byte(`{"amount":"1500.00"}`), Rules: []string{"amount >= 1000.00"},
		Required: 1, DistinctFromRequester: true, ExpiresAt: time.Now().Add(time.Hour),
	})
	require.NoError(t, err)
	require.True(t, created)
	out, a, err := s.DecideApproval(t.Context(), state.Decision{ID: a.ID, Approver: "alice", Approve: true, Reason: "ok"})
	require.NoError(t, err)
	require.Equal(t, state.DecisionRecorded, out)
	return a
}

// TestConsumptionIsTheExecution makes each half of AcquireApproved fail in
// turn, inside the database: the record insert, then the approval's
// consumption. Whichever fails, neither is left without the other — the
// record and the CONSUMED approval are one transaction.
func TestConsumptionIsTheExecution(t *testing.T) {
	dsn := newDatabase(t)
	s := newStore(t, dsn)
	ctx := t.Context()

	t.Run("record insert fails", func(t *testing.T) {
		key := statetest.NewKey(t)
		a := approvedFor(t, s, key)
		_, err := s.Pool().Exec(ctx, `CREATE FUNCTION fail_insert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN RAISE EXCEPTION 'insert refused by test'; END $$;
CREATE TRIGGER fail_insert BEFORE INSERT ON idempotency_record FOR EACH ROW EXECUTE FUNCTION fail_insert();`)
		require.NoError(t, err)
		t.Cleanup(func() {
			_, _ = s.Pool().Exec(ctx, `DROP TRIGGER fail_insert ON idempotency_record; DROP FUNCTION fail_insert();`)
		})
		_, err = s.AcquireApproved(ctx, statetest.AcquireRequest(key, "o1"), a.ID)
		require.ErrorIs(t, err, state.ErrUnavailable)
		got, _, err := s.GetApproval(ctx, a.ID)
		require.NoError(t, err)
		require.Equal(t, state.ApprovalApproved, got.State, "no record, so the approval is not consumed")
		require.Len(t, got.Events, 2)
	})

	t.Run("consumption fails", func(t *testing.T) {
		key := statetest.NewKey(t)
		a := approvedFor(t, s, key)
		_, err := s.Pool().Exec(ctx, `CREATE FUNCTION fail_consume() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN IF NEW.state = 'CONSUMED' THEN RAISE EXCEPTION 'consumption refused by test'; END IF; RETURN NEW; END $$;
CREATE TRIGGER fail_consume BEFORE UPDATE ON approval FOR EACH ROW EXECUTE FUNCTION fail_consume();`)
		require.NoError(t, err)
		t.Cleanup(func() {
			_, _ = s.Pool().Exec(ctx, `DROP TRIGGER fail_consume ON approval; DROP FUNCTION fail_consume();`)
		})
		_, err = s.AcquireApproved(ctx, statetest.AcquireRequest(key, "o1"), a.ID)
		require.ErrorIs(t, err, state.ErrUnavailable)
		_, found, err := s.Get(ctx, key)
		require.NoError(t, err)
		require.False(t, found, "an approval that was not consumed started no execution")
	})
}

// TestApprovalEventsAreAppendOnly: the audit trail refuses changes.
func TestApprovalEventsAreAppendOnly(t *testing.T) {
	dsn := newDatabase(t)
	s := newStore(t, dsn)
	a := approvedFor(t, s, statetest.NewKey(t))
	_, err := s.Pool().Exec(t.Context(), `UPDATE approval_event SET actor = 'mallory' WHERE approval_id = $1`, a.ID)
	require.ErrorContains(t, err, "append-only")
	_, err = s.Pool().Exec(t.Context(), `DELETE FROM approval_event WHERE approval_id = $1`, a.ID)
	require.ErrorContains(t, err, "append-only")
}

// TestResolveAsRecordsWhoAndWhy: a hand settlement and its audit row are
// one transaction; a record already terminal gets neither.
func TestResolveAsRecordsWhoAndWhy(t *testing.T) {
	dsn := newDatabase(t)
	s := newStore(t, dsn)
	ctx := t.Context()
	key := statetest.NewKey(t)
	a, err := s.Acquire(ctx, statetest.AcquireRequest(key, "o1"))
	statetest.RequireOutcome(t, state.OutcomeAcquired, a, err)
	_, err = s.ResolveAs(ctx, key, statetest.Done(), "carol", " ")
	require.ErrorIs(t, err, state.ErrInvalidArgument)
	ans, err := s.ResolveAs(ctx, key, statetest.Done(), "carol", "ledger checked")
	statetest.RequireOutcome(t, state.OutcomeOK, ans, err)
	ans, err = s.ResolveAs(ctx, key, statetest.Done(), "dave", "again")
	statetest.RequireOutcome(t, state.OutcomeNotOwner, ans, err)
	ans, err = s.ResolveAs(ctx, statetest.NewKey(t), statetest.Done(), "dave", "absent")
	statetest.RequireOutcome(t, state.OutcomeNotFound, ans, err)
	rs, err := s.Resolutions(ctx, key)
	require.NoError(t, err)
	require.Len(t, rs, 1)
	require.Equal(t, "carol", rs[0].Actor)
	require.Equal(t, "ledger checked", rs[0].Reason)
	require.Equal(t, state.Done, rs[0].State)
	_, err = s.Pool().Exec(ctx, `DELETE FROM record_resolution`)
	require.ErrorContains(t, err, "append-only")
}
