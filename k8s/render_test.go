package k8s

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	networkingv1alpha3 "istio.io/api/networking/v1alpha3"
	securityv1 "istio.io/api/security/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/util/strategicpatch"
	k8syaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

// kubectl and kustomize are not installed here, so this file renders a
// kustomization itself: the subset of kustomize our manifests use (resources,
// directories as bases, configMapGenerator (with namespace and
// options.disableNameSuffixHash), strategic-merge patches including
// `$patch: delete`), with kustomize's order (resources, generators, patches).
// A kustomization.yaml that uses anything else fails to decode, so the tests
// never silently render something kustomize would render differently. One
// known difference: kustomize suffixes generated ConfigMap names with a content
// hash and rewrites the references; we keep the plain names, which name the
// same objects.

// kustomization is the subset of kustomize.config.k8s.io/v1beta1 we support.
type kustomization struct {
	APIVersion         string           `json:"apiVersion"`
	Kind               string           `json:"kind"`
	Resources          []string         `json:"resources"`
	Patches            []kustomizePatch `json:"patches"`
	ConfigMapGenerator []configMapArgs  `json:"configMapGenerator"`
}

type kustomizePatch struct {
	Path string `json:"path"`
}

type configMapArgs struct {
	Name      string   `json:"name"`
	Namespace string   `json:"namespace"`
	Files     []string `json:"files"`
	Options   *struct {
		DisableNameSuffixHash bool `json:"disableNameSuffixHash"`
	} `json:"options"`
}

// resID names an object the way kustomize matches patches to resources.
type resID struct {
	APIVersion, Kind, Name string
}

func (id resID) String() string { return id.APIVersion + "/" + id.Kind + "/" + id.Name }

// document is one rendered object before typed decoding.
type document struct {
	id   resID
	json []byte
	from string // file it came from, for messages
}

// object is one rendered object, decoded strictly.
type object struct {
	id    resID
	from  string
	typed any // a Kubernetes runtime.Object or an *istioObject
}

// istioObject is an Istio custom resource: Kubernetes metadata and a proto spec.
type istioObject struct {
	Meta metav1.ObjectMeta
	Spec proto.Message
}

var scheme = func() *runtime.Scheme {
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{
		appsv1.AddToScheme, corev1.AddToScheme, networkingv1.AddToScheme, policyv1.AddToScheme,
	} {
		if err := add(s); err != nil {
			panic(err) // static registration of compiled-in types; cannot fail at run time
		}
	}
	return s
}()

// strictDecoder rejects unknown and duplicate fields (serializer.EnableStrict).
var strictDecoder = serializer.NewCodecFactory(scheme, serializer.EnableStrict).UniversalDeserializer()

// istioKinds maps the Istio kinds we ship to a fresh spec message.
var istioKinds = map[resID]func() proto.Message{
	{APIVersion: "networking.istio.io/v1alpha3", Kind: "EnvoyFilter"}:   func() proto.Message { return &networkingv1alpha3.EnvoyFilter{} },
	{APIVersion: "security.istio.io/v1", Kind: "RequestAuthentication"}: func() proto.Message { return &securityv1.RequestAuthentication{} },
	{APIVersion: "security.istio.io/v1", Kind: "AuthorizationPolicy"}:   func() proto.Message { return &securityv1.AuthorizationPolicy{} },
}

// render builds the kustomization in dir and decodes every object strictly.
func render(t *testing.T, dir string) []object {
	t.Helper()
	docs, err := build(dir)
	require.NoError(t, err)
	var out []object
	for _, d := range docs {
		typed, err := decodeStrict(d)
		require.NoError(t, err, "%s (from %s)", d.id, d.from)
		out = append(out, object{id: d.id, from: d.from, typed: typed})
	}
	return out
}

func build(dir string) ([]document, error) {
	raw, err := os.ReadFile(filepath.Join(dir, "kustomization.yaml"))
	if err != nil {
		return nil, fmt.Errorf("failed to read kustomization: %w", err)
	}
	var k kustomization
	if err := yaml.UnmarshalStrict(raw, &k); err != nil {
		return nil, fmt.Errorf("%s/kustomization.yaml uses a field this renderer does not support: %w", dir, err)
	}
	if k.APIVersion != "kustomize.config.k8s.io/v1beta1" || k.Kind != "Kustomization" {
		return nil, fmt.Errorf("%s/kustomization.yaml: unexpected %s %s", dir, k.APIVersion, k.Kind)
	}
	var docs []document
	for _, r := range k.Resources {
		p := filepath.Join(dir, r)
		if st, err := os.Stat(p); err == nil && st.IsDir() {
			sub, err := build(p)
			if err != nil {
				return nil, err
			}
			docs = append(docs, sub...)
			continue
		}
		fileDocs, err := readDocuments(p)
		if err != nil {
			return nil, err
		}
		docs = append(docs, fileDocs...)
	}
	for _, g := range k.ConfigMapGenerator {
		cm, err := generateConfigMap(dir, g)
		if err != nil {
			return nil, err
		}
		docs = append(docs, cm)
	}
	seen := map[resID]string{}
	for _, d := range docs {
		if prev, dup := seen[d.id]; dup {
			return nil, fmt.Errorf("%s defined in %s and %s", d.id, prev, d.from)
		}
		seen[d.id] = d.from
	}
	for _, p := range k.Patches {
		if docs, err = applyPatchFile(docs, filepath.Join(dir, p.Path)); err != nil {
			return nil, err
		}
	}
	return docs, nil
}

