// Package istio is the Istio judge of `make test-mesh`: Istio's own config
// generator (pilot's ConfigGenTest, as pilot's sidecar simulation tests use
// it) builds the payments pod's sidecar from the shipped k8s/istio files, and
// the test reads what Envoy would receive; the pinned Envoy then validates it
// and runs its idemgate filter in front of idemgate (run_test.go). It is a
// separate Go module so that the product's go.mod does not carry
// istio.io/istio.
package istio

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"

	xdsmatcher "github.com/cncf/xds/go/xds/type/matcher/v3"
	bootstrap "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listener "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	matching "github.com/envoyproxy/go-control-plane/envoy/extensions/common/matching/v3"
	composite "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/composite/v3"
	extproc "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	hcm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"sigs.k8s.io/yaml"

	"istio.io/istio/pilot/pkg/features"
	"istio.io/istio/pilot/pkg/model"
	"istio.io/istio/pilot/pkg/networking/core"
	"istio.io/istio/pilot/pkg/simulation"
	"istio.io/istio/pilot/test/xdstest"
	"istio.io/istio/pkg/jwt"
	"istio.io/istio/pkg/test"
)

// podIP is the payments-api pod's address in the simulation.
const (
	filterName   = "idemgate"
	routerName   = "envoy.filters.http.router"
	podIP        = "10.0.0.7"
	responseCode = "response.code"
)

type object = map[string]any

func TestIstioGeneratesTheShippedSidecar(t *testing.T) {
	objs := render(t, filepath.Join(k8sDir(t), "istio"))
	paths := operationPaths(t, objs)
	sim := generate(t, objs)
	if err := checkSidecar(sim, paths); err != nil {
		t.Fatal(err)
	}
	t.Logf("Istio's generator put %s before the router and ran it for %v", filterName, paths)
}

// The judge fails on the mistakes it exists to catch.
func TestIstioJudgeFails(t *testing.T) {
	for _, tc := range []struct {
		name   string
		mutate func(t *testing.T, ef object)
		want   string
	}{
		{"without the idemgate filter", func(t *testing.T, ef object) {
			dropPatch(t, ef, func(p object) bool {
				return get(p, "patch", "value", "name") == filterName && get(p, "applyTo") == "HTTP_FILTER"
			})
		}, "no " + filterName},
		{"without response_attributes", dropResponseAttributes, "asks for response attributes []"},
		{"without the /mcp route", func(t *testing.T, ef object) {
			dropPatch(t, ef, func(p object) bool { return get(p, "patch", "value", "name") == "transfer_mcp" })
		}, "operation path /mcp takes route default"},
		{"with the virtual host named after the container port", func(t *testing.T, ef object) {
			for _, p := range list(get(ef, "spec", "configPatches")) {
				if vh, ok := get(p, "match", "routeConfiguration", "vhost").(object); ok {
					vh["name"] = "inbound|http|8080"
				}
			}
		}, "operation path /v1/transfers/confirm takes route default"},
		{"with the matcher reduced to the exact paths", func(t *testing.T, ef object) {
			for _, p := range list(get(ef, "spec", "configPatches")) {
				if get(p, "patch", "value", "name") != filterName || get(p, "applyTo") != "HTTP_FILTER" {
					continue
				}
				matchers := list(get(p, "patch", "value", "typed_config", "xds_matcher", "matcher_list", "matchers"))
				for _, pred := range list(get(matchers[0], "predicate", "or_matcher", "predicate")) {
					vm := get(pred, "single_predicate", "value_match").(object)
					if prefix, ok := vm["prefix"]; ok {
						delete(vm, "prefix")
						delete(vm, "ignore_case")
						vm["exact"] = prefix
					}
				}
			}
		}, "near miss /v1/transfers/confirm/"},
		{"with a route that switches idemgate off", func(t *testing.T, ef object) {
			for _, p := range list(get(ef, "spec", "configPatches")) {
				if get(p, "patch", "value", "name") == "transfer_confirm" {
					get(p, "patch", "value").(object)["typed_per_filter_config"] = object{filterName: object{
						"@type":    "type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExtProcPerRoute",
						"disabled": true,
					}}
				}
			}
		}, "switches idemgate off"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			objs := render(t, filepath.Join(k8sDir(t), "istio"))
			for _, o := range objs {
				if get(o, "kind") == "EnvoyFilter" {
					tc.mutate(t, o)
				}
			}
			err := checkSidecar(generate(t, objs), operationPaths(t, objs))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("want an error mentioning %q, got %v", tc.want, err)
			}
		})
	}
}

