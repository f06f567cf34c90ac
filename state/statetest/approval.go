package statetest

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/state"
)

// ApprovalStore is a backend that keeps records and approvals.
type ApprovalStore interface {
	state.Store
	state.Approvals
}

// ApprovalOptions tunes RunApprovals.
type ApprovalOptions struct {
	// Now is the backend's clock as the test can read it (time.Now when
	// nil); Wait lets at least d pass on it (time.Sleep when nil).
	Now  func() time.Time
	Wait func(d time.Duration)
	// Short is the life of an approval a test waits out (300ms when zero).
	Short time.Duration
}

// RunApprovals is the conformance suite of state.Approvals (docs/design.md
// §10): memory, postgres and tiered run it.
func RunApprovals(t *testing.T, newStore func(t *testing.T) ApprovalStore, opts ApprovalOptions) {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Wait == nil {
		opts.Wait = time.Sleep
	}
	if opts.Short == 0 {
		opts.Short = 300 * time.Millisecond
	}
	s := &approvalSuite{opts: opts}
	for _, tc := range []struct {
		name string
		fn   func(t *testing.T, st ApprovalStore)
	}{
		{"OnePerNonce", s.onePerNonce},
		{"SelfApprovalRefused", s.selfApproval},
		{"RequesterMayDeny", s.requesterMayDeny},
		{"StepUpRecorded", s.stepUpRecorded},
		{"RequiredDistinctApprovers", s.requiredDistinct},
		{"DeniedNeverExecutes", s.deniedNeverExecutes},
		{"PendingNeverExecutes", s.pendingNeverExecutes},
		{"ConsumedOnceWithTheRecord", s.consumedOnce},
		{"FailedDoesNotFreeIt", s.failedDoesNotFree},
		{"NotForAnotherNonce", s.notForAnotherNonce},
		{"NotForOtherParams", s.notForOtherParams},
		{"ExistingRecordConsumesNothing", s.existingRecord},
		{"Lapses", s.lapses},
		{"ConcurrentConsume", s.concurrentConsume},
		{"ConcurrentApprovers", s.concurrentApprovers},
		{"List", s.list},
		{"RecordNotified", s.recordNotified},
		{"BudgetCountsExecutionsAndOpenApprovals", s.budgetCounts},
		{"BudgetExistingRecordAnswers", s.budgetExistingRecord},
		{"BudgetConcurrent", s.budgetConcurrent},
		{"InvalidArguments", s.invalidArguments},
	} {
		t.Run(tc.name, func(t *testing.T) { tc.fn(t, newStore(t)) })
	}
}

type approvalSuite struct{ opts ApprovalOptions }

// request is an approval of a fresh nonce by requester "req", one approver
// needed, four eyes, an hour to live.
func (s *approvalSuite) request(key string) state.ApprovalRequest {
	return state.ApprovalRequest{
		ID: state.NewApprovalID(), Key: key, Operation: "transfer", Scope: "payments.transfer", SubjectTag: "subj-tag-1",
		Requester: "req", ParamHash: "ph-1", Params: []byte(`{"amount":"1500.00","currency":"EUR"}`),
		Rules: []string{"amount >= 1000.00"}, Required: 1, DistinctFromRequester: true,
		ExpiresAt: s.opts.Now().Add(time.Hour),
	}
}

func create(t *testing.T, st ApprovalStore, req state.ApprovalRequest) state.Approval {
	t.Helper()
	a, created, err := st.RequestApproval(ctxT(t), req)
	require.NoError(t, err)
	require.True(t, created)
	return a
}

func decide(t *testing.T, st ApprovalStore, id, who string, approve bool) (state.DecisionOutcome, state.Approval) {
	t.Helper()
	out, a, err := st.DecideApproval(ctxT(t), state.Decision{ID: id, Approver: who, Approve: approve, Reason: "checked with " + who})
	require.NoError(t, err)
	return out, a
}

// approved creates an approval of key approved by "alice".
func (s *approvalSuite) approved(t *testing.T, st ApprovalStore, key string) state.Approval {
	t.Helper()
	a := create(t, st, s.request(key))
	out, a := decide(t, st, a.ID, "alice", true)
	require.Equal(t, state.DecisionRecorded, out)
	require.Equal(t, state.ApprovalApproved, a.State)
	return a
}

