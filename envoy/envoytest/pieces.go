package envoytest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"slices"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"google.golang.org/protobuf/proto"
	"sigs.k8s.io/yaml"
)

// Pieces is the output of `idemgate envoy-config` (envoy/ext_proc-filter.yaml)
// decoded strictly into the v3 types of the places each piece goes.
type Pieces struct {
	FiltersBeforeAuthentication []*hcmv3.HttpFilter
	Filters                     []*hcmv3.HttpFilter
	Clusters                    []*clusterv3.Cluster
	Routes                      []*routev3.Route
	LocalReplyConfig            *hcmv3.LocalReplyConfig
}

// rawPieces is the file's top level; no other key is allowed.
type rawPieces struct {
	FiltersBeforeAuthentication []json.RawMessage `json:"http_filters_before_authentication"`
	Filters                     []json.RawMessage `json:"http_filters"`
	Clusters                    []json.RawMessage `json:"clusters"`
	Routes                      []json.RawMessage `json:"routes"`
	LocalReplyConfig            json.RawMessage   `json:"local_reply_config"`
}

func decodeRawPieces(data []byte) (rawPieces, error) {
	var raw rawPieces
	js, err := yaml.YAMLToJSONStrict(data)
	if err != nil {
		return raw, err
	}
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&raw); err != nil {
		return raw, fmt.Errorf("the pieces hold only http_filters_before_authentication, http_filters, clusters, routes and local_reply_config: %w", err)
	}
	return raw, nil
}

// DecodePieces decodes the pieces strictly (UnmarshalJSON on each).
func DecodePieces(data []byte) (*Pieces, error) {
	raw, err := decodeRawPieces(data)
	if err != nil {
		return nil, err
	}
	p := &Pieces{}
	if p.FiltersBeforeAuthentication, err = decodeEach[hcmv3.HttpFilter](raw.FiltersBeforeAuthentication); err != nil {
		return nil, fmt.Errorf("http_filters_before_authentication: %w", err)
	}
	if p.Filters, err = decodeEach[hcmv3.HttpFilter](raw.Filters); err != nil {
		return nil, fmt.Errorf("http_filters: %w", err)
	}
	if p.Clusters, err = decodeEach[clusterv3.Cluster](raw.Clusters); err != nil {
		return nil, fmt.Errorf("clusters: %w", err)
	}
	if p.Routes, err = decodeEach[routev3.Route](raw.Routes); err != nil {
		return nil, fmt.Errorf("routes: %w", err)
	}
	if len(raw.LocalReplyConfig) > 0 {
		p.LocalReplyConfig = &hcmv3.LocalReplyConfig{}
		if err := UnmarshalJSON(raw.LocalReplyConfig, p.LocalReplyConfig); err != nil {
			return nil, fmt.Errorf("local_reply_config: %w", err)
		}
	}
	return p, nil
}

func decodeEach[T any, PT interface {
	*T
	proto.Message
}](raws []json.RawMessage) ([]PT, error) {
	out := make([]PT, 0, len(raws))
	for i, r := range raws {
		m := PT(new(T))
		if err := UnmarshalJSON(r, m); err != nil {
			return nil, fmt.Errorf("[%d]: %w", i, err)
		}
		out = append(out, m)
	}
	return out, nil
}

// PasteOptions describe the user's own bootstrap the pieces are pasted into.
type PasteOptions struct {
	// UpstreamAddr is host:port of the user's app (cluster "payments", the
	// cluster `idemgate envoy-config` routes to by default).
	UpstreamAddr string
	// AuthFilters are the user's authentication filters (JSON objects of
	// HttpFilter), between the two filter pieces.
	AuthFilters []any
	// RawPaths leaves out every path-normalisation option of the connection
	// manager (the user's config need not have them).
	RawPaths bool
	// LoopbackIsInternal counts loopback clients as internal
	// (internal_address_config): Envoy then keeps and honours their
	// x-envoy-* request headers, as a mesh that trusts its callers does.
	LoopbackIsInternal bool
}