// generate runs Istio's generator for one payments-api pod: the rendered
// EnvoyFilter, RequestAuthentication and AuthorizationPolicy as they are,
// and the rendered Service as the ServiceEntry that pilot would derive from
// it (same port, target port and protocol; the pod's labels and an IP).
func generate(t *testing.T, objs []object) *simulation.Simulation {
	t.Helper()
	var cfg bytes.Buffer
	var podLabels map[string]string
	for _, o := range objs {
		switch get(o, "kind") {
		case "EnvoyFilter", "RequestAuthentication", "AuthorizationPolicy":
			b, err := yaml.Marshal(o)
			if err != nil {
				t.Fatal(err)
			}
			cfg.WriteString("---\n")
			cfg.Write(b)
		case "Deployment":
			podLabels = stringMap(get(o, "spec", "template", "metadata", "labels"))
		}
	}
	svc := serviceEntry(t, objs, podLabels)
	cfg.WriteString("---\n")
	cfg.Write(svc)
	// Envoy fetches the JWKS (PILOT_JWT_ENABLE_REMOTE_JWKS=envoy): the
	// generator then needs neither the network nor istiod's key resolver,
	// and the jwt_authn filter it builds is the same but for the key source.
	test.SetForTest(t, &features.JwksFetchMode, jwt.Envoy)
	s := core.NewConfigGenTest(t, core.TestOptions{ConfigString: cfg.String()})
	proxy := s.SetupProxy(&model.Proxy{
		Labels:      podLabels,
		IPAddresses: []string{podIP},
		Metadata:    &model.NodeMetadata{Labels: podLabels, IstioVersion: "1.30.0"},
	})
	return simulation.NewSimulationFromConfigGen(t, s, proxy)
}

// serviceEntry is the Service of the rendered manifests as a ServiceEntry
// with the pod as its endpoint.
func serviceEntry(t *testing.T, objs []object, podLabels map[string]string) []byte {
	t.Helper()
	var svc, deploy object
	for _, o := range objs {
		switch get(o, "kind") {
		case "Service":
			svc = o
		case "Deployment":
			deploy = o
		}
	}
	if svc == nil || deploy == nil {
		t.Fatal("the rendered k8s/istio should have one Service and one Deployment")
	}
	ports := list(get(svc, "spec", "ports"))
	if len(ports) != 1 {
		t.Fatalf("the Service should have one port, has %d", len(ports))
	}
	port := ports[0]
	target := containerPort(t, deploy, fmt.Sprint(get(port, "targetPort")))
	name := fmt.Sprint(get(svc, "metadata", "name"))
	return fmt.Appendf(nil, `apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: %s, namespace: default}
spec:
  hosts: [%s.default.svc.cluster.local]
  location: MESH_INTERNAL
  resolution: STATIC
  ports:
  - {name: %v, number: %v, protocol: HTTP, targetPort: %d}
  workloadSelector: {labels: %s}
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: payments-api-pod, namespace: default}
spec:
  address: %s
  labels: %s
`, name, name, get(port, "name"), get(port, "port"), target, jsonOf(t, podLabels), podIP, jsonOf(t, podLabels))
}