func kinds(a state.Approval) []string {
	var out []string
	for _, e := range a.Events {
		out = append(out, e.Kind)
	}
	return out
}

func requireNoRecord(t *testing.T, st ApprovalStore, key string) {
	t.Helper()
	_, found, err := st.Get(ctxT(t), key)
	require.NoError(t, err)
	require.False(t, found, "no record may exist")
}

func (s *approvalSuite) onePerNonce(t *testing.T, st ApprovalStore) {
	key := NewKey(t)
	req := s.request(key)
	a := create(t, st, req)
	require.Equal(t, state.ApprovalPending, a.State)
	require.Equal(t, req.ID, a.ID)
	require.Equal(t, key, a.Key)
	require.Equal(t, "req", a.Requester)
	require.JSONEq(t, string(req.Params), string(a.Params))
	require.Equal(t, []string{"amount >= 1000.00"}, a.Rules)
	require.Equal(t, []string{state.EventRequested}, kinds(a))
	require.WithinDuration(t, req.ExpiresAt, a.ExpiresAt, time.Millisecond)

	again := s.request(key)
	b, created, err := st.RequestApproval(ctxT(t), again)
	require.NoError(t, err)
	require.False(t, created, "a second request for the nonce returns the first")
	require.Equal(t, a.ID, b.ID)
	require.Len(t, b.Events, 1)

	got, found, err := st.ApprovalByKey(ctxT(t), key)
	require.NoError(t, err)
	require.True(t, found)
	require.Equal(t, a.ID, got.ID)
	got, found, err = st.GetApproval(ctxT(t), a.ID)
	require.NoError(t, err)
	require.True(t, found)
	require.Equal(t, key, got.Key)
	_, found, err = st.ApprovalByKey(ctxT(t), NewKey(t))
	require.NoError(t, err)
	require.False(t, found)
	_, found, err = st.GetApproval(ctxT(t), state.NewApprovalID())
	require.NoError(t, err)
	require.False(t, found)
	requireNoRecord(t, st, key)
}

func (s *approvalSuite) selfApproval(t *testing.T, st ApprovalStore) {
	a := create(t, st, s.request(NewKey(t)))
	out, got := decide(t, st, a.ID, "req", true)
	require.Equal(t, state.DecisionSelfApproval, out)
	require.Equal(t, state.ApprovalPending, got.State)
	require.Equal(t, []string{state.EventRequested}, kinds(got), "a refused decision records nothing")

	// Without four eyes the requester may approve.
	req := s.request(NewKey(t))
	req.DistinctFromRequester = false
	b := create(t, st, req)
	out, got = decide(t, st, b.ID, "req", true)
	require.Equal(t, state.DecisionRecorded, out)
	require.Equal(t, state.ApprovalApproved, got.State)
}

// stepUpRecorded (docs/design.md §13): a requester's approval marked
// StepUp counts under four eyes and is consumed like any other; how the
// person authenticated (acr, amr, auth_time) is stored with the decision
// and read back.
func (s *approvalSuite) stepUpRecorded(t *testing.T, st ApprovalStore) {
	a := create(t, st, s.request(NewKey(t)))
	authTime := s.opts.Now().Add(-time.Minute).Truncate(time.Second)
	out, got, err := st.DecideApproval(ctxT(t), state.Decision{ID: a.ID, Approver: "req", Approve: true, Reason: "it is my rent",
		StepUp: true, ACR: "urn:example:sca", AMR: []string{"hwk", "pin"}, AuthTime: authTime})
	require.NoError(t, err)
	require.Equal(t, state.DecisionRecorded, out)
	require.Equal(t, state.ApprovalApproved, got.State)
	for _, read := range []state.Approval{got, s.reread(t, st, a.ID)} {
		last := read.Events[len(read.Events)-1]
		require.Equal(t, state.EventApproved, last.Kind)
		require.Equal(t, "req", last.Actor)
		require.Equal(t, "urn:example:sca", last.ACR)
		require.Equal(t, []string{"hwk", "pin"}, last.AMR)
		require.True(t, authTime.Equal(last.AuthTime), "%s != %s", authTime, last.AuthTime)
		first := read.Events[0]
		require.Empty(t, first.ACR)
		require.Nil(t, first.AMR)
		require.True(t, first.AuthTime.IsZero())
	}
	ans, err := st.AcquireApproved(ctxT(t), AcquireRequest(a.Key, "o1"), a.ID)
	require.NoError(t, err)
	require.NotNil(t, ans.Answer)
	require.Equal(t, state.OutcomeAcquired, ans.Answer.Outcome)
	require.Equal(t, state.ApprovalConsumed, ans.Approval.State)
}

