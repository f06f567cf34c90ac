package tiered

import (
	"sync"
	"time"
)

// Breaker states, as reported by Stats.
const (
	BreakerClosed   = "closed"
	BreakerOpen     = "open"
	BreakerHalfOpen = "half_open"
)

// breaker keeps a failing Redis out of the request path. Closed: every call
// goes to Redis. Open: no call does, so a dead Redis costs nothing per
// request. After the cool-down exactly one call (a request or Ping) is let
// through as a probe; its success closes the breaker, its failure opens it
// for another cool-down.
type breaker struct {
	mu        sync.Mutex
	state     string
	failures  int
	openedAt  time.Time
	probing   bool
	threshold int
	coolDown  time.Duration
	now       func() time.Time
	onChange  func(from, to string)
}

func newBreaker(threshold int, coolDown time.Duration, now func() time.Time, onChange func(from, to string)) *breaker {
	return &breaker{state: BreakerClosed, threshold: threshold, coolDown: coolDown, now: now, onChange: onChange}
}

// call is a call the breaker let through: an ordinary one, or the probe
// at the end of a cool-down. Its outcome is reported with it.
type call bool

const (
	ordinaryCall call = false
	probeCall    call = true
)

// allow says whether a call may use Redis, and which call it is.
func (b *breaker) allow() (ok bool, c call) {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch b.state {
	case BreakerClosed:
		return true, ordinaryCall
	case BreakerOpen:
		if b.now().Sub(b.openedAt) < b.coolDown {
			return false, ordinaryCall
		}
		b.set(BreakerHalfOpen)
		b.probing = true
		return true, probeCall
	default: // half open
		if b.probing {
			return false, ordinaryCall
		}
		b.probing = true
		return true, probeCall
	}
}

func (b *breaker) success(c call) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.failures = 0
	if c == probeCall {
		b.probing = false
	}
	if b.state != BreakerClosed {
		b.set(BreakerClosed)
	}
}

// failure records a fast Redis failure (connection refused). Fast failures
// count towards the threshold, so one dropped connection does not send all
// traffic to PostgreSQL.
func (b *breaker) failure(c call) { b.fail(c, b.threshold) }

// timeout records a Redis timeout, which opens the breaker at once: a hung
// Redis makes every call wait the full Redis timeout, so waiting for
// several of them would spend the request budgets of everyone in flight.
func (b *breaker) timeout(c call) { b.fail(c, 1) }

// fail records a failed call; a closed breaker opens once threshold
// failures in a row were recorded. A failed probe opens it again.
func (b *breaker) fail(c call, threshold int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if c == probeCall {
		b.probing = false
		b.openedAt = b.now()
		b.set(BreakerOpen)
		return
	}
	b.failures++
	// Calls that started before the breaker opened may still fail late;
	// only a closed breaker opens on them.
	if b.state == BreakerClosed && b.failures >= threshold {
		b.openedAt = b.now()
		b.set(BreakerOpen)
	}
}

// abandon gives the probe back when a call ended for reasons that say
// nothing about Redis (the caller's own deadline), so the next call probes.
func (b *breaker) abandon(c call) {
	if c != probeCall {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.probing = false
}

func (b *breaker) current() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.state
}

// set changes state and reports the change (under the lock: onChange must
// not call back into the breaker).
func (b *breaker) set(to string) {
	from := b.state
	if from == to {
		return
	}
	b.state = to
	if b.onChange != nil {
		b.onChange(from, to)
	}
}
