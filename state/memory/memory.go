// Package memory is the embedded default store: one process, no services,
// the same semantics as the Redis and PostgreSQL backends (the shared
// conformance suite in state/statetest proves it).
//
// Design choices:
//   - One mutex around one map. Every call is a few map operations, so a
//     single lock is both the simplest way to make Acquire atomic and fast
//     enough for the demo and local development it serves; sharding would
//     only add code.
//   - Records are copied in and out, so a caller can never mutate stored
//     bytes and break the byte-identical replay.
//   - Time comes from an injectable clock (Options.Now) so tests can move a
//     lease past its end without sleeping. Times are truncated to
//     microseconds like PostgreSQL's timestamptz, so every backend reports
//     the same precision.
//   - Expiry is lazy plus Sweep: a record whose ExpiresAt has passed is
//     treated as absent by every call and deleted when touched; Sweep removes
//     the rest in bounded batches when the server's sweeper calls it. Like
//     Redis key expiry, this applies to every state: an IN_FLIGHT or UNKNOWN
//     record outlives the fingerprint that could reach it long before its
//     retention runs out, so forgetting it then bounds memory without
//     opening a hole. (PostgreSQL, the system of record, keeps unresolved
//     records until a person resolves them.)
package memory

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/idemgate/idemgate/state"
)

