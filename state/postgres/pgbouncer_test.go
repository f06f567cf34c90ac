package postgres

import (
	"context"
	"errors"
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

// bouncedDatabase creates a migrated test database and returns its direct
// DSN and a DSN through a PgBouncer in transaction mode.
func bouncedDatabase(t *testing.T) (direct, bounced string) {
	t.Helper()
	direct = testutil.CreateDatabase(t)
	b := testutil.StartPgBouncer(t, testutil.PgBouncerOptions{PoolSize: 2})
	bounced = b.DSN(t, direct)
	require.NoError(t, Migrate(t.Context(), bounced), "migrations run through the pooler")
	return direct, bounced
}

// The whole conformance suite through PgBouncer 1.18 in transaction mode.
func TestConformanceThroughPgBouncerTransactionMode(t *testing.T) {
	_, bounced := bouncedDatabase(t)
	statetest.Run(t, func(t *testing.T) state.Store {
		s, err := New(t.Context(), Options{DSN: bounced, TransactionPooler: true})
		require.NoError(t, err)
		t.Cleanup(func() { _ = s.Close() })
		return s
	})
}

// Many callers at once, so that a client connection's transactions land on
// different server connections: no call may fail for want of a prepared
// statement (what named statements did behind the pooler, in the
// TransactionPooler mode and in any DSN-chosen exec mode alike).
func TestNoNamedStatementsBehindATransactionPooler(t *testing.T) {
	_, bounced := bouncedDatabase(t)
	for name, opts := range map[string]Options{
		"transaction pooler": {DSN: bounced, TransactionPooler: true},
		"exec mode from DSN": {DSN: bounced + "&default_query_exec_mode=exec"},
	} {
		t.Run(name, func(t *testing.T) {
			opts.MaxConns, opts.MinConns = 6, 6
			s, err := New(t.Context(), opts)
			require.NoError(t, err)
			defer s.Close()
			require.NoError(t, s.Warm(t.Context(), 6))
			var wg sync.WaitGroup
			errs := make(chan error, 600)
			for g := 0; g < 12; g++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := 0; i < 25; i++ {
						key := statetest.NewKey(t)
						a, err := s.Acquire(t.Context(), statetest.AcquireRequest(key, "o"))
						if err != nil {
							errs <- err
							continue
						}
						if _, err := s.Complete(t.Context(), state.Claim{Key: key, Owner: "o", Fence: a.Record.Fence}, statetest.Done()); err != nil {
							errs <- err
						}
						if _, _, err := s.Get(t.Context(), key); err != nil {
							errs <- err
						}
					}
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				require.NoError(t, err)
			}
		})
	}
}

// Migrations through the pooler leave no advisory lock behind on a pooled
// server connection: later starts (here, many at once) still migrate.
func TestMigrationLockCannotLeakThroughAPooler(t *testing.T) {
	direct, bounced := bouncedDatabase(t)
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	for round := 0; round < 3; round++ {
		var wg sync.WaitGroup
		errs := make([]error, 6)
		for i := range errs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs[i] = Migrate(ctx, bounced)
			}()
		}
		wg.Wait()
		require.NoError(t, errors.Join(errs...))
	}
	conn, err := pgx.Connect(ctx, direct)
	require.NoError(t, err)
	defer conn.Close(context.Background())
	var held int
	require.NoError(t, conn.QueryRow(ctx, `SELECT count(*) FROM pg_locks l JOIN pg_database d ON d.oid = l.database
		WHERE l.locktype = 'advisory' AND d.datname = current_database()`).Scan(&held))
	require.Zero(t, held, "no advisory lock outlives its migration")
}

// TestUnsetTransactionPoolerIsNamed: behind PgBouncer in transaction mode
// without store.postgres.pooler: transaction, the connections' named
// statements collide (SQLSTATE 42P05) and the error, which readiness
// reports, names the setting that fixes it.
func TestUnsetTransactionPoolerIsNamed(t *testing.T) {
	_, bounced := bouncedDatabase(t)
	s, err := New(t.Context(), Options{DSN: bounced, MaxConns: 6, MinConns: 1})
	require.NoError(t, err)
	defer s.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	err = s.Warm(ctx, 6)
	require.ErrorIs(t, err, ErrTransactionPoolerUnset)
	require.ErrorContains(t, err, "set store.postgres.pooler: transaction")
	require.ErrorContains(t, err, "SQLSTATE 42P05")
	require.Equal(t, 1, strings.Count(err.Error(), "store.postgres.pooler"), "named once: %v", err)

	fixed, err := New(t.Context(), Options{DSN: bounced, MaxConns: 6, MinConns: 1, TransactionPooler: true})
	require.NoError(t, err)
	defer fixed.Close()
	require.NoError(t, fixed.Warm(ctx, 6), "the named setting fixes it")
}
