// Package statetest is the conformance suite every state.Store backend must
// pass: memory, redis (single and cluster), postgres and tiered run the same
// tests, so "same semantics" is a checked claim rather than a hope.
//
// The suite uses short leases and real waits by default, because the Redis
// and PostgreSQL backends judge leases by their servers' clocks and no test
// hook can move those. A backend with an injectable clock passes
// Options.Wait to advance it instead of sleeping.
package statetest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/state"
)

// Options tunes the suite for one backend.
type Options struct {
	// Wait lets at least d pass on the backend's clock. Nil sleeps.
	Wait func(d time.Duration)
	// ShortLease is the lease used where a test waits for expiry; zero means
	// 300ms. Keep it well above one round trip to the backend.
	ShortLease time.Duration
}

// Run runs the suite against stores made by newStore, one per subtest.
func Run(t *testing.T, newStore func(t *testing.T) state.Store) {
	RunWith(t, newStore, Options{})
}

// RunWith is Run with options.
func RunWith(t *testing.T, newStore func(t *testing.T) state.Store, opts Options) {
	if opts.Wait == nil {
		opts.Wait = time.Sleep
	}
	if opts.ShortLease == 0 {
		opts.ShortLease = 300 * time.Millisecond
	}
	s := &suite{opts: opts}
	for _, tc := range []struct {
		name string
		fn   func(t *testing.T, st state.Store)
	}{
		{"AcquireThenInFlight", s.acquireThenInFlight},
		{"ParamHashBeforeState", s.paramHashBeforeState},
		{"CompleteReplaysByteIdentical", s.completeReplaysByteIdentical},
		{"LargeBinaryBodyReplays", s.largeBinaryBody},
		{"CompleteNotOwner", s.completeNotOwner},
		{"ReleaseTakeoverFencesOldOwner", s.releaseTakeover},
		{"AbandonFreshClaimIsDeleted", s.abandonFresh},
		{"AbandonTakenOverClaimEndsLease", s.abandonTakenOver},
		{"AbandonNotOwner", s.abandonNotOwner},
		{"AbandonRacesTakeover", s.abandonRacesTakeover},
		{"LeaseExpiryTakeover", s.leaseExpiryTakeover},
		{"MarkUnknown", s.markUnknown},
		{"MarkUnknownAfterExpiry", s.markUnknownAfterExpiry},
		{"CompleteUnknownByOwner", s.completeUnknownByOwner},
		{"Resolve", s.resolve},
		{"Get", s.get},
		{"Retention", s.retention},
		{"ConcurrentAcquire", s.concurrentAcquire},
		{"ConcurrentTakeover", s.concurrentTakeover},
		{"ContextRespected", s.contextRespected},
		{"InvalidArguments", s.invalidArguments},
		{"Ping", s.ping},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := newStore(t)
			tc.fn(t, st)
		})
	}
}

type suite struct{ opts Options }

// NewKey returns a random fingerprint nonce. It never fails the test, so
// goroutines other than the test's may call it (crypto/rand.Read does not
// return errors).
func NewKey(testing.TB) string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// AcquireRequest is the request the suite uses: a 30s lease, an hour of
// retention.
func AcquireRequest(key, owner string) state.AcquireRequest {
	return state.AcquireRequest{
		Key:        key,
		Scope:      "payments.transfer",
		SubjectTag: "subj-tag-1",
		ParamHash:  "ph-1",
		Owner:      owner,
		Lease:      30 * time.Second,
		Retention:  time.Hour,
	}
}

// SampleResult is an upstream answer that only a byte-exact store replays
// unchanged: repeated and unsorted headers, a header value that is not
// UTF-8, and a body with NUL and invalid UTF-8 bytes.
func SampleResult() state.Result {
	return state.Result{
		Status: 201,
		Headers: []state.Header{
			{Name: "Content-Type", Value: "application/json; charset=utf-8"},
			{Name: "X-Zeta", Value: "z"},
			{Name: "X-Alpha", Value: "a1"},
			{Name: "X-Alpha", Value: "a2"},
			{Name: "X-Raw", Value: "bin\xff\xfe"},
		},
		Body: []byte("{\"transfer_id\":\"t-1\",\"note\":\"h\u00e9\"}\x00\xff\xfe\xc3\x28 end\n"),
		Ref:  "t-1",
	}
}

// Done is a DONE completion with SampleResult and an hour of retention.
func Done() state.Completion {
	return state.Completion{State: state.Done, Result: SampleResult(), Retention: time.Hour}
}

