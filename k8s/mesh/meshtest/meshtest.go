//go:build mesh

// Package meshtest is what the judges of k8s/mesh share: the binaries
// `make test-mesh` built, and the manifests kustomize renders from k8s/.
package meshtest

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"
)

// Binary returns the executable the environment variable env names. A
// missing one fails the test: a judge that cannot run must not pass.
func Binary(t testing.TB, env, what string) string {
	t.Helper()
	bin := os.Getenv(env)
	if bin == "" {
		t.Fatalf("%s is unset: it names the %s binary; run the judges with `make test-mesh`, which builds it", env, what)
	}
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("%s=%s: %v; `make test-mesh` builds it", env, bin, err)
	}
	return bin
}

// K8sDir is the absolute path of the repository's k8s/ directory.
func K8sDir(t testing.TB) string {
	t.Helper()
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("cannot locate meshtest's source file")
	}
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// Object is one rendered Kubernetes object, as generic YAML.
type Object = map[string]any

// Render runs `kustomize build` (the binary KUSTOMIZE_BIN names) on dir and
// returns the rendered documents, in kustomize's order, as raw YAML and
// decoded.
func Render(t testing.TB, dir string) ([][]byte, []Object) {
	t.Helper()
	bin := Binary(t, "KUSTOMIZE_BIN", "kustomize")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, bin, "build", dir)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("kustomize build %s: %v\n%s", dir, err, stderr.String())
	}
	var docs [][]byte
	var objs []Object
	for _, doc := range strings.Split(string(out), "\n---\n") {
		if strings.TrimSpace(doc) == "" {
			continue
		}
		var o Object
		if err := yaml.Unmarshal([]byte(doc), &o); err != nil {
			t.Fatalf("kustomize build %s printed a document that is not YAML: %v\n%s", dir, err, doc)
		}
		docs = append(docs, []byte(doc))
		objs = append(objs, o)
	}
	if len(objs) == 0 {
		t.Fatalf("kustomize build %s rendered nothing", dir)
	}
	return docs, objs
}

// Kind and Name read an object's kind and metadata.name.
func Kind(o Object) string { s, _ := o["kind"].(string); return s }

// Name is the object's metadata.name.
func Name(o Object) string {
	m, _ := o["metadata"].(map[string]any)
	s, _ := m["name"].(string)
	return s
}

// Find returns the object of kind and name, failing the test when there is
// not exactly one.
func Find(t testing.TB, objs []Object, kind, name string) Object {
	t.Helper()
	var found []Object
	for _, o := range objs {
		if Kind(o) == kind && Name(o) == name {
			found = append(found, o)
		}
	}
	if len(found) != 1 {
		t.Fatalf("want one %s %s in the rendered manifests, found %d", kind, name, len(found))
	}
	return found[0]
}

// Path walks nested maps along keys and returns the value there (nil if any
// step is missing).
func Path(o any, keys ...string) any {
	for _, k := range keys {
		m, ok := o.(map[string]any)
		if !ok {
			return nil
		}
		o = m[k]
	}
	return o
}

// SetPath sets the value at keys, creating maps on the way.
func SetPath(o Object, v any, keys ...string) {
	for _, k := range keys[:len(keys)-1] {
		next, ok := o[k].(map[string]any)
		if !ok {
			next = map[string]any{}
			o[k] = next
		}
		o = next
	}
	o[keys[len(keys)-1]] = v
}

// WriteYAML writes objs as one multi-document YAML file.
func WriteYAML(t testing.TB, path string, objs []Object) {
	t.Helper()
	var b bytes.Buffer
	for _, o := range objs {
		out, err := yaml.Marshal(o)
		if err != nil {
			t.Fatalf("encode %s %s: %v", Kind(o), Name(o), err)
		}
		b.WriteString("---\n")
		b.Write(out)
	}
	if err := os.WriteFile(path, b.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
}
