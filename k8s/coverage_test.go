package k8s

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/envoy"
	"github.com/idemgate/idemgate/envoy/envoytest"
)

// Every route a shipped front exposes (plain Envoy, the Kubernetes sidecar,
// Istio, Envoy Gateway) is one of:
//   - guarded: ext_proc runs on it, and it is an exact operation path of the
//     idemgate config shipped beside that front (a guarded route idemgate
//     has no operation for is passed through unexamined: the /mcp hole);
//   - refused: Envoy answers it itself (direct response), nothing reaches
//     the app;
//   - a pass-through: it reaches the app with ext_proc off, and neither a
//     guarded surface nor a near-miss spelling of one ever lands on it.
//
// The guarded surfaces are the operation paths of every idemgate config the
// repository ships (so an endpoint one deployment guards, such as the MCP
// endpoint, cannot reach the app unguarded through another), plus those of
// the config beside the front. The routes are read from the shipped files,
// not listed here, so the test follows them as they change.

type verdict int

const (
	guarded verdict = iota
	refused
	passThrough
)

func (v verdict) String() string {
	return [...]string{"guarded", "refused", "pass-through"}[v]
}

// exposed is one route (or HTTPRoute rule match) of a front.
type exposed struct {
	name string
	v    verdict
	// exact is the path of an exact path match, "" for any other match.
	exact string
}

// front is a shipped front as the coverage check sees it: its routes, and
// the route a request path takes (ok false: the front answers 404 itself).
type front struct {
	routes   []exposed
	routeFor func(path string) (r exposed, ok bool, err error)
}

func checkCoverage(f front, cfg *envoytest.IdemgateConfig, surfaces []string) error {
	var errs []error
	ops := cfg.OperationPaths()
	for _, r := range f.routes {
		if r.v == guarded && (r.exact == "" || !slices.Contains(ops, r.exact)) {
			errs = append(errs, fmt.Errorf("route %s runs ext_proc but is no operation of the idemgate config beside it: idemgate passes it through unexamined", r.name))
		}
	}
	all := slices.Clone(ops)
	for _, s := range surfaces {
		if !slices.Contains(all, s) {
			all = append(all, s)
		}
	}
	for _, s := range all {
		for _, probe := range append([]string{s}, envoytest.NearMisses(s)...) {
			r, ok, err := f.routeFor(probe)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			switch {
			case probe == s && slices.Contains(ops, s) && (!ok || r.v != guarded):
				errs = append(errs, fmt.Errorf("operation path %s is not guarded (route %s, %v)", s, r.name, r.v))
			case ok && r.v == passThrough:
				errs = append(errs, fmt.Errorf("%s reaches the app unguarded through route %s (a guarded surface of the shipped configs)", probe, r.name))
			}
		}
	}
	return errors.Join(errs...)
}

// envoyFront reads a front from Envoy's route table: a request ext_proc runs
// for (the filter's path matcher lets it, and the route's
// typed_per_filter_config does not switch it off) is guarded, a direct
// response refused, anything else forwarded a pass-through. A route is
// classified by its own path or prefix.
func envoyFront(g *envoytest.Gateway) (front, error) {
	classify := func(m envoytest.Match, path string) (exposed, error) {
		e := exposed{name: m.Route.GetName(), exact: m.Route.GetMatch().GetPath()}
		if m.Route.GetDirectResponse() != nil || m.Route.GetRedirect() != nil {
			e.v = refused
			return e, nil
		}
		runs, err := g.ExtProcRunsOn(path, m)
		if err != nil {
			return e, err
		}
		e.v = passThrough
		if runs {
			e.v = guarded
		}
		return e, nil
	}
	var f front
	for _, vh := range g.VirtualHosts() {
		for _, r := range vh.GetRoutes() {
			probe := r.GetMatch().GetPath()
			if probe == "" {
				probe = r.GetMatch().GetPrefix()
			}
			e, err := classify(envoytest.Match{VirtualHost: vh, Route: r}, probe)
			if err != nil {
				return front{}, err
			}
			f.routes = append(f.routes, e)
		}
	}
	f.routeFor = func(path string) (exposed, bool, error) {
		m, err := g.RouteFor(path)
		if err != nil {
			return exposed{}, false, nil // no route: Envoy's own 404
		}
		e, err := classify(m, path)
		return e, true, err
	}
	return f, nil
}

// egFront reads a front from the rendered HTTPRoutes: a rule of an HTTPRoute
// the EnvoyExtensionPolicy targets is guarded, a rule answering with an
// HTTPRouteFilter direct response refused, any other a pass-through.
func egFront(m *egManifests) (front, error) {
	guardedRoutes, err := m.guardedRoutes()
	if err != nil {
		return front{}, err
	}
	classify := func(rm ruleMatch) exposed {
		e := exposed{name: rm.String()}
		if typ, value := pathMatchOf(rm.match); typ == "Exact" {
			e.exact = value
		}
		_, direct := m.directResponse(rm.rule)
		switch {
		case isGuarded(guardedRoutes, rm.route):
			e.v = guarded
		case direct && len(rm.rule.BackendRefs) == 0:
			e.v = refused
		default:
			e.v = passThrough
		}
		return e
	}
	var f front
	for _, r := range m.routes {
		for i := range r.Spec.Rules {
			for _, mt := range r.Spec.Rules[i].Matches {
				f.routes = append(f.routes, classify(ruleMatch{route: r, rule: &r.Spec.Rules[i], match: mt}))
			}
		}
	}
	f.routeFor = func(path string) (exposed, bool, error) {
		rm, err := egRouteFor(m.routes, path)
		if err != nil {
			return exposed{}, false, nil // no rule: Envoy's own 404
		}
		return classify(rm), true, nil
	}
	return f, nil
}