func failedCompletion() state.Completion {
	return state.Completion{State: state.Failed, Retention: time.Hour, Result: state.Result{
		Status:  422,
		Headers: []state.Header{{Name: "Content-Type", Value: "application/problem+json"}},
		Body:    []byte(`{"error":"insufficient_funds"}`),
	}}
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func claimOf(a state.Answer) state.Claim {
	return state.Claim{Key: a.Record.Key, Owner: a.Record.Owner, Fence: a.Record.Fence}
}

// RequireOutcome fails unless a has the wanted outcome.
func RequireOutcome(t testing.TB, want state.Outcome, a state.Answer, err error) {
	t.Helper()
	require.NoError(t, err)
	require.Equal(t, want, a.Outcome, "record: %+v", a.Record)
}

// AssertOutcome is RequireOutcome for goroutines other than the test's,
// where FailNow is not allowed: it marks the test failed and returns false.
func AssertOutcome(t testing.TB, want state.Outcome, a state.Answer, err error) bool {
	t.Helper()
	return assert.NoError(t, err) && assert.Equal(t, want, a.Outcome, "record: %+v", a.Record)
}

// AssertSameResult is RequireSameResult for goroutines other than the test's.
func AssertSameResult(t testing.TB, want state.Result, got *state.Result) bool {
	t.Helper()
	return assert.NotNil(t, got, "record has no result") &&
		assert.Equal(t, want.Status, got.Status) &&
		assert.Equal(t, want.Headers, got.Headers) &&
		assert.True(t, bytes.Equal(want.Body, got.Body), "body differs:\nwant %q\ngot  %q", want.Body, got.Body) &&
		assert.Equal(t, want.Ref, got.Ref, "result ref")
}

// RequireSameResult fails unless got holds exactly want (status, header
// order, body bytes, ref).
func RequireSameResult(t testing.TB, want state.Result, got *state.Result) {
	t.Helper()
	require.NotNil(t, got, "record has no result")
	require.Equal(t, want.Status, got.Status)
	require.Equal(t, want.Headers, got.Headers)
	require.True(t, bytes.Equal(want.Body, got.Body), "body differs:\nwant %q\ngot  %q", want.Body, got.Body)
	require.Equal(t, want.Ref, got.Ref, "result ref")
}

func (s *suite) acquire(t *testing.T, st state.Store, key, owner string) state.Answer {
	t.Helper()
	a, err := st.Acquire(ctxT(t), AcquireRequest(key, owner))
	RequireOutcome(t, state.OutcomeAcquired, a, err)
	return a
}

// acquireShortLease acquires key for owner with the suite's short lease.
func (s *suite) acquireShortLease(t *testing.T, st state.Store, key, owner string) state.Answer {
	t.Helper()
	req := AcquireRequest(key, owner)
	req.Lease = s.opts.ShortLease
	a, err := st.Acquire(ctxT(t), req)
	RequireOutcome(t, state.OutcomeAcquired, a, err)
	return a
}

// waitPastShortLease waits until a short lease taken now has run out.
func (s *suite) waitPastShortLease() { s.opts.Wait(s.opts.ShortLease + s.opts.ShortLease/2) }

func (s *suite) acquireThenInFlight(t *testing.T, st state.Store) {
	ctx := ctxT(t)
	key := NewKey(t)
	a, err := st.Acquire(ctx, AcquireRequest(key, "owner-a"))
	RequireOutcome(t, state.OutcomeAcquired, a, err)
	r := a.Record
	require.Equal(t, key, r.Key)
	require.Equal(t, "payments.transfer", r.Scope)
	require.Equal(t, "subj-tag-1", r.SubjectTag)
	require.Equal(t, "ph-1", r.ParamHash)
	require.Equal(t, state.InFlight, r.State)
	require.Equal(t, "owner-a", r.Owner)
	require.Equal(t, int64(1), r.Fence)
	require.False(t, r.LeaseExpired)
	require.Nil(t, r.Result)
	require.False(t, r.CreatedAt.IsZero())
	require.WithinDuration(t, r.CreatedAt.Add(30*time.Second), r.LeaseUntil, time.Second)
	require.WithinDuration(t, r.CreatedAt.Add(time.Hour), r.ExpiresAt, time.Second)

	b, err := st.Acquire(ctx, AcquireRequest(key, "owner-b"))
	RequireOutcome(t, state.OutcomeInFlight, b, err)
	require.Equal(t, "owner-a", b.Record.Owner)
	require.Equal(t, int64(1), b.Record.Fence)
	require.False(t, b.Record.LeaseExpired)
	require.Equal(t, state.InFlight, b.Record.State)

	// The same owner id asking again is not a second ACQUIRED: owner ids
	// may repeat, only the first acquire owns the record.
	c, err := st.Acquire(ctx, AcquireRequest(key, "owner-a"))
	RequireOutcome(t, state.OutcomeInFlight, c, err)
}

func (s *suite) paramHashBeforeState(t *testing.T, st state.Store) {
	ctx := ctxT(t)
	mismatch := func(t *testing.T, key string) {
		t.Helper()
		req := AcquireRequest(key, "owner-x")
		req.ParamHash = "ph-tampered"
		a, err := st.Acquire(ctx, req)
		RequireOutcome(t, state.OutcomeParamMismatch, a, err)
		require.Equal(t, "ph-1", a.Record.ParamHash)
	}
	for _, tc := range []struct {
		name  string
		setup func(t *testing.T, key string)
	}{
		{"in flight", func(t *testing.T, key string) { s.acquire(t, st, key, "o1") }},
		{"done", func(t *testing.T, key string) {
			a := s.acquire(t, st, key, "o1")
			c, err := st.Complete(ctx, claimOf(a), Done())
			RequireOutcome(t, state.OutcomeOK, c, err)
		}},
		{"failed", func(t *testing.T, key string) {
			a := s.acquire(t, st, key, "o1")
			c, err := st.Complete(ctx, claimOf(a), failedCompletion())
			RequireOutcome(t, state.OutcomeOK, c, err)
		}},
		{"unknown", func(t *testing.T, key string) {
			a := s.acquire(t, st, key, "o1")
			c, err := st.MarkUnknown(ctx, claimOf(a))
			RequireOutcome(t, state.OutcomeOK, c, err)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := NewKey(t)
			tc.setup(t, key)
			mismatch(t, key)
		})
	}
}

func (s *suite) completeReplaysByteIdentical(t *testing.T, st state.Store) {
	for _, tc := range []struct {
		name    string
		c       state.Completion
		outcome state.Outcome
		state   state.RecordState
	}{
		{"done", Done(), state.OutcomeDone, state.Done},
		{"failed", failedCompletion(), state.OutcomeFailed, state.Failed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := ctxT(t)
			key := NewKey(t)
			a := s.acquire(t, st, key, "owner-a")
			c, err := st.Complete(ctx, claimOf(a), tc.c)
			RequireOutcome(t, state.OutcomeOK, c, err)
			require.Equal(t, tc.state, c.Record.State)
			RequireSameResult(t, tc.c.Result, c.Record.Result)

			for i := 0; i < 3; i++ {
				r, err := st.Acquire(ctx, AcquireRequest(key, fmt.Sprintf("retry-%d", i)))
				RequireOutcome(t, tc.outcome, r, err)
				require.Equal(t, tc.state, r.Record.State)
				RequireSameResult(t, tc.c.Result, r.Record.Result)
			}
			rec, found, err := st.Get(ctx, key)
			require.NoError(t, err)
			require.True(t, found)
			require.Equal(t, tc.state, rec.State)
			RequireSameResult(t, tc.c.Result, rec.Result)
		})
	}
}