// Options configures a memory store.
type Options struct {
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// Store is an in-process state.Store.
type Store struct {
	mu      sync.Mutex
	records map[string]*state.Record
	// approvals by id, and their ids by nonce (approval.go).
	approvals    map[string]*state.Approval
	approvalKeys map[string]string
	// spends of daily_total budgets, by nonce and budget (approval.go).
	spends map[spendKey]*spend
	now    func() time.Time
	closed bool
	// onLapse is told of approvals marked EXPIRED (OnApprovalLapse).
	onLapse func(operation string)
}

var _ state.Store = (*Store)(nil)

// ErrClosed is returned by calls on a closed store.
var ErrClosed = errors.New("memory store closed")

// New returns an empty store.
func New(opts Options) *Store {
	now := opts.Now
	if now == nil {
		now = time.Now
	}
	return &Store{records: make(map[string]*state.Record), approvals: map[string]*state.Approval{}, approvalKeys: map[string]string{}, spends: map[spendKey]*spend{}, now: now}
}

func (s *Store) clock() time.Time { return s.now().Truncate(time.Microsecond) }

// begin checks the context and the store, locks, and returns the current
// time. The caller must unlock.
func (s *Store) begin(ctx context.Context, op string) (time.Time, error) {
	if err := ctx.Err(); err != nil {
		return time.Time{}, state.Unavailable(op, err)
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return time.Time{}, state.Unavailable(op, ErrClosed)
	}
	return s.clock(), nil
}

// lookup returns the live record for key, deleting it if it has expired.
func (s *Store) lookup(key string, now time.Time) *state.Record {
	rec, ok := s.records[key]
	if !ok {
		return nil
	}
	if !now.Before(rec.ExpiresAt) {
		delete(s.records, key)
		return nil
	}
	return rec
}

// view is the copy of rec handed to callers, with LeaseExpired computed now.
func view(rec *state.Record, now time.Time) state.Record {
	out := rec.Clone()
	out.LeaseExpired = !now.Before(rec.LeaseUntil)
	return out
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// Acquire implements state.Store.
func (s *Store) Acquire(ctx context.Context, req state.AcquireRequest) (state.Answer, error) {
	if err := req.Validate(); err != nil {
		return state.Answer{}, err
	}
	now, err := s.begin(ctx, "acquire")
	if err != nil {
		return state.Answer{}, err
	}
	defer s.mu.Unlock()
	return s.acquireLocked(req, now), nil
}

// acquireLocked is Acquire with s.mu held.
func (s *Store) acquireLocked(req state.AcquireRequest, now time.Time) state.Answer {
	if rec := s.lookup(req.Key, now); rec != nil {
		if rec.ParamHash != req.ParamHash {
			return state.Answer{Outcome: state.OutcomeParamMismatch, Record: view(rec, now)}
		}
		return state.Answer{Outcome: state.OutcomeOf(rec.State), Record: view(rec, now)}
	}
	leaseUntil := now.Add(req.Lease).Truncate(time.Microsecond)
	rec := &state.Record{
		Key:        req.Key,
		Scope:      req.Scope,
		SubjectTag: req.SubjectTag,
		ParamHash:  req.ParamHash,
		State:      state.InFlight,
		Owner:      req.Owner,
		Fence:      1,
		LeaseUntil: leaseUntil,
		CreatedAt:  now,
		UpdatedAt:  now,
		// Never let the record vanish while its lease runs: a retry would
		// then find nothing and execute again.
		ExpiresAt: maxTime(now.Add(req.Retention).Truncate(time.Microsecond), leaseUntil),
	}
	s.records[req.Key] = rec
	return state.Answer{Outcome: state.OutcomeAcquired, Record: view(rec, now)}
}

func owns(rec *state.Record, c state.Claim) bool {
	return rec.Owner == c.Owner && rec.Fence == c.Fence
}

func finish(rec *state.Record, c state.Completion, now time.Time) {
	rec.State = c.State
	rec.Result = c.Result.Clone()
	rec.UpdatedAt = now
	rec.ExpiresAt = now.Add(c.Retention).Truncate(time.Microsecond)
}

// ownerCall applies change to the record claim holds, if it is in one of
// the states given; otherwise it answers NOT_OWNER (with the record when
// there is one) and changes nothing. change reports whether it deleted the
// record.
func (s *Store) ownerCall(ctx context.Context, op string, claim state.Claim, states []state.RecordState, change func(rec *state.Record, now time.Time) (deleted bool)) (state.Answer, error) {
	if err := claim.Validate(); err != nil {
		return state.Answer{}, err
	}
	now, err := s.begin(ctx, op)
	if err != nil {
		return state.Answer{}, err
	}
	defer s.mu.Unlock()
	rec := s.lookup(claim.Key, now)
	if rec == nil {
		return state.Answer{Outcome: state.OutcomeNotOwner}, nil
	}
	if !owns(rec, claim) || !slices.Contains(states, rec.State) {
		return state.Answer{Outcome: state.OutcomeNotOwner, Record: view(rec, now)}, nil
	}
	if change(rec, now) {
		delete(s.records, claim.Key)
		return state.Answer{Outcome: state.OutcomeOK}, nil
	}
	return state.Answer{Outcome: state.OutcomeOK, Record: view(rec, now)}, nil
}

var (
	inFlight          = []state.RecordState{state.InFlight}
	inFlightOrUnknown = []state.RecordState{state.InFlight, state.Unknown}
)

// endLease ends rec's lease now: the next retry may take over.
func endLease(rec *state.Record, now time.Time) bool {
	rec.LeaseUntil = now
	rec.UpdatedAt = now
	return false
}

// Complete implements state.Store.
func (s *Store) Complete(ctx context.Context, claim state.Claim, c state.Completion) (state.Answer, error) {
	if err := c.Validate(); err != nil {
		return state.Answer{}, err
	}
	return s.ownerCall(ctx, "complete", claim, inFlightOrUnknown, func(rec *state.Record, now time.Time) bool {
		finish(rec, c, now)
		return false
	})
}

// EndLease implements state.Store.
func (s *Store) EndLease(ctx context.Context, claim state.Claim) (state.Answer, error) {
	return s.ownerCall(ctx, "end lease", claim, inFlight, endLease)
}

// AbandonUnsent implements state.Store: a fresh claim (fence 1) is deleted,
// a takeover's lease ended (an earlier attempt may have executed).
func (s *Store) AbandonUnsent(ctx context.Context, claim state.Claim) (state.Answer, error) {
	return s.ownerCall(ctx, "abandon unsent", claim, inFlight, func(rec *state.Record, now time.Time) bool {
		if rec.Fence == 1 {
			return true
		}
		return endLease(rec, now)
	})
}

// MarkUnknown implements state.Store.
func (s *Store) MarkUnknown(ctx context.Context, claim state.Claim) (state.Answer, error) {
	if err := claim.Validate(); err != nil {
		return state.Answer{}, err
	}
	now, err := s.begin(ctx, "mark unknown")
	if err != nil {
		return state.Answer{}, err
	}
	defer s.mu.Unlock()
	rec := s.lookup(claim.Key, now)
	if rec == nil {
		return state.Answer{Outcome: state.OutcomeNotFound}, nil
	}
	expired := !now.Before(rec.LeaseUntil)
	if rec.State != state.InFlight || rec.Fence != claim.Fence || (rec.Owner != claim.Owner && !expired) {
		return state.Answer{Outcome: state.OutcomeNotOwner, Record: view(rec, now)}, nil
	}
	rec.State = state.Unknown
	rec.UpdatedAt = now
	return state.Answer{Outcome: state.OutcomeOK, Record: view(rec, now)}, nil
}

// Takeover implements state.Store.
func (s *Store) Takeover(ctx context.Context, req state.TakeoverRequest) (state.Answer, error) {
	if err := req.Validate(); err != nil {
		return state.Answer{}, err
	}
	now, err := s.begin(ctx, "take over")
	if err != nil {
		return state.Answer{}, err
	}
	defer s.mu.Unlock()
	rec := s.lookup(req.Key, now)
	if rec == nil {
		return state.Answer{Outcome: state.OutcomeNotFound}, nil
	}
	if rec.State != state.InFlight || rec.Fence != req.Fence || now.Before(rec.LeaseUntil) {
		return state.Answer{Outcome: state.OutcomeOf(rec.State), Record: view(rec, now)}, nil
	}
	rec.Owner = req.NewOwner
	rec.Fence++
	rec.LeaseUntil = now.Add(req.Lease).Truncate(time.Microsecond)
	rec.UpdatedAt = now
	rec.ExpiresAt = maxTime(rec.ExpiresAt, rec.LeaseUntil)
	return state.Answer{Outcome: state.OutcomeAcquired, Record: view(rec, now)}, nil
}

// Get implements state.Store.
func (s *Store) Get(ctx context.Context, key string) (state.Record, bool, error) {
	if err := state.ValidKey(key); err != nil {
		return state.Record{}, false, err
	}
	now, err := s.begin(ctx, "get")
	if err != nil {
		return state.Record{}, false, err
	}
	defer s.mu.Unlock()
	rec := s.lookup(key, now)
	if rec == nil {
		return state.Record{}, false, nil
	}
	return view(rec, now), true, nil
}

// Resolve implements state.Store.
func (s *Store) Resolve(ctx context.Context, key string, c state.Completion) (state.Answer, error) {
	if err := state.ValidKey(key); err != nil {
		return state.Answer{}, err
	}
	if err := c.Validate(); err != nil {
		return state.Answer{}, err
	}
	now, err := s.begin(ctx, "resolve")
	if err != nil {
		return state.Answer{}, err
	}
	defer s.mu.Unlock()
	rec := s.lookup(key, now)
	if rec == nil {
		return state.Answer{Outcome: state.OutcomeNotFound}, nil
	}
	if rec.State.Terminal() {
		return state.Answer{Outcome: state.OutcomeNotOwner, Record: view(rec, now)}, nil
	}
	finish(rec, c, now)
	return state.Answer{Outcome: state.OutcomeOK, Record: view(rec, now)}, nil
}

// Sweep deletes up to limit expired records (of any state, see the package
// doc) and reports how many it deleted.
func (s *Store) Sweep(ctx context.Context, limit int) (int, error) {
	if limit <= 0 {
		return 0, nil
	}
	now, err := s.begin(ctx, "sweep")
	if err != nil {
		return 0, err
	}
	defer s.mu.Unlock()
	n := 0
	for key, rec := range s.records {
		if n >= limit {
			break
		}
		if !now.Before(rec.ExpiresAt) {
			delete(s.records, key)
			n++
		}
	}
	return n, nil
}

// Len reports how many records are held, expired ones included (for tests
// and the demo's diagnostics).
func (s *Store) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.records)
}

// Ping implements state.Store.
func (s *Store) Ping(ctx context.Context) error {
	if _, err := s.begin(ctx, "ping"); err != nil {
		return err
	}
	s.mu.Unlock()
	return nil
}

// Close implements state.Store; later calls fail.
func (s *Store) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	s.records = make(map[string]*state.Record)
	s.approvals, s.approvalKeys, s.spends = map[string]*state.Approval{}, map[string]string{}, map[spendKey]*spend{}
	return nil
}
