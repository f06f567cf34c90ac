// Package state holds idempotency records: the acquire/complete state machine
// that lets a confirm reach the upstream exactly once and lets every later
// retry learn what happened.
//
// Every transition a Store allows, with who may make it:
//
//	(absent) --Acquire (anyone)--> IN_FLIGHT, fence 1, lease running
//
//	IN_FLIGHT --Complete (owner: same owner and fence)-------------> DONE | FAILED (+result)
//	IN_FLIGHT --EndLease (owner)-----------------------------------> IN_FLIGHT, lease ended
//	                                                                  (the next retry takes over)
//	IN_FLIGHT --AbandonUnsent (owner), fence 1---------------------> (absent)
//	IN_FLIGHT --AbandonUnsent (owner), fence > 1-------------------> IN_FLIGHT, lease ended (as EndLease)
//	IN_FLIGHT --Takeover (anyone holding the fence, lease ended)---> IN_FLIGHT, new owner, fence+1
//	IN_FLIGHT --MarkUnknown (owner; anyone holding the fence
//	                         once the lease ended)-----------------> UNKNOWN
//	IN_FLIGHT --Resolve (a person: idemgate ops resolve)-----------> DONE | FAILED (+result)
//
//	UNKNOWN   --Complete (the original owner, same owner and fence:
//	                      its answer arrived after MarkUnknown)----> DONE | FAILED (+result)
//	UNKNOWN   --Resolve (a person: idemgate ops resolve)-----------> DONE | FAILED (+result)
//
//	DONE | FAILED: final. No call changes them; retention removes them
//	               (Sweep in PostgreSQL, key expiry in Redis and memory).
//	IN_FLIGHT | UNKNOWN --ExpiresAt passes (Redis and memory only)--> (absent)
//
// Every other call is refused without change: NOT_OWNER, NOT_FOUND, or (for
// Takeover) the answer Acquire would give. The tiered store's Redis cache
// has two calls more, for Redis only (tiered.Cache): Repair overwrites the
// Redis copy with PostgreSQL's record, and DropOrphan deletes a Redis
// IN_FLIGHT claim that PostgreSQL does not hold, whatever its fence.
//
// Three calls give a claim back without a result; they differ in why, and
// so in what is left:
//   - EndLease: the upstream was called and its answer is ambiguous (5xx,
//     timeout, reset), and the downstream honours idempotency keys. The
//     record stays IN_FLIGHT with its lease ended, so the next retry takes
//     it over and re-sends the same key. (A downstream that ignores keys
//     gets MarkUnknown instead.)
//   - AbandonUnsent: the upstream was never called (the reply letting the
//     request through was not sent, or the Acquire or Takeover that made
//     the claim failed after it may have been written). A fresh claim
//     (fence 1) is deleted, so the next confirm acquires afresh, whatever
//     the downstream does with keys; a taken-over claim (fence > 1: an
//     earlier attempt may have executed) keeps its record and is ended like
//     EndLease.
//   - DropOrphan (tiered.Cache, Redis only): the tiered store deletes the
//     Redis copy of a claim that PostgreSQL never got or has just deleted;
//     PostgreSQL is not asked.
//
// Outcomes are values, not errors: an error from a Store always means the
// backend failed and nothing can be said about the record. The package knows
// nothing about Envoy or HTTP beyond the stored Result.
//
// Details every backend shares (state/statetest checks them all):
//   - Keys are fingerprint nonces, 32 lower-case hex characters; anything
//     else is ErrInvalidArgument, as are an empty owner, a non-positive lease
//     or retention, a non-terminal Completion state and a status outside
//     100..599. Backend failures wrap ErrUnavailable.
//   - A lease has expired when the backend's clock reads at or after
//     LeaseUntil; EndLease sets LeaseUntil to that clock's now.
//   - A record never expires while its lease runs: ExpiresAt is at least
//     LeaseUntil (retention shorter than the lease is stretched).
//   - Complete, EndLease and AbandonUnsent on an absent record answer
//     NOT_OWNER with a zero Record; Takeover, MarkUnknown and Resolve answer
//     NOT_FOUND.
//   - Acquire by an owner id that already holds the record is IN_FLIGHT, not
//     a second ACQUIRED: owner ids may repeat, only fences are unique.
//   - Takeover carries no parameter hash; when it does not apply it answers
//     the record's state (DONE, FAILED, UNKNOWN or IN_FLIGHT), never
//     PARAM_MISMATCH.
//   - Retention: PostgreSQL sweeps only terminal records and keeps IN_FLIGHT
//     and UNKNOWN rows until a person resolves them; Redis and memory forget
//     any record at ExpiresAt (no confirm can reach it by then: fingerprints
//     expire long before).
package state

