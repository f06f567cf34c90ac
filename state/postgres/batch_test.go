package postgres

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/internal/testutil"
	"github.com/idemgate/idemgate/state"
	"github.com/idemgate/idemgate/state/internal/batch"
	"github.com/idemgate/idemgate/state/statetest"
)

// patient makes s send only full batches of n statements (or after wait),
// so that a test knows which calls share a batch.
func patient(t *testing.T, s *Store, n int, wait time.Duration) {
	t.Helper()
	s.batch.close()
	opts := queueOptions(BatchOptions{MaxItems: n, MaxWait: wait, Conns: 1})
	opts.Patient = true
	s.batch = newBatcher(s.pool, opts)
}

type call struct {
	name string
	run  func(ctx context.Context) (state.Answer, error)
}

func runTogether(t *testing.T, calls []call) map[string]state.Answer {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	var (
		mu  sync.Mutex
		out = map[string]state.Answer{}
		wg  sync.WaitGroup
	)
	for _, c := range calls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			a, err := c.run(ctx)
			assert.NoError(t, err, c.name)
			mu.Lock()
			out[c.name] = a
			mu.Unlock()
		}()
	}
	wg.Wait()
	return out
}

// One batch carrying every kind of answer: each caller gets its own.
func TestBatchHandsEachCallerItsOwnAnswer(t *testing.T) {
	s := newStore(t, newDatabase(t))
	ctx := t.Context()
	done, inFlight, other, mismatch := statetest.NewKey(t), statetest.NewKey(t), statetest.NewKey(t), statetest.NewKey(t)
	for _, k := range []string{done, inFlight, other, mismatch} {
		a, err := s.Acquire(ctx, statetest.AcquireRequest(k, "o1"))
		statetest.RequireOutcome(t, state.OutcomeAcquired, a, err)
	}
	c, err := s.Complete(ctx, state.Claim{Key: done, Owner: "o1", Fence: 1}, statetest.Done())
	statetest.RequireOutcome(t, state.OutcomeOK, c, err)

	fresh, dup := statetest.NewKey(t), statetest.NewKey(t)
	calls := []call{
		{"fresh", func(ctx context.Context) (state.Answer, error) {
			return s.Acquire(ctx, statetest.AcquireRequest(fresh, "o2"))
		}},
		{"replay", func(ctx context.Context) (state.Answer, error) {
			return s.Acquire(ctx, statetest.AcquireRequest(done, "o2"))
		}},
		{"mismatch", func(ctx context.Context) (state.Answer, error) {
			req := statetest.AcquireRequest(mismatch, "o2")
			req.ParamHash = "ph-tampered"
			return s.Acquire(ctx, req)
		}},
		{"complete", func(ctx context.Context) (state.Answer, error) {
			return s.Complete(ctx, state.Claim{Key: inFlight, Owner: "o1", Fence: 1}, statetest.Done())
		}},
		{"not owner", func(ctx context.Context) (state.Answer, error) {
			return s.Complete(ctx, state.Claim{Key: other, Owner: "intruder", Fence: 1}, statetest.Done())
		}},
	}
	for i := 0; i < 3; i++ {
		calls = append(calls, call{fmt.Sprintf("dup-%d", i), func(ctx context.Context) (state.Answer, error) {
			return s.Acquire(ctx, statetest.AcquireRequest(dup, fmt.Sprintf("dup-owner-%d", i)))
		}})
	}
	patient(t, s, len(calls), 10*time.Second)

	out := runTogether(t, calls)
	st := s.BatchStats()
	require.Equal(t, uint64(1), st.Batches, "every call shared one round trip")
	require.Equal(t, uint64(len(calls)), st.Statements)

	require.Equal(t, state.OutcomeAcquired, out["fresh"].Outcome)
	require.Equal(t, "o2", out["fresh"].Record.Owner)
	require.Equal(t, state.OutcomeDone, out["replay"].Outcome)
	statetest.RequireSameResult(t, statetest.SampleResult(), out["replay"].Record.Result)
	require.Equal(t, state.OutcomeParamMismatch, out["mismatch"].Outcome)
	require.Equal(t, state.OutcomeOK, out["complete"].Outcome)
	require.Equal(t, state.Done, out["complete"].Record.State)
	require.Equal(t, state.OutcomeNotOwner, out["not owner"].Outcome)
	require.Equal(t, state.InFlight, out["not owner"].Record.State)

	// Duplicates of one key inside one batch: exactly one ACQUIRED, and the
	// others name the winner.
	var winner string
	counts := map[state.Outcome]int{}
	for i := 0; i < 3; i++ {
		a := out[fmt.Sprintf("dup-%d", i)]
		counts[a.Outcome]++
		if a.Outcome == state.OutcomeAcquired {
			winner = a.Record.Owner
		}
	}
	require.Equal(t, map[state.Outcome]int{state.OutcomeAcquired: 1, state.OutcomeInFlight: 2}, counts)
	for i := 0; i < 3; i++ {
		require.Equal(t, winner, out[fmt.Sprintf("dup-%d", i)].Record.Owner)
	}
	var n int
	require.NoError(t, s.Pool().QueryRow(ctx, "SELECT count(*) FROM idempotency_record WHERE idem_key = $1::char(32)", dup).Scan(&n))
	require.Equal(t, 1, n)
}

