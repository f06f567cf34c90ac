package state

import (
	"errors"
	"fmt"
	"time"
)

// ErrUnavailable is wrapped into every error that means a backend could not
// be reached or did not answer in time. The server turns it into
// temporarily_unavailable (retryable, nothing executed). Backends wrap it
// together with the cause, so errors.Is also finds context.DeadlineExceeded
// and friends.
var ErrUnavailable = errors.New("store unavailable")

// Unavailable wraps err as a backend failure of op. It returns nil for nil.
func Unavailable(op string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("failed to %s: %w: %w", op, ErrUnavailable, err)
}

// ValidKey reports whether key is a fingerprint nonce: exactly 32 lower-case
// hex characters. Every backend checks it, so a key that PostgreSQL's
// char(32) would pad or reject is refused the same way by the memory and
// Redis stores.
func ValidKey(key string) error {
	if len(key) != 32 {
		return fmt.Errorf("%w: key must be 32 lower-case hex characters, got %d characters", ErrInvalidArgument, len(key))
	}
	for i := 0; i < len(key); i++ {
		c := key[i]
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return fmt.Errorf("%w: key must be 32 lower-case hex characters", ErrInvalidArgument)
		}
	}
	return nil
}

// Validate checks an AcquireRequest before any backend is touched.
func (r AcquireRequest) Validate() error {
	if err := ValidKey(r.Key); err != nil {
		return err
	}
	if r.Owner == "" {
		return fmt.Errorf("%w: owner is empty", ErrInvalidArgument)
	}
	if r.Lease <= 0 {
		return fmt.Errorf("%w: lease must be positive", ErrInvalidArgument)
	}
	if r.Retention <= 0 {
		return fmt.Errorf("%w: retention must be positive", ErrInvalidArgument)
	}
	return nil
}

// Validate checks a Claim.
func (c Claim) Validate() error {
	if err := ValidKey(c.Key); err != nil {
		return err
	}
	if c.Owner == "" {
		return fmt.Errorf("%w: owner is empty", ErrInvalidArgument)
	}
	return nil
}

// Validate checks a TakeoverRequest.
func (r TakeoverRequest) Validate() error {
	if err := ValidKey(r.Key); err != nil {
		return err
	}
	if r.NewOwner == "" {
		return fmt.Errorf("%w: new owner is empty", ErrInvalidArgument)
	}
	if r.Lease <= 0 {
		return fmt.Errorf("%w: lease must be positive", ErrInvalidArgument)
	}
	return nil
}

// Validate checks a Completion: a terminal state, an HTTP status and a
// positive retention.
func (c Completion) Validate() error {
	if !c.State.Terminal() {
		return fmt.Errorf("%w: completion state must be DONE or FAILED, got %q", ErrInvalidArgument, c.State)
	}
	if c.Result.Status < 100 || c.Result.Status > 599 {
		return fmt.Errorf("%w: result status %d is not an HTTP status", ErrInvalidArgument, c.Result.Status)
	}
	if c.Retention <= 0 {
		return fmt.Errorf("%w: retention must be positive", ErrInvalidArgument)
	}
	return nil
}

// OutcomeOf is the outcome Acquire answers for an existing record whose
// parameter hash matched.
func OutcomeOf(s RecordState) Outcome {
	switch s {
	case Done:
		return OutcomeDone
	case Failed:
		return OutcomeFailed
	case Unknown:
		return OutcomeUnknown
	default:
		return OutcomeInFlight
	}
}

// Clone returns a deep copy of r. Empty header and body slices become nil, so
// every backend hands back the same shape for the same stored bytes.
func (r *Result) Clone() *Result {
	if r == nil {
		return nil
	}
	c := &Result{Status: r.Status, Ref: r.Ref}
	if len(r.Headers) > 0 {
		c.Headers = append([]Header(nil), r.Headers...)
	}
	if len(r.Body) > 0 {
		c.Body = append([]byte(nil), r.Body...)
	}
	return c
}

// Clone returns a deep copy of rec (its Result is copied too).
func (rec Record) Clone() Record {
	rec.Result = rec.Result.Clone()
	return rec
}

// DurationMicros converts a duration to whole microseconds, rounding up so
// that a positive duration never becomes zero. Backends store times with
// microsecond precision (PostgreSQL's timestamptz resolution).
func DurationMicros(d time.Duration) int64 {
	us := int64(d / time.Microsecond)
	if d%time.Microsecond != 0 {
		us++
	}
	return us
}