func (s *approvalSuite) reread(t *testing.T, st ApprovalStore, id string) state.Approval {
	t.Helper()
	a, found, err := st.GetApproval(ctxT(t), id)
	require.NoError(t, err)
	require.True(t, found)
	return a
}

func (s *approvalSuite) requesterMayDeny(t *testing.T, st ApprovalStore) {
	a := create(t, st, s.request(NewKey(t)))
	out, got := decide(t, st, a.ID, "req", false)
	require.Equal(t, state.DecisionRecorded, out)
	require.Equal(t, state.ApprovalDenied, got.State)
	last := got.Events[len(got.Events)-1]
	require.Equal(t, state.EventDenied, last.Kind)
	require.Equal(t, "req", last.Actor)
	require.Equal(t, "checked with req", last.Reason)
	require.Equal(t, "ph-1", last.ParamHash, "the decision records the hash of the params shown")
}

func (s *approvalSuite) requiredDistinct(t *testing.T, st ApprovalStore) {
	req := s.request(NewKey(t))
	req.Required = 2
	a := create(t, st, req)
	out, got := decide(t, st, a.ID, "alice", true)
	require.Equal(t, state.DecisionRecorded, out)
	require.Equal(t, state.ApprovalPending, got.State)
	out, got = decide(t, st, a.ID, "alice", true)
	require.Equal(t, state.DecisionRepeated, out, "an approver counts once")
	require.Equal(t, state.ApprovalPending, got.State)
	require.Equal(t, []string{"alice"}, got.Approvers())
	out, got = decide(t, st, a.ID, "bob", true)
	require.Equal(t, state.DecisionRecorded, out)
	require.Equal(t, state.ApprovalApproved, got.State)
	require.Equal(t, []string{"alice", "bob"}, got.Approvers())
	out, _ = decide(t, st, a.ID, "alice", true)
	require.Equal(t, state.DecisionRepeated, out)
	out, got = decide(t, st, a.ID, "carol", true)
	require.Equal(t, state.DecisionNotPending, out)
	require.Equal(t, []string{state.EventRequested, state.EventApproved, state.EventApproved}, kinds(got))
	out, got = decide(t, st, a.ID, "carol", false)
	require.Equal(t, state.DecisionNotPending, out, "an approved approval is not denied afterwards")
	require.Equal(t, state.ApprovalApproved, got.State)
	out, _ = decide(t, st, state.NewApprovalID(), "carol", true)
	require.Equal(t, state.DecisionNotFound, out)
}

func (s *approvalSuite) deniedNeverExecutes(t *testing.T, st ApprovalStore) {
	key := NewKey(t)
	req := s.request(key)
	req.Required = 2
	a := create(t, st, req)
	decide(t, st, a.ID, "alice", true)
	out, got := decide(t, st, a.ID, "bob", false)
	require.Equal(t, state.DecisionRecorded, out, "one deny decides")
	require.Equal(t, state.ApprovalDenied, got.State)
	out, _ = decide(t, st, a.ID, "carol", true)
	require.Equal(t, state.DecisionNotPending, out)
	ans, err := st.AcquireApproved(ctxT(t), AcquireRequest(key, "o1"), a.ID)
	require.NoError(t, err)
	require.Nil(t, ans.Answer)
	require.Equal(t, state.ApprovalDenied, ans.Approval.State)
	requireNoRecord(t, st, key)
}

