package config

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// The defaults are docs/design.md §3's: 408/409/425/429 say nothing about
// whether an earlier attempt ran, so they are ambiguous, not failures.
func TestDefaultOutcomes(t *testing.T) {
	var o Outcomes
	for status, want := range map[int]Outcome{
		200: OutcomeDone, 201: OutcomeDone, 204: OutcomeDone, 299: OutcomeDone,
		301: OutcomeFailed, 400: OutcomeFailed, 402: OutcomeFailed, 404: OutcomeFailed, 422: OutcomeFailed,
		408: OutcomeAmbiguous, 409: OutcomeAmbiguous, 425: OutcomeAmbiguous, 429: OutcomeAmbiguous,
		500: OutcomeAmbiguous, 502: OutcomeAmbiguous, 503: OutcomeAmbiguous, 504: OutcomeAmbiguous,
		0: OutcomeAmbiguous, 100: OutcomeAmbiguous, 600: OutcomeAmbiguous,
	} {
		require.Equal(t, want, o.Classify(status), "status %d", status)
	}
}
