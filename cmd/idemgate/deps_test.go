package main

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// TestProductImportsNothingFromE2E: the production binary carries no demo
// upstream, no Envoy simulator (internal/extprocdriver plays Envoy for the
// tests) and no demo keys. Everything under e2e/
// (payments, demoauth with its committed private key, the harnesses) is for
// tests and the demo command only.
func TestProductImportsNothingFromE2E(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = "/usr/local/go/bin/go"
	}
	// -test=false (the default) lists what the binary links, not what its
	// tests import.
	out, err := exec.Command(goBin, "list", "-deps", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	deps := strings.Fields(string(out))
	if len(deps) < 10 || !slices.Contains(deps, "github.com/idemgate/idemgate/extproc") {
		t.Fatalf("go list -deps printed an implausible list:\n%s", out)
	}
	for _, p := range deps {
		if strings.Contains(p, "/e2e") || strings.HasSuffix(p, "/internal/extprocdriver") {
			t.Errorf("cmd/idemgate links %s", p)
		}
	}
}