// checkSidecar is what the judge asserts on the generated sidecar:
//   - the inbound HTTP chain for the app's port runs the subject strip first,
//     idemgate after Istio's authentication (jwt_authn, rbac) and right
//     before the router; idemgate is ext_proc delegated to by a composite
//     filter, failing closed to the idemgate cluster;
//   - no route switches idemgate off; every operation path of idemgate.yaml
//     takes its own exact route to the app, and idemgate runs for it and for
//     every near-miss spelling (which it refuses), and not for other paths
//     (Istio's simulation does the route matching; the matcher is evaluated
//     here as Envoy evaluates it);
//   - the ext_proc filter asks for the response.code attribute, which a
//     preview with fingerprint_header: false reads its status from;
//   - the idemgate cluster exists.
func checkSidecar(sim *simulation.Simulation, paths []string) error {
	var errs []error
	chain, err := inboundHTTPChain(sim)
	if err != nil {
		return err
	}
	var names []string
	var runs func(path string) (bool, error)
	for _, f := range chain.GetHttpFilters() {
		names = append(names, f.GetName())
		if f.GetName() == filterName {
			var ep *extproc.ExternalProcessor
			if ep, runs, err = unwrapComposite(f); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", filterName, err))
			} else if ep.GetFailureModeAllow() || ep.GetGrpcService().GetEnvoyGrpc().GetClusterName() != "idemgate" {
				errs = append(errs, fmt.Errorf("%s does not fail closed to cluster idemgate: %v", filterName, ep))
			} else if !slices.Equal(ep.GetResponseAttributes(), []string{responseCode}) {
				errs = append(errs, fmt.Errorf("%s asks for response attributes %v, want [%s]: a preview with fingerprint_header: false would never be signed", filterName, ep.GetResponseAttributes(), responseCode))
			}
		}
	}
	at := slices.Index(names, filterName)
	switch {
	case at < 0:
		return fmt.Errorf("no %s on the inbound HTTP chain: %v", filterName, names)
	case at != len(names)-2 || names[len(names)-1] != routerName:
		errs = append(errs, fmt.Errorf("%s is not right before the router: %v", filterName, names))
	}
	if names[0] != "idemgate.strip_subject" {
		errs = append(errs, fmt.Errorf("the subject strip is not the first filter: %v", names))
	}
	for _, authn := range []string{"envoy.filters.http.jwt_authn", "envoy.filters.http.rbac"} {
		if i := slices.Index(names, authn); i < 0 || i > at {
			errs = append(errs, fmt.Errorf("%s does not run before %s: %v", authn, filterName, names))
		}
	}
	if xdstest.ExtractCluster("idemgate", sim.Clusters) == nil {
		errs = append(errs, errors.New("no idemgate cluster"))
	}
	if runs == nil {
		return errors.Join(errs...)
	}

	for _, vh := range chain.GetRouteConfig().GetVirtualHosts() {
		for _, r := range vh.GetRoutes() {
			if _, ok := r.GetTypedPerFilterConfig()[filterName]; ok {
				errs = append(errs, fmt.Errorf("route %s of %s switches idemgate off (or configures it): a near miss routed there would pass unchecked", r.GetName(), vh.GetName()))
			}
		}
	}
	// guarded: the request reaches the app with idemgate running for it.
	guarded := func(path string) (bool, *route.Route, error) {
		r, err := routeFor(sim, path)
		if err != nil {
			return false, nil, err
		}
		on, err := runs(path)
		return on && r.GetRoute().GetCluster() != "", r, err
	}
	for _, p := range paths {
		on, r, err := guarded(p)
		switch {
		case err != nil:
			errs = append(errs, err)
		case r.GetMatch().GetPath() != p:
			errs = append(errs, fmt.Errorf("operation path %s takes route %s, not its own exact route (timeouts, retries)", p, r.GetName()))
		case !on:
			errs = append(errs, fmt.Errorf("operation path %s: idemgate does not run on route %s", p, r.GetName()))
		}
		for _, miss := range []string{p + "/", strings.ToUpper(p), p + ";x", p + ".json"} {
			if on, r, err := guarded(miss); err != nil {
				errs = append(errs, err)
			} else if !on && r.GetDirectResponse() == nil {
				errs = append(errs, fmt.Errorf("near miss %s reaches route %s without idemgate", miss, r.GetName()))
			}
		}
	}
	// A surface another shipped config guards (envoy/idemgate.yaml's MCP
	// endpoint, say) must not reach the app unguarded here either.
	for _, p := range shippedSurfaces() {
		if slices.Contains(paths, p) {
			continue
		}
		if on, r, err := guarded(p); err == nil && !on && r.GetDirectResponse() == nil {
			errs = append(errs, fmt.Errorf("%s, guarded by envoy/idemgate.yaml, reaches the app through route %s without idemgate", p, r.GetName()))
		}
	}
	for _, other := range []string{"/", "/healthz", "/v1/transfers/by-key/x", "/v1/other"} {
		r, err := routeFor(sim, other)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		on, err := runs(other)
		if err != nil || on || r.GetRoute().GetCluster() == "" {
			errs = append(errs, fmt.Errorf("unguarded path %s: route %s should reach the app without idemgate (runs %v, %v)", other, r.GetName(), on, err))
		}
	}
	return errors.Join(errs...)
}