func (s *approvalSuite) pendingNeverExecutes(t *testing.T, st ApprovalStore) {
	key := NewKey(t)
	a := create(t, st, s.request(key))
	ans, err := st.AcquireApproved(ctxT(t), AcquireRequest(key, "o1"), a.ID)
	require.NoError(t, err)
	require.Nil(t, ans.Answer)
	require.Equal(t, state.ApprovalPending, ans.Approval.State)
	requireNoRecord(t, st, key)
	ans, err = st.AcquireApproved(ctxT(t), AcquireRequest(key, "o1"), state.NewApprovalID())
	require.NoError(t, err)
	require.Nil(t, ans.Answer, "an unknown approval grants nothing")
	requireNoRecord(t, st, key)
}

func (s *approvalSuite) consumedOnce(t *testing.T, st ApprovalStore) {
	key := NewKey(t)
	a := s.approved(t, st, key)
	ans, err := st.AcquireApproved(ctxT(t), AcquireRequest(key, "o1"), a.ID)
	require.NoError(t, err)
	require.NotNil(t, ans.Answer)
	RequireOutcome(t, state.OutcomeAcquired, *ans.Answer, nil)
	require.Equal(t, state.ApprovalConsumed, ans.Approval.State)
	require.Equal(t, []string{state.EventRequested, state.EventApproved, state.EventConsumed}, kinds(ans.Approval))
	rec, found, err := st.Get(ctxT(t), key)
	require.NoError(t, err)
	require.True(t, found)
	require.Equal(t, state.InFlight, rec.State)
	require.Equal(t, "o1", rec.Owner)

	got, _, err := st.GetApproval(ctxT(t), a.ID)
	require.NoError(t, err)
	require.Equal(t, state.ApprovalConsumed, got.State)

	ans, err = st.AcquireApproved(ctxT(t), AcquireRequest(key, "o2"), a.ID)
	require.NoError(t, err)
	require.Nil(t, ans.Answer, "a consumed approval grants nothing again")
	rec, _, err = st.Get(ctxT(t), key)
	require.NoError(t, err)
	require.Equal(t, "o1", rec.Owner)
}

func (s *approvalSuite) failedDoesNotFree(t *testing.T, st ApprovalStore) {
	for _, end := range []string{"failed", "unknown"} {
		t.Run(end, func(t *testing.T) {
			key := NewKey(t)
			a := s.approved(t, st, key)
			ans, err := st.AcquireApproved(ctxT(t), AcquireRequest(key, "o1"), a.ID)
			require.NoError(t, err)
			RequireOutcome(t, state.OutcomeAcquired, *ans.Answer, nil)
			claim := state.Claim{Key: key, Owner: "o1", Fence: 1}
			if end == "failed" {
				c, err := st.Complete(ctxT(t), claim, failedCompletion())
				RequireOutcome(t, state.OutcomeOK, c, err)
			} else {
				c, err := st.MarkUnknown(ctxT(t), claim)
				RequireOutcome(t, state.OutcomeOK, c, err)
			}
			got, _, err := st.GetApproval(ctxT(t), a.ID)
			require.NoError(t, err)
			require.Equal(t, state.ApprovalConsumed, got.State)
			ans, err = st.AcquireApproved(ctxT(t), AcquireRequest(key, "o2"), a.ID)
			require.NoError(t, err)
			require.Nil(t, ans.Answer)
			out, _ := decide(t, st, a.ID, "bob", true)
			require.Equal(t, state.DecisionNotPending, out)
		})
	}
}

func (s *approvalSuite) notForAnotherNonce(t *testing.T, st ApprovalStore) {
	key, other := NewKey(t), NewKey(t)
	a := s.approved(t, st, key)
	ans, err := st.AcquireApproved(ctxT(t), AcquireRequest(other, "o1"), a.ID)
	require.NoError(t, err)
	require.Nil(t, ans.Answer, "an approval is for its own nonce only")
	require.Equal(t, state.ApprovalApproved, ans.Approval.State)
	requireNoRecord(t, st, other)
	// Its own nonce still may.
	ans, err = st.AcquireApproved(ctxT(t), AcquireRequest(key, "o1"), a.ID)
	require.NoError(t, err)
	RequireOutcome(t, state.OutcomeAcquired, *ans.Answer, nil)
}

