package main

import (
	"fmt"
	"net"
	"strconv"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/access_loggers/stream/v3" // resolves the typed_configs of envoy.yaml
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/header_mutation/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/jwt_authn/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/anypb"
	"sigs.k8s.io/yaml"

	"github.com/idemgate/idemgate/envoy"
)

// The names in the shipped envoy/envoy.yaml the benchmark relies on.
const (
	envoyExtProcCluster  = "idemgate"
	envoyUpstreamCluster = "payments"
	envoyExtProcFilter   = "envoy.filters.http.ext_proc"
)

// envoyEdits are the only changes the benchmark makes to the shipped
// envoy.yaml: where things listen and where the two clusters point, plus,
// for the no-ext_proc column, the ext_proc filter taken out of the chain.
// Everything else (jwt_authn, header_mutation, path normalisation, the
// filter's processing modes and timeouts, the access log) stays as shipped.
type envoyEdits struct {
	listen, admin     string
	extProc, upstream string // host:port of the two clusters' single endpoint
	dropExtProc       bool
}

// renderEnvoyConfig returns the edited bootstrap as YAML.
func renderEnvoyConfig(e envoyEdits) ([]byte, error) {
	js, err := yaml.YAMLToJSON(envoy.BootstrapYAML())
	if err != nil {
		return nil, fmt.Errorf("failed to read envoy.yaml: %w", err)
	}
	var bs bootstrapv3.Bootstrap
	if err := protojson.Unmarshal(js, &bs); err != nil {
		return nil, fmt.Errorf("failed to decode envoy.yaml: %w", err)
	}
	admin, err := envoyAddress(e.admin)
	if err != nil {
		return nil, err
	}
	bs.GetAdmin().Address = admin
	listeners := bs.GetStaticResources().GetListeners()
	if len(listeners) != 1 {
		return nil, fmt.Errorf("envoy.yaml has %d listeners, the benchmark expects one", len(listeners))
	}
	if listeners[0].Address, err = envoyAddress(e.listen); err != nil {
		return nil, err
	}
	targets := map[string]string{envoyExtProcCluster: e.extProc, envoyUpstreamCluster: e.upstream}
	for _, c := range bs.GetStaticResources().GetClusters() {
		addr, ok := targets[c.GetName()]
		if !ok {
			continue
		}
		eps := c.GetLoadAssignment().GetEndpoints()
		if len(eps) != 1 || len(eps[0].GetLbEndpoints()) != 1 {
			return nil, fmt.Errorf("cluster %s in envoy.yaml does not have exactly one endpoint", c.GetName())
		}
		if eps[0].GetLbEndpoints()[0].GetEndpoint().Address, err = envoyAddress(addr); err != nil {
			return nil, err
		}
		delete(targets, c.GetName())
	}
	if len(targets) > 0 {
		return nil, fmt.Errorf("envoy.yaml lacks the clusters %v", targets)
	}
	if e.dropExtProc {
		if err := dropHTTPFilter(listeners[0].GetFilterChains()[0].GetFilters()[0].GetTypedConfig(), envoyExtProcFilter); err != nil {
			return nil, err
		}
	}
	if err := bs.ValidateAll(); err != nil {
		return nil, fmt.Errorf("the edited envoy.yaml is invalid: %w", err)
	}
	out, err := protojson.Marshal(&bs)
	if err != nil {
		return nil, fmt.Errorf("failed to encode the bootstrap: %w", err)
	}
	return yaml.JSONToYAML(out)
}

// dropHTTPFilter removes the named filter from the connection manager in a.
// The routes' per-filter configs that disable it stay: they name a filter
// type Envoy knows, which is all it checks.
func dropHTTPFilter(a *anypb.Any, name string) error {
	var h hcmv3.HttpConnectionManager
	if err := a.UnmarshalTo(&h); err != nil {
		return fmt.Errorf("failed to decode the http_connection_manager: %w", err)
	}
	kept := h.HttpFilters[:0]
	for _, f := range h.HttpFilters {
		if f.GetName() != name {
			kept = append(kept, f)
		}
	}
	if len(kept) == len(h.HttpFilters) {
		return fmt.Errorf("envoy.yaml has no %s filter", name)
	}
	h.HttpFilters = kept
	packed, err := anypb.New(&h)
	if err != nil {
		return fmt.Errorf("failed to encode the http_connection_manager: %w", err)
	}
	a.TypeUrl, a.Value = packed.TypeUrl, packed.Value
	return nil
}

func envoyAddress(hostport string) (*corev3.Address, error) {
	host, port, err := net.SplitHostPort(hostport)
	if err != nil {
		return nil, fmt.Errorf("bad address %q: %w", hostport, err)
	}
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil {
		return nil, fmt.Errorf("bad port in %q: %w", hostport, err)
	}
	return &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
		Address: host, PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: uint32(p)},
	}}}, nil
}