// shippedSurfaces are the operation paths of every shipped idemgate config.
func shippedSurfaces(t *testing.T) []string {
	t.Helper()
	var out []string
	for _, p := range []string{"../envoy/idemgate.yaml", "base/idemgate.yaml", "envoy-gateway/idemgate.yaml"} {
		b, err := os.ReadFile(filepath.FromSlash(p))
		require.NoError(t, err)
		cfg, err := envoytest.ReadIdemgateConfig(b)
		require.NoError(t, err, p)
		for _, s := range cfg.OperationPaths() {
			if !slices.Contains(out, s) {
				out = append(out, s)
			}
		}
	}
	return out
}

// shippedFronts builds every shipped front with the idemgate config that
// ships beside it.
func shippedFronts(t *testing.T) map[string]struct {
	f   front
	cfg *envoytest.IdemgateConfig
} {
	t.Helper()
	out := map[string]struct {
		f   front
		cfg *envoytest.IdemgateConfig
	}{}
	add := func(name string, g *envoytest.Gateway, cfg *envoytest.IdemgateConfig) {
		f, err := envoyFront(g)
		require.NoError(t, err, name)
		out[name] = struct {
			f   front
			cfg *envoytest.IdemgateConfig
		}{f, cfg}
	}

	g, err := envoytest.DecodeBootstrap(envoy.BootstrapYAML())
	require.NoError(t, err)
	cfg, err := envoytest.ReadIdemgateConfig(envoy.IdemgateYAML())
	require.NoError(t, err)
	add("envoy/envoy.yaml", g, cfg)

	objs := render(t, baseDir)
	pod := &deployment(t, objs).Spec.Template.Spec
	proxy := container(t, pod, "envoy")
	g, err = envoytest.DecodeBootstrap(configMapFile(t, objs, pod, proxy, flagValue(proxy.Args, "-c")))
	require.NoError(t, err)
	_, cfg = idemgateConfig(t, objs)
	add("k8s/base", g, cfg)

	// Istio: the inbound chain as the EnvoyFilter's patches assemble it (the
	// Istio judge in k8s/mesh/istio checks the same on Istio's own output).
	objs = render(t, istioDir)
	appPort := container(t, &deployment(t, objs).Spec.Template.Spec, "app").Ports[0].ContainerPort
	_, cfg = idemgateConfig(t, objs)
	add("k8s/istio", assembleInbound(t, decodePatches(t, envoyFilter(t, objs)), uint32(appPort)), cfg)

	m := mustRenderEG(t)
	f, err := egFront(m)
	require.NoError(t, err)
	out["k8s/envoy-gateway"] = struct {
		f   front
		cfg *envoytest.IdemgateConfig
	}{f, m.cfg}
	return out
}

func TestEveryShippedRouteIsGuardedRefusedOrPassThrough(t *testing.T) {
	surfaces := shippedSurfaces(t)
	require.Contains(t, surfaces, "/mcp", "the shipped configs guard an MCP endpoint")
	for name, fc := range shippedFronts(t) {
		t.Run(name, func(t *testing.T) {
			require.NotEmpty(t, fc.f.routes)
			require.NoError(t, checkCoverage(fc.f, fc.cfg, surfaces))
		})
	}
}

// The check catches the hole it was written for: each front's idemgate
// config without its MCP operation (the /mcp route then runs ext_proc for
// nothing, or the catch-all forwards /mcp), and a pass-through that takes a
// guarded path.
func TestCoverageCheckCatchesTheMCPHole(t *testing.T) {
	surfaces := shippedSurfaces(t)
	for name, fc := range shippedFronts(t) {
		t.Run(name+" without the MCP operation", func(t *testing.T) {
			cfg := *fc.cfg
			cfg.Operations = slices.DeleteFunc(slices.Clone(cfg.Operations), func(op envoytest.Operation) bool { return op.MCP != nil })
			require.Less(t, len(cfg.Operations), len(fc.cfg.Operations), "the shipped config has an MCP operation")
			require.ErrorContains(t, checkCoverage(fc.f, &cfg, surfaces), "no operation of the idemgate config beside it")
		})
		t.Run(name+" with the MCP route forwarded unguarded", func(t *testing.T) {
			f := fc.f
			inner := f.routeFor
			f.routeFor = func(p string) (exposed, bool, error) {
				r, ok, err := inner(p)
				if p == "/mcp" {
					r.v = passThrough
				}
				return r, ok, err
			}
			require.ErrorContains(t, checkCoverage(f, fc.cfg, surfaces), "/mcp")
		})
	}
}