func (s *suite) largeBinaryBody(t *testing.T, st state.Store) {
	ctx := ctxT(t)
	body := make([]byte, 256<<10)
	_, err := rand.Read(body)
	require.NoError(t, err)
	c := Done()
	c.Result.Body = body
	key := NewKey(t)
	a := s.acquire(t, st, key, "owner-a")
	done, err := st.Complete(ctx, claimOf(a), c)
	RequireOutcome(t, state.OutcomeOK, done, err)
	r, err := st.Acquire(ctx, AcquireRequest(key, "owner-b"))
	RequireOutcome(t, state.OutcomeDone, r, err)
	RequireSameResult(t, c.Result, r.Record.Result)
}

func (s *suite) completeNotOwner(t *testing.T, st state.Store) {
	ctx := ctxT(t)
	key := NewKey(t)
	a := s.acquire(t, st, key, "owner-a")

	for _, tc := range []struct {
		name  string
		claim state.Claim
	}{
		{"wrong owner", state.Claim{Key: key, Owner: "owner-b", Fence: 1}},
		{"stale fence", state.Claim{Key: key, Owner: "owner-a", Fence: 0}},
		{"future fence", state.Claim{Key: key, Owner: "owner-a", Fence: 2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := st.Complete(ctx, tc.claim, Done())
			RequireOutcome(t, state.OutcomeNotOwner, r, err)
			rec, found, err := st.Get(ctx, key)
			require.NoError(t, err)
			require.True(t, found)
			require.Equal(t, state.InFlight, rec.State)
			require.Nil(t, rec.Result)
		})
	}

	done, err := st.Complete(ctx, claimOf(a), Done())
	RequireOutcome(t, state.OutcomeOK, done, err)

	// A second Complete by the owner itself must not overwrite the result.
	again, err := st.Complete(ctx, claimOf(a), failedCompletion())
	RequireOutcome(t, state.OutcomeNotOwner, again, err)
	require.Equal(t, state.Done, again.Record.State)
	rec, _, err := st.Get(ctx, key)
	require.NoError(t, err)
	require.Equal(t, state.Done, rec.State)
	RequireSameResult(t, SampleResult(), rec.Result)

	absent, err := st.Complete(ctx, state.Claim{Key: NewKey(t), Owner: "o", Fence: 1}, Done())
	RequireOutcome(t, state.OutcomeNotOwner, absent, err)
}

func (s *suite) releaseTakeover(t *testing.T, st state.Store) {
	ctx := ctxT(t)
	key := NewKey(t)
	a := s.acquire(t, st, key, "owner-a")

	wrong, err := st.EndLease(ctx, state.Claim{Key: key, Owner: "owner-b", Fence: 1})
	RequireOutcome(t, state.OutcomeNotOwner, wrong, err)
	rel, err := st.EndLease(ctx, claimOf(a))
	RequireOutcome(t, state.OutcomeOK, rel, err)
	require.True(t, rel.Record.LeaseExpired)
	require.Equal(t, state.InFlight, rel.Record.State)

	seen, err := st.Acquire(ctx, AcquireRequest(key, "owner-b"))
	RequireOutcome(t, state.OutcomeInFlight, seen, err)
	require.True(t, seen.Record.LeaseExpired, "a released record must read as lease expired")
	require.Equal(t, int64(1), seen.Record.Fence)

	tk, err := st.Takeover(ctx, state.TakeoverRequest{Key: key, NewOwner: "owner-b", Fence: seen.Record.Fence, Lease: 30 * time.Second})
	RequireOutcome(t, state.OutcomeAcquired, tk, err)
	require.Equal(t, "owner-b", tk.Record.Owner)
	require.Equal(t, int64(2), tk.Record.Fence)
	require.False(t, tk.Record.LeaseExpired)

	late, err := st.Complete(ctx, claimOf(a), failedCompletion())
	RequireOutcome(t, state.OutcomeNotOwner, late, err)
	lateEndLease, err := st.EndLease(ctx, claimOf(a))
	RequireOutcome(t, state.OutcomeNotOwner, lateEndLease, err)

	done, err := st.Complete(ctx, claimOf(tk), Done())
	RequireOutcome(t, state.OutcomeOK, done, err)

	// The stale owner comes back once more after the new owner finished.
	late2, err := st.Complete(ctx, claimOf(a), failedCompletion())
	RequireOutcome(t, state.OutcomeNotOwner, late2, err)
	rec, _, err := st.Get(ctx, key)
	require.NoError(t, err)
	require.Equal(t, state.Done, rec.State)
	require.Equal(t, "owner-b", rec.Owner)
	RequireSameResult(t, SampleResult(), rec.Result)

	relDone, err := st.EndLease(ctx, claimOf(tk))
	RequireOutcome(t, state.OutcomeNotOwner, relDone, err)
}

