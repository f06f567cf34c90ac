package envoytest

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	xdsmatcherv3 "github.com/cncf/xds/go/xds/type/matcher/v3"
	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	headermutationv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/header_mutation/v3"
	jwtauthnv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/jwt_authn/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// Gateway is the part of an Envoy bootstrap that carries idemgate: the one
// listener with its HTTP connection manager, that manager's filters (unpacked)
// and inline routes, and the clusters by name.
type Gateway struct {
	Bootstrap *bootstrapv3.Bootstrap
	Listener  *listenerv3.Listener
	HCM       *hcmv3.HttpConnectionManager
	// Filters holds each HTTP filter's typed_config, unpacked, in chain order.
	Filters  []Filter
	Clusters map[string]*clusterv3.Cluster
}

// Filter is one HTTP filter of the connection manager. A filter wrapped in
// an ExtensionWithMatcher (directly, or as the filter a composite delegates
// to) is the wrapped filter's config, with the matcher that decides when it
// runs (RunsFor).
type Filter struct {
	Name    string
	Config  proto.Message
	Matcher *xdsmatcherv3.Matcher
	// Delegated: the filter runs only where the matcher executes it (a
	// composite filter's ExecuteFilterAction), not by default.
	Delegated bool
}

// DecodeBootstrap decodes and validates a bootstrap YAML (see UnmarshalYAML)
// and returns its Gateway view.
func DecodeBootstrap(data []byte) (*Gateway, error) {
	var b bootstrapv3.Bootstrap
	if err := UnmarshalYAML(data, &b); err != nil {
		return nil, err
	}
	return NewGateway(&b)
}

// NewGateway finds the single listener with a single HTTP connection manager
// and an inline route_config (idemgate's shipped configs use nothing else).
func NewGateway(b *bootstrapv3.Bootstrap) (*Gateway, error) {
	listeners := b.GetStaticResources().GetListeners()
	if len(listeners) != 1 {
		return nil, fmt.Errorf("want exactly one listener, found %d", len(listeners))
	}
	g := &Gateway{Bootstrap: b, Listener: listeners[0], Clusters: map[string]*clusterv3.Cluster{}}
	for _, fc := range g.Listener.GetFilterChains() {
		for _, f := range fc.GetFilters() {
			var hcm hcmv3.HttpConnectionManager
			if f.GetTypedConfig().MessageIs(&hcm) {
				if g.HCM != nil {
					return nil, errors.New("want one http_connection_manager, found several")
				}
				if err := f.GetTypedConfig().UnmarshalTo(&hcm); err != nil {
					return nil, fmt.Errorf("failed to unpack http_connection_manager: %w", err)
				}
				g.HCM = &hcm
			}
		}
	}
	if g.HCM == nil {
		return nil, fmt.Errorf("listener %q has no http_connection_manager", g.Listener.GetName())
	}
	if g.HCM.GetRouteConfig() == nil {
		return nil, errors.New("http_connection_manager must carry an inline route_config")
	}
	filters, err := UnpackFilters(g.HCM.GetHttpFilters())
	if err != nil {
		return nil, err
	}
	g.Filters = filters
	for _, c := range b.GetStaticResources().GetClusters() {
		if _, dup := g.Clusters[c.GetName()]; dup {
			return nil, fmt.Errorf("cluster %q defined twice", c.GetName())
		}
		g.Clusters[c.GetName()] = c
	}
	return g, nil
}

// UnpackFilters unpacks each HTTP filter's typed_config.
func UnpackFilters(in []*hcmv3.HttpFilter) ([]Filter, error) {
	out := make([]Filter, 0, len(in))
	for _, f := range in {
		m, err := anypb.UnmarshalNew(f.GetTypedConfig(), proto.UnmarshalOptions{})
		if err != nil {
			return nil, fmt.Errorf("failed to unpack http filter %q: %w", f.GetName(), err)
		}
		inner, matcher, delegated, err := unwrapMatcher(m)
		if err != nil {
			return nil, fmt.Errorf("http filter %q: %w", f.GetName(), err)
		}
		out = append(out, Filter{Name: f.GetName(), Config: inner, Matcher: matcher, Delegated: delegated})
	}
	return out, nil
}

// filterOf returns the first filter whose config has type T, and its name.
func filterOf[T proto.Message](g *Gateway) (T, string, bool) {
	for _, f := range g.Filters {
		if c, ok := f.Config.(T); ok {
			return c, f.Name, true
		}
	}
	var zero T
	return zero, "", false
}

// ExtProc returns the ext_proc filter config and the name it is registered under.
func (g *Gateway) ExtProc() (*extprocv3.ExternalProcessor, string, error) {
	c, name, ok := filterOf[*extprocv3.ExternalProcessor](g)
	if !ok {
		return nil, "", errors.New("no ext_proc filter")
	}
	return c, name, nil
}

// JWTAuthn returns the jwt_authn filter config.
func (g *Gateway) JWTAuthn() (*jwtauthnv3.JwtAuthentication, error) {
	c, _, ok := filterOf[*jwtauthnv3.JwtAuthentication](g)
	if !ok {
		return nil, errors.New("no jwt_authn filter")
	}
	return c, nil
}

// VirtualHosts returns the inline route_config's virtual hosts.
func (g *Gateway) VirtualHosts() []*routev3.VirtualHost {
	return g.HCM.GetRouteConfig().GetVirtualHosts()
}

// ListenerPort returns the port the listener binds.
func (g *Gateway) ListenerPort() uint32 {
	return g.Listener.GetAddress().GetSocketAddress().GetPortValue()
}