func (s *approvalSuite) notForOtherParams(t *testing.T, st ApprovalStore) {
	key := NewKey(t)
	a := s.approved(t, st, key)
	req := AcquireRequest(key, "o1")
	req.ParamHash = "ph-other"
	ans, err := st.AcquireApproved(ctxT(t), req, a.ID)
	require.NoError(t, err)
	require.Nil(t, ans.Answer, "an approval does not survive a params change")
	require.Equal(t, state.ApprovalApproved, ans.Approval.State)
	requireNoRecord(t, st, key)
}

func (s *approvalSuite) existingRecord(t *testing.T, st ApprovalStore) {
	key := NewKey(t)
	a := s.approved(t, st, key)
	first, err := st.Acquire(ctxT(t), AcquireRequest(key, "o0"))
	RequireOutcome(t, state.OutcomeAcquired, first, err)
	ans, err := st.AcquireApproved(ctxT(t), AcquireRequest(key, "o1"), a.ID)
	require.NoError(t, err)
	require.NotNil(t, ans.Answer)
	RequireOutcome(t, state.OutcomeInFlight, *ans.Answer, nil)
	require.Equal(t, state.ApprovalApproved, ans.Approval.State, "nothing was created, so nothing is consumed")
}

// LapseReporter is a store that tells of the approvals it marks EXPIRED
// (serve counts them): memory and postgres.
type LapseReporter interface {
	OnApprovalLapse(fn func(operation string))
}

func (s *approvalSuite) lapses(t *testing.T, st ApprovalStore) {
	var mu sync.Mutex
	var lapsed []string
	reporter, reports := st.(LapseReporter)
	if reporter != nil {
		reporter.OnApprovalLapse(func(op string) {
			mu.Lock()
			defer mu.Unlock()
			lapsed = append(lapsed, op)
		})
	}
	pending := s.request(NewKey(t))
	pending.ExpiresAt = s.opts.Now().Add(s.opts.Short)
	p := create(t, st, pending)
	granted := s.request(NewKey(t))
	granted.ExpiresAt = s.opts.Now().Add(s.opts.Short)
	g := create(t, st, granted)
	out, got := decide(t, st, g.ID, "alice", true)
	require.Equal(t, state.DecisionRecorded, out)
	require.Equal(t, state.ApprovalApproved, got.State)
	s.opts.Wait(s.opts.Short + 50*time.Millisecond)

	got, found, err := st.GetApproval(ctxT(t), p.ID)
	require.NoError(t, err)
	require.True(t, found)
	require.Equal(t, state.ApprovalExpired, got.State)
	require.Equal(t, []string{state.EventRequested, state.EventExpired}, kinds(got))
	out, _ = decide(t, st, p.ID, "alice", true)
	require.Equal(t, state.DecisionNotPending, out)

	ans, err := st.AcquireApproved(ctxT(t), AcquireRequest(granted.Key, "o1"), g.ID)
	require.NoError(t, err)
	require.Nil(t, ans.Answer, "a lapsed approval grants nothing")
	require.Equal(t, state.ApprovalExpired, ans.Approval.State)
	requireNoRecord(t, st, granted.Key)
	got, _, err = st.ApprovalByKey(ctxT(t), granted.Key)
	require.NoError(t, err)
	require.Equal(t, []string{state.EventRequested, state.EventApproved, state.EventExpired}, kinds(got), "expired once")
	if reports {
		_, err := st.ListApprovals(ctxT(t), state.ApprovalFilter{})
		require.NoError(t, err)
		mu.Lock()
		defer mu.Unlock()
		require.Equal(t, []string{"transfer", "transfer"}, lapsed, "each lapse reported once, by the call that marked it")
	}
}