func (s *suite) abandonFresh(t *testing.T, st state.Store) {
	ctx := ctxT(t)
	key := NewKey(t)
	a := s.acquire(t, st, key, "owner-a")

	ab, err := st.AbandonUnsent(ctx, claimOf(a))
	RequireOutcome(t, state.OutcomeOK, ab, err)
	require.Zero(t, ab.Record, "a deleted record is answered with a zero Record")
	_, found, err := st.Get(ctx, key)
	require.NoError(t, err)
	require.False(t, found, "a fresh claim that never reached the upstream is deleted")

	// The next confirm starts over: a new claim with fence 1, whatever the
	// downstream does with keys.
	again, err := st.Acquire(ctx, AcquireRequest(key, "owner-b"))
	RequireOutcome(t, state.OutcomeAcquired, again, err)
	require.Equal(t, "owner-b", again.Record.Owner)
	require.Equal(t, int64(1), again.Record.Fence)
	require.False(t, again.Record.LeaseExpired)

	// The old owner's claim is gone: abandoning it again touches nothing,
	// even though owner ids are not what protects the new claim (the
	// record's owner differs) — and the new claim can still complete.
	twice, err := st.AbandonUnsent(ctx, claimOf(a))
	RequireOutcome(t, state.OutcomeNotOwner, twice, err)
	require.Equal(t, "owner-b", twice.Record.Owner)
	done, err := st.Complete(ctx, claimOf(again), Done())
	RequireOutcome(t, state.OutcomeOK, done, err)
}

func (s *suite) abandonTakenOver(t *testing.T, st state.Store) {
	ctx := ctxT(t)
	key := NewKey(t)
	a := s.acquire(t, st, key, "owner-a")
	rel, err := st.EndLease(ctx, claimOf(a))
	RequireOutcome(t, state.OutcomeOK, rel, err)
	tk, err := st.Takeover(ctx, state.TakeoverRequest{Key: key, NewOwner: "owner-b", Fence: 1, Lease: 30 * time.Second})
	RequireOutcome(t, state.OutcomeAcquired, tk, err)
	require.Equal(t, int64(2), tk.Record.Fence)

	// The first attempt may have executed: the record stays, only the
	// taker's lease ends so the next retry takes over and re-sends the key.
	ab, err := st.AbandonUnsent(ctx, claimOf(tk))
	RequireOutcome(t, state.OutcomeOK, ab, err)
	require.Equal(t, state.InFlight, ab.Record.State)
	require.Equal(t, "owner-b", ab.Record.Owner)
	require.Equal(t, int64(2), ab.Record.Fence)
	require.True(t, ab.Record.LeaseExpired)

	seen, err := st.Acquire(ctx, AcquireRequest(key, "owner-c"))
	RequireOutcome(t, state.OutcomeInFlight, seen, err)
	require.True(t, seen.Record.LeaseExpired)
	next, err := st.Takeover(ctx, state.TakeoverRequest{Key: key, NewOwner: "owner-c", Fence: 2, Lease: 30 * time.Second})
	RequireOutcome(t, state.OutcomeAcquired, next, err)
	require.Equal(t, int64(3), next.Record.Fence)
}

func (s *suite) abandonNotOwner(t *testing.T, st state.Store) {
	ctx := ctxT(t)
	absent, err := st.AbandonUnsent(ctx, state.Claim{Key: NewKey(t), Owner: "o", Fence: 1})
	RequireOutcome(t, state.OutcomeNotOwner, absent, err)
	require.Zero(t, absent.Record)

	for _, tc := range []struct {
		name  string
		setup func(t *testing.T, a state.Answer)
		want  state.RecordState
	}{
		{"in flight", func(*testing.T, state.Answer) {}, state.InFlight},
		{"done", func(t *testing.T, a state.Answer) {
			c, err := st.Complete(ctx, claimOf(a), Done())
			RequireOutcome(t, state.OutcomeOK, c, err)
		}, state.Done},
		{"unknown", func(t *testing.T, a state.Answer) {
			c, err := st.MarkUnknown(ctx, claimOf(a))
			RequireOutcome(t, state.OutcomeOK, c, err)
		}, state.Unknown},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := NewKey(t)
			a := s.acquire(t, st, key, "owner-a")
			tc.setup(t, a)
			claims := []state.Claim{
				{Key: key, Owner: "owner-b", Fence: 1},
				{Key: key, Owner: "owner-a", Fence: 2},
			}
			if tc.want != state.InFlight {
				claims = append(claims, claimOf(a)) // the owner itself, after the fact
			}
			for _, c := range claims {
				r, err := st.AbandonUnsent(ctx, c)
				RequireOutcome(t, state.OutcomeNotOwner, r, err)
				require.Equal(t, tc.want, r.Record.State)
			}
			rec, found, err := st.Get(ctx, key)
			require.NoError(t, err)
			require.True(t, found)
			require.Equal(t, tc.want, rec.State)
			require.Equal(t, "owner-a", rec.Owner)
			if tc.want == state.InFlight {
				require.False(t, rec.LeaseExpired, "a refused AbandonUnsent leaves the lease alone")
			}
		})
	}
}

