package verify

import (
	"os/exec"
	"strings"
	"testing"
)

// TestImportsOnlyTheStandardLibrary: the package is dropped into upstreams
// that must not inherit idemgate's dependencies (gRPC, Envoy's protos,
// Redis and PostgreSQL drivers). go list -deps without -test lists what
// importing it links.
func TestImportsOnlyTheStandardLibrary(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = "/usr/local/go/bin/go"
	}
	out, err := exec.Command(goBin, "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	deps := strings.Fields(string(out))
	if len(deps) != 1 || deps[0] != "github.com/idemgate/idemgate/attest/verify" {
		t.Fatalf("attest/verify links packages outside the standard library: %v", deps)
	}
}