// unwrapComposite reads the shape `idemgate envoy-config` prints: an
// ExtensionWithMatcher around envoy.filters.http.composite whose matcher's
// actions execute ext_proc. It returns the ext_proc config and whether the
// composite runs it for a :path, evaluated as Envoy does (first matching
// field matcher; no match runs nothing). Only the predicates the pieces use
// are understood (or/single, :path, prefix with ignore_case, RE2 regex);
// anything else is an error, never a guess.
func unwrapComposite(f *hcm.HttpFilter) (*extproc.ExternalProcessor, func(string) (bool, error), error) {
	ewm := &matching.ExtensionWithMatcher{}
	if err := f.GetTypedConfig().UnmarshalTo(ewm); err != nil {
		return nil, nil, fmt.Errorf("not an ExtensionWithMatcher: %w", err)
	}
	if !ewm.GetExtensionConfig().GetTypedConfig().MessageIs(&composite.Composite{}) {
		return nil, nil, errors.New("does not wrap envoy.filters.http.composite")
	}
	ms := ewm.GetXdsMatcher().GetMatcherList().GetMatchers()
	if len(ms) == 0 || ewm.GetXdsMatcher().GetOnNoMatch() != nil {
		return nil, nil, errors.New("want a matcher_list and no on_no_match")
	}
	var ep *extproc.ExternalProcessor
	for _, m := range ms {
		exec := &composite.ExecuteFilterAction{}
		if err := m.GetOnMatch().GetAction().GetTypedConfig().UnmarshalTo(exec); err != nil {
			return nil, nil, fmt.Errorf("an action that is not ExecuteFilterAction: %w", err)
		}
		ep = &extproc.ExternalProcessor{}
		if err := exec.GetTypedConfig().GetTypedConfig().UnmarshalTo(ep); err != nil {
			return nil, nil, fmt.Errorf("the composite executes no ext_proc: %w", err)
		}
	}
	runs := func(path string) (bool, error) {
		for _, m := range ms {
			hit, err := predicateMatches(m.GetPredicate(), path)
			if err != nil || hit {
				return hit, err
			}
		}
		return false, nil
	}
	return ep, runs, nil
}

