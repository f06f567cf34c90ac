package attest

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The Python and Node verifiers' own suites (golden vectors, the shared
// fixtures, log-only, JWKS refresh) run here, so `make test` runs them.
// A missing runtime skips only outside `make test`
// (IDEMGATE_REQUIRE_SERVICES unset); there it fails.

func requireRuntime(t *testing.T, name string, probe ...string) string {
	t.Helper()
	bin, err := exec.LookPath(name)
	if err == nil && len(probe) > 0 {
		err = exec.Command(bin, probe...).Run()
	}
	if err != nil {
		if os.Getenv("IDEMGATE_REQUIRE_SERVICES") != "" {
			t.Fatalf("%s (%s) is required: %v", name, strings.Join(probe, " "), err)
		}
		t.Skipf("%s not usable (%v); `make test` requires it", name, err)
	}
	return bin
}

func run(t *testing.T, dir string, env []string, name string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s in %s: %v\n%s", name, strings.Join(args, " "), dir, err, out)
	}
	return string(out)
}

func TestPythonVerifier(t *testing.T) {
	py := requireRuntime(t, "python3", "-c", "import cryptography")
	out := run(t, "python", []string{"PYTHONDONTWRITEBYTECODE=1"}, py, "-m", "unittest", "-v")
	if !strings.Contains(out, "\nOK") || strings.Contains(out, "skipped") {
		t.Fatalf("python unittest did not pass every test:\n%s", out)
	}
	t.Log(out)
}

// TestPythonPackageBuilds builds the wheel (pip, from attest/python's
// pyproject.toml) and runs a fixture through the installed copy.
func TestPythonPackageBuilds(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a wheel (pip may fetch setuptools from PyPI)")
	}
	sys := requireRuntime(t, "python3", "-m", "venv", "--help")
	// A virtual environment of its own: pip there may build and install
	// (a distribution's python3 refuses, PEP 668).
	venv := filepath.Join(t.TempDir(), "venv")
	run(t, ".", nil, sys, "-m", "venv", "--system-site-packages", venv) // cryptography from the system
	py := filepath.Join(venv, "bin", "python")
	dist, target := t.TempDir(), t.TempDir()
	src, err := filepath.Abs("python")
	if err != nil {
		t.Fatal(err)
	}
	build := filepath.Join(t.TempDir(), "src")
	run(t, ".", nil, "cp", "-r", src, build) // pip writes build/ and *.egg-info next to the sources
	run(t, ".", nil, py, "-m", "pip", "wheel", "--no-deps", "--disable-pip-version-check", "-q", "-w", dist, build)
	wheels, _ := filepath.Glob(filepath.Join(dist, "idemgate_attest-*.whl"))
	if len(wheels) != 1 {
		t.Fatalf("built %v", wheels)
	}
	run(t, ".", nil, py, "-m", "pip", "install", "--no-deps", "--disable-pip-version-check", "-q", "--target", target, wheels[0])
	fixtures, err := filepath.Abs(fixtureFile)
	if err != nil {
		t.Fatal(err)
	}
	script := `
import json, sys, idemgate_attest
assert idemgate_attest.__file__.startswith(sys.argv[1]), idemgate_attest.__file__
f = json.load(open(sys.argv[2]))
c = next(c for c in f["cases"] if c["name"] == "the attested confirm")
v = idemgate_attest.Verifier(keys=f["jwks"], now=lambda: f["now"])
claims = v.check(c["method"], c["path"], {k.lower(): x for k, x in c["headers"].items()}, c["body"].encode())
print(claims["idk"])
`
	out := run(t, t.TempDir(), []string{"PYTHONPATH=" + target}, py, "-c", script, target, fixtures)
	if strings.TrimSpace(out) != "00112233445566778899aabbccddeeff" {
		t.Fatalf("the installed package answered %q", out)
	}
}

func TestNodeVerifier(t *testing.T) {
	node := requireRuntime(t, "node", "-e", "require('crypto').createPublicKey")
	out := run(t, "node", nil, node, "--test", "test/")
	if !strings.Contains(out, "# fail 0") || !strings.Contains(out, "# skipped 0") || strings.Contains(out, "# pass 0\n") {
		t.Fatalf("node --test did not pass every test:\n%s", out)
	}
	t.Log(out)
}

// TestNodeVerifierInExpressAndFastify mounts the Node middleware in real
// Express 5 and Fastify 5 apps (installed from npm into a temporary
// directory: the package itself has no dependencies) and runs the shared
// fixtures through both.
func TestNodeVerifierInExpressAndFastify(t *testing.T) {
	if testing.Short() {
		t.Skip("installs express and fastify from npm")
	}
	node := requireRuntime(t, "node", "-e", "require('crypto').createPublicKey")
	npm := requireRuntime(t, "npm", "--version")
	deps := t.TempDir()
	run(t, deps, nil, npm, "install", "--no-save", "--no-package-lock", "--no-audit", "--no-fund", "--silent", "express@5", "fastify@5")
	out := run(t, "node", []string{"NODE_PATH=" + filepath.Join(deps, "node_modules")}, node, "frameworks/check.js")
	if !strings.Contains(out, "frameworks: ") || !strings.Contains(out, " 0 failed") {
		t.Fatalf("frameworks/check.js:\n%s", out)
	}
	t.Log(out)
}