// A caller whose context ends stops waiting at once, and a statement whose
// caller is gone before the batch is sent is not written.
func TestBatchHonoursEachCallersContext(t *testing.T) {
	s := newStore(t, newDatabase(t))
	patient(t, s, 64, 300*time.Millisecond)
	gone := statetest.NewKey(t)
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := s.Acquire(ctx, statetest.AcquireRequest(gone, "o"))
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.ErrorIs(t, err, state.ErrUnavailable)
	require.Less(t, time.Since(start), 250*time.Millisecond, "the caller did not wait for the batch")

	// The batch it was queued in is sent later, with a caller still waiting.
	stays := statetest.NewKey(t)
	a, err := s.Acquire(t.Context(), statetest.AcquireRequest(stays, "o"))
	statetest.RequireOutcome(t, state.OutcomeAcquired, a, err)
	_, found, err := s.Get(t.Context(), gone)
	require.NoError(t, err)
	require.False(t, found, "the abandoned statement was never sent")
	require.Equal(t, uint64(1), s.BatchStats().Statements)
}

// A statement that fails rolls its whole batch back (one implicit
// transaction): nothing of it is committed, and every caller runs its own
// statement alone and gets its normal answer.
func TestFailingBatchFallsBackToSingleStatements(t *testing.T) {
	s := newStore(t, newDatabase(t))
	ctx := t.Context()
	patient(t, s, 4, 10*time.Second)

	// Two statements that do not come from callers: an insert sent first
	// (lowest key) that succeeds inside the batch, and one that fails last.
	rolledBack := "00000000000000000000000000000000"
	first := batch.NewCall[stmt, row](ctx, stmt{key: rolledBack, sql: acquireSQL, lead: true,
		args: []any{rolledBack, "s", "u", "p", "raw", micros(time.Minute), micros(time.Hour), nil, int32(2)}})
	failing := batch.NewCall[stmt, row](ctx, stmt{key: "ffffffffffffffffffffffffffffffff", sql: "SELECT 1/0"})
	require.NoError(t, s.batch.q.Enqueue(first))
	require.NoError(t, s.batch.q.Enqueue(failing))

	a, b := statetest.NewKey(t), statetest.NewKey(t)
	out := runTogether(t, []call{
		{"a", func(ctx context.Context) (state.Answer, error) {
			return s.Acquire(ctx, statetest.AcquireRequest(a, "o"))
		}},
		{"b", func(ctx context.Context) (state.Answer, error) {
			return s.Acquire(ctx, statetest.AcquireRequest(b, "o"))
		}},
	})
	require.Equal(t, state.OutcomeAcquired, out["a"].Outcome)
	require.Equal(t, state.OutcomeAcquired, out["b"].Outcome)
	_, err := first.Wait()
	require.ErrorIs(t, err, errRunAlone)
	_, err = failing.Wait()
	require.ErrorIs(t, err, errRunAlone)
	_, found, err := s.Get(ctx, rolledBack)
	require.NoError(t, err)
	require.False(t, found, "the batch was rolled back as a whole")
	st := s.BatchStats()
	require.Equal(t, uint64(1), st.Batches)
	require.Equal(t, uint64(1), st.RolledBack)
}