// abandonRacesTakeover: the owner of an expired fresh claim abandons it
// while retries take it over. Either the abandon wins (the record is gone
// and every takeover finds nothing) or one takeover wins (the abandon is
// refused and the taker's record, fence 2, stays): never both.
func (s *suite) abandonRacesTakeover(t *testing.T, st state.Store) {
	ctx := ctxT(t)
	key := NewKey(t)
	a := s.acquireShortLease(t, st, key, "owner-a")
	s.waitPastShortLease()

	const n = 20
	answers := make([]state.Answer, n)
	errs := make([]error, n)
	var (
		abandon    state.Answer
		abandonErr error
		wg         sync.WaitGroup
	)
	start := make(chan struct{})
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			<-start
			answers[i], errs[i] = st.Takeover(ctx, state.TakeoverRequest{
				Key: key, NewOwner: fmt.Sprintf("taker-%02d", i), Fence: 1, Lease: 30 * time.Second,
			})
		}(i)
		if i == n/2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				abandon, abandonErr = st.AbandonUnsent(ctx, claimOf(a))
			}()
		}
	}
	close(start)
	wg.Wait()
	require.NoError(t, abandonErr)
	for i, err := range errs {
		require.NoError(t, err, "goroutine %d", i)
	}
	counts := CountOutcomes(answers)
	rec, found, err := st.Get(ctx, key)
	require.NoError(t, err)
	switch abandon.Outcome {
	case state.OutcomeOK:
		require.Equal(t, n, counts[state.OutcomeNotFound], "every takeover came after the abandon and found nothing: %v", counts)
		require.False(t, found, "the abandoned claim is gone")
	case state.OutcomeNotOwner:
		require.Equal(t, 1, counts[state.OutcomeAcquired], "%v", counts)
		require.True(t, found)
		require.Equal(t, int64(2), rec.Fence)
		require.Equal(t, state.InFlight, rec.State)
		require.False(t, rec.LeaseExpired, "the taker's lease is not touched by the refused abandon")
		require.Equal(t, int64(2), abandon.Record.Fence)
	default:
		t.Fatalf("abandon answered %s", abandon.Outcome)
	}
}

func (s *suite) leaseExpiryTakeover(t *testing.T, st state.Store) {
	ctx := ctxT(t)
	// A running lease is not taken over (checked on a long lease, so a slow
	// machine cannot turn it into an expired one).
	running := NewKey(t)
	s.acquire(t, st, running, "owner-a")
	early, err := st.Takeover(ctx, state.TakeoverRequest{Key: running, NewOwner: "owner-b", Fence: 1, Lease: 30 * time.Second})
	RequireOutcome(t, state.OutcomeInFlight, early, err)
	require.Equal(t, "owner-a", early.Record.Owner)
	require.Equal(t, int64(1), early.Record.Fence)
	require.False(t, early.Record.LeaseExpired)

	key := NewKey(t)
	a := s.acquireShortLease(t, st, key, "owner-a")

	s.waitPastShortLease()

	seen, err := st.Acquire(ctx, AcquireRequest(key, "owner-b"))
	RequireOutcome(t, state.OutcomeInFlight, seen, err)
	require.True(t, seen.Record.LeaseExpired)

	stale, err := st.Takeover(ctx, state.TakeoverRequest{Key: key, NewOwner: "owner-b", Fence: 0, Lease: 30 * time.Second})
	RequireOutcome(t, state.OutcomeInFlight, stale, err)
	require.Equal(t, int64(1), stale.Record.Fence)

	tk, err := st.Takeover(ctx, state.TakeoverRequest{Key: key, NewOwner: "owner-b", Fence: 1, Lease: 30 * time.Second})
	RequireOutcome(t, state.OutcomeAcquired, tk, err)
	require.Equal(t, int64(2), tk.Record.Fence)
	require.True(t, tk.Record.LeaseUntil.After(seen.Record.LeaseUntil))

	// The fence, not the owner id, refuses the old attempt: even the same
	// owner id with the old fence is refused.
	sameID, err := st.Complete(ctx, state.Claim{Key: key, Owner: "owner-b", Fence: 1}, failedCompletion())
	RequireOutcome(t, state.OutcomeNotOwner, sameID, err)
	late, err := st.Complete(ctx, claimOf(a), failedCompletion())
	RequireOutcome(t, state.OutcomeNotOwner, late, err)

	done, err := st.Complete(ctx, claimOf(tk), Done())
	RequireOutcome(t, state.OutcomeOK, done, err)
	after, err := st.Takeover(ctx, state.TakeoverRequest{Key: key, NewOwner: "owner-c", Fence: 2, Lease: 30 * time.Second})
	RequireOutcome(t, state.OutcomeDone, after, err)
	RequireSameResult(t, SampleResult(), after.Record.Result)

	absent, err := st.Takeover(ctx, state.TakeoverRequest{Key: NewKey(t), NewOwner: "o", Fence: 1, Lease: time.Second})
	RequireOutcome(t, state.OutcomeNotFound, absent, err)
}

