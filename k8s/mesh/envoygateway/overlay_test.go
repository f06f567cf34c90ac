//go:build mesh

package envoygateway_test

import (
	"fmt"
	"net"
	"os"
	"strconv"
	"testing"

	"github.com/idemgate/idemgate/k8s/mesh/meshtest"
)

// The standalone overlay: what changes between k8s/envoy-gateway as shipped
// and what Envoy Gateway standalone (File provider, Host infrastructure)
// runs on one machine. Everything else, every policy and route included,
// is the shipped files as kustomize renders them.
//
//  1. Only Gateway API and Envoy Gateway kinds are kept: the NetworkPolicies
//     and the ConfigMap are Kubernetes' business (the judge runs idemgate
//     itself, with the config from the rendered ConfigMap, as the proxy
//     pods' sidecar would).
//  2. The shipped EnvoyProxy (idemgate-sidecar, which the Gateway uses) is
//     checked to carry idemgate as a sidecar of the Kubernetes proxy pods,
//     and its provider becomes Host with the pinned Envoy version (a host
//     runs no pod): without the version Envoy Gateway takes it from its
//     digest-pinned default image, finds none, and func-e tries the
//     internet. It also turns hot restart off, whose domain socket another
//     Envoy on the machine may hold. It moves to envoy-gateway-system and
//     the GatewayClass points at it too: the file provider loads a single
//     EnvoyProxy, as the GatewayClass's.
//  3. Standalone does not resolve Service backendRefs, so the HTTPRoutes'
//     `payments-api` becomes a gateway.envoyproxy.io Backend on 127.0.0.1
//     (extensionApis.enableBackend). The shipped Backend `idemgate` (a unix
//     socket) is kept; only its path moves to where the judge's idemgate
//     listens (a test directory instead of the pod's emptyDir).
//  4. The Gateway listens on a free loopback port: host mode binds the
//     listener's port as written (80 in the shipped file).
//  5. The SecurityPolicy verifies the demo issuer's tokens against its inline
//     JWKS, taken from securitypolicy-local-jwks.example.yaml (shipped beside
//     it for exactly this), instead of fetching a JWKS from the internet.
type overlayAddrs struct {
	gatewayPort    int
	idemgateSocket string // the path of the judge's idemgate's gRPC unix socket
	shippedSocket  string // the path in the shipped idemgate.yaml
	envoyAdminFile string // where Envoy writes its admin address
	payments       string // host:port of the payments API
}

// Envoy Gateway puts every object without a namespace into
// envoy-gateway-system (but an EnvoyProxy: see standalone).
const (
	envoyGatewayNS      = "envoy-gateway-system"
	egGroup             = "gateway.envoyproxy.io"
	extensionPolicyKind = "EnvoyExtensionPolicy"
)

