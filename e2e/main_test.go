package e2e

import (
	"flag"
	"fmt"
	"os"
	"testing"

	"github.com/idemgate/idemgate/e2e/internal/stack"
)

// env is shared by every test of one `go test` run: the idemgate binary,
// built once, and the Envoy binary in real-Envoy mode.
var env stack.Env

func TestMain(m *testing.M) {
	flag.Parse()
	if testing.Short() {
		// Every test here needs services and a built binary; each one
		// skips itself with a line saying so.
		os.Exit(m.Run())
	}
	dir, err := os.MkdirTemp("", "idemgate-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e: failed to create a build directory:", err)
		os.Exit(1)
	}
	env, err = stack.EnvFromEnvironment(dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		_ = os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// startStack brings up a full stack for t (see package stack).
func startStack(t *testing.T, opts stack.Options) *stack.Stack {
	t.Helper()
	if testing.Short() {
		t.Skip("e2e: builds idemgate and needs Redis and PostgreSQL; skipped with -short")
	}
	return stack.Start(t, env, opts)
}