func (s *suite) markUnknown(t *testing.T, st state.Store) {
	ctx := ctxT(t)
	key := NewKey(t)
	a := s.acquire(t, st, key, "owner-a")

	early, err := st.MarkUnknown(ctx, state.Claim{Key: key, Owner: "owner-b", Fence: 1})
	RequireOutcome(t, state.OutcomeNotOwner, early, err)
	require.Equal(t, state.InFlight, early.Record.State)

	m, err := st.MarkUnknown(ctx, claimOf(a))
	RequireOutcome(t, state.OutcomeOK, m, err)
	require.Equal(t, state.Unknown, m.Record.State)

	r, err := st.Acquire(ctx, AcquireRequest(key, "owner-c"))
	RequireOutcome(t, state.OutcomeUnknown, r, err)
	require.Equal(t, state.Unknown, r.Record.State)

	again, err := st.MarkUnknown(ctx, claimOf(a))
	RequireOutcome(t, state.OutcomeNotOwner, again, err)
	tk, err := st.Takeover(ctx, state.TakeoverRequest{Key: key, NewOwner: "owner-c", Fence: 1, Lease: time.Second})
	RequireOutcome(t, state.OutcomeUnknown, tk, err)
	rel, err := st.EndLease(ctx, claimOf(a))
	RequireOutcome(t, state.OutcomeNotOwner, rel, err)

	absent, err := st.MarkUnknown(ctx, state.Claim{Key: NewKey(t), Owner: "o", Fence: 1})
	RequireOutcome(t, state.OutcomeNotFound, absent, err)
}

func (s *suite) markUnknownAfterExpiry(t *testing.T, st state.Store) {
	ctx := ctxT(t)
	running := NewKey(t)
	s.acquire(t, st, running, "owner-a")
	before, err := st.MarkUnknown(ctx, state.Claim{Key: running, Owner: "owner-b", Fence: 1})
	RequireOutcome(t, state.OutcomeNotOwner, before, err)
	require.Equal(t, state.InFlight, before.Record.State)

	key := NewKey(t)
	s.acquireShortLease(t, st, key, "owner-a")
	s.waitPastShortLease()

	wrongFence, err := st.MarkUnknown(ctx, state.Claim{Key: key, Owner: "owner-b", Fence: 0})
	RequireOutcome(t, state.OutcomeNotOwner, wrongFence, err)
	after, err := st.MarkUnknown(ctx, state.Claim{Key: key, Owner: "owner-b", Fence: 1})
	RequireOutcome(t, state.OutcomeOK, after, err)
	require.Equal(t, state.Unknown, after.Record.State)
	r, err := st.Acquire(ctx, AcquireRequest(key, "owner-c"))
	RequireOutcome(t, state.OutcomeUnknown, r, err)
}

func (s *suite) completeUnknownByOwner(t *testing.T, st state.Store) {
	ctx := ctxT(t)
	key := NewKey(t)
	a := s.acquire(t, st, key, "owner-a")
	m, err := st.MarkUnknown(ctx, claimOf(a))
	RequireOutcome(t, state.OutcomeOK, m, err)

	other, err := st.Complete(ctx, state.Claim{Key: key, Owner: "owner-b", Fence: 1}, failedCompletion())
	RequireOutcome(t, state.OutcomeNotOwner, other, err)

	c, err := st.Complete(ctx, claimOf(a), Done())
	RequireOutcome(t, state.OutcomeOK, c, err)
	r, err := st.Acquire(ctx, AcquireRequest(key, "owner-c"))
	RequireOutcome(t, state.OutcomeDone, r, err)
	RequireSameResult(t, SampleResult(), r.Record.Result)
}

func (s *suite) resolve(t *testing.T, st state.Store) {
	ctx := ctxT(t)

	t.Run("unknown", func(t *testing.T) {
		key := NewKey(t)
		a := s.acquire(t, st, key, "owner-a")
		m, err := st.MarkUnknown(ctx, claimOf(a))
		RequireOutcome(t, state.OutcomeOK, m, err)
		r, err := st.Resolve(ctx, key, Done())
		RequireOutcome(t, state.OutcomeOK, r, err)
		require.Equal(t, state.Done, r.Record.State)
		replay, err := st.Acquire(ctx, AcquireRequest(key, "owner-b"))
		RequireOutcome(t, state.OutcomeDone, replay, err)
		RequireSameResult(t, SampleResult(), replay.Record.Result)
		// The owner learning its answer after a person settled it changes nothing.
		late, err := st.Complete(ctx, claimOf(a), failedCompletion())
		RequireOutcome(t, state.OutcomeNotOwner, late, err)
	})
	t.Run("in flight", func(t *testing.T) {
		key := NewKey(t)
		a := s.acquire(t, st, key, "owner-a")
		r, err := st.Resolve(ctx, key, failedCompletion())
		RequireOutcome(t, state.OutcomeOK, r, err)
		require.Equal(t, state.Failed, r.Record.State)
		late, err := st.Complete(ctx, claimOf(a), Done())
		RequireOutcome(t, state.OutcomeNotOwner, late, err)
		replay, err := st.Acquire(ctx, AcquireRequest(key, "owner-b"))
		RequireOutcome(t, state.OutcomeFailed, replay, err)
		RequireSameResult(t, failedCompletion().Result, replay.Record.Result)
	})
	t.Run("terminal is left alone", func(t *testing.T) {
		key := NewKey(t)
		a := s.acquire(t, st, key, "owner-a")
		c, err := st.Complete(ctx, claimOf(a), Done())
		RequireOutcome(t, state.OutcomeOK, c, err)
		r, err := st.Resolve(ctx, key, failedCompletion())
		RequireOutcome(t, state.OutcomeNotOwner, r, err)
		require.Equal(t, state.Done, r.Record.State)
		rec, _, err := st.Get(ctx, key)
		require.NoError(t, err)
		require.Equal(t, state.Done, rec.State)
		RequireSameResult(t, SampleResult(), rec.Result)
	})
	t.Run("absent", func(t *testing.T) {
		r, err := st.Resolve(ctx, NewKey(t), Done())
		RequireOutcome(t, state.OutcomeNotFound, r, err)
	})
}

