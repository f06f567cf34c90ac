package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// The defaults are DESIGN section 3's: 408/409/425/429 say nothing about
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

func TestConfiguredOutcomes(t *testing.T) {
	rt, warns, err := Load("testdata/good.yaml", testOptions())
	require.NoError(t, err)
	require.Empty(t, warns)
	o := rt.Operations[0].Outcomes
	require.Equal(t, OutcomeFailed, o.Classify(409), "exact code overrides the default")
	require.Equal(t, OutcomeAmbiguous, o.Classify(202), "a 2xx may be ambiguous (accepted, not yet executed)")
	require.Equal(t, OutcomeDone, o.Classify(201))
	require.Equal(t, OutcomeAmbiguous, o.Classify(429), "untouched codes keep their default")
	require.Equal(t, []string{"202 ambiguous", "409 failed", "5xx ambiguous"}, o.Overrides())
	var sum strings.Builder
	require.NoError(t, rt.WriteSummary(&sum))
	require.Contains(t, sum.String(), "outcomes 202 ambiguous, 409 failed, 5xx ambiguous")

	// The second operation configures none: the defaults.
	require.Equal(t, OutcomeAmbiguous, rt.Operations[1].Outcomes.Classify(409))
}

func TestOutcomesAreValidated(t *testing.T) {
	good, err := os.ReadFile("testdata/good.yaml")
	require.NoError(t, err)
	for bad, want := range map[string]string{
		`{503: done}`:        `operations[0].outcomes.503: only a 2xx may be done`,
		`{"4xx": done}`:      `operations[0].outcomes.4xx: only a 2xx may be done`,
		`{201: failed}`:      `operations[0].outcomes.201: a 2xx may not be failed`,
		`{409: maybe}`:       `operations[0].outcomes.409: unknown outcome "maybe" (known: done, failed, ambiguous)`,
		`{"1xx": failed}`:    `operations[0].outcomes.1xx: "1xx" is neither an HTTP status (200-599) nor a range like 4xx (2xx-5xx)`,
		`{"40x": failed}`:    `operations[0].outcomes.40x: "40x" is neither an HTTP status`,
		`{4090: failed}`:     `operations[0].outcomes.4090: "4090" is neither an HTTP status`,
		`{"+09": ambiguous}`: `"+09" is neither an HTTP status`,
	} {
		t.Run(bad, func(t *testing.T) {
			cfg := strings.Replace(string(good), `outcomes: {409: failed, "5xx": ambiguous, 202: ambiguous}`, "outcomes: "+bad, 1)
			require.NotEqual(t, string(good), cfg)
			dir := t.TempDir()
			require.NoError(t, os.CopyFS(filepath.Join(dir, "keys"), os.DirFS("testdata/keys")))
			path := filepath.Join(dir, "idemgate.yaml")
			require.NoError(t, os.WriteFile(path, []byte(cfg), 0o600))
			_, _, err := Load(path, testOptions())
			require.Error(t, err)
			require.Contains(t, err.Error(), want)
			require.Regexp(t, `idemgate.yaml:\d+:\d+: `, err.Error(), "the problem names its line")
		})
	}
}
