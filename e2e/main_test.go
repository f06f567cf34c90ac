package e2e

import (
	"flag"
	"fmt"
	"os"
	"testing"

	"github.com/idemgate/idemgate/e2e/internal/stack"
)

// env is shared by every test of one `go test` run: the idemgate binary,
// built once, and the pinned Envoy. envErr says why it could not be set
// up; every test then fails with it (no Envoy is a failure, not a skip).
var (
	env    stack.Env
	envErr error
)

func TestMain(m *testing.M) {
	flag.Parse()
	if testing.Short() {
		// Every test here needs services, Envoy and a built binary; each
		// one skips itself with a line saying so.
		os.Exit(m.Run())
	}
	dir, err := os.MkdirTemp("", "idemgate-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e: failed to create a build directory:", err)
		os.Exit(1)
	}
	env, envErr = stack.EnvFromEnvironment(dir)
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// requireEnv fails t when the run has no Envoy or no idemgate binary.
func requireEnv(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("e2e: builds idemgate and needs Envoy, Redis and PostgreSQL; skipped with -short")
	}
	if envErr != nil {
		t.Fatalf("e2e: %v", envErr)
	}
}

// startStack brings up a full stack for t (see package stack).
func startStack(t *testing.T, opts stack.Options) *stack.Stack {
	t.Helper()
	requireEnv(t)
	return stack.Start(t, env, opts)
}
