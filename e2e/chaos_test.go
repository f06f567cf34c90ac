package e2e

import (
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/e2e/internal/stack"
	"github.com/idemgate/idemgate/e2e/payments"
)

// forEach runs fn(i) for i in [0, n) on workers goroutines.
func forEach(n, workers int, fn func(i int)) {
	next := make(chan int)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for i := range next {
				fn(i)
			}
		})
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
}

// TestRedisKilledDuringLoad: the test-owned Redis is killed halfway through
// a bounded load of distinct confirms and started again (empty) near the
// end. Redis is only the fast path: every confirm still gets a definite
// answer and no 5xx, nothing executes twice, and retrying every one of them
// afterwards replays only.
func TestRedisKilledDuringLoad(t *testing.T) {
	const (
		n         = 200
		workers   = 16
		killAt    = n / 2
		restartAt = n * 9 / 10
	)
	s := startStack(t, stack.Options{})
	alice := s.Agent("alice")

	previews := make([]*stack.Preview, n)
	forEach(n, workers, func(i int) {
		p, err := alice.Preview(transfer(strconv.Itoa(i+1)+".00", fmt.Sprintf("acct_%03d", i), "load"))
		if err == nil {
			previews[i] = p
		}
	})
	for i, p := range previews {
		require.NotNil(t, p, "preview %d failed", i)
	}

	first := make([]*stack.Response, n)
	errs := make([]error, n)
	var answered atomic.Int64
	load := make(chan struct{})
	go func() {
		defer close(load)
		forEach(n, workers, func(i int) {
			first[i], errs[i] = alice.Confirm(previews[i].ConfirmBody())
			answered.Add(1)
		})
	}()
	waitCount := func(min int64) {
		for answered.Load() < min {
			select {
			case <-load:
				return
			case <-time.After(2 * time.Millisecond):
			}
		}
	}
	waitCount(killAt)
	s.Redis.Kill()
	redisDownAt := answered.Load()
	waitCount(restartAt)
	s.Redis.Restart()
	redisUpAt := answered.Load()
	<-load
	t.Logf("Redis killed after %d answers, back after %d of %d", redisDownAt, redisUpAt, n)
	require.Less(t, redisDownAt, int64(n), "the load ended before Redis was killed; nothing was tested")

	executed := 0
	for i, r := range first {
		require.NoError(t, errs[i])
		require.Less(t, r.StatusCode, 500, "confirm %d: no 5xx: %s", i, r)
		if r.Envelope == nil {
			requireExecuted(t, r)
			executed++
			continue
		}
		// Any other first answer must be a definite envelope.
		requireEnvelope(t, s, r, r.StatusCode, r.Envelope.Status, notRetryable)
	}
	require.Equal(t, executed, s.Payments.Executions(), "executions equal the 2xx first answers")
	for _, p := range previews {
		require.LessOrEqual(t, s.Payments.ExecutionsForKey(p.Nonce), 1, "fingerprint %s executed twice", p.Nonce)
	}
	fallbacks := metric(t, s, `idemgate_store_fallbacks_total{reason="breaker_open"}`) +
		metric(t, s, `idemgate_store_fallbacks_total{reason="redis_error"}`) +
		metric(t, s, `idemgate_store_fallbacks_total{reason="redis_timeout"}`)
	require.Positive(t, fallbacks, "idemgate never noticed Redis was gone")

	// Retrying every one of them: replays only, nothing executes.
	retries := make([]*stack.Response, n)
	forEach(n, workers, func(i int) {
		retries[i], errs[i] = alice.Confirm(previews[i].ConfirmBody())
	})
	for i, r := range retries {
		require.NoError(t, errs[i])
		requireReplay(t, s, r, previews[i].Nonce, first[i].Body)
	}
	require.Equal(t, executed, s.Payments.Executions())
	require.Equal(t, n, executed, "every confirm ran once")
	requireRowCounts(t, s, map[string]int{"DONE": n})
}