func predicateMatches(p *xdsmatcher.Matcher_MatcherList_Predicate, path string) (bool, error) {
	if or := p.GetOrMatcher(); or != nil {
		for _, q := range or.GetPredicate() {
			hit, err := predicateMatches(q, path)
			if err != nil || hit {
				return hit, err
			}
		}
		return false, nil
	}
	sp := p.GetSinglePredicate()
	in := &matcherv3.HttpRequestHeaderMatchInput{}
	if sp == nil || sp.GetInput().GetTypedConfig().UnmarshalTo(in) != nil || in.GetHeaderName() != ":path" {
		return false, fmt.Errorf("predicate %v is not understood here", p)
	}
	vm := sp.GetValueMatch()
	switch {
	case vm.GetPrefix() != "" && vm.GetIgnoreCase():
		return strings.HasPrefix(strings.ToLower(path), strings.ToLower(vm.GetPrefix())), nil
	case vm.GetExact() != "" && !vm.GetIgnoreCase():
		return path == vm.GetExact(), nil
	case vm.GetSafeRegex() != nil:
		re, err := regexp.Compile(`^(?:` + vm.GetSafeRegex().GetRegex() + `)$`)
		if err != nil {
			return false, err
		}
		return re.MatchString(path), nil
	}
	return false, fmt.Errorf("string matcher %v is not understood here", vm)
}

// inboundHTTPChain is the HTTP connection manager Istio built for inbound
// HTTP to the app's port on the virtual inbound listener.
func inboundHTTPChain(sim *simulation.Simulation) (*hcm.HttpConnectionManager, error) {
	l := xdstest.ExtractListener("virtualInbound", sim.Listeners)
	if l == nil {
		return nil, errors.New("no virtualInbound listener")
	}
	for _, fc := range l.GetFilterChains() {
		if fc.GetFilterChainMatch().GetDestinationPort().GetValue() != 8080 || !slices.Contains(fc.GetFilterChainMatch().GetApplicationProtocols(), "http/1.1") &&
			fc.GetFilterChainMatch().GetTransportProtocol() != "raw_buffer" {
			continue
		}
		if h := hcmOf(fc); h != nil {
			return h, nil
		}
	}
	return nil, errors.New("no inbound HTTP filter chain for port 8080")
}

func hcmOf(fc *listener.FilterChain) *hcm.HttpConnectionManager {
	for _, f := range fc.GetFilters() {
		h := &hcm.HttpConnectionManager{}
		if f.GetTypedConfig().UnmarshalTo(h) == nil {
			return h
		}
	}
	return nil
}

// routeFor runs an inbound HTTP call through the simulation (Istio's own
// listener, filter chain, virtual host and route matching) and returns the
// route it took.
func routeFor(sim *simulation.Simulation, path string) (*route.Route, error) {
	res := sim.Run(simulation.Call{Address: podIP, Port: 8080, Path: path, Protocol: simulation.HTTP, CallMode: simulation.CallModeInbound})
	if res.Error != nil {
		return nil, fmt.Errorf("%s: %w", path, res.Error)
	}
	// Inbound routes are inline in the connection manager, not from RDS.
	rcs := sim.Routes
	if chain, err := inboundHTTPChain(sim); err == nil && chain.GetRouteConfig() != nil {
		rcs = append(rcs, chain.GetRouteConfig())
	}
	for _, rc := range rcs {
		if res.RouteConfigMatched != "" && rc.GetName() != res.RouteConfigMatched {
			continue
		}
		for _, vh := range rc.GetVirtualHosts() {
			if vh.GetName() != res.VirtualHostMatched {
				continue
			}
			for _, r := range vh.GetRoutes() {
				if r.GetName() == res.RouteMatched {
					return r, nil
				}
			}
		}
	}
	return nil, fmt.Errorf("%s: matched route %q of %q/%q not found", path, res.RouteMatched, res.RouteConfigMatched, res.VirtualHostMatched)
}

// --- the shipped files --------------------------------------------------

