package redis_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/internal/testutil"
	"github.com/idemgate/idemgate/state"
	"github.com/idemgate/idemgate/state/redis"
	"github.com/idemgate/idemgate/state/statetest"
)

// Calls that arrive together share pipelines, and each still gets its own
// answer: one key acquired by many at once has exactly one winner, and
// every other key is acquired by its caller.
func TestConcurrentCallsSharePipelines(t *testing.T) {
	srv := testutil.StartRedis(t)
	s := newSingle(t, srv.Addr)
	ctx := t.Context()
	contested := statetest.NewKey(t)
	const n = 64
	answers := make([]state.Answer, 2*n)
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(2)
		go func() {
			defer wg.Done()
			a, err := s.Acquire(ctx, statetest.AcquireRequest(contested, fmt.Sprintf("c-%d", i)))
			assert.NoError(t, err)
			answers[i] = a
		}()
		go func() {
			defer wg.Done()
			a, err := s.Acquire(ctx, statetest.AcquireRequest(statetest.NewKey(t), "own"))
			assert.NoError(t, err)
			answers[n+i] = a
		}()
	}
	wg.Wait()
	require.Equal(t, map[state.Outcome]int{state.OutcomeAcquired: 1, state.OutcomeInFlight: n - 1}, statetest.CountOutcomes(answers[:n]))
	require.Equal(t, map[state.Outcome]int{state.OutcomeAcquired: n}, statetest.CountOutcomes(answers[n:]))
	pipelines, calls := s.BatchStats()
	require.Equal(t, uint64(2*n), calls)
	require.Less(t, pipelines, calls, "some calls shared a pipeline")
}

// A script the server forgot (SCRIPT FLUSH, a failover to a fresh replica)
// is answered NOSCRIPT inside the pipeline without running; the call is
// then sent alone with EVAL.
func TestPipelinedCallsSurviveScriptFlush(t *testing.T) {
	srv := testutil.StartRedis(t)
	s := newSingle(t, srv.Addr)
	ctx := t.Context()
	raw := goredis.NewClient(&goredis.Options{Addr: srv.Addr})
	defer raw.Close()
	var wg sync.WaitGroup
	for round := 0; round < 3; round++ {
		require.NoError(t, raw.ScriptFlush(ctx).Err())
		for i := 0; i < 16; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				a, err := s.Acquire(ctx, statetest.AcquireRequest(statetest.NewKey(t), "o"))
				statetest.AssertOutcome(t, state.OutcomeAcquired, a, err)
			}()
		}
		wg.Wait()
	}
}

// A caller whose context ends stops waiting and is reported unavailable,
// like any Redis call that ran out of time.
func TestPipelinedCallHonoursItsContext(t *testing.T) {
	srv := testutil.StartRedis(t)
	s := newSingle(t, srv.Addr)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	_, err := s.Acquire(ctx, statetest.AcquireRequest(statetest.NewKey(t), "o"))
	require.ErrorIs(t, err, context.Canceled)
	require.ErrorIs(t, err, state.ErrUnavailable)
	dctx, dcancel := context.WithTimeout(t.Context(), time.Nanosecond)
	defer dcancel()
	<-dctx.Done()
	_, _, err = s.Get(dctx, statetest.NewKey(t))
	require.ErrorIs(t, err, context.DeadlineExceeded)
}

func TestPipeliningCanBeTurnedOff(t *testing.T) {
	srv := testutil.StartRedis(t)
	s, err := redis.New(redis.Options{Addrs: []string{srv.Addr}, Batch: redis.BatchOptions{Disabled: true}})
	require.NoError(t, err)
	defer s.Close()
	a, err := s.Acquire(t.Context(), statetest.AcquireRequest(statetest.NewKey(t), "o"))
	statetest.RequireOutcome(t, state.OutcomeAcquired, a, err)
	pipelines, calls := s.BatchStats()
	require.Zero(t, pipelines+calls)
}

// In cluster mode one pipeline spans the shards that hold its keys.
func TestPipelinesAcrossClusterShards(t *testing.T) {
	addrs := testutil.StartRedisCluster(t, 3)
	s, err := redis.New(redis.Options{Addrs: addrs, Mode: redis.ModeCluster})
	require.NoError(t, err)
	defer s.Close()
	ctx := t.Context()
	var wg sync.WaitGroup
	for i := 0; i < 48; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := statetest.NewKey(t)
			a, err := s.Acquire(ctx, statetest.AcquireRequest(key, "o"))
			statetest.AssertOutcome(t, state.OutcomeAcquired, a, err)
			c, err := s.Complete(ctx, state.Claim{Key: key, Owner: "o", Fence: 1}, statetest.Done())
			statetest.AssertOutcome(t, state.OutcomeOK, c, err)
			r, err := s.Acquire(ctx, statetest.AcquireRequest(key, "p"))
			statetest.AssertOutcome(t, state.OutcomeDone, r, err)
			statetest.AssertSameResult(t, statetest.SampleResult(), r.Record.Result)
		}()
	}
	wg.Wait()
}