func (s *approvalSuite) concurrentConsume(t *testing.T, st ApprovalStore) {
	key := NewKey(t)
	a := s.approved(t, st, key)
	const n = 16
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
			ans, err := st.AcquireApproved(ctxT(t), AcquireRequest(key, "o"+string(rune('a'+i))), a.ID)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
				return
			}
			if ans.Answer != nil && ans.Answer.Outcome == state.OutcomeAcquired {
				acquired++
			}
		}()
	}
	wg.Wait()
	require.Empty(t, errs)
	require.Equal(t, 1, acquired)
	got, _, err := st.GetApproval(ctxT(t), a.ID)
	require.NoError(t, err)
	require.Equal(t, []string{state.EventRequested, state.EventApproved, state.EventConsumed}, kinds(got))
}

func (s *approvalSuite) concurrentApprovers(t *testing.T, st ApprovalStore) {
	req := s.request(NewKey(t))
	req.Required = 2
	a := create(t, st, req)
	var wg sync.WaitGroup
	for _, who := range []string{"a", "b", "c", "d", "e", "f", "a", "b"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _, err := st.DecideApproval(ctxT(t), state.Decision{ID: a.ID, Approver: who, Approve: true, Reason: "ok"})
			require.NoError(t, err)
		}()
	}
	wg.Wait()
	got, _, err := st.GetApproval(ctxT(t), a.ID)
	require.NoError(t, err)
	require.Equal(t, state.ApprovalApproved, got.State)
	require.Len(t, got.Approvers(), 2, "exactly the required number of distinct approvals is recorded")
	require.Len(t, got.Events, 3)
}

func (s *approvalSuite) list(t *testing.T, st ApprovalStore) {
	p := create(t, st, s.request(NewKey(t)))
	g := s.approved(t, st, NewKey(t))
	all, err := st.ListApprovals(ctxT(t), state.ApprovalFilter{})
	require.NoError(t, err)
	ids := map[string]state.ApprovalState{}
	for _, a := range all {
		ids[a.ID] = a.State
	}
	require.Equal(t, state.ApprovalPending, ids[p.ID])
	require.Equal(t, state.ApprovalApproved, ids[g.ID])
	pending, err := st.ListApprovals(ctxT(t), state.ApprovalFilter{State: state.ApprovalPending})
	require.NoError(t, err)
	for _, a := range pending {
		require.Equal(t, state.ApprovalPending, a.State)
		require.NotEqual(t, g.ID, a.ID)
	}
}

func (s *approvalSuite) invalidArguments(t *testing.T, st ApprovalStore) {
	bad := s.request("nope")
	_, _, err := st.RequestApproval(ctxT(t), bad)
	require.ErrorIs(t, err, state.ErrInvalidArgument)
	bad = s.request(NewKey(t))
	bad.ID = "not-an-id"
	_, _, err = st.RequestApproval(ctxT(t), bad)
	require.ErrorIs(t, err, state.ErrInvalidArgument)
	a := create(t, st, s.request(NewKey(t)))
	_, _, err = st.DecideApproval(ctxT(t), state.Decision{ID: a.ID, Approver: "alice", Approve: true, Reason: "  "})
	require.ErrorIs(t, err, state.ErrInvalidArgument, "a decision needs a reason")
	_, _, err = st.DecideApproval(ctxT(t), state.Decision{ID: a.ID, Approve: true, Reason: "ok"})
	require.ErrorIs(t, err, state.ErrInvalidArgument)
}

func (s *approvalSuite) recordNotified(t *testing.T, st ApprovalStore) {
	a := create(t, st, s.request(NewKey(t)))
	found, err := st.RecordNotified(ctxT(t), a.ID, "https://hooks.example")
	require.NoError(t, err)
	require.True(t, found)
	got, _, err := st.GetApproval(ctxT(t), a.ID)
	require.NoError(t, err)
	require.Equal(t, state.ApprovalPending, got.State)
	require.Equal(t, []string{state.EventRequested, state.EventNotified}, kinds(got))
	require.Equal(t, "https://hooks.example", got.Events[1].Actor)
	found, err = st.RecordNotified(ctxT(t), state.NewApprovalID(), "x")
	require.NoError(t, err)
	require.False(t, found)
}

// spendOf is a spend of amount on budget (a fresh budget per test: the
// backends of one suite may share a database) with a limit of 500.00.
func spendOf(budget, amount string) []state.Spend {
	return []state.Spend{{Operation: "transfer", Budget: budget, Amount: amount, Over: "500.00"}}
}