// readDocuments splits a multi-document YAML file into JSON documents.
func readDocuments(path string) ([]document, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("failed to read %s: %w", path, err)
	}
	r := k8syaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(raw)))
	var out []document
	for {
		chunk, err := r.Read()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("failed to split %s: %w", path, err)
		}
		js, err := yaml.YAMLToJSONStrict(chunk)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		if string(bytes.TrimSpace(js)) == "null" {
			continue // a document of comments only
		}
		id, err := idOf(js)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		out = append(out, document{id: id, json: js, from: path})
	}
}

func idOf(js []byte) (resID, error) {
	var h struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
		Metadata   struct {
			Name string `json:"name"`
		} `json:"metadata"`
	}
	if err := json.Unmarshal(js, &h); err != nil {
		return resID{}, fmt.Errorf("failed to read apiVersion/kind/name: %w", err)
	}
	if h.APIVersion == "" || h.Kind == "" || h.Metadata.Name == "" {
		return resID{}, errors.New("object without apiVersion, kind or metadata.name")
	}
	return resID{APIVersion: h.APIVersion, Kind: h.Kind, Name: h.Metadata.Name}, nil
}

// generateConfigMap builds a ConfigMap from files; a file's key is its base
// name, or KEY in a "KEY=path" entry, as in kustomize.
func generateConfigMap(dir string, g configMapArgs) (document, error) {
	data := map[string]string{}
	for _, f := range g.Files {
		key, path := filepath.Base(f), f
		if k, p, ok := strings.Cut(f, "="); ok {
			key, path = k, p
		}
		b, err := os.ReadFile(filepath.Join(dir, path))
		if err != nil {
			return document{}, fmt.Errorf("configMapGenerator %s: %w", g.Name, err)
		}
		data[key] = string(b)
	}
	cm := corev1.ConfigMap{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "ConfigMap"},
		ObjectMeta: metav1.ObjectMeta{Name: g.Name, Namespace: g.Namespace},
		Data:       data,
	}
	js, err := json.Marshal(cm)
	if err != nil {
		return document{}, fmt.Errorf("failed to encode ConfigMap %s: %w", g.Name, err)
	}
	return document{id: resID{APIVersion: "v1", Kind: "ConfigMap", Name: g.Name}, json: js, from: filepath.Join(dir, "kustomization.yaml")}, nil
}

// applyPatchFile applies each strategic-merge patch in path to the object it
// names; a patch whose top level says `$patch: delete` removes the object.
func applyPatchFile(docs []document, path string) ([]document, error) {
	patches, err := readDocuments(path)
	if err != nil {
		return nil, err
	}
	for _, p := range patches {
		i := indexOf(docs, p.id)
		if i < 0 {
			return nil, fmt.Errorf("patch %s: no %s to patch", path, p.id)
		}
		var top map[string]any
		if err := json.Unmarshal(p.json, &top); err != nil {
			return nil, fmt.Errorf("patch %s: %w", path, err)
		}
		if top["$patch"] == "delete" {
			docs = append(docs[:i], docs[i+1:]...)
			continue
		}
		gv, err := schema.ParseGroupVersion(p.id.APIVersion)
		if err != nil {
			return nil, fmt.Errorf("patch %s: %w", path, err)
		}
		schemaObj, err := scheme.New(gv.WithKind(p.id.Kind))
		if err != nil {
			return nil, fmt.Errorf("patch %s: strategic merge needs a known type: %w", path, err)
		}
		merged, err := strategicpatch.StrategicMergePatch(docs[i].json, p.json, schemaObj)
		if err != nil {
			return nil, fmt.Errorf("patch %s on %s: %w", path, p.id, err)
		}
		docs[i].json = merged
		docs[i].from += " + " + path
	}
	return docs, nil
}