import (
	"context"
	"errors"
	"strings"
	"time"
)

// RecordState is where a record is in the state machine (the diagram
// above). It is stored as its string, in Redis and PostgreSQL alike.
type RecordState string

const (
	InFlight RecordState = "IN_FLIGHT"
	Done     RecordState = "DONE"
	Failed   RecordState = "FAILED"
	Unknown  RecordState = "UNKNOWN"
)

// Terminal reports whether s carries a final, replayable result.
func (s RecordState) Terminal() bool { return s == Done || s == Failed }

// Outcome is the answer of a state-changing call.
type Outcome string

const (
	// OutcomeAcquired: the caller owns the record and may call the upstream.
	OutcomeAcquired Outcome = "ACQUIRED"
	// OutcomeDone / OutcomeFailed: the record is terminal; Record.Result holds the
	// stored upstream answer.
	OutcomeDone   Outcome = "DONE"
	OutcomeFailed Outcome = "FAILED"
	// OutcomeInFlight: another owner holds the record. Record.LeaseExpired says
	// whether its lease has run out (judged by the backend's clock).
	OutcomeInFlight Outcome = "IN_FLIGHT"
	// OutcomeUnknown: an earlier attempt may or may not have executed; a person
	// must reconcile.
	OutcomeUnknown Outcome = "UNKNOWN"
	// OutcomeParamMismatch: the record exists under a different parameter hash.
	OutcomeParamMismatch Outcome = "PARAM_MISMATCH"
	// OutcomeNotOwner: the caller is no longer the owner (or the fence moved,
	// or the record is not in a state the call applies to); nothing was written.
	OutcomeNotOwner Outcome = "NOT_OWNER"
	// OutcomeOK: a Complete, EndLease, AbandonUnsent, MarkUnknown or Resolve
	// was applied.
	OutcomeOK Outcome = "OK"
	// OutcomeNotFound: Takeover, MarkUnknown or Resolve on an absent record.
	OutcomeNotFound Outcome = "NOT_FOUND"
)

// ErrInvalidArgument is returned (wrapped) for calls that can never succeed,
// such as an empty key or a non-terminal state passed to Complete.
var ErrInvalidArgument = errors.New("invalid argument")

// Header is one stored response header, in the order the upstream sent it.
type Header struct {
	Name  string `json:"name"`
	Value string `json:"value"`
}

// Result is the upstream answer stored with a terminal record, kept so that a
// replay is byte-identical: status, allow-listed headers (content-type among
// them) and the body bytes.
type Result struct {
	Status  int      `json:"status"`
	Headers []Header `json:"headers,omitempty"`
	Body    []byte   `json:"body,omitempty"`
	// Ref is the reference a replay names the result by (the operation's
	// result_ref read from Body, or the nonce), worked out once when the
	// result is recorded so that no replay has to parse Body again. Empty
	// means it was not recorded (a result settled by a person, or written
	// before this field existed); readers then derive it themselves.
	Ref string `json:"ref,omitempty"`
	// BodyJSON reports that Body is known to be strict JSON
	// (internal/jsonx.Check), so a replay embeds it without checking it
	// again. Like Record.LeaseExpired it is not stored: the terminal cache
	// works it out once, on its own copy, when it keeps a record; false
	// means not known.
	BodyJSON bool `json:"-"`
}

// ContentType returns the stored content-type header, if any.
func (r *Result) ContentType() string {
	if r == nil {
		return ""
	}
	for _, h := range r.Headers {
		if strings.EqualFold(h.Name, "content-type") {
			return h.Value
		}
	}
	return ""
}

// Record is everything a backend keeps about one idempotency key.
type Record struct {
	Key        string // the fingerprint nonce: 32 lower-case hex characters
	Scope      string
	SubjectTag string
	ParamHash  string
	State      RecordState
	Owner      string
	Fence      int64
	LeaseUntil time.Time
	// LeaseExpired is computed by the backend from its own clock when the
	// record is read; it is not stored.
	LeaseExpired bool
	Result       *Result
	CreatedAt    time.Time
	UpdatedAt    time.Time
	ExpiresAt    time.Time
}

// Claim identifies one owner's hold on a record. Fence increases on every
// takeover, so an old owner's late call is refused even if owner ids repeat.
type Claim struct {
	Key   string
	Owner string
	Fence int64
}

