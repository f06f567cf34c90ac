//go:build mesh

// Package kubectlvalidate is the Kubernetes judge of `make test-mesh`:
// kubectl-validate checks every manifest kustomize renders from k8s/ (and
// the shipped examples that are not rendered) nearly as an API server would:
// the Kubernetes 1.35 OpenAPI schemas of the built-in kinds, and for the
// custom kinds the CRDs of the versions the repository is written for
// (Gateway API and Envoy Gateway from their Go modules, Istio from
// istio.io/api), CEL rules included. It cannot see inside an EnvoyFilter's
// patch values: that is the Istio judge's job.
package kubectlvalidate

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/idemgate/idemgate/k8s/mesh/meshtest"
)

// kubernetesVersion is the newest schema set kubectl-validate ships.
const kubernetesVersion = "1.35"

// overlays are the kustomizations users apply; examples are shipped files
// that are not part of one.
var (
	overlays = []string{"base", "istio", "envoy-gateway"}
	examples = []string{"base/secrets.example.yaml", "envoy-gateway/securitypolicy-local-jwks.example.yaml"}
)

func TestKubectlValidateAcceptsEveryShippedManifest(t *testing.T) {
	crds := crdDir(t)
	dir := t.TempDir()
	n := writeShipped(t, dir)
	res, err := validate(t, crds, dir)
	if err != nil {
		t.Fatalf("kubectl-validate refused a shipped manifest: %v\n%s", err, res)
	}
	if len(res) != n {
		t.Fatalf("kubectl-validate reported on %d files, %d were written", len(res), n)
	}
	t.Logf("kubectl-validate (Kubernetes %s) accepted %d documents", kubernetesVersion, n)
}

// The judge fails on broken copies: one mutation per kind of check it does
// (built-in schema, CRD schema and pattern, CRD CEL rule, Istio CRD schema),
// each on a copy of one rendered document. Removing the ext_proc attachment
// altogether is no schema error: the Envoy Gateway and Istio judges, which
// run it, are the ones that fail then.
func TestKubectlValidateRefusesBrokenCopies(t *testing.T) {
	crds := crdDir(t)
	for _, tc := range []struct {
		name, overlay, kind, objName string
		mutate                       func(meshtest.Object)
		want                         string
	}{
		{"Deployment with a misspelt field", "base", "Deployment", "payments-api", func(o meshtest.Object) {
			meshtest.SetPath(o, 2, "spec", "replicaz")
		}, "replicaz"},
		{"Service whose ports are not a list", "base", "Service", "payments-api", func(o meshtest.Object) {
			meshtest.SetPath(o, map[string]any{"http": 80}, "spec", "ports")
		}, "ports"},
		{"HTTPRoute with an unknown path match type", "envoy-gateway", "HTTPRoute", "payments-api-idemgate", func(o meshtest.Object) {
			rule := meshtest.Path(o, "spec", "rules").([]any)[0].(map[string]any)
			rule["matches"].([]any)[0].(map[string]any)["path"].(map[string]any)["type"] = "Exakt"
		}, "Exakt"},
		{"EnvoyExtensionPolicy with failOpen as a string", "envoy-gateway", "EnvoyExtensionPolicy", "idemgate", func(o meshtest.Object) {
			meshtest.Path(o, "spec", "extProc").([]any)[0].(map[string]any)["failOpen"] = "no"
		}, "failOpen"},
		{"EnvoyExtensionPolicy attached to a Service (a CEL rule)", "envoy-gateway", "EnvoyExtensionPolicy", "idemgate", func(o meshtest.Object) {
			meshtest.Path(o, "spec", "targetRefs").([]any)[0].(map[string]any)["kind"] = "Service"
		}, "targetRefs"},
		{"EnvoyExtensionPolicy with a messageTimeout that is no duration", "envoy-gateway", "EnvoyExtensionPolicy", "idemgate", func(o meshtest.Object) {
			meshtest.Path(o, "spec", "extProc").([]any)[0].(map[string]any)["messageTimeout"] = "1 second"
		}, "messageTimeout"},
		{"EnvoyFilter with an unknown patch target", "istio", "EnvoyFilter", "payments-api-idemgate", func(o meshtest.Object) {
			meshtest.Path(o, "spec", "configPatches").([]any)[0].(map[string]any)["applyTo"] = "HTTP_FILTA"
		}, "HTTP_FILTA"},
		{"AuthorizationPolicy with an unknown action", "istio", "AuthorizationPolicy", "payments-api-require-jwt", func(o meshtest.Object) {
			meshtest.SetPath(o, "REFUSE", "spec", "action")
		}, "REFUSE"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, objs := meshtest.Render(t, filepath.Join(meshtest.K8sDir(t), tc.overlay))
			o := meshtest.Find(t, objs, tc.kind, tc.objName)
			tc.mutate(o)
			dir := t.TempDir()
			meshtest.WriteYAML(t, filepath.Join(dir, "broken.yaml"), []meshtest.Object{o})
			res, err := validate(t, crds, dir)
			if err == nil {
				t.Fatalf("kubectl-validate accepted the broken copy:\n%s", res)
			}
			if !strings.Contains(res.String(), tc.want) {
				t.Fatalf("kubectl-validate refused it, but not for %q:\n%s", tc.want, res)
			}
		})
	}
}

