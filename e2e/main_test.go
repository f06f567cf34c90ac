package e2e

import (
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

func TestMain(m *testing.M) { stack.Main(m, "e2e", &env, &envErr) }

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
