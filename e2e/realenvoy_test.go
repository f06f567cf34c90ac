package e2e

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/e2e/internal/stack"
)

// TestRealEnvoy: the stacks run the pinned Envoy (the binary reports the
// version in .envoy-version, which FindEnvoy checked), and a preview, a
// confirm and a replay go through it.
func TestRealEnvoy(t *testing.T) {
	requireEnv(t)
	out, err := exec.Command(env.EnvoyBin, "--version").CombinedOutput()
	require.NoError(t, err, "%s --version: %s", env.EnvoyBin, out)
	t.Logf("e2e front: %s", strings.TrimSpace(string(out)))

	s := startStack(t, stack.Options{})
	code, body, err := s.Envoy.Admin("/server_info")
	require.NoError(t, err)
	require.Equal(t, 200, code)
	require.Contains(t, body, `"state": "LIVE"`, "the front is a live Envoy server")

	alice := s.Agent("alice")
	p := preview(t, alice, transfer("5.00", "acct_leo", "real envoy"))
	first := confirm(t, alice, p.ConfirmBody())
	requireExecuted(t, first)
	requireReplay(t, s, confirm(t, alice, p.ConfirmBody()), p.Nonce, first.Body)
	require.Equal(t, 1, s.Payments.Executions())
}
