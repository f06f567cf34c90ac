package extproc

import (
	"context"
	"time"

	"github.com/idemgate/idemgate/state"
)

// A Complete that fails (the store was unreachable for a moment) after the
// upstream executed leaves the record IN_FLIGHT although the client got its
// answer and will not come back: the record would say "interrupted, confirm
// again" about a payment that happened until someone did. completeLater
// retries the Complete in the background for completeWindow. Complete is
// fenced (owner and fence), so a late one can never overwrite what a
// takeover wrote: it answers NOT_OWNER and the pursuit ends.
const completeWindow = 10 * time.Second

// completeDelays are the pauses before each try: a store cut or restart
// usually ends within a second or two.
var completeDelays = []time.Duration{100 * time.Millisecond, 250 * time.Millisecond, 500 * time.Millisecond, time.Second, 2 * time.Second, 2 * time.Second, 2 * time.Second}

// completeLater starts the pursuit; it shares the abandoner's bound on
// background work (a store that keeps failing gets no more load from it).
// It returns at once. result reports how it ended: "done"/"failed" once
// written, "not_owner", or "error" when the window passed.
func (a *abandoner) completeLater(ctx context.Context, claim state.Claim, c state.Completion, result func(string)) {
	select {
	case a.slots <- struct{}{}:
	default:
		result("error")
		return
	}
	go func() {
		defer func() { <-a.slots }()
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), completeWindow)
		defer cancel()
		for _, d := range completeDelays {
			t := time.NewTimer(d)
			select {
			case <-ctx.Done():
				t.Stop()
				result("error")
				return
			case <-t.C:
			}
			cctx, ccancel := context.WithTimeout(ctx, a.timeout)
			ans, err := a.store.Complete(cctx, claim, c)
			ccancel()
			switch {
			case err != nil:
				continue
			case ans.Outcome == state.OutcomeOK:
				if c.State == state.Failed {
					result("failed")
				} else {
					result("done")
				}
				return
			default:
				result("not_owner")
				return
			}
		}
		result("error")
	}()
}
