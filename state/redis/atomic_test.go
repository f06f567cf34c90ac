package redis_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/internal/testutil"
	"github.com/idemgate/idemgate/state"
	"github.com/idemgate/idemgate/state/statetest"
)

// acquireFunc is one way of acquiring key for owner; it reports whether the
// caller got the claim.
type acquireFunc func(ctx context.Context, key, owner string) (bool, error)

// writesHeld is how long CLIENT PAUSE WRITE holds every write (and every
// script that may write) while reads go on. It is the window between a read
// and a write, widened from microseconds to a deterministic interval.
const writesHeld = 400 * time.Millisecond

// racedAcquires starts n acquires of one key while Redis holds writes, and
// returns how many got the claim. An acquire that reads, then writes in a
// separate command, reads "absent" n times during the pause and writes n
// claims after it; one script runs whole or not at all, so the scripts run
// one after another once the pause ends.
func racedAcquires(t *testing.T, addr string, n int, acquire acquireFunc) int {
	t.Helper()
	admin := goredis.NewClient(&goredis.Options{Addr: addr})
	defer admin.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	key := statetest.NewKey(t)

	require.NoError(t, admin.Do(ctx, "CLIENT", "PAUSE", writesHeld.Milliseconds(), "WRITE").Err())
	start := time.Now()
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		acquired int
		errs     []error
	)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got, err := acquire(ctx, key, fmt.Sprintf("owner-%d", i))
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
			}
			if got {
				acquired++
			}
		}()
	}
	wg.Wait()
	require.Empty(t, errs)
	// The pause really covered the calls: none could finish before it ended.
	require.GreaterOrEqual(t, time.Since(start), writesHeld*3/4, "the acquires did not wait for the paused writes")
	return acquired
}

// TestAcquireIsAtomicWhileWritesAreHeld holds docs/design.md's "acquire is atomic: a
// Lua script (never SETNX plus separate commands)". The concurrency tests
// elsewhere race goroutines on loopback, where the gap between a read and a
// write is too short to hit; here Redis itself holds the writes.
func TestAcquireIsAtomicWhileWritesAreHeld(t *testing.T) {
	srv := testutil.StartRedis(t)
	const n = 12

	t.Run("store acquire", func(t *testing.T) {
		s := newSingle(t, srv.Addr)
		got := racedAcquires(t, srv.Addr, n, func(ctx context.Context, key, owner string) (bool, error) {
			a, err := s.Acquire(ctx, statetest.AcquireRequest(key, owner))
			if err != nil {
				return false, err
			}
			if a.Outcome != state.OutcomeAcquired && a.Outcome != state.OutcomeInFlight {
				return false, fmt.Errorf("unexpected outcome %s", a.Outcome)
			}
			return a.Outcome == state.OutcomeAcquired, nil
		})
		require.Equal(t, 1, got, "exactly one of %d simultaneous acquires may get the claim", n)
	})

	// The check above must be able to fail: the same race against an acquire
	// that reads, then writes, hands out more than one claim.
	t.Run("a read-then-write acquire is caught", func(t *testing.T) {
		c := goredis.NewClient(&goredis.Options{Addr: srv.Addr, PoolSize: n})
		defer c.Close()
		got := racedAcquires(t, srv.Addr, n, func(ctx context.Context, key, owner string) (bool, error) {
			held, err := c.HGet(ctx, "naive:"+key, "owner").Result()
			if err != nil && err != goredis.Nil {
				return false, err
			}
			if held != "" {
				return false, nil
			}
			return true, c.HSet(ctx, "naive:"+key, "owner", owner).Err()
		})
		require.Greater(t, got, 1, "the widened window did not expose a non-atomic acquire")
	})
}
