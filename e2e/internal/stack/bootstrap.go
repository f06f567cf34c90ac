package stack

import (
	"fmt"
	"net"
	"strconv"
	"time"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/access_loggers/stream/v3" // typed_config resolution
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/header_mutation/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/jwt_authn/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"sigs.k8s.io/yaml"

	"github.com/idemgate/idemgate/envoy"
)

// Names in the shipped envoy.yaml.
const (
	confirmRouteName  = "transfer_confirm"
	extProcFilterName = "envoy.filters.http.ext_proc"
)

// bootstrapEdits are the changes the stack makes to the shipped envoy.yaml:
// ports, cluster endpoints and the test's timeouts, nothing else. They are
// made on the decoded v3 Bootstrap, so an edit cannot silently miss its
// target (a renamed route or cluster is an error).
type bootstrapEdits struct {
	listenAddr string
	adminAddr  string
	// clusters maps cluster names to their single endpoint (host:port).
	clusters map[string]string
	// confirmRouteTimeout replaces the confirm route's timeout when > 0.
	confirmRouteTimeout time.Duration
	// messageTimeout replaces ext_proc's message_timeout when > 0.
	messageTimeout time.Duration
	// confirmRetryOn replaces the confirm route's retry_policy.retry_on
	// when set (envoy.yaml: a downstream that ignores keys must not be
	// retried on reset).
	confirmRetryOn string
	// rawPaths turns off the HCM's path normalisation (normalize_path,
	// merge_slashes, escaped slashes kept): only for the test that shows
	// why envoy.yaml normalises.
	rawPaths bool
}

// renderBootstrap returns the shipped envoy.yaml with edits applied, as YAML.
func renderBootstrap(e bootstrapEdits) ([]byte, error) {
	js, err := yaml.YAMLToJSON(envoy.BootstrapYAML())
	if err != nil {
		return nil, fmt.Errorf("failed to convert envoy.yaml to JSON: %w", err)
	}
	var bs bootstrapv3.Bootstrap
	if err := protojson.Unmarshal(js, &bs); err != nil {
		return nil, fmt.Errorf("failed to decode envoy.yaml: %w", err)
	}

	if e.adminAddr != "" {
		sa, err := socketAddress(e.adminAddr)
		if err != nil {
			return nil, err
		}
		bs.GetAdmin().GetAddress().Address = &corev3.Address_SocketAddress{SocketAddress: sa}
	}
	listeners := bs.GetStaticResources().GetListeners()
	if len(listeners) != 1 {
		return nil, fmt.Errorf("envoy.yaml should have one listener, has %d", len(listeners))
	}
	if e.listenAddr != "" {
		sa, err := socketAddress(e.listenAddr)
		if err != nil {
			return nil, err
		}
		listeners[0].Address = &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: sa}}
	}

	found := map[string]bool{}
	for _, c := range bs.GetStaticResources().GetClusters() {
		addr, ok := e.clusters[c.GetName()]
		if !ok {
			continue
		}
		sa, err := socketAddress(addr)
		if err != nil {
			return nil, err
		}
		eps := c.GetLoadAssignment().GetEndpoints()
		if len(eps) != 1 || len(eps[0].GetLbEndpoints()) != 1 {
			return nil, fmt.Errorf("cluster %s should have exactly one endpoint", c.GetName())
		}
		eps[0].GetLbEndpoints()[0].GetEndpoint().Address = &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: sa}}
		found[c.GetName()] = true
	}
	for name := range e.clusters {
		if !found[name] {
			return nil, fmt.Errorf("envoy.yaml has no cluster %q", name)
		}
	}

	if err := editHCM(listeners[0].GetFilterChains()[0].GetFilters()[0].GetTypedConfig(), func(h *hcmv3.HttpConnectionManager) error {
		if e.confirmRouteTimeout > 0 {
			if err := editRoute(h, confirmRouteName, func(ra *routev3.RouteAction) error {
				ra.Timeout = durationpb.New(e.confirmRouteTimeout)
				return nil
			}); err != nil {
				return err
			}
		}
		if e.confirmRetryOn != "" {
			if err := editRoute(h, confirmRouteName, func(ra *routev3.RouteAction) error {
				if ra.GetRetryPolicy() == nil {
					return fmt.Errorf("route %s has no retry_policy", confirmRouteName)
				}
				ra.RetryPolicy.RetryOn = e.confirmRetryOn
				return nil
			}); err != nil {
				return err
			}
		}
		if e.rawPaths {
			h.NormalizePath = nil
			h.MergeSlashes = false
			h.PathWithEscapedSlashesAction = hcmv3.HttpConnectionManager_KEEP_UNCHANGED
		}
		if e.messageTimeout > 0 {
			return setMessageTimeout(h, e.messageTimeout)
		}
		return nil
	}); err != nil {
		return nil, err
	}

	if err := bs.ValidateAll(); err != nil {
		return nil, fmt.Errorf("the edited bootstrap is invalid: %w", err)
	}
	out, err := protojson.Marshal(&bs)
	if err != nil {
		return nil, fmt.Errorf("failed to encode the bootstrap: %w", err)
	}
	return yaml.JSONToYAML(out)
}

