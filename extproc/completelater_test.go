package extproc

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/state"
)

// failingCompletes fails the next n Completes (a store cut or restart right
// after the upstream executed).
type failingCompletes struct {
	state.Store
	n atomic.Int32
}

func (f *failingCompletes) Complete(ctx context.Context, claim state.Claim, c state.Completion) (state.Answer, error) {
	if f.n.Add(-1) >= 0 {
		return state.Answer{}, state.Unavailable(state.OpComplete, context.DeadlineExceeded)
	}
	return f.Store.Complete(ctx, claim, c)
}

// TestFailedCompleteIsRetriedInTheBackground: the client got the upstream's
// answer and will not come back; the record still becomes DONE with that
// answer once the store answers again, instead of staying IN_FLIGHT.
func TestFailedCompleteIsRetriedInTheBackground(t *testing.T) {
	clk := newClock()
	store := &failingCompletes{Store: newMemoryStore(clk)}
	e := newEnv(t, store, clk)
	d := fakeDialer{srv: e.srv}
	fp := preview(t, d, "alice", `8`)
	nonce := e.claimsOf(t, fp, "alice", "payments.transfer").Nonce
	store.n.Store(3)
	p := newPayments()
	res := do(t, d, post("/v1/transfers/confirm", "alice", transferBody(`8`, "EUR", "DE89", fp)), p.handle)
	require.Equal(t, 201, res.status, "the client gets the upstream's answer whatever the store says")
	require.Eventually(t, func() bool {
		rec, found := e.recordNow(nonce)
		return found && rec.State == state.Done && rec.Result.Status == 201
	}, 10*time.Second, 20*time.Millisecond, "the completion landed in the background")
	require.Eventually(t, func() bool {
		return metricNow(e.metrics.settlements.WithLabelValues("transfer", "done")) == 1
	}, 5*time.Second, 10*time.Millisecond)
	// A replay answers from the record, the upstream runs once.
	res = do(t, d, post("/v1/transfers/confirm", "alice", transferBody(`8`, "EUR", "DE89", fp)), neverCalled(t))
	require.Equal(t, "true", res.headers["idempotent-replayed"])
	require.Equal(t, 1, p.Executions())
}