// TestPostgresUnreachable: with the TCP path to PostgreSQL cut, a confirm is
// refused with 503 temporarily_unavailable (retryable, Retry-After) and
// nothing executes — never fail open — and /readyz reports the outage. Once
// the path is back, the same confirm succeeds, once.
func TestPostgresUnreachable(t *testing.T) {
	s := startStack(t, stack.Options{PostgresThroughProxy: true})
	alice := s.Agent("alice")
	p := preview(t, alice, transfer("64.00", "acct_judy", "utilities"))

	s.PGProxy.Cut()
	for range 2 {
		r := confirm(t, alice, p.ConfirmBody())
		e := requireEnvelope(t, s, r, http.StatusServiceUnavailable, "temporarily_unavailable", retryable)
		require.NotNil(t, e.RetryAfterMS)
		require.Positive(t, *e.RetryAfterMS)
		secs, err := strconv.Atoi(r.Header.Get("Retry-After"))
		require.NoError(t, err, "Retry-After %q", r.Header.Get("Retry-After"))
		require.Positive(t, secs)
	}
	require.Zero(t, s.Payments.Executions())
	require.Empty(t, s.Upstream.Confirms(), "nothing reaches the upstream while the record cannot be written")

	require.Eventually(t, func() bool {
		code, _, err := s.Idemgate.Readyz()
		return err == nil && code == http.StatusServiceUnavailable
	}, 30*time.Second, 50*time.Millisecond, "/readyz must fail while PostgreSQL is unreachable")

	s.PGProxy.Restore()
	require.NoError(t, s.Idemgate.WaitReady(30*time.Second))
	r := confirm(t, alice, p.ConfirmBody())
	requireExecuted(t, r)
	require.Equal(t, 1, s.Payments.Executions())
	requireRow(t, s, p.Nonce, "DONE")
	requireReplay(t, s, confirm(t, alice, p.ConfirmBody()), p.Nonce, r.Body)
	require.Equal(t, 1, s.Payments.Executions())
	requireRowCounts(t, s, map[string]int{"DONE": 1})
}

// TestUpstreamTimeout: the confirm route's timeout (1s here) ends the call
// while payments is still answering. Envoy answers 504 itself (and shows
// that 504 to idemgate's response phase, which treats it as an ambiguous
// 5xx: see TestEnvoyLocalRepliesSettleTheClaim); idemgate settles the
// claim at once (EndLease: the downstream honours keys),
// so the retry need not wait for the 2 minute lease: it re-sends the same
// Idempotency-Key and gets the transfer that was made, executed once.
func TestUpstreamTimeout(t *testing.T) {
	s := startStack(t, stack.Options{ConfirmRouteTimeout: time.Second})
	alice := s.Agent("alice")
	p := preview(t, alice, transfer("12.34", "acct_ken", "parking"))

	s.Payments.SetFaults(payments.Faults{DelayAfterExecute: 4 * time.Second, Times: 1})
	r := confirm(t, alice, p.ConfirmBody())
	require.Equal(t, http.StatusGatewayTimeout, r.StatusCode, "got %s", r)
	require.Nil(t, r.Envelope, "the 504 is the front's own reply")
	require.Equal(t, 1, s.Payments.Executions())

	// Settled at once: released, not left for ttl.in_flight (2m) to expire.
	require.Eventually(t, func() bool {
		return metric(t, s, `idemgate_settlements_total{operation="transfer",result="released"}`) == 1
	}, 10*time.Second, 20*time.Millisecond, "idemgate must release the claim when the stream ends without a response")
	require.Equal(t, "not_started", statusOf(t, s, alice, p.Fingerprint))
	row := requireRow(t, s, p.Nonce, "IN_FLIGHT")
	require.False(t, row.LeaseUntil.After(time.Now()), "a released claim has no lease left")

	retry := confirm(t, alice, p.ConfirmBody())
	tr := requireExecuted(t, retry)
	rec, ok := s.Payments.RecordForKey(p.Nonce)
	require.True(t, ok)
	require.Equal(t, rec.TransferID, tr.TransferID)
	require.Equal(t, string(rec.Body), string(retry.Body))
	calls := s.Upstream.Confirms()
	require.Len(t, calls, 2)
	require.Equal(t, p.Nonce, calls[0].IdempotencyKey)
	require.Equal(t, p.Nonce, calls[1].IdempotencyKey)
	require.Equal(t, 1, s.Payments.Executions())
	require.Equal(t, 1, s.Payments.Stats().Replays)

	requireRow(t, s, p.Nonce, "DONE")
	requireReplay(t, s, confirm(t, alice, p.ConfirmBody()), p.Nonce, retry.Body)
	require.Equal(t, 1, s.Payments.Executions())
}