// Under concurrency statements do share batches (the default batcher sends
// at once when idle, and gathers while a batch is in flight).
func TestConcurrentCallsShareBatches(t *testing.T) {
	s := newStore(t, newDatabase(t))
	const n = 64
	calls := make([]call, n)
	for i := range calls {
		key := statetest.NewKey(t)
		calls[i] = call{key, func(ctx context.Context) (state.Answer, error) {
			return s.Acquire(ctx, statetest.AcquireRequest(key, "o"))
		}}
	}
	out := runTogether(t, calls)
	for _, a := range out {
		require.Equal(t, state.OutcomeAcquired, a.Outcome)
	}
	st := s.BatchStats()
	require.Equal(t, uint64(n), st.Statements)
	require.Less(t, st.Batches, st.Statements, "some statements shared a batch")
}

func TestClosedStoreRefusesBatchedCalls(t *testing.T) {
	s, err := New(t.Context(), Options{DSN: newDatabase(t)})
	require.NoError(t, err)
	require.NoError(t, s.Close())
	_, err = s.Acquire(t.Context(), statetest.AcquireRequest(statetest.NewKey(t), "o"))
	require.ErrorIs(t, err, state.ErrUnavailable)
}

func TestBatchingCanBeTurnedOff(t *testing.T) {
	s, err := New(t.Context(), Options{DSN: newDatabase(t), Batch: BatchOptions{Disabled: true}})
	require.NoError(t, err)
	defer s.Close()
	a, err := s.Acquire(t.Context(), statetest.AcquireRequest(statetest.NewKey(t), "o"))
	statetest.RequireOutcome(t, state.OutcomeAcquired, a, err)
	require.Zero(t, s.BatchStats())
}

// Warm opens the connections serve keeps ready.
func TestWarmOpensConnections(t *testing.T) {
	s, err := New(t.Context(), Options{DSN: newDatabase(t), MinConns: 1, MaxConns: 4})
	require.NoError(t, err)
	defer s.Close()
	require.NoError(t, s.Warm(t.Context(), 3))
	require.GreaterOrEqual(t, s.Pool().Stat().TotalConns(), int32(3))
	require.NoError(t, s.Warm(t.Context(), 10), "capped by MaxConns")
	require.LessOrEqual(t, s.Pool().Stat().TotalConns(), int32(4))
}

// A caller that gives up while its batch runs gets its context error at
// once, and the connection is not broken for the batch (pgx closes a
// connection whose own context ends mid-statement; batches run on their
// own). This is what kept timeouts from turning into a storm of new
// connections under load.
func TestCallerTimeoutDoesNotBreakTheConnection(t *testing.T) {
	s := newStore(t, newDatabase(t))
	patient(t, s, 2, 10*time.Second)
	require.NoError(t, s.Warm(t.Context(), 2))
	before := s.Pool().Stat().NewConnsCount()

	slow := batch.NewCall[stmt, row](t.Context(), stmt{key: "00000000000000000000000000000000", sql: "SELECT pg_sleep(0.3)"})
	require.NoError(t, s.batch.q.Enqueue(slow))
	key := statetest.NewKey(t)
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := s.Acquire(ctx, statetest.AcquireRequest(key, "o"))
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.Less(t, time.Since(start), 250*time.Millisecond)
	_, _ = slow.Wait()

	// The statement was sent before the caller left: it committed (the
	// server's background abandon exists for exactly this claim).
	rec, found, err := s.Get(t.Context(), key)
	require.NoError(t, err)
	require.True(t, found)
	require.Equal(t, "o", rec.Owner)
	patient(t, s, 1, time.Millisecond)
	for i := 0; i < 5; i++ {
		a, err := s.Acquire(t.Context(), statetest.AcquireRequest(statetest.NewKey(t), "o"))
		statetest.RequireOutcome(t, state.OutcomeAcquired, a, err)
	}
	require.Equal(t, before, s.Pool().Stat().NewConnsCount(), "no connection had to be replaced")
}

// serve opens its pool before the migrations have run: connections opened
// then still work (statements are prepared on first use instead).
func TestConnectionsBeforeMigrationWork(t *testing.T) {
	dsn := testutil.CreateDatabase(t)
	s := newStore(t, dsn)
	require.NoError(t, s.Ping(t.Context()))
	require.NoError(t, s.Warm(t.Context(), 2))
	require.NoError(t, s.Migrate(t.Context()))
	a, err := s.Acquire(t.Context(), statetest.AcquireRequest(statetest.NewKey(t), "o"))
	statetest.RequireOutcome(t, state.OutcomeAcquired, a, err)
}