func (s *suite) get(t *testing.T, st state.Store) {
	ctx := ctxT(t)
	_, found, err := st.Get(ctx, NewKey(t))
	require.NoError(t, err)
	require.False(t, found)

	key := NewKey(t)
	s.acquire(t, st, key, "owner-a")
	rec, found, err := st.Get(ctx, key)
	require.NoError(t, err)
	require.True(t, found)
	require.Equal(t, key, rec.Key)
	require.Equal(t, state.InFlight, rec.State)
	require.Equal(t, "owner-a", rec.Owner)
	require.Equal(t, int64(1), rec.Fence)
	require.Equal(t, "ph-1", rec.ParamHash)
	require.Equal(t, "payments.transfer", rec.Scope)
	require.Equal(t, "subj-tag-1", rec.SubjectTag)
	require.False(t, rec.LeaseExpired)
	require.Nil(t, rec.Result)

	short := NewKey(t)
	s.acquireShortLease(t, st, short, "owner-a")
	s.waitPastShortLease()
	rec, found, err = st.Get(ctx, short)
	require.NoError(t, err)
	require.True(t, found)
	require.True(t, rec.LeaseExpired, "LeaseExpired is computed when the record is read")
}

func (s *suite) retention(t *testing.T, st state.Store) {
	ctx := ctxT(t)
	key := NewKey(t)
	a := s.acquire(t, st, key, "owner-a")
	c := Done()
	c.Retention = s.opts.ShortLease
	done, err := st.Complete(ctx, claimOf(a), c)
	RequireOutcome(t, state.OutcomeOK, done, err)
	require.WithinDuration(t, done.Record.UpdatedAt.Add(s.opts.ShortLease), done.Record.ExpiresAt, 50*time.Millisecond)

	keep := NewKey(t)
	k := s.acquire(t, st, keep, "owner-k")
	kept, err := st.Complete(ctx, claimOf(k), Done())
	RequireOutcome(t, state.OutcomeOK, kept, err)

	s.opts.Wait(s.opts.ShortLease * 2)
	_, err = st.Sweep(ctx, 1000)
	require.NoError(t, err)
	_, found, err := st.Get(ctx, key)
	require.NoError(t, err)
	require.False(t, found, "a terminal record past its retention must be gone after a sweep")
	_, found, err = st.Get(ctx, keep)
	require.NoError(t, err)
	require.True(t, found, "a record within its retention must survive a sweep")

	again, err := st.Acquire(ctx, AcquireRequest(key, "owner-b"))
	RequireOutcome(t, state.OutcomeAcquired, again, err)

	n, err := st.Sweep(ctx, 0)
	require.NoError(t, err)
	require.Zero(t, n)
}

// ConcurrentAcquire runs n goroutines acquiring key with distinct owners at
// once and returns their answers.
func ConcurrentAcquire(t testing.TB, ctx context.Context, st state.Store, key string, n int) []state.Answer {
	t.Helper()
	answers := make([]state.Answer, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			<-start
			answers[i], errs[i] = st.Acquire(ctx, AcquireRequest(key, fmt.Sprintf("owner-%03d", i)))
		}(i)
	}
	close(start)
	wg.Wait()
	for i, err := range errs {
		require.NoError(t, err, "goroutine %d", i)
	}
	return answers
}

// CountOutcomes tallies answers by outcome.
func CountOutcomes(answers []state.Answer) map[state.Outcome]int {
	m := make(map[state.Outcome]int)
	for _, a := range answers {
		m[a.Outcome]++
	}
	return m
}

func (s *suite) concurrentAcquire(t *testing.T, st state.Store) {
	ctx := ctxT(t)
	key := NewKey(t)
	const n = 200
	answers := ConcurrentAcquire(t, ctx, st, key, n)
	require.Equal(t, map[state.Outcome]int{state.OutcomeAcquired: 1, state.OutcomeInFlight: n - 1}, CountOutcomes(answers))
	var winner state.Answer
	for _, a := range answers {
		if a.Outcome == state.OutcomeAcquired {
			winner = a
		}
	}
	for _, a := range answers {
		require.Equal(t, winner.Record.Owner, a.Record.Owner, "every loser must name the winner")
	}
	done, err := st.Complete(ctx, claimOf(winner), Done())
	RequireOutcome(t, state.OutcomeOK, done, err)

	answers = ConcurrentAcquire(t, ctx, st, key, n)
	require.Equal(t, map[state.Outcome]int{state.OutcomeDone: n}, CountOutcomes(answers))
	for _, a := range answers {
		RequireSameResult(t, SampleResult(), a.Record.Result)
	}
}