func k8sDir(t *testing.T) string {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("cannot locate the test's source")
	}
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// render runs `kustomize build` (KUSTOMIZE_BIN) on dir.
func render(t *testing.T, dir string) []object {
	t.Helper()
	bin := os.Getenv("KUSTOMIZE_BIN")
	if bin == "" {
		t.Fatal("KUSTOMIZE_BIN is unset: run the judges with `make test-mesh`, which builds kustomize")
	}
	var stderr bytes.Buffer
	cmd := exec.Command(bin, "build", dir)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("kustomize build %s: %v\n%s", dir, err, stderr.String())
	}
	var objs []object
	for _, doc := range strings.Split(string(out), "\n---\n") {
		var o object
		if err := yaml.Unmarshal([]byte(doc), &o); err != nil {
			t.Fatal(err)
		}
		if o != nil {
			objs = append(objs, o)
		}
	}
	return objs
}

// operationPaths reads the paths idemgate guards from the idemgate.yaml in
// the rendered ConfigMap: every preview, confirm and status path and every
// MCP endpoint.
func operationPaths(t *testing.T, objs []object) []string {
	t.Helper()
	for _, o := range objs {
		if get(o, "kind") != "ConfigMap" || !strings.HasPrefix(fmt.Sprint(get(o, "metadata", "name")), "idemgate-config") {
			continue
		}
		paths := pathsOf([]byte(fmt.Sprint(get(o, "data", "idemgate.yaml"))))
		if len(paths) == 0 {
			t.Fatal("the rendered idemgate.yaml has no operations")
		}
		return paths
	}
	t.Fatal("no idemgate-config ConfigMap in the rendered k8s/istio")
	return nil
}

// shippedSurfaces are the operation paths of envoy/idemgate.yaml, the
// reference config (its MCP endpoint included).
func shippedSurfaces() []string {
	_, file, _, _ := runtime.Caller(0)
	b, err := os.ReadFile(filepath.Join(filepath.Dir(file), "..", "..", "..", "envoy", "idemgate.yaml"))
	if err != nil {
		return []string{"(envoy/idemgate.yaml unreadable: " + err.Error() + ")"}
	}
	return pathsOf(b)
}

// pathsOf reads every preview, confirm and status path and every MCP
// endpoint of an idemgate.yaml.
func pathsOf(b []byte) []string {
	var cfg struct {
		Operations []struct {
			Preview, Confirm, Status struct{ Path string }
			MCP                      *struct{ Endpoint string }
		}
	}
	if err := yaml.Unmarshal(b, &cfg); err != nil {
		return nil
	}
	var paths []string
	for _, op := range cfg.Operations {
		for _, p := range []string{op.Preview.Path, op.Confirm.Path, op.Status.Path} {
			if p != "" {
				paths = append(paths, p)
			}
		}
		if op.MCP != nil && !slices.Contains(paths, op.MCP.Endpoint) {
			paths = append(paths, op.MCP.Endpoint)
		}
	}
	return paths
}

func containerPort(t *testing.T, deploy object, name string) int {
	t.Helper()
	for _, c := range list(get(deploy, "spec", "template", "spec", "containers")) {
		for _, p := range list(get(c, "ports")) {
			if fmt.Sprint(get(p, "name")) == name || fmt.Sprint(get(p, "containerPort")) == name {
				var n int
				_, _ = fmt.Sscan(fmt.Sprint(get(p, "containerPort")), &n)
				return n
			}
		}
	}
	t.Fatalf("no container port %s in the Deployment", name)
	return 0
}

// dropResponseAttributes removes response_attributes from the ext_proc
// filter the EnvoyFilter ef inserts.
func dropResponseAttributes(t *testing.T, ef object) {
	t.Helper()
	n := 0
	for _, p := range list(get(ef, "spec", "configPatches")) {
		if get(p, "patch", "value", "name") != filterName || get(p, "applyTo") != "HTTP_FILTER" {
			continue
		}
		for _, m := range list(get(p, "patch", "value", "typed_config", "xds_matcher", "matcher_list", "matchers")) {
			ep, _ := get(m, "on_match", "action", "typed_config", "typed_config", "typed_config").(object)
			if _, ok := ep["response_attributes"]; ok {
				delete(ep, "response_attributes")
				n++
			}
		}
	}
	if n == 0 {
		t.Fatal("the shipped filter has no response_attributes to drop")
	}
}

