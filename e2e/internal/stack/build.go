package stack

import (
	"flag"
	"fmt"
	"github.com/idemgate/idemgate/envoy/envoytest"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// idemgatePackage is what BuildIdemgate builds.
const idemgatePackage = "github.com/idemgate/idemgate/cmd/idemgate"

// Env is what every stack of one `go test` run shares: the idemgate binary
// and the Envoy binary that fronts it.
type Env struct {
	// IdemgateBin is the idemgate binary every stack runs as a child process.
	IdemgateBin string
	// EnvoyBin is the pinned Envoy (.envoy-version) every stack runs as its
	// front.
	EnvoyBin string
}

// EnvFromEnvironment builds the idemgate binary into dir (or takes the one
// IDEMGATE_BIN names) and finds the pinned Envoy (FindEnvoy).
func EnvFromEnvironment(dir string) (Env, error) {
	envoyBin, err := envoytest.FindEnvoy()
	if err != nil {
		return Env{}, err
	}
	bin, err := BuildIdemgate(dir)
	if err != nil {
		return Env{}, err
	}
	return Env{IdemgateBin: bin, EnvoyBin: envoyBin}, nil
}

// BuildIdemgate returns the idemgate binary to test: IDEMGATE_BIN when set,
// otherwise cmd/idemgate built into dir, with -race when this test binary
// is a race build (so data races in the server fail the tests too).
func BuildIdemgate(dir string) (string, error) {
	if bin := os.Getenv("IDEMGATE_BIN"); bin != "" {
		if _, err := os.Stat(bin); err != nil {
			return "", fmt.Errorf("IDEMGATE_BIN=%s: %w", bin, err)
		}
		return bin, nil
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = "/usr/local/go/bin/go"
	}
	out := filepath.Join(dir, "idemgate")
	args := []string{"build", "-o", out}
	if RaceEnabled {
		args = append(args, "-race")
	}
	args = append(args, idemgatePackage)
	cmd := exec.Command(goBin, args...)
	if msg, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("failed to build %s: %w\n%s", idemgatePackage, err, msg)
	}
	return out, nil
}

// Main is the TestMain of a package of stacks: it builds idemgate once into
// a temporary directory, stores the Env (or the reason there is none, which
// every test then fails with) in env and envErr, runs the tests and exits.
// Under -short it only runs them: each test skips itself.
func Main(m *testing.M, name string, env *Env, envErr *error) {
	flag.Parse()
	if testing.Short() {
		os.Exit(m.Run())
	}
	dir, err := os.MkdirTemp("", "idemgate-"+name+"-")
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: failed to create a build directory: %v\n", name, err)
		os.Exit(1)
	}
	*env, *envErr = EnvFromEnvironment(dir)
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}
