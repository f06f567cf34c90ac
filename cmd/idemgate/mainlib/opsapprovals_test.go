package mainlib

import (
	"bytes"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/fingerprint"
	"github.com/idemgate/idemgate/internal/testutil"
	"github.com/idemgate/idemgate/state"
	"github.com/idemgate/idemgate/state/postgres"
)

func TestOpsApprovals(t *testing.T) {
	dsn := testutil.CreateDatabase(t)
	var out, errOut bytes.Buffer
	require.NoError(t, Main(t.Context(), []string{"migrate", "--dsn", dsn}, &out, &errOut))
	pg, err := postgres.New(t.Context(), postgres.Options{DSN: dsn})
	require.NoError(t, err)
	defer pg.Close()
	request := func(required int) state.Approval {
		nonce, err := fingerprint.NewNonce()
		require.NoError(t, err)
		a, _, err := pg.RequestApproval(t.Context(), state.ApprovalRequest{
			ID: state.NewApprovalID(), Key: nonce, Operation: "transfer", Scope: "payments.transfer", SubjectTag: "tag",
			Requester: "user-alice", ParamHash: "hash", Params: []byte(`{"amount":1500.00,"payee.account_id":"DE89"}`),
			Rules: []string{"amount >= 1000.00"}, Required: required, DistinctFromRequester: true, ExpiresAt: time.Now().Add(time.Hour),
		})
		require.NoError(t, err)
		return a
	}
	a := request(1)

	out.Reset()
	require.NoError(t, Main(t.Context(), []string{"ops", "approvals", "list", "--dsn", dsn}, &out, &errOut))
	require.Contains(t, out.String(), a.ID+"  pending  transfer")

	out.Reset()
	require.NoError(t, Main(t.Context(), []string{"ops", "approvals", "show", a.ID, "--dsn", dsn}, &out, &errOut))
	require.Contains(t, out.String(), `"account_id": "DE89"`)
	require.Contains(t, out.String(), `"amount": "1500.00"`)

	// --as and --reason are required.
	require.ErrorIs(t, Main(t.Context(), []string{"ops", "approvals", "approve", a.ID, "--as", "ops-bob", "--dsn", dsn}, &out, &errOut), ErrUsage)
	require.ErrorIs(t, Main(t.Context(), []string{"ops", "approvals", "approve", a.ID, "--reason", "ok", "--dsn", dsn}, &out, &errOut), ErrUsage)

	err = Main(t.Context(), []string{"ops", "approvals", "approve", a.ID, "--as", "user-alice", "--reason", "mine", "--dsn", dsn}, &out, &errOut)
	require.EqualError(t, err, "user-alice requested "+a.ID+" and may not approve it (distinct_from_requester); they may deny it")

	out.Reset()
	require.NoError(t, Main(t.Context(), []string{"ops", "approvals", "approve", a.ID, "--as", "ops-bob", "--reason", "payee checked", "--dsn", dsn}, &out, &errOut))
	require.Contains(t, out.String(), `"state": "approved"`)
	require.Regexp(t, `approved +ops-bob +\S+ +payee checked`, out.String())

	err = Main(t.Context(), []string{"ops", "approvals", "deny", a.ID, "--as", "ops-carol", "--reason", "late", "--dsn", dsn}, &out, &errOut)
	require.EqualError(t, err, "approval "+a.ID+" is approved, not pending: nothing decided")

	got, _, err := pg.GetApproval(t.Context(), a.ID)
	require.NoError(t, err)
	require.Equal(t, state.ApprovalApproved, got.State)
	last := got.Events[len(got.Events)-1]
	require.Equal(t, "ops-bob", last.Actor)
	require.Equal(t, "payee checked", last.Reason)

	b := request(1)
	out.Reset()
	require.NoError(t, Main(t.Context(), []string{"ops", "approvals", "deny", b.ID, "--as", "ops-bob", "--reason", "unknown payee", "--dsn", dsn}, &out, &errOut))
	require.Contains(t, out.String(), `"state": "denied"`)
	err = Main(t.Context(), []string{"ops", "approvals", "show", state.NewApprovalID(), "--dsn", dsn}, &out, &errOut)
	require.ErrorContains(t, err, "no approval apr_")
}
