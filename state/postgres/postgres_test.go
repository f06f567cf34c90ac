package postgres

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/internal/testutil"
	"github.com/idemgate/idemgate/state"
	"github.com/idemgate/idemgate/state/statetest"
)

// newDatabase creates a database, migrates it and returns its DSN.
func newDatabase(t *testing.T) string {
	t.Helper()
	dsn := testutil.CreateDatabase(t)
	require.NoError(t, Migrate(t.Context(), dsn))
	return dsn
}

func newStore(t *testing.T, dsn string) *Store {
	t.Helper()
	s, err := New(t.Context(), Options{DSN: dsn})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func TestConformance(t *testing.T) {
	dsn := newDatabase(t)
	statetest.Run(t, func(t *testing.T) state.Store { return newStore(t, dsn) })
}

func TestConcurrentAcquireLeavesOneRow(t *testing.T) {
	dsn := newDatabase(t)
	s := newStore(t, dsn)
	ctx := t.Context()
	key := statetest.NewKey(t)
	answers := statetest.ConcurrentAcquire(t, ctx, s, key, 200)
	require.Equal(t, map[state.Outcome]int{state.OutcomeAcquired: 1, state.OutcomeInFlight: 199}, statetest.CountOutcomes(answers))
	var n int
	require.NoError(t, s.Pool().QueryRow(ctx, "SELECT count(*) FROM idempotency_record WHERE idem_key = $1::char(32)", key).Scan(&n))
	require.Equal(t, 1, n)
}

// TestKeyLookupUsesPrimaryKey guards the char(32) comparison: with a text
// parameter PostgreSQL casts idem_key to text and scans the table.
func TestKeyLookupUsesPrimaryKey(t *testing.T) {
	dsn := newDatabase(t)
	s := newStore(t, dsn)
	ctx := t.Context()
	// Enough rows that the planner prefers an index when it can use one.
	_, err := s.Pool().Exec(ctx, `INSERT INTO idempotency_record
		(idem_key, scope, subject_tag, param_hash, state, owner, fence, lease_until, created_at, updated_at, expires_at)
		SELECT md5(i::text), 's', 'u', 'p', 'IN_FLIGHT', 'o', 1, now(), now(), now(), now() + interval '1 hour'
		FROM generate_series(1, 5000) AS i`)
	require.NoError(t, err)
	_, err = s.Pool().Exec(ctx, "ANALYZE idempotency_record")
	require.NoError(t, err)

	explain := func(sql string, args ...any) string {
		t.Helper()
		rows, err := s.Pool().Query(ctx, "EXPLAIN "+sql, args...)
		require.NoError(t, err)
		lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		return strings.Join(lines, "\n")
	}
	key := statetest.NewKey(t)
	for _, tc := range []struct {
		name string
		sql  string
		args []any
	}{
		{"get", selectSQL, []any{key}},
		{"complete", completeSQL, []any{key, "o", int64(1), "DONE", int32(200), "[]", []byte("x"), int64(1), "ref"}},
		{"end lease", endLeaseSQL, []any{key, "o", int64(1)}},
		{"abandon unsent", abandonUnsentSQL, []any{key, "o"}},
		{"mark unknown", markUnknownSQL, []any{key, "o", int64(1)}},
		{"takeover", takeoverSQL, []any{key, "o", int64(1), int64(1)}},
		{"resolve", resolveSQL, []any{key, "DONE", int32(200), "[]", []byte("x"), int64(1), "ref"}},
		{"acquire", acquireSQL, []any{key, "s", "u", "p", "o", int64(1), int64(1), nil, int32(2)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			plan := explain(tc.sql, tc.args...)
			// The rows are in the held partition; the daily ones are empty
			// here (a sequential scan of an empty table reads nothing).
			require.Contains(t, plan, "Index Scan using idempotency_record_held_pkey", plan)
			require.NotContains(t, plan, "Seq Scan on idempotency_record_held", plan)
		})
	}
	// The contrast that makes the test meaningful: a text parameter scans.
	plan := explain(`SELECT idem_key FROM idempotency_record WHERE idem_key = $1::text`, key)
	require.Contains(t, plan, "Seq Scan", plan)
}

func TestSweepIndexIsUsed(t *testing.T) {
	dsn := newDatabase(t)
	s := newStore(t, dsn)
	ctx := t.Context()
	_, err := s.Pool().Exec(ctx, `INSERT INTO idempotency_record
		(idem_key, scope, subject_tag, param_hash, state, owner, fence, lease_until, result_status,
		 created_at, updated_at, expires_at)
		SELECT md5(i::text), 's', 'u', 'p', 'DONE', 'o', 1, now(), 200, now(), now(), now() + interval '1 hour'
		FROM generate_series(1, 5000) AS i`)
	require.NoError(t, err)
	_, err = s.Pool().Exec(ctx, "ANALYZE idempotency_record")
	require.NoError(t, err)
	rows, err := s.Pool().Query(ctx, "EXPLAIN "+sweepSQL, 100)
	require.NoError(t, err)
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	plan := strings.Join(lines, "\n")
	require.Contains(t, plan, "idempotency_record_held_sweep_idx", plan)
}

func TestSweepInBoundedBatchesKeepsUnresolved(t *testing.T) {
	dsn := newDatabase(t)
	s := newStore(t, dsn)
	ctx := t.Context()
	for i := 0; i < 5; i++ {
		key := statetest.NewKey(t)
		a, err := s.Acquire(ctx, statetest.AcquireRequest(key, "o"))
		statetest.RequireOutcome(t, state.OutcomeAcquired, a, err)
		c := statetest.Done()
		c.Retention = time.Millisecond
		d, err := s.Complete(ctx, state.Claim{Key: key, Owner: "o", Fence: 1}, c)
		statetest.RequireOutcome(t, state.OutcomeOK, d, err)
	}
	// An UNKNOWN record past its expiry waits for a person, not the sweeper.
	unknown := statetest.NewKey(t)
	req := statetest.AcquireRequest(unknown, "o")
	req.Lease, req.Retention = time.Millisecond, time.Millisecond
	a, err := s.Acquire(ctx, req)
	statetest.RequireOutcome(t, state.OutcomeAcquired, a, err)
	m, err := s.MarkUnknown(ctx, state.Claim{Key: unknown, Owner: "o", Fence: 1})
	statetest.RequireOutcome(t, state.OutcomeOK, m, err)
	time.Sleep(20 * time.Millisecond)

	n, err := s.Sweep(ctx, 3)
	require.NoError(t, err)
	require.Equal(t, 3, n)
	n, err = s.Sweep(ctx, 3)
	require.NoError(t, err)
	require.Equal(t, 2, n)
	n, err = s.Sweep(ctx, 3)
	require.NoError(t, err)
	require.Zero(t, n)
	rec, found, err := s.Get(ctx, unknown)
	require.NoError(t, err)
	require.True(t, found)
	require.Equal(t, state.Unknown, rec.State)
}

func TestList(t *testing.T) {
	dsn := newDatabase(t)
	s := newStore(t, dsn)
	ctx := t.Context()
	mk := func(st state.RecordState) string {
		key := statetest.NewKey(t)
		a, err := s.Acquire(ctx, statetest.AcquireRequest(key, "o"))
		statetest.RequireOutcome(t, state.OutcomeAcquired, a, err)
		claim := state.Claim{Key: key, Owner: "o", Fence: 1}
		switch st {
		case state.Unknown:
			_, err = s.MarkUnknown(ctx, claim)
		case state.Done:
			_, err = s.Complete(ctx, claim, statetest.Done())
		}
		require.NoError(t, err)
		return key
	}
	u1 := mk(state.Unknown)
	u2 := mk(state.Unknown)
	f := mk(state.InFlight)
	d := mk(state.Done)
	time.Sleep(50 * time.Millisecond)
	fresh := mk(state.Unknown)

	keys := func(recs []state.Record) []string {
		var out []string
		for _, r := range recs {
			out = append(out, r.Key)
		}
		return out
	}
	for _, tc := range []struct {
		name   string
		filter ListFilter
		want   []string
	}{
		{"unknown, any age, oldest first", ListFilter{State: state.Unknown}, []string{u1, u2, fresh}},
		{"unknown older than 40ms", ListFilter{State: state.Unknown, OlderThan: 40 * time.Millisecond}, []string{u1, u2}},
		{"in flight", ListFilter{State: state.InFlight}, []string{f}},
		{"done", ListFilter{State: state.Done}, []string{d}},
		{"limit", ListFilter{State: state.Unknown, Limit: 1}, []string{u1}},
		{"every state", ListFilter{OlderThan: 40 * time.Millisecond}, []string{u1, u2, f, d}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			recs, err := s.List(ctx, tc.filter)
			require.NoError(t, err)
			require.Equal(t, tc.want, keys(recs))
		})
	}
	recs, err := s.List(ctx, ListFilter{State: state.Done})
	require.NoError(t, err)
	statetest.RequireSameResult(t, statetest.SampleResult(), recs[0].Result)

	_, err = s.List(ctx, ListFilter{State: "BOGUS"})
	require.ErrorIs(t, err, state.ErrInvalidArgument)
	_, err = s.List(ctx, ListFilter{OlderThan: -time.Second})
	require.ErrorIs(t, err, state.ErrInvalidArgument)
}

