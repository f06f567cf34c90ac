package extproc

import "testing"

// TestSettlement holds settlement to the settlement half of the decision
// table at the top of confirm.go, row by row.
func TestSettlement(t *testing.T) {
	const whole, cut = true, false
	const honours, ignores = true, false
	for _, tc := range []struct {
		phase   claimPhase
		class   outcomeClass
		whole   bool
		honours bool
		want    storeCall
	}{
		// Never sent: whatever else is true, the upstream was not contacted.
		{claimPending, classNone, cut, honours, callAbandonUnsent},
		{claimPending, classNone, cut, ignores, callAbandonUnsent},
		// Sent, the answer seen whole.
		{claimLetThrough, classDone, whole, honours, callCompleteDone},
		{claimLetThrough, classDone, whole, ignores, callCompleteDone},
		{claimLetThrough, classFailed, whole, honours, callCompleteFailed},
		{claimLetThrough, classFailed, whole, ignores, callCompleteFailed},
		{claimLetThrough, classAmbiguous, whole, honours, callEndLease},
		{claimLetThrough, classAmbiguous, whole, ignores, callMarkUnknown},
		// Sent, the stream ended first.
		{claimLetThrough, classDone, cut, honours, callEndLease},
		{claimLetThrough, classDone, cut, ignores, callCompleteDone},
		{claimLetThrough, classFailed, cut, honours, callEndLease},
		{claimLetThrough, classFailed, cut, ignores, callCompleteFailed},
		{claimLetThrough, classNone, cut, honours, callEndLease},
		{claimLetThrough, classNone, cut, ignores, callMarkUnknown},
		// Nothing held: nothing to settle.
		{claimNone, classNone, cut, honours, callNone},
		{claimSettled, classDone, whole, ignores, callNone},
	} {
		if got := settlement(tc.phase, tc.class, tc.whole, tc.honours); got != tc.want {
			t.Errorf("settlement(%s, %s, whole=%v, honours=%v) = %s, want %s", tc.phase, tc.class, tc.whole, tc.honours, got, tc.want)
		}
	}
}