// writeShipped writes every rendered document and every example into dir,
// one file each, and returns how many.
func writeShipped(t *testing.T, dir string) int {
	t.Helper()
	k8s := meshtest.K8sDir(t)
	n := 0
	for _, overlay := range overlays {
		docs, objs := meshtest.Render(t, filepath.Join(k8s, overlay))
		for i, doc := range docs {
			name := fmt.Sprintf("%s-%02d-%s-%s.yaml", overlay, i, strings.ToLower(meshtest.Kind(objs[i])), meshtest.Name(objs[i]))
			if err := os.WriteFile(filepath.Join(dir, name), doc, 0o600); err != nil {
				t.Fatal(err)
			}
			n++
		}
	}
	for _, ex := range examples {
		b, err := os.ReadFile(filepath.Join(k8s, ex))
		if err != nil {
			t.Fatal(err)
		}
		for i, doc := range bytes.Split(b, []byte("\n---\n")) {
			name := fmt.Sprintf("example-%s-%d.yaml", strings.ReplaceAll(ex, "/", "-"), i)
			if err := os.WriteFile(filepath.Join(dir, name), doc, 0o600); err != nil {
				t.Fatal(err)
			}
			n++
		}
	}
	return n
}

// results are kubectl-validate's JSON report: per file, one status per
// document.
type results map[string][]struct {
	Status  string `json:"status"`
	Message string `json:"message"`
	Details any    `json:"details"`
}

func (r results) String() string {
	b, _ := json.MarshalIndent(r, "", "  ")
	return string(b)
}

// validate runs kubectl-validate on dir; err is set when it refused a
// document (or could not run).
func validate(t *testing.T, crds, dir string) (results, error) {
	t.Helper()
	bin := meshtest.Binary(t, "KUBECTL_VALIDATE_BIN", "kubectl-validate")
	cmd := exec.Command(bin, dir, "--version", kubernetesVersion, "--local-crds", crds, "--output", "json")
	// No cluster is consulted: an empty KUBECONFIG and no in-cluster config.
	cmd.Env = append(os.Environ(), "KUBECONFIG="+filepath.Join(t.TempDir(), "none"))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, runErr := cmd.Output()
	var res results
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("kubectl-validate printed no JSON report (%v): %s\n%s", runErr, out, stderr.String())
	}
	var failed []string
	for file, statuses := range res {
		for _, s := range statuses {
			if s.Status != "Success" {
				failed = append(failed, filepath.Base(file)+": "+s.Message)
			}
		}
	}
	switch {
	case runErr == nil && len(failed) == 0:
		return res, nil
	case len(failed) == 0:
		t.Fatalf("kubectl-validate failed without reporting a document: %v\n%s", runErr, stderr.String())
	}
	return res, fmt.Errorf("%s", strings.Join(failed, "\n"))
}

// crdDir gathers the CRDs of the API versions the repository is written
// for from the Go module cache (the versions go.mod pins): Gateway API's
// experimental channel (a superset of standard), Envoy Gateway's generated
// CRDs (a Helm template: its {{ }} lines removed) and Istio's.
func crdDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	gwapi := moduleDir(t, "sigs.k8s.io/gateway-api")
	eg := moduleDir(t, "github.com/envoyproxy/gateway")
	istio := moduleDir(t, "istio.io/api")
	var files []string
	for _, pattern := range []string{
		filepath.Join(gwapi, "config", "crd", "experimental", "gateway.networking.k8s.io_*.yaml"),
		filepath.Join(eg, "charts", "gateway-crds-helm", "templates", "generated", "gateway.envoyproxy.io_*.yaml"),
		filepath.Join(istio, "kubernetes", "customresourcedefinitions.gen.yaml"),
	} {
		m, err := filepath.Glob(pattern)
		if err != nil || len(m) == 0 {
			t.Fatalf("no CRDs at %s (%v)", pattern, err)
		}
		files = append(files, m...)
	}
	template := regexp.MustCompile(`^\s*\{\{.*\}\}\s*$`)
	for i, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var kept bytes.Buffer
		sc := bufio.NewScanner(bytes.NewReader(b))
		sc.Buffer(make([]byte, 1<<20), 16<<20)
		for sc.Scan() {
			if !template.Match(sc.Bytes()) {
				kept.Write(sc.Bytes())
				kept.WriteByte('\n')
			}
		}
		if err := sc.Err(); err != nil {
			t.Fatal(err)
		}
		// Every document must still be YAML after the template lines went.
		for _, doc := range bytes.Split(kept.Bytes(), []byte("\n---\n")) {
			var o map[string]any
			if err := yaml.Unmarshal(doc, &o); err != nil {
				t.Fatalf("%s: not YAML once the template lines are removed: %v", f, err)
			}
		}
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("%03d-%s", i, filepath.Base(f))), kept.Bytes(), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// moduleDir is the module cache directory of module at the version the
// repository's go.mod requires (downloaded if needed).
func moduleDir(t *testing.T, module string) string {
	t.Helper()
	cmd := exec.Command("go", "mod", "download", "-json", module)
	cmd.Dir = meshtest.K8sDir(t)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go mod download %s: %v", module, err)
	}
	var info struct{ Dir string }
	if err := json.Unmarshal(out, &info); err != nil || info.Dir == "" {
		t.Fatalf("go mod download %s: no directory in %s", module, out)
	}
	return info.Dir
}