func (s *approvalSuite) budgetCounts(t *testing.T, st ApprovalStore) {
	budget := "subj-tag-1|EUR|" + NewKey(t)
	within := func(amount string) state.BudgetAnswer {
		t.Helper()
		ans, err := st.AcquireWithinBudget(ctxT(t), AcquireRequest(NewKey(t), "o"), spendOf(budget, amount))
		require.NoError(t, err)
		return ans
	}
	first := within("300.00")
	require.Empty(t, first.Exceeded)
	RequireOutcome(t, state.OutcomeAcquired, *first.Answer, nil)
	over := within("200.01")
	require.Equal(t, []int{0}, over.Exceeded, "300.00 + 200.01 > 500.00")
	require.Nil(t, over.Answer)
	exact := within("200.00")
	require.Empty(t, exact.Exceeded, "exactly the limit is not over it")

	// Another budget (another currency) is its own.
	other, err := st.AcquireWithinBudget(ctxT(t), AcquireRequest(NewKey(t), "o"),
		[]state.Spend{{Operation: "transfer", Budget: "subj-tag-1|USD|" + NewKey(t), Amount: "499", Over: "500"}})
	require.NoError(t, err)
	require.Empty(t, other.Exceeded)

	// A FAILED execution frees its amount; an UNKNOWN one does not.
	c, err := st.Complete(ctxT(t), state.Claim{Key: exact.Answer.Record.Key, Owner: "o", Fence: 1}, failedCompletion())
	RequireOutcome(t, state.OutcomeOK, c, err)
	u, err := st.MarkUnknown(ctxT(t), state.Claim{Key: first.Answer.Record.Key, Owner: "o", Fence: 1})
	RequireOutcome(t, state.OutcomeOK, u, err)
	require.Empty(t, within("100.00").Exceeded)
	require.Equal(t, []int{0}, within("100.01").Exceeded)

	// A pending approval counts; a denied one does not.
	req := s.request(NewKey(t))
	req.Spends = spendOf(budget, "50.00")
	a := create(t, st, req)
	require.Equal(t, []int{0}, within("50.01").Exceeded, "300 unknown + 100 + 50 pending + 50.01 > 500")
	decide(t, st, a.ID, "alice", false)
	require.Empty(t, within("50.01").Exceeded, "a denied approval does not count")
}

func (s *approvalSuite) budgetExistingRecord(t *testing.T, st ApprovalStore) {
	key, budget := NewKey(t), NewKey(t)
	first, err := st.AcquireWithinBudget(ctxT(t), AcquireRequest(key, "o1"), spendOf(budget, "400"))
	require.NoError(t, err)
	RequireOutcome(t, state.OutcomeAcquired, *first.Answer, nil)
	again, err := st.AcquireWithinBudget(ctxT(t), AcquireRequest(key, "o2"), spendOf(budget, "400"))
	require.NoError(t, err)
	require.Empty(t, again.Exceeded, "a nonce with a record is answered by it, whatever the budget says now")
	RequireOutcome(t, state.OutcomeInFlight, *again.Answer, nil)
	other := AcquireRequest(key, "o3")
	other.ParamHash = "ph-other"
	mismatch, err := st.AcquireWithinBudget(ctxT(t), other, spendOf(budget, "1"))
	require.NoError(t, err)
	RequireOutcome(t, state.OutcomeParamMismatch, *mismatch.Answer, nil)
}

func (s *approvalSuite) budgetConcurrent(t *testing.T, st ApprovalStore) {
	const n = 12
	budget := NewKey(t)
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		acquired int
		errs     []error
	)
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ans, err := st.AcquireWithinBudget(ctxT(t), AcquireRequest(NewKey(t), "o"),
				[]state.Spend{{Operation: "transfer", Budget: budget, Amount: "100", Over: "450"}})
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
				return
			}
			if ans.Answer != nil && ans.Answer.Outcome == state.OutcomeAcquired {
				acquired++
			}
		}()
	}
	wg.Wait()
	require.Empty(t, errs)
	require.Equal(t, 4, acquired, "the budget is checked and spent atomically")
}