func TestMigrateIsIdempotentAndSafeConcurrently(t *testing.T) {
	dsn := testutil.CreateDatabase(t)
	ctx := t.Context()
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			errs[i] = Migrate(ctx, dsn)
		}(i)
	}
	wg.Wait()
	for i, err := range errs {
		require.NoError(t, err, "migrate %d", i)
	}
	s := newStore(t, dsn)
	require.NoError(t, s.Migrate(ctx), "a store can migrate at start too")
	require.NoError(t, Migrate(ctx, dsn))

	all, err := migrations()
	require.NoError(t, err)
	var n int
	require.NoError(t, s.Pool().QueryRow(ctx, "SELECT count(*) FROM schema_migrations").Scan(&n))
	require.Equal(t, len(all), n, "each migration recorded exactly once")

	// The table has the declared shape.
	var keyType string
	var keyLen int
	require.NoError(t, s.Pool().QueryRow(ctx, `SELECT data_type, character_maximum_length FROM information_schema.columns
		WHERE table_name = 'idempotency_record' AND column_name = 'idem_key'`).Scan(&keyType, &keyLen))
	require.Equal(t, "character", keyType)
	require.Equal(t, 32, keyLen)
	_, err = s.Pool().Exec(ctx, `INSERT INTO idempotency_record
		(idem_key, scope, subject_tag, param_hash, state, owner, fence, lease_until, created_at, updated_at, expires_at)
		VALUES (md5('x'), 's', 'u', 'p', 'BOGUS', 'o', 1, now(), now(), now(), now())`)
	require.Error(t, err, "the state CHECK refuses unknown states")
	_, err = s.Pool().Exec(ctx, `INSERT INTO idempotency_record
		(idem_key, scope, subject_tag, param_hash, state, owner, fence, lease_until, created_at, updated_at, expires_at)
		VALUES (md5('y'), 's', 'u', 'p', 'DONE', 'o', 1, now(), now(), now(), now())`)
	require.Error(t, err, "a terminal record without a result is refused")
}

