package extproc

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/state"
	"github.com/idemgate/idemgate/state/memory"
)

// settleBound is docs/design.md §8's promise: a stream that ends after
// ACQUIRED with no response phase is settled within one second (EndLease or
// MarkUnknown), so the agent's retry does not wait for the lease. The
// measured settle is a few milliseconds; a second is margin enough for a
// loaded two-core machine, and a settle that waited (a timer, a sweep) fails.
const settleBound = time.Second

// TestStreamEndAfterAcquireIsSettledWithinOneSecond measures the settle on
// the record itself: its UpdatedAt (stamped by the store's real clock) less
// the moment the upstream was reached, which precedes the stream's end. So
// the figure is an upper bound of the real delay, and polling latency does
// not enter it.
func TestStreamEndAfterAcquireIsSettledWithinOneSecond(t *testing.T) {
	const alice = "alice"
	e := newEnv(t, memory.New(memory.Options{}), nil)
	d := fakeDialer{srv: e.srv}
	reset := func(reached *time.Time) upstreamFunc {
		return func(map[string]string, []byte) upstreamReply {
			*reached = time.Now()
			return upstreamReply{reset: true}
		}
	}

	for _, tc := range []struct {
		name    string
		preview func() (fp, nonce string)
		confirm func(fp string) httpRequest
		settled state.RecordState
	}{
		{
			name: "downstream honours keys: released",
			preview: func() (string, string) {
				fp := preview(t, d, alice, `7`)
				return fp, e.claimsOf(t, fp, alice, "payments.transfer").Nonce
			},
			confirm: func(fp string) httpRequest {
				return post("/v1/transfers/confirm", alice, transferBody(`7`, "EUR", "DE89", fp))
			},
			settled: state.InFlight, // with its lease ended
		},
		{
			name: "downstream ignores keys: marked unknown",
			preview: func() (string, string) {
				res := do(t, d, post("/v1/accounts/acc-1/payouts/preview", alice, []byte(`{"amount":3}`)), previewOK)
				fp := res.json(t)["fingerprint"].(string)
				return fp, e.claimsOf(t, fp, alice, "payments.payout").Nonce
			},
			confirm: func(fp string) httpRequest {
				return post("/v1/accounts/acc-1/payouts/confirm", alice, []byte(fmt.Sprintf(`{"amount":3,"fingerprint":%q}`, fp)))
			},
			settled: state.Unknown,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fp, nonce := tc.preview()
			var reached time.Time
			res := do(t, d, tc.confirm(fp), reset(&reached))
			require.True(t, res.upstreamCalled, "the confirm was acquired and forwarded")
			var rec state.Record
			require.Eventually(t, func() bool {
				r, found := e.recordNow(nonce)
				rec = r
				return found && r.State == tc.settled && (r.State != state.InFlight || r.LeaseExpired)
			}, 10*time.Second, 5*time.Millisecond, "the record was never settled")
			took := rec.UpdatedAt.Sub(reached)
			t.Logf("settled %s after the upstream was reached", took)
			require.Less(t, took, settleBound, "settled %s after the stream ended", took)
		})
	}
}
