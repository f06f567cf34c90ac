package postgres

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/internal/testutil"
	"github.com/idemgate/idemgate/state"
	"github.com/idemgate/idemgate/state/statetest"
)

func partitionExists(t *testing.T, s *Store, name string) bool {
	t.Helper()
	parts, err := dailyPartitions(t.Context(), s.Pool())
	require.NoError(t, err)
	_, ok := parts[name]
	return ok
}

func acquireWithExpiry(t *testing.T, s *Store, exp time.Time) state.Answer {
	t.Helper()
	req := statetest.AcquireRequest(statetest.NewKey(t), "owner-a")
	req.FingerprintExpiry = exp
	a, err := s.Acquire(t.Context(), req)
	statetest.RequireOutcome(t, state.OutcomeAcquired, a, err)
	return a
}

func completeShort(t *testing.T, s *Store, a state.Answer, retention time.Duration) {
	t.Helper()
	c := statetest.Done()
	c.Retention = retention
	done, err := s.Complete(t.Context(), state.Claim{Key: a.Record.Key, Owner: a.Record.Owner, Fence: a.Record.Fence}, c)
	statetest.RequireOutcome(t, state.OutcomeOK, done, err)
}

// Terminal records leave with their whole partition once every one of
// them has expired; the IN_FLIGHT and UNKNOWN ones of that partition move
// to the held partition first, where reconciliation still finds them.
func TestExpiredPartitionIsDroppedKeepingUnresolvedRecords(t *testing.T) {
	s := newStore(t, newDatabase(t))
	ctx := t.Context()
	exp := time.Now().Add(time.Minute)
	name := partitionName(exp.UTC().Truncate(24 * time.Hour))
	require.True(t, partitionExists(t, s, name))

	done := acquireWithExpiry(t, s, exp)
	completeShort(t, s, done, 200*time.Millisecond)
	inFlight := acquireWithExpiry(t, s, exp)
	unknown := acquireWithExpiry(t, s, exp)
	u, err := s.MarkUnknown(ctx, state.Claim{Key: unknown.Record.Key, Owner: "owner-a", Fence: 1})
	statetest.RequireOutcome(t, state.OutcomeOK, u, err)
	time.Sleep(400 * time.Millisecond)

	// Today's partition stays, every terminal record in it expired or not:
	// fingerprints filed there may still confirm.
	dropped, err := s.DropExpiredPartitions(ctx)
	require.NoError(t, err)
	require.NotContains(t, dropped, name)

	// Three days on (the day's fingerprints all expired long ago).
	dropped, err = s.dropExpiredPartitions(ctx, time.Now().Add(72*time.Hour))
	require.NoError(t, err)
	require.Contains(t, dropped, name)
	require.False(t, partitionExists(t, s, name))

	_, found, err := s.Get(ctx, done.Record.Key)
	require.NoError(t, err)
	require.False(t, found, "the expired DONE record left with its partition")
	rec, found, err := s.Get(ctx, inFlight.Record.Key)
	require.NoError(t, err)
	require.True(t, found, "an IN_FLIGHT record is never dropped with its partition")
	require.Equal(t, state.InFlight, rec.State)
	rec, found, err = s.Get(ctx, unknown.Record.Key)
	require.NoError(t, err)
	require.True(t, found, "an UNKNOWN record is never dropped with its partition")
	require.Equal(t, state.Unknown, rec.State)
	listed, err := s.List(ctx, ListFilter{State: state.Unknown})
	require.NoError(t, err)
	require.Len(t, listed, 1, "ops list still finds it")

	// The moved records still settle: the owner's late completion and a
	// person's resolution.
	c, err := s.Complete(ctx, state.Claim{Key: inFlight.Record.Key, Owner: "owner-a", Fence: 1}, statetest.Done())
	statetest.RequireOutcome(t, state.OutcomeOK, c, err)
	r, err := s.Resolve(ctx, unknown.Record.Key, statetest.Done())
	statetest.RequireOutcome(t, state.OutcomeOK, r, err)
	// And a retry of one answers from it, never acquiring anew.
	req := statetest.AcquireRequest(inFlight.Record.Key, "late")
	req.FingerprintExpiry = exp
	a, err := s.Acquire(ctx, req)
	statetest.RequireOutcome(t, state.OutcomeDone, a, err)
}

// A partition with a terminal record not yet past its retention stays.
func TestPartitionWithLiveRecordsStays(t *testing.T) {
	s := newStore(t, newDatabase(t))
	exp := time.Now().Add(time.Minute)
	name := partitionName(exp.UTC().Truncate(24 * time.Hour))
	completeShort(t, s, acquireWithExpiry(t, s, exp), time.Hour)
	dropped, err := s.dropExpiredPartitions(t.Context(), time.Now().Add(72*time.Hour))
	require.NoError(t, err)
	require.NotContains(t, dropped, name)
	require.True(t, partitionExists(t, s, name))
}

// Migrating today's table: its rows land in the held partition, stay
// readable, and a retry of a confirm made before the migration (now filed
// under its fingerprint's day) is answered from them, never acquired anew.
func TestMigrationToPartitionsKeepsExistingRows(t *testing.T) {
	dsn := testutil.CreateDatabase(t)
	ctx := t.Context()
	all, err := migrations()
	require.NoError(t, err)
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	defer conn.Close(context.Background())
	_, err = conn.Exec(ctx, `CREATE TABLE schema_migrations (version int PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())`)
	require.NoError(t, err)
	for _, m := range all {
		if m.version >= 3 {
			break
		}
		_, err := conn.Exec(ctx, m.sql)
		require.NoError(t, err, m.name)
		_, err = conn.Exec(ctx, "INSERT INTO schema_migrations (version, name) VALUES ($1, $2)", m.version, m.name)
		require.NoError(t, err)
	}
	doneKey, inFlightKey := statetest.NewKey(t), statetest.NewKey(t)
	_, err = conn.Exec(ctx, `INSERT INTO idempotency_record
		(idem_key, scope, subject_tag, param_hash, state, owner, fence, lease_until, result_status, result_headers, result_body,
		 created_at, updated_at, expires_at)
		VALUES ($1, 'payments.transfer', 'subj-tag-1', 'ph-1', 'DONE', 'o', 1, now(), 201, '[]', '{"id":1}', now(), now(), now() + interval '1 day'),
		       ($2, 'payments.transfer', 'subj-tag-1', 'ph-1', 'IN_FLIGHT', 'o', 1, now() + interval '1 hour', NULL, NULL, NULL, now(), now(), now() + interval '1 day')`,
		doneKey, inFlightKey)
	require.NoError(t, err)

	require.NoError(t, Migrate(ctx, dsn))
	s := newStore(t, dsn)
	rec, found, err := s.Get(ctx, doneKey)
	require.NoError(t, err)
	require.True(t, found)
	require.Equal(t, state.Done, rec.State)
	require.Equal(t, `{"id":1}`, string(rec.Result.Body))

	for key, want := range map[string]state.Outcome{doneKey: state.OutcomeDone, inFlightKey: state.OutcomeInFlight} {
		req := statetest.AcquireRequest(key, "retry")
		req.FingerprintExpiry = time.Now().Add(time.Minute)
		a, err := s.Acquire(ctx, req)
		statetest.RequireOutcome(t, want, a, err)
	}
	var rows int
	require.NoError(t, conn.QueryRow(ctx, "SELECT count(*) FROM idempotency_record").Scan(&rows))
	require.Equal(t, 2, rows, "no second row for a nonce recorded before the migration")
}