// PasteIntoBootstrap writes the smallest bootstrap a user might already run
// (one listener on 127.0.0.1:0 and admin on 127.0.0.1:0, a connection
// manager routing everything to their app with a catch-all route) with every
// piece pasted where its comment says: the first filter piece first, the
// user's authentication, the second piece before the router, the cluster
// beside the app's, the operation routes before the catch-all, and the local
// reply mapping on the connection manager. The result is JSON (Envoy reads
// it as YAML).
func PasteIntoBootstrap(pieces []byte, o PasteOptions) ([]byte, error) {
	raw, err := decodeRawPieces(pieces)
	if err != nil {
		return nil, err
	}
	host, port, err := net.SplitHostPort(o.UpstreamAddr)
	if err != nil {
		return nil, fmt.Errorf("upstream address: %w", err)
	}
	var filters []any
	for _, f := range raw.FiltersBeforeAuthentication {
		filters = append(filters, f)
	}
	filters = append(filters, o.AuthFilters...)
	for _, f := range raw.Filters {
		filters = append(filters, f)
	}
	filters = append(filters, map[string]any{"name": "envoy.filters.http.router",
		"typed_config": map[string]any{"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}})
	var routes []any
	for _, r := range raw.Routes {
		routes = append(routes, r)
	}
	routes = append(routes, map[string]any{"name": "everything_else", "match": map[string]any{"prefix": "/"},
		"route": map[string]any{"cluster": PaymentsCluster, "timeout": "15s"}})
	var clusters []any
	for _, c := range raw.Clusters {
		clusters = append(clusters, c)
	}
	clusters = append(clusters, map[string]any{
		"name": PaymentsCluster, "type": "STATIC", "connect_timeout": "1s",
		"load_assignment": map[string]any{"cluster_name": PaymentsCluster, "endpoints": []any{map[string]any{"lb_endpoints": []any{
			map[string]any{"endpoint": map[string]any{"address": map[string]any{"socket_address": map[string]any{"address": host, "port_value": port}}}},
		}}}},
	})
	hcm := map[string]any{
		"@type":       "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
		"stat_prefix": "existing",
		// An edge proxy: the client's address is the connection's.
		"use_remote_address": true,
		"route_config":       map[string]any{"virtual_hosts": []any{map[string]any{"name": "app", "domains": []any{"*"}, "routes": routes}}},
		"http_filters":       filters,
	}
	if len(raw.LocalReplyConfig) > 0 {
		hcm["local_reply_config"] = raw.LocalReplyConfig
	}
	if o.LoopbackIsInternal {
		hcm["internal_address_config"] = map[string]any{"cidr_ranges": []any{
			map[string]any{"address_prefix": "127.0.0.0", "prefix_len": 8}}}
	}
	if !o.RawPaths {
		hcm["normalize_path"] = true
		hcm["merge_slashes"] = true
	}
	loopback0 := map[string]any{"socket_address": map[string]any{"address": "127.0.0.1", "port_value": 0}}
	return json.Marshal(map[string]any{
		"admin": map[string]any{"address": loopback0},
		"static_resources": map[string]any{
			"listeners": []any{map[string]any{
				"name":    IngressListener,
				"address": loopback0,
				"filter_chains": []any{map[string]any{"filters": []any{map[string]any{
					"name": "envoy.filters.network.http_connection_manager", "typed_config": hcm,
				}}}},
			}},
			"clusters": clusters,
		},
	})
}

// CheckCarriesPieces reports whether a bootstrap carries every piece
// unchanged (proto-equal): each filter under its name, the strip filter
// first in the chain, the cluster, the operation routes first in the
// catch-all virtual host, and the local reply mapping.
func CheckCarriesPieces(g *Gateway, p *Pieces) error {
	var errs []error
	filters := g.HCM.GetHttpFilters()
	for _, f := range append(append([]*hcmv3.HttpFilter{}, p.FiltersBeforeAuthentication...), p.Filters...) {
		i := slices.IndexFunc(filters, func(h *hcmv3.HttpFilter) bool { return h.GetName() == f.GetName() })
		switch {
		case i < 0:
			errs = append(errs, fmt.Errorf("no http filter named %s", f.GetName()))
		case !proto.Equal(filters[i], f):
			errs = append(errs, fmt.Errorf("http filter %s differs from the piece", f.GetName()))
		}
	}
	if len(p.FiltersBeforeAuthentication) > 0 && (len(filters) == 0 || filters[0].GetName() != p.FiltersBeforeAuthentication[0].GetName()) {
		errs = append(errs, fmt.Errorf("%s is not the first http filter", p.FiltersBeforeAuthentication[0].GetName()))
	}
	for _, c := range p.Clusters {
		if !proto.Equal(g.Clusters[c.GetName()], c) {
			errs = append(errs, fmt.Errorf("cluster %s differs from the piece", c.GetName()))
		}
	}
	vh, err := g.wildcardHost()
	if err != nil {
		return errors.Join(append(errs, err)...)
	}
	routes := vh.GetRoutes()
	for i, r := range p.Routes {
		if i >= len(routes) || !proto.Equal(routes[i], r) {
			errs = append(errs, fmt.Errorf("route %d is not the piece's %s", i, r.GetName()))
		}
	}
	if !proto.Equal(g.HCM.GetLocalReplyConfig(), p.LocalReplyConfig) {
		errs = append(errs, errors.New("local_reply_config differs from the piece"))
	}
	return errors.Join(errs...)
}