// AcquireRequest asks for ownership of a key.
type AcquireRequest struct {
	Key        string
	Scope      string
	SubjectTag string
	ParamHash  string
	Owner      string
	// Lease is how long the owner may hold IN_FLIGHT before a retry may take
	// over (ttl.in_flight). Leases are never renewed.
	Lease time.Duration
	// Retention is how long the record is kept (ttl.terminal); it is counted
	// from creation and restarted when the record becomes terminal.
	Retention time.Duration
	// FingerprintExpiry is the fingerprint's exp, signed into the token, so
	// every attempt at one nonce carries the same one. PostgreSQL files the
	// record under its UTC day, the partition dropped whole when its
	// records have expired. Zero (not known) files it with the records
	// swept one by one.
	FingerprintExpiry time.Time
}

// TakeoverRequest moves an IN_FLIGHT record whose lease expired to a new
// owner. Fence is the fence the caller saw; the takeover succeeds only if it
// is still current, so of many retries racing for one expired lease exactly one
// wins.
type TakeoverRequest struct {
	Key      string
	NewOwner string
	Fence    int64
	Lease    time.Duration
}

// Completion is the terminal state and result written by Complete or Resolve.
type Completion struct {
	State     RecordState // Done or Failed
	Result    Result
	Retention time.Duration // how long the terminal record is kept (ttl.terminal)
}

// Answer is what a state-changing call returns: an outcome and, where the
// outcome is about an existing record, that record as the backend saw it.
type Answer struct {
	Outcome Outcome
	Record  Record
}

// Store is implemented by every backend: memory, redis, postgres and tiered.
// All methods honour the context deadline. Implementations are safe for
// concurrent use.
type Store interface {
	// Acquire creates the record IN_FLIGHT and answers ACQUIRED, or reports
	// what is already there: DONE/FAILED (+result), IN_FLIGHT (+owner, fence,
	// LeaseExpired), UNKNOWN, or PARAM_MISMATCH when the stored parameter hash
	// differs (the hash is compared before the state). Atomic.
	Acquire(ctx context.Context, req AcquireRequest) (Answer, error)

	// Complete writes DONE or FAILED with its result if claim still owns the
	// record (same owner and fence) and the record is IN_FLIGHT, or UNKNOWN
	// (the owner learned the answer after the record was marked unknown).
	// Otherwise NOT_OWNER and nothing is written.
	Complete(ctx context.Context, claim Claim, c Completion) (Answer, error)

	// EndLease ends the lease of an IN_FLIGHT record at once, keeping the
	// record: its owner calls it after an ambiguous upstream answer when the
	// downstream honours idempotency keys, so the next retry takes over and
	// re-sends the same key. Owner and fence must match, else NOT_OWNER and
	// nothing changes.
	EndLease(ctx context.Context, claim Claim) (Answer, error)

	// AbandonUnsent gives back a claim whose request never reached the
	// upstream: the reply that would have let it through was not sent, or
	// the Acquire or Takeover that made it failed (a timeout after the
	// backend may already have written it). Owner and fence must match an
	// IN_FLIGHT record, else NOT_OWNER and nothing changes. A fresh claim
	// (fence 1: no earlier attempt exists) is deleted, so the next confirm
	// acquires afresh, whatever the downstream does with idempotency keys;
	// the answer's Record is then zero. A claim made by a takeover (fence >
	// 1: an earlier attempt may have executed) keeps its record and only
	// ends its lease, exactly like EndLease.
	AbandonUnsent(ctx context.Context, claim Claim) (Answer, error)

	// MarkUnknown moves an IN_FLIGHT record to UNKNOWN: by its owner (same
	// owner and fence) after an ambiguous outcome with a downstream that does
	// not honour keys, or by anyone holding the current fence once the lease
	// has expired. Otherwise NOT_OWNER (or NOT_FOUND).
	MarkUnknown(ctx context.Context, claim Claim) (Answer, error)

	// Takeover gives an IN_FLIGHT record whose lease has expired to a new owner
	// with fence+1 and answers ACQUIRED. If the lease is still running, the
	// fence moved, or the record is not IN_FLIGHT, it answers what Acquire
	// would have answered, without change.
	Takeover(ctx context.Context, req TakeoverRequest) (Answer, error)

	// Get reads a record. found is false when there is none.
	Get(ctx context.Context, key string) (rec Record, found bool, err error)

	// Resolve lets a person settle an UNKNOWN or IN_FLIGHT record as DONE or
	// FAILED with a result. A terminal record is left alone (NOT_OWNER with
	// the record); an absent one answers NOT_FOUND.
	Resolve(ctx context.Context, key string, c Completion) (Answer, error)

	// Sweep deletes up to limit terminal records whose retention has passed
	// and reports how many it deleted. Backends with native expiry may
	// return 0.
	Sweep(ctx context.Context, limit int) (int, error)

	// Ping reports whether the backend answers.
	Ping(ctx context.Context) error

	// Close releases connections.
	Close() error
}