func indexOf(docs []document, id resID) int {
	for i, d := range docs {
		if d.id == id {
			return i
		}
	}
	return -1
}

// decodeStrict decodes a Kubernetes object with the strict codec (unknown or
// duplicate fields are errors) and an Istio object as metadata plus a proto
// spec read by protojson with unknown fields rejected.
func decodeStrict(d document) (any, error) {
	if newSpec, ok := istioKinds[resID{APIVersion: d.id.APIVersion, Kind: d.id.Kind}]; ok {
		var envelope struct {
			APIVersion string            `json:"apiVersion"`
			Kind       string            `json:"kind"`
			Metadata   metav1.ObjectMeta `json:"metadata"`
			Spec       json.RawMessage   `json:"spec"`
		}
		dec := json.NewDecoder(bytes.NewReader(d.json))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&envelope); err != nil {
			return nil, fmt.Errorf("failed to decode %s: %w", d.id, err)
		}
		spec := newSpec()
		if err := (protojson.UnmarshalOptions{DiscardUnknown: false}).Unmarshal(envelope.Spec, spec); err != nil {
			return nil, fmt.Errorf("failed to decode the spec of %s: %w", d.id, err)
		}
		return &istioObject{Meta: envelope.Metadata, Spec: spec}, nil
	}
	obj, gvk, err := strictDecoder.Decode(d.json, nil, nil)
	if err != nil {
		return nil, fmt.Errorf("failed to decode %s: %w", d.id, err)
	}
	if gvk.GroupVersion().String() != d.id.APIVersion || gvk.Kind != d.id.Kind {
		return nil, fmt.Errorf("%s decoded as %s", d.id, gvk)
	}
	return obj, nil
}

// objectsOf returns the rendered objects of Go type T.
func objectsOf[T any](objs []object) []T {
	var out []T
	for _, o := range objs {
		if v, ok := o.typed.(T); ok {
			out = append(out, v)
		}
	}
	return out
}

// istioSpecs returns the specs of the rendered Istio objects of type T.
func istioSpecs[T proto.Message](objs []object) []T {
	var out []T
	for _, o := range objs {
		if obj, ok := o.typed.(*istioObject); ok {
			if s, ok := obj.Spec.(T); ok {
				out = append(out, s)
			}
		}
	}
	return out
}

// TestRendererIsStrict shows that the renderer and decoders refuse what
// kubectl, kustomize or Istio would refuse (or silently ignore).
func TestRendererIsStrict(t *testing.T) {
	const deploymentYAML = `apiVersion: apps/v1
kind: Deployment
metadata: {name: d}
spec:
  selector: {matchLabels: {a: b}}
  template:
    metadata: {labels: {a: b}}
    spec:
      containers: [{name: c, image: i}]
`
	tests := []struct {
		name  string
		files map[string]string
	}{
		{"unknown field in a Kubernetes object", map[string]string{
			"kustomization.yaml": "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources: [d.yaml]\n",
			"d.yaml":             strings.Replace(deploymentYAML, "containers:", "containerz: []\n      containers:", 1),
		}},
		{"duplicate key", map[string]string{
			"kustomization.yaml": "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources: [d.yaml]\n",
			"d.yaml":             strings.Replace(deploymentYAML, "metadata: {name: d}", "metadata: {name: d}\nmetadata: {name: e}", 1),
		}},
		{"kustomize feature the renderer does not implement", map[string]string{
			"kustomization.yaml": "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nnamePrefix: x-\nresources: [d.yaml]\n",
			"d.yaml":             deploymentYAML,
		}},
		{"patch without a target", map[string]string{
			"kustomization.yaml": "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources: [d.yaml]\npatches: [{path: p.yaml}]\n",
			"d.yaml":             deploymentYAML,
			"p.yaml":             "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: other}\nspec: {replicas: 2}\n",
		}},
		{"unknown field in an Istio spec", map[string]string{
			"kustomization.yaml": "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources: [ef.yaml]\n",
			"ef.yaml":            "apiVersion: networking.istio.io/v1alpha3\nkind: EnvoyFilter\nmetadata: {name: e}\nspec: {workloadSelector: {labels: {a: b}}, configPatchez: []}\n",
		}},
		{"kind nobody decodes", map[string]string{
			"kustomization.yaml": "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources: [x.yaml]\n",
			"x.yaml":             "apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: w}\n",
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			for name, content := range tt.files {
				require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte(content), 0o600))
			}
			docs, err := build(dir)
			if err == nil {
				for _, d := range docs {
					if _, err = decodeStrict(d); err != nil {
						break
					}
				}
			}
			require.Error(t, err)
			t.Log(err)
		})
	}
}