func (s *suite) concurrentTakeover(t *testing.T, st state.Store) {
	ctx := ctxT(t)
	key := NewKey(t)
	s.acquireShortLease(t, st, key, "owner-a")
	s.waitPastShortLease()

	const n = 50
	answers := make([]state.Answer, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			<-start
			answers[i], errs[i] = st.Takeover(ctx, state.TakeoverRequest{
				Key: key, NewOwner: fmt.Sprintf("taker-%02d", i), Fence: 1, Lease: 30 * time.Second,
			})
		}(i)
	}
	close(start)
	wg.Wait()
	for i, err := range errs {
		require.NoError(t, err, "goroutine %d", i)
	}
	require.Equal(t, map[state.Outcome]int{state.OutcomeAcquired: 1, state.OutcomeInFlight: n - 1}, CountOutcomes(answers))
	var winner string
	for _, a := range answers {
		if a.Outcome == state.OutcomeAcquired {
			winner = a.Record.Owner
		}
	}
	for _, a := range answers {
		require.Equal(t, int64(2), a.Record.Fence)
		require.Equal(t, winner, a.Record.Owner)
	}
}

func (s *suite) contextRespected(t *testing.T, st state.Store) {
	key := NewKey(t)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	claim := state.Claim{Key: key, Owner: "owner-a", Fence: 1}
	for _, tc := range []struct {
		name string
		call func() error
	}{
		{"acquire", func() error { _, err := st.Acquire(ctx, AcquireRequest(key, "owner-a")); return err }},
		{"complete", func() error { _, err := st.Complete(ctx, claim, Done()); return err }},
		{"release", func() error { _, err := st.EndLease(ctx, claim); return err }},
		{"abandon", func() error { _, err := st.AbandonUnsent(ctx, claim); return err }},
		{"mark unknown", func() error { _, err := st.MarkUnknown(ctx, claim); return err }},
		{"takeover", func() error {
			_, err := st.Takeover(ctx, state.TakeoverRequest{Key: key, NewOwner: "b", Fence: 1, Lease: time.Second})
			return err
		}},
		{"get", func() error { _, _, err := st.Get(ctx, key); return err }},
		{"resolve", func() error { _, err := st.Resolve(ctx, key, Done()); return err }},
		{"sweep", func() error { _, err := st.Sweep(ctx, 10); return err }},
		{"ping", func() error { return st.Ping(ctx) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.call()
			require.ErrorIs(t, err, context.Canceled)
		})
	}
	// Nothing was written by the cancelled calls.
	_, found, err := st.Get(ctxT(t), key)
	require.NoError(t, err)
	require.False(t, found)

	// An expired deadline is reported, not waited out.
	dctx, dcancel := context.WithDeadline(t.Context(), time.Now().Add(-time.Second))
	defer dcancel()
	_, err = st.Acquire(dctx, AcquireRequest(key, "owner-a"))
	require.ErrorIs(t, err, context.DeadlineExceeded)
}

func (s *suite) invalidArguments(t *testing.T, st state.Store) {
	ctx := ctxT(t)
	key := NewKey(t)
	bad := func(r state.AcquireRequest, f func(*state.AcquireRequest)) state.AcquireRequest { f(&r); return r }
	base := AcquireRequest(key, "owner-a")
	for _, tc := range []struct {
		name string
		call func() error
	}{
		{"short key", func() error {
			_, err := st.Acquire(ctx, bad(base, func(r *state.AcquireRequest) { r.Key = "abc" }))
			return err
		}},
		{"upper-case key", func() error {
			_, err := st.Acquire(ctx, bad(base, func(r *state.AcquireRequest) { r.Key = "ABCDEF0123456789ABCDEF0123456789" }))
			return err
		}},
		{"no owner", func() error {
			_, err := st.Acquire(ctx, bad(base, func(r *state.AcquireRequest) { r.Owner = "" }))
			return err
		}},
		{"no lease", func() error {
			_, err := st.Acquire(ctx, bad(base, func(r *state.AcquireRequest) { r.Lease = 0 }))
			return err
		}},
		{"no retention", func() error {
			_, err := st.Acquire(ctx, bad(base, func(r *state.AcquireRequest) { r.Retention = 0 }))
			return err
		}},
		{"complete non-terminal", func() error {
			_, err := st.Complete(ctx, state.Claim{Key: key, Owner: "o", Fence: 1}, state.Completion{State: state.InFlight, Result: state.Result{Status: 200}, Retention: time.Hour})
			return err
		}},
		{"complete bad status", func() error {
			_, err := st.Complete(ctx, state.Claim{Key: key, Owner: "o", Fence: 1}, state.Completion{State: state.Done, Result: state.Result{Status: 0}, Retention: time.Hour})
			return err
		}},
		{"resolve unknown state", func() error {
			_, err := st.Resolve(ctx, key, state.Completion{State: state.Unknown, Result: state.Result{Status: 200}, Retention: time.Hour})
			return err
		}},
		{"get bad key", func() error { _, _, err := st.Get(ctx, "nope"); return err }},
		{"abandon no owner", func() error {
			_, err := st.AbandonUnsent(ctx, state.Claim{Key: key, Fence: 1})
			return err
		}},
		{"abandon bad key", func() error {
			_, err := st.AbandonUnsent(ctx, state.Claim{Key: "abc", Owner: "o", Fence: 1})
			return err
		}},
		{"takeover no owner", func() error {
			_, err := st.Takeover(ctx, state.TakeoverRequest{Key: key, Fence: 1, Lease: time.Second})
			return err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.ErrorIs(t, tc.call(), state.ErrInvalidArgument)
		})
	}
	_, found, err := st.Get(ctx, key)
	require.NoError(t, err)
	require.False(t, found)
}

func (s *suite) ping(t *testing.T, st state.Store) {
	require.NoError(t, st.Ping(ctxT(t)))
}
