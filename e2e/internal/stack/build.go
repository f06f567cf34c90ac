package stack

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

// idemgatePackage is what BuildIdemgate builds.
const idemgatePackage = "github.com/idemgate/idemgate/cmd/idemgate"

// Env is what every stack of one `go test` run shares: the idemgate binary
// and, in real-Envoy mode, the Envoy binary.
type Env struct {
	// IdemgateBin is the idemgate binary every stack runs as a child process.
	IdemgateBin string
	// EnvoyBin, when set, runs a real Envoy as the front instead of the
	// envoysim harness.
	EnvoyBin string
}

// EnvFromEnvironment builds the idemgate binary into dir (or takes the one
// IDEMGATE_BIN names) and reads ENVOY_BIN.
func EnvFromEnvironment(dir string) (Env, error) {
	bin, err := BuildIdemgate(dir)
	if err != nil {
		return Env{}, err
	}
	env := Env{IdemgateBin: bin, EnvoyBin: os.Getenv("ENVOY_BIN")}
	if env.EnvoyBin != "" {
		if _, err := os.Stat(env.EnvoyBin); err != nil {
			return Env{}, fmt.Errorf("ENVOY_BIN=%s: %w", env.EnvoyBin, err)
		}
	}
	return env, nil
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