// editHCM decodes the HTTP connection manager in a, lets edit change it, and
// packs it back.
func editHCM(a *anypb.Any, edit func(*hcmv3.HttpConnectionManager) error) error {
	var h hcmv3.HttpConnectionManager
	if err := a.UnmarshalTo(&h); err != nil {
		return fmt.Errorf("failed to decode the http_connection_manager: %w", err)
	}
	if err := edit(&h); err != nil {
		return err
	}
	packed, err := anypb.New(&h)
	if err != nil {
		return fmt.Errorf("failed to encode the http_connection_manager: %w", err)
	}
	a.TypeUrl, a.Value = packed.TypeUrl, packed.Value
	return nil
}

// editRoute lets edit change the action of the route called name.
func editRoute(h *hcmv3.HttpConnectionManager, name string, edit func(*routev3.RouteAction) error) error {
	for _, vh := range h.GetRouteConfig().GetVirtualHosts() {
		for _, r := range vh.GetRoutes() {
			if r.GetName() != name {
				continue
			}
			ra, ok := r.GetAction().(*routev3.Route_Route)
			if !ok {
				return fmt.Errorf("route %s does not forward to a cluster", name)
			}
			return edit(ra.Route)
		}
	}
	return fmt.Errorf("envoy.yaml has no route %q", name)
}

func setMessageTimeout(h *hcmv3.HttpConnectionManager, d time.Duration) error {
	for _, f := range h.GetHttpFilters() {
		if f.GetName() != extProcFilterName {
			continue
		}
		var ep extprocv3.ExternalProcessor
		if err := f.GetTypedConfig().UnmarshalTo(&ep); err != nil {
			return fmt.Errorf("failed to decode the ext_proc filter: %w", err)
		}
		ep.MessageTimeout = durationpb.New(d)
		packed, err := anypb.New(&ep)
		if err != nil {
			return fmt.Errorf("failed to encode the ext_proc filter: %w", err)
		}
		f.ConfigType = &hcmv3.HttpFilter_TypedConfig{TypedConfig: packed}
		return nil
	}
	return fmt.Errorf("envoy.yaml has no %s filter", extProcFilterName)
}

func socketAddress(hostport string) (*corev3.SocketAddress, error) {
	host, port, err := net.SplitHostPort(hostport)
	if err != nil {
		return nil, fmt.Errorf("bad address %q: %w", hostport, err)
	}
	p, err := strconv.ParseUint(port, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("bad port in %q: %w", hostport, err)
	}
	return &corev3.SocketAddress{Address: host, PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: uint32(p)}}, nil
}