func TestMigrationFilesAreOrdered(t *testing.T) {
	all, err := migrations()
	require.NoError(t, err)
	require.NotEmpty(t, all)
	for i, m := range all {
		require.Equal(t, i+1, m.version, "migration versions are 1..n without gaps")
		require.True(t, strings.HasPrefix(m.name, fmt.Sprintf("%04d_", m.version)))
	}
}

func TestUnreachablePostgresIsUnavailable(t *testing.T) {
	port := testutil.FreePort(t)
	dsn := fmt.Sprintf("postgres://postgres@127.0.0.1:%d/none?sslmode=disable&connect_timeout=1", port)
	s, err := New(t.Context(), Options{DSN: dsn})
	require.NoError(t, err, "a database that is down at start does not stop the store from being built")
	defer s.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	defer cancel()
	_, err = s.Acquire(ctx, statetest.AcquireRequest(statetest.NewKey(t), "o"))
	require.ErrorIs(t, err, state.ErrUnavailable)
	require.ErrorIs(t, s.Ping(ctx), state.ErrUnavailable)
	require.ErrorIs(t, Migrate(ctx, dsn), state.ErrUnavailable)

	_, err = New(t.Context(), Options{DSN: "postgres://%zz"})
	require.ErrorIs(t, err, state.ErrInvalidArgument)
}

func TestApprovalConformance(t *testing.T) {
	dsn := newDatabase(t)
	statetest.RunApprovals(t, func(t *testing.T) statetest.ApprovalStore { return newStore(t, dsn) }, statetest.ApprovalOptions{})
}