func standalone(t *testing.T, objs []meshtest.Object, localJWKS meshtest.Object, envoyVersion string, a overlayAddrs) []meshtest.Object {
	t.Helper()
	var out []meshtest.Object
	for _, o := range objs {
		api, _ := o["apiVersion"].(string)
		if !isGatewayKind(api) {
			continue
		}
		out = append(out, o)
	}
	hostSpec := func() map[string]any {
		return map[string]any{
			"provider": map[string]any{"type": "Host", "host": map[string]any{"envoyVersion": envoyVersion}},
			// Other Envoys on this machine hold hot restart's base id 0.
			// Host mode gives Envoy's admin a random port: Envoy writes it
			// to a.envoyAdminFile for the judge to read its config.
			"extraArgs": []any{"--disable-hot-restart", "--admin-address-path", a.envoyAdminFile},
		}
	}
	gw := meshtest.Find(t, out, "Gateway", "payments")
	sidecarProxy, _ := meshtest.Path(gw, "spec", "infrastructure", "parametersRef", "name").(string)
	if kind, _ := meshtest.Path(gw, "spec", "infrastructure", "parametersRef", "kind").(string); kind != "EnvoyProxy" || sidecarProxy == "" {
		t.Fatal("the shipped Gateway should use its own EnvoyProxy (infrastructure.parametersRef)")
	}
	ep := meshtest.Find(t, out, "EnvoyProxy", sidecarProxy)
	if meshtest.Path(ep, "spec", "provider", "type") != "Kubernetes" {
		t.Fatalf("the shipped EnvoyProxy %s should configure the Kubernetes proxy pods", sidecarProxy)
	}
	inits := asList(meshtest.Path(ep, "spec", "provider", "kubernetes", "envoyDeployment", "initContainers"))
	if len(inits) != 1 || meshtest.Path(inits[0], "name") != "idemgate" || meshtest.Path(inits[0], "restartPolicy") != "Always" {
		t.Fatalf("the shipped EnvoyProxy %s should carry idemgate as a native sidecar, has %v", sidecarProxy, inits)
	}
	ep["spec"] = hostSpec()
	// Standalone's file provider loads one EnvoyProxy only, as the
	// GatewayClass's, with the namespace written on it: it is this one, in
	// Envoy Gateway's namespace (where the Gateway's parametersRef looks),
	// and the GatewayClass points at it too.
	meshtest.SetPath(ep, envoyGatewayNS, "metadata", "namespace")
	gc := meshtest.Find(t, out, "GatewayClass", "envoy-gateway")
	meshtest.SetPath(gc, map[string]any{
		"group": egGroup, "kind": "EnvoyProxy", "name": sidecarProxy, "namespace": envoyGatewayNS,
	}, "spec", "parametersRef")

	listeners, _ := meshtest.Path(gw, "spec", "listeners").([]any)
	if len(listeners) != 1 {
		t.Fatalf("the shipped Gateway should have one listener, has %d", len(listeners))
	}
	listeners[0].(map[string]any)["port"] = a.gatewayPort

	backends := map[string]string{}
	var extProcBackend string
	for _, o := range out {
		switch meshtest.Kind(o) {
		case "HTTPRoute":
			for _, rule := range asList(meshtest.Path(o, "spec", "rules")) {
				for _, ref := range asList(meshtest.Path(rule, "backendRefs")) {
					backends[toBackend(t, ref.(map[string]any))] = a.payments
				}
			}
		case extensionPolicyKind:
			for _, ext := range asList(meshtest.Path(o, "spec", "extProc")) {
				for _, ref := range asList(meshtest.Path(ext, "backendRefs")) {
					r := ref.(map[string]any)
					if r["group"] != egGroup || r["kind"] != "Backend" {
						t.Fatalf("the shipped extProc backendRef %v should be a Backend", r)
					}
					extProcBackend, _ = r["name"].(string)
				}
			}
		case "SecurityPolicy":
			meshtest.SetPath(o, meshtest.Path(localJWKS, "spec", "jwt"), "spec", "jwt")
		}
	}
	if backends["payments-api"] == "" || extProcBackend == "" {
		t.Fatalf("the shipped files should refer to Service payments-api and an extProc Backend, found %v and %q", backends, extProcBackend)
	}
	for name, addr := range backends {
		host, port := splitHostPort(t, addr)
		out = append(out, meshtest.Object{
			"apiVersion": egGroup + "/v1alpha1", "kind": "Backend",
			"metadata": map[string]any{"name": name},
			"spec":     map[string]any{"endpoints": []any{map[string]any{"ip": map[string]any{"address": host, "port": port}}}},
		})
	}
	b := meshtest.Find(t, out, "Backend", extProcBackend)
	endpoints := asList(meshtest.Path(b, "spec", "endpoints"))
	if len(endpoints) != 1 || meshtest.Path(endpoints[0], "unix", "path") != a.shippedSocket {
		t.Fatalf("the shipped Backend %s should have one unix endpoint, idemgate.yaml's socket %s; has %v", extProcBackend, a.shippedSocket, endpoints)
	}
	meshtest.SetPath(endpoints[0].(map[string]any), a.idemgateSocket, "unix", "path")
	return out
}

func isGatewayKind(apiVersion string) bool {
	for _, group := range []string{"gateway.networking.k8s.io/", egGroup + "/"} {
		if len(apiVersion) > len(group) && apiVersion[:len(group)] == group {
			return true
		}
	}
	return false
}

// toBackend turns a Service backendRef into a Backend reference (port
// dropped: a Backend carries its own) and returns the name.
func toBackend(t *testing.T, ref map[string]any) string {
	t.Helper()
	if g, _ := ref["group"].(string); g != "" && g != "core" {
		t.Fatalf("backendRef %v is not a Service", ref)
	}
	name, _ := ref["name"].(string)
	ref["group"], ref["kind"] = egGroup, "Backend"
	delete(ref, "port")
	return name
}

func asList(v any) []any { l, _ := v.([]any); return l }

func splitHostPort(t *testing.T, addr string) (string, int) {
	t.Helper()
	host, p, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	port, err := strconv.Atoi(p)
	if err != nil {
		t.Fatal(err)
	}
	return host, port
}

// without returns objs minus every object of kind.
func without(objs []meshtest.Object, kind string) []meshtest.Object {
	var out []meshtest.Object
	for _, o := range objs {
		if meshtest.Kind(o) != kind {
			out = append(out, o)
		}
	}
	return out
}

// egConfig is Envoy Gateway's own configuration: standalone, resources from
// resourcesDir, Envoy run by func-e from dirs under home (dataHome holds the
// link to the pinned Envoy, so nothing is downloaded).
func egConfig(resourcesDir, home string) []byte {
	return fmt.Appendf(nil, `apiVersion: gateway.envoyproxy.io/v1alpha1
kind: EnvoyGateway
gateway:
  controllerName: gateway.envoyproxy.io/gatewayclass-controller
provider:
  type: Custom
  custom:
    resource:
      type: File
      file:
        paths: [%q]
    infrastructure:
      type: Host
      host:
        configHome: %q
        dataHome: %q
        stateHome: %q
        runtimeDir: %q
logging:
  level:
    default: info
extensionApis:
  enableBackend: true
`, resourcesDir, home+"/config", home+"/data", home+"/state", home+"/run")
}

// linkEnvoy makes func-e find the pinned Envoy instead of downloading one.
func linkEnvoy(t *testing.T, home, envoyBin, version string) {
	t.Helper()
	dir := home + "/data/envoy-versions/" + version + "/bin"
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(envoyBin, dir+"/envoy"); err != nil {
		t.Fatal(err)
	}
}
