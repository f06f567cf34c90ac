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
//  1. Only Gateway API and Envoy Gateway kinds are kept: the Deployment,
//     Service, PodDisruptionBudget, NetworkPolicies and the ConfigMap are
//     Kubernetes' business (the judge runs idemgate itself, with the config
//     from the rendered ConfigMap).
//  2. The GatewayClass points at an EnvoyProxy of type Host with the pinned
//     Envoy version: without it Envoy Gateway takes the version from its
//     digest-pinned default image, finds none, and func-e tries the internet.
//     It also turns hot restart off, whose domain socket another Envoy on
//     the machine may hold.
//  3. Standalone does not resolve Service backendRefs, so the HTTPRoutes'
//     `payments-api` and the EnvoyExtensionPolicy's `idemgate` become
//     gateway.envoyproxy.io Backends on 127.0.0.1 (extensionApis.enableBackend).
//  4. The Gateway listens on a free loopback port: host mode binds the
//     listener's port as written (80 in the shipped file).
//  5. The SecurityPolicy verifies the demo issuer's tokens against its inline
//     JWKS, taken from securitypolicy-local-jwks.example.yaml (shipped beside
//     it for exactly this), instead of fetching a JWKS from the internet.
type overlayAddrs struct {
	gatewayPort int
	idemgate    string // host:port of idemgate's gRPC
	payments    string // host:port of the payments API
}

// envoyProxyName is the EnvoyProxy the overlay adds; Envoy Gateway puts
// every object without a namespace into envoy-gateway-system.
const (
	envoyProxyName      = "standalone-host"
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
	gc := meshtest.Find(t, out, "GatewayClass", "envoy-gateway")
	meshtest.SetPath(gc, map[string]any{
		"group": egGroup, "kind": "EnvoyProxy", "name": envoyProxyName, "namespace": envoyGatewayNS,
	}, "spec", "parametersRef")
	out = append(out, meshtest.Object{
		"apiVersion": egGroup + "/v1alpha1", "kind": "EnvoyProxy",
		"metadata": map[string]any{"name": envoyProxyName, "namespace": envoyGatewayNS},
		"spec": map[string]any{
			"provider": map[string]any{"type": "Host", "host": map[string]any{"envoyVersion": envoyVersion}},
			// Other Envoys on this machine hold hot restart's base id 0.
			"extraArgs": []any{"--disable-hot-restart"},
		},
	})

	gw := meshtest.Find(t, out, "Gateway", "payments")
	listeners, _ := meshtest.Path(gw, "spec", "listeners").([]any)
	if len(listeners) != 1 {
		t.Fatalf("the shipped Gateway should have one listener, has %d", len(listeners))
	}
	listeners[0].(map[string]any)["port"] = a.gatewayPort

	backends := map[string]string{}
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
					backends[toBackend(t, ref.(map[string]any))] = a.idemgate
				}
			}
		case "SecurityPolicy":
			meshtest.SetPath(o, meshtest.Path(localJWKS, "spec", "jwt"), "spec", "jwt")
		}
	}
	if backends["payments-api"] == "" || backends["idemgate"] == "" {
		t.Fatalf("the shipped files should refer to Services payments-api and idemgate, found %v", backends)
	}
	for name, addr := range backends {
		host, port := splitHostPort(t, addr)
		b := meshtest.Object{
			"apiVersion": egGroup + "/v1alpha1", "kind": "Backend",
			"metadata": map[string]any{"name": name},
			"spec":     map[string]any{"endpoints": []any{map[string]any{"ip": map[string]any{"address": host, "port": port}}}},
		}
		if name == "idemgate" {
			// gRPC: HTTP/2 without TLS, as the shipped Service's appProtocol says.
			meshtest.SetPath(b, []any{"gateway.envoyproxy.io/h2c"}, "spec", "appProtocols")
		}
		out = append(out, b)
	}
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