func dropPatch(t *testing.T, ef object, drop func(object) bool) {
	t.Helper()
	patches := list(get(ef, "spec", "configPatches"))
	var kept []any
	for _, p := range patches {
		if !drop(p.(object)) {
			kept = append(kept, p)
		}
	}
	if len(kept) == len(patches) {
		t.Fatal("no patch dropped")
	}
	ef["spec"].(object)["configPatches"] = kept
}

func get(o any, keys ...string) any {
	for _, k := range keys {
		m, ok := o.(object)
		if !ok {
			return nil
		}
		o = m[k]
	}
	return o
}

func list(v any) []any { l, _ := v.([]any); return l }

func stringMap(v any) map[string]string {
	out := map[string]string{}
	for k, v := range v.(object) {
		out[k] = fmt.Sprint(v)
	}
	return out
}

func jsonOf(t *testing.T, v any) string {
	b, err := yaml.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	js, err := yaml.YAMLToJSON(b)
	if err != nil {
		t.Fatal(err)
	}
	return string(js)
}

// The HTTP chain Istio generated, with its Istio-only extensions removed,
// must also be accepted by the pinned upstream Envoy: it is written as a
// static bootstrap (one listener with that connection manager and its
// inline routes; the clusters it names, idemgate's as generated and the
// others as loopback placeholders, since their endpoints come from istiod's
// EDS and SDS) and run with `envoy --mode validate`. Then the generated
// idemgate filter, cluster and routes run in that Envoy in front of a real
// idemgate whose preview is body-only (fingerprint_header: false): the
// preview is signed only if the response.code attribute the filter asks for
// reaches idemgate.
func TestIstioSidecarPassesEnvoyValidate(t *testing.T) {
	envoyBin := os.Getenv("ENVOY_BIN")
	if envoyBin == "" {
		t.Fatal("ENVOY_BIN is unset: run the judges with `make test-mesh`, which passes the pinned Envoy")
	}
	objs := render(t, filepath.Join(k8sDir(t), "istio"))
	sim := generate(t, objs)
	chain, kept, dropped := upstreamChain(t, sim, nil)
	t.Logf("validating the inbound chain %v (Istio-only, left out: %v)", kept, dropped)
	path := writeBootstrap(t, inboundBootstrap(t, sim, chain, loopback(0), loopback(0), nil))
	msg, err := exec.Command(envoyBin, "--mode", "validate", "-c", path, "--disable-hot-restart", "-l", "error").CombinedOutput()
	if err != nil {
		t.Fatalf("envoy --mode validate refused the generated inbound chain: %v\n%s", err, msg)
	}

	t.Run("a body-only preview is signed through the generated filter", func(t *testing.T) {
		runBodyOnlyPreview(t, envoyBin, objs, sim)
	})
}

// upstreamChain is the inbound connection manager Istio generated without
// the filters upstream Envoy cannot load (Istio's own types and
// TypedStructs) and without those leave says to leave out too; its access
// log and tracing (Istio's formatters and providers) are removed.
func upstreamChain(t *testing.T, sim *simulation.Simulation, leave func(name string) bool) (chain *hcm.HttpConnectionManager, kept, dropped []string) {
	t.Helper()
	chain, err := inboundHTTPChain(sim)
	if err != nil {
		t.Fatal(err)
	}
	var filters []*hcm.HttpFilter
	for _, f := range chain.GetHttpFilters() {
		url := f.GetTypedConfig().GetTypeUrl()
		if strings.Contains(url, "istio") || strings.Contains(url, "TypedStruct") || leave != nil && leave(f.GetName()) {
			dropped = append(dropped, f.GetName())
			continue
		}
		kept = append(kept, f.GetName())
		filters = append(filters, f)
	}
	chain.HttpFilters = filters
	chain.AccessLog, chain.Tracing = nil, nil
	if !slices.Contains(kept, filterName) {
		t.Fatalf("%s was dropped: %v", filterName, dropped)
	}
	return chain, kept, dropped
}