// ClusterAddress returns host:port of the single endpoint of cluster name.
func (g *Gateway) ClusterAddress(name string) (string, uint32, error) {
	c, ok := g.Clusters[name]
	if !ok {
		return "", 0, fmt.Errorf("no cluster %q", name)
	}
	return SingleEndpoint(c)
}

// SingleEndpoint returns the address of a cluster's only endpoint.
func SingleEndpoint(c *clusterv3.Cluster) (string, uint32, error) {
	var addrs []string
	var host string
	var port uint32
	for _, le := range c.GetLoadAssignment().GetEndpoints() {
		for _, lb := range le.GetLbEndpoints() {
			sa := lb.GetEndpoint().GetAddress().GetSocketAddress()
			host, port = sa.GetAddress(), sa.GetPortValue()
			addrs = append(addrs, fmt.Sprintf("%s:%d", host, port))
		}
	}
	if len(addrs) != 1 {
		return "", 0, fmt.Errorf("cluster %q: want one endpoint, found %v", c.GetName(), addrs)
	}
	return host, port, nil
}

// ExtProcDisabled reports whether ext_proc (registered as filterName) is
// disabled on route r of virtual host vh: the most specific
// typed_per_filter_config wins (route, then virtual host), as in Envoy.
func ExtProcDisabled(vh *routev3.VirtualHost, r *routev3.Route, filterName string) (bool, error) {
	for _, cfgs := range []map[string]*anypb.Any{r.GetTypedPerFilterConfig(), vh.GetTypedPerFilterConfig()} {
		a, ok := cfgs[filterName]
		if !ok {
			continue
		}
		var per extprocv3.ExtProcPerRoute
		if err := a.UnmarshalTo(&per); err != nil {
			return false, fmt.Errorf("route %q: typed_per_filter_config[%s] is %s, want ExtProcPerRoute: %w",
				r.GetName(), filterName, a.GetTypeUrl(), err)
		}
		if per.GetOverrides() != nil {
			return false, nil
		}
		return per.GetDisabled(), nil
	}
	return false, nil
}

// Match is the route Envoy would pick for a request path.
type Match struct {
	VirtualHost *routev3.VirtualHost
	Route       *routev3.Route
}

// RouteFor returns the first route of the catch-all virtual host (domains
// ["*"]) that matches path, the way Envoy walks routes: in order, first match
// wins. It understands path, prefix, path_separated_prefix and safe_regex
// matches and refuses routes with other conditions (headers, query
// parameters, ...) because it could not decide them from a path alone.
func (g *Gateway) RouteFor(path string) (Match, error) {
	vh, err := g.wildcardHost()
	if err != nil {
		return Match{}, err
	}
	return RouteFor(vh, path)
}

// RouteFor is Gateway.RouteFor on one virtual host.
func RouteFor(vh *routev3.VirtualHost, path string) (Match, error) {
	for _, r := range vh.GetRoutes() {
		ok, err := routeMatches(r.GetMatch(), path)
		if err != nil {
			return Match{}, fmt.Errorf("route %q: %w", r.GetName(), err)
		}
		if ok {
			return Match{VirtualHost: vh, Route: r}, nil
		}
	}
	return Match{}, fmt.Errorf("no route matches %q", path)
}

func (g *Gateway) wildcardHost() (*routev3.VirtualHost, error) {
	for _, vh := range g.VirtualHosts() {
		for _, d := range vh.GetDomains() {
			if d == "*" {
				return vh, nil
			}
		}
	}
	return nil, errors.New(`no virtual host with domains ["*"]`)
}

func routeMatches(m *routev3.RouteMatch, path string) (bool, error) {
	if len(m.GetHeaders()) > 0 || len(m.GetQueryParameters()) > 0 || m.GetGrpc() != nil ||
		m.GetRuntimeFraction() != nil || m.GetTlsContext() != nil || len(m.GetDynamicMetadata()) > 0 ||
		m.GetFilterState() != nil || len(m.GetCookies()) > 0 {
		return false, errors.New("route has conditions beyond the path; cannot decide it from a path")
	}
	caseSensitive := m.GetCaseSensitive() == nil || m.GetCaseSensitive().GetValue()
	fold := func(s string) string {
		if caseSensitive {
			return s
		}
		return strings.ToLower(s)
	}
	switch ps := m.GetPathSpecifier().(type) {
	case *routev3.RouteMatch_Path:
		return fold(path) == fold(ps.Path), nil
	case *routev3.RouteMatch_Prefix:
		return strings.HasPrefix(fold(path), fold(ps.Prefix)), nil
	case *routev3.RouteMatch_PathSeparatedPrefix:
		p, pre := fold(path), fold(ps.PathSeparatedPrefix)
		return p == pre || strings.HasPrefix(p, pre+"/"), nil
	case *routev3.RouteMatch_SafeRegex:
		// Envoy matches the whole path (query string excluded) with RE2, as Go's regexp does.
		re, err := regexp.Compile(`^(?:` + ps.SafeRegex.GetRegex() + `)$`)
		if err != nil {
			return false, fmt.Errorf("failed to compile %q: %w", ps.SafeRegex.GetRegex(), err)
		}
		return re.MatchString(path), nil
	default:
		return false, fmt.Errorf("path specifier %T is not understood here", ps)
	}
}

// RouteTimeout is the timeout Envoy applies to a route action: unset means
// Envoy's default of 15 s, zero means none.
func RouteTimeout(ra *routev3.RouteAction) time.Duration {
	if ra.GetTimeout() == nil {
		return 15 * time.Second
	}
	return ra.GetTimeout().AsDuration()
}

// isHeaderMutation reports whether a filter is header_mutation.
func isHeaderMutation(f Filter) bool {
	_, ok := f.Config.(*headermutationv3.HeaderMutation)
	return ok
}
