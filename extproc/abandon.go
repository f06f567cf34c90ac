package extproc

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/idemgate/idemgate/state"
)

// An Acquire or Takeover that answers an error may still have written its
// claim: the backend can commit after the caller's deadline passed (a slow
// PostgreSQL, a reply lost on the way back). Left alone, such a claim makes
// every retry wait for the whole lease (in_progress), although the confirm
// was answered temporarily_unavailable ("nothing executed, retry") and the
// upstream was never contacted. The abandoner gives such claims back in the
// background: a few AbandonUnsent calls within abandonWindow on a context of their
// own, never holding up the reply.
const (
	// abandonWindow bounds how long one claim is pursued.
	abandonWindow = 2 * time.Second
	// maxBackgroundAbandons bounds the claims pursued at once. During an
	// outage every confirm fails; the pursuit must not multiply the load on a
	// store that is already failing, so beyond this the claim is left to its
	// lease (the behaviour without an abandoner), and counted.
	maxBackgroundAbandons = 64
)

// abandonDelays are the pauses before each try after the first: quick
// enough that an agent retrying after Retry-After (1s) finds the claim gone,
// spaced so that a write still in flight has time to land first.
var abandonDelays = []time.Duration{100 * time.Millisecond, 200 * time.Millisecond, 400 * time.Millisecond, 800 * time.Millisecond}

// Results counted in idemgate_background_abandons_total.
const (
	abandonResultAbandoned = "abandoned"   // the claim had been written and was given back
	abandonResultNothing   = "not_written" // the claim was never written (or already moved on)
	abandonResultGaveUp    = "gave_up"     // the store kept failing for the whole window
	abandonResultDropped   = "dropped"     // too many pursuits at once
)

// pendingKey names one pursued claim: the record key and the owner that may
// hold it (owner ids are unique per attempt).
type pendingKey struct{ key, owner string }

// abandoner pursues claims in the background; see the comment above.
type abandoner struct {
	store   state.Store
	timeout time.Duration // per call: store.timeout
	log     *slog.Logger
	metrics *Metrics
	slots   chan struct{}

	mu      sync.Mutex
	pending map[pendingKey]chan struct{} // closed when the pursuit ends
}

func newAbandoner(store state.Store, timeout time.Duration, log *slog.Logger, m *Metrics) *abandoner {
	return &abandoner{
		store: store, timeout: timeout, log: log, metrics: m,
		slots:   make(chan struct{}, maxBackgroundAbandons),
		pending: make(map[pendingKey]chan struct{}),
	}
}

// mayHaveWritten reports whether a failed store call could have written its
// claim: only a backend failure can (an invalid argument never reaches it).
func mayHaveWritten(err error) bool {
	return err != nil && !errors.Is(err, state.ErrInvalidArgument)
}

// pursue starts giving claim back in the background. It returns at once.
// ctx only carries values (the pursuit outlives the stream by design).
func (a *abandoner) pursue(ctx context.Context, claim state.Claim, operation string) {
	select {
	case a.slots <- struct{}{}:
	default:
		a.metrics.backgroundAbandons.WithLabelValues(operation, abandonResultDropped).Inc()
		a.log.Warn("too many claims being abandoned in the background; this one is left to its lease", "operation", operation)
		return
	}
	pk := pendingKey{claim.Key, claim.Owner}
	done := make(chan struct{})
	a.mu.Lock()
	a.pending[pk] = done
	a.mu.Unlock()
	go func() {
		defer func() {
			a.mu.Lock()
			delete(a.pending, pk)
			a.mu.Unlock()
			close(done)
			<-a.slots
		}()
		result := a.run(context.WithoutCancel(ctx), claim)
		a.metrics.backgroundAbandons.WithLabelValues(operation, result).Inc()
		if result == abandonResultGaveUp {
			a.log.Warn("could not give back a claim a failed store call may have written; it stays IN_FLIGHT until its lease ends",
				"operation", operation, "fence", claim.Fence)
		}
	}()
}

// run tries AbandonUnsent until it is applied, or until the answer shows that the
// claim can no longer appear, or until the tries run out.
func (a *abandoner) run(ctx context.Context, claim state.Claim) string {
	ctx, cancel := context.WithTimeout(ctx, abandonWindow)
	defer cancel()
	// Until the store has answered at all, nothing is known.
	result := abandonResultGaveUp
	for try := 0; try <= len(abandonDelays); try++ {
		if try > 0 {
			t := time.NewTimer(abandonDelays[try-1])
			select {
			case <-ctx.Done():
				t.Stop()
				return result
			case <-t.C:
			}
		}
		cctx, ccancel := context.WithTimeout(ctx, a.timeout)
		ans, err := a.store.AbandonUnsent(cctx, claim)
		ccancel()
		switch {
		case errors.Is(err, state.ErrInvalidArgument):
			return abandonResultNothing
		case err != nil:
			continue
		case ans.Outcome == state.OutcomeOK:
			return abandonResultAbandoned
		case ans.Record.Key == "" && claim.Fence > 1:
			// A takeover needs the record; with none, none can land.
			return abandonResultNothing
		case ans.Record.Key != "" && ans.Record.Fence >= claim.Fence:
			// Someone else holds this fence (or the record moved on): our
			// write can no longer land.
			return abandonResultNothing
		}
		// Absent, or an older fence: the failed call's write may still be
		// on its way. Ask again.
		result = abandonResultNothing
	}
	return result
}

// wait blocks until the pursuit of (key, owner) ends, if there is one, or
// until ctx ends. It reports whether there was one.
func (a *abandoner) wait(ctx context.Context, key, owner string) bool {
	a.mu.Lock()
	done, ok := a.pending[pendingKey{key, owner}]
	a.mu.Unlock()
	if !ok {
		return false
	}
	select {
	case <-done:
	case <-ctx.Done():
	}
	return true
}