// inboundBootstrap is a static bootstrap with one listener at listen
// running chain, an admin at admin, and the clusters chain names. at moves
// a cluster to an address: idemgate's keeps everything else Istio generated
// for it (HTTP/2, health checks), the others become plain placeholders. A
// cluster at does not move is kept as generated when it is static without
// TLS, else a placeholder on 127.0.0.1:1.
func inboundBootstrap(t *testing.T, sim *simulation.Simulation, chain *hcm.HttpConnectionManager, listen, admin *corev3.Address, at map[string]*corev3.Address) *bootstrap.Bootstrap {
	t.Helper()
	hcmAny, err := anypb.New(chain)
	if err != nil {
		t.Fatal(err)
	}
	js, err := protojson.Marshal(chain)
	if err != nil {
		t.Fatal(err)
	}
	placeholder := func(name string, addr *corev3.Address) *cluster.Cluster {
		return &cluster.Cluster{
			Name:                 name,
			ClusterDiscoveryType: &cluster.Cluster_Type{Type: cluster.Cluster_STATIC},
			LoadAssignment: &endpoint.ClusterLoadAssignment{ClusterName: name, Endpoints: []*endpoint.LocalityLbEndpoints{{
				LbEndpoints: []*endpoint.LbEndpoint{{HostIdentifier: &endpoint.LbEndpoint_Endpoint{Endpoint: &endpoint.Endpoint{
					Address: addr,
				}}}},
			}}},
		}
	}
	var clusters []*cluster.Cluster
	for _, name := range referencedClusters(js) {
		c := xdstest.ExtractCluster(name, sim.Clusters)
		generatedStatic := c != nil && c.GetTransportSocket() == nil && c.GetType() == cluster.Cluster_STATIC
		addr, moved := at[name]
		switch {
		case moved && name == "idemgate" && generatedStatic:
			c = proto.Clone(c).(*cluster.Cluster)
			for _, l := range c.GetLoadAssignment().GetEndpoints() {
				for _, e := range l.GetLbEndpoints() {
					e.GetEndpoint().Address = addr
				}
			}
			clusters = append(clusters, c)
		case moved:
			clusters = append(clusters, placeholder(name, addr))
		case generatedStatic:
			clusters = append(clusters, c)
		default:
			clusters = append(clusters, placeholder(name, loopback(1)))
		}
	}
	return &bootstrap.Bootstrap{
		Admin: &bootstrap.Admin{Address: admin},
		StaticResources: &bootstrap.Bootstrap_StaticResources{
			Listeners: []*listener.Listener{{
				Name:    "inbound_http_8080",
				Address: listen,
				FilterChains: []*listener.FilterChain{{Filters: []*listener.Filter{{
					Name:       "envoy.filters.network.http_connection_manager",
					ConfigType: &listener.Filter_TypedConfig{TypedConfig: hcmAny},
				}}}},
			}},
			Clusters: clusters,
		},
	}
}

func writeBootstrap(t *testing.T, bs *bootstrap.Bootstrap) string {
	t.Helper()
	out, err := protojson.Marshal(bs)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "istio-inbound.json")
	if err := os.WriteFile(path, out, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// referencedClusters are the cluster names a connection manager's JSON
// mentions (routes, ext_proc's gRPC service, jwt_authn's JWKS fetch).
func referencedClusters(js []byte) []string {
	var names []string
	for _, m := range regexp.MustCompile(`"(?:cluster|clusterName)":"([^"]+)"`).FindAllSubmatch(js, -1) {
		if n := string(m[1]); !slices.Contains(names, n) {
			names = append(names, n)
		}
	}
	return names
}

func loopback(port uint32) *corev3.Address {
	return &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
		Address: "127.0.0.1", PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: port},
	}}}
}
