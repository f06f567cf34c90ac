package e2e

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/e2e/internal/stack"
)

// realEnvoyOff is the one line the suite prints (with -v) when it runs
// through the harness.
const realEnvoyOff = "real-Envoy mode is off: every e2e test runs through the Envoy-faithful harness (e2e/envoysim); " +
	"set ENVOY_BIN=/path/to/envoy to run the same tests through a real Envoy"

// TestRealEnvoy says which front the suite ran through. In real-Envoy mode
// (ENVOY_BIN set) it checks that the stacks really run Envoy, and that a
// preview, a confirm and a replay go through it.
func TestRealEnvoy(t *testing.T) {
	if testing.Short() || env.EnvoyBin == "" {
		t.Skip(realEnvoyOff)
	}
	out, err := exec.Command(env.EnvoyBin, "--version").CombinedOutput()
	require.NoError(t, err, "%s --version: %s", env.EnvoyBin, out)
	t.Logf("real-Envoy mode is on: %s", strings.TrimSpace(string(out)))

	s := startStack(t, stack.Options{})
	require.Equal(t, "real Envoy", s.Mode())
	alice := s.Agent("alice")
	p := preview(t, alice, transfer("5.00", "acct_leo", "real envoy"))
	first := confirm(t, alice, p.ConfirmBody())
	requireExecuted(t, first)
	requireReplay(t, s, confirm(t, alice, p.ConfirmBody()), p.Nonce, first.Body)
	require.Equal(t, 1, s.Payments.Executions())
}
