package envoytest

import (
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	mutationrulesv3 "github.com/envoyproxy/go-control-plane/envoy/config/common/mutation_rules/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	headermutationv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/header_mutation/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"sigs.k8s.io/yaml"
)

// Names in the shipped envoy/envoy.yaml that Edits rely on.
const (
	// IngressListener is the name of the one listener.
	IngressListener = "ingress"
	// IdemgateCluster and PaymentsCluster are the ext_proc cluster and the
	// upstream.
	IdemgateCluster = "idemgate"
	PaymentsCluster = "payments"
	// ConfirmRoute is the transfer confirm route.
	ConfirmRoute = "transfer_confirm"
	// ExtProcFilter is the name the ext_proc filter (inside its matcher) is
	// registered under.
	ExtProcFilter = "idemgate"
)

// Edits are the changes the e2e stacks, the load benchmark and the demo make
// to the shipped envoy/envoy.yaml before they run it. The zero value changes
// nothing. The edits are made on the decoded v3 Bootstrap, so one cannot
// silently miss its target (a renamed route, cluster or filter is an error).
type Edits struct {
	// Listen and Admin replace the listener's and the admin interface's
	// address (host:port; port 0 lets the kernel choose, Start reads the
	// bound ports back); empty keeps the shipped one.
	Listen, Admin string
	// Clusters points each named cluster's single endpoint at host:port,
	// or at a unix socket for unix:///path (a pipe address).
	Clusters map[string]string
	// ClusterTLS gives each named cluster an UpstreamTlsContext (for the
	// idemgate cluster: IdemgateUpstreamTLS, mTLS to grpc_tls).
	ClusterTLS map[string]*tlsv3.UpstreamTlsContext
	// ConfirmRouteTimeout replaces the confirm route's timeout when > 0.
	ConfirmRouteTimeout time.Duration
	// ConfirmRetryOn replaces the confirm route's retry_policy.retry_on when
	// set (envoy.yaml: a downstream that ignores keys must not be retried on
	// reset).
	ConfirmRetryOn string
	// MessageTimeout replaces ext_proc's message_timeout when > 0.
	MessageTimeout time.Duration
	// RawPaths turns off the HCM's path normalisation (normalize_path,
	// merge_slashes, escaped slashes kept): only for the test that shows why
	// envoy.yaml normalises.
	RawPaths bool
	// DropExtProc takes the ext_proc filter out of the chain (the load
	// benchmark's Envoy-without-ext_proc column). The routes' per-filter
	// configs that disable it stay: they name a filter type Envoy knows,
	// which is all it checks.
	DropExtProc bool
	// ResponseCode adds response_attributes: [response.code] to the ext_proc
	// filter, as `idemgate envoy-config` writes it for a config with a
	// preview.fingerprint_header: false.
	ResponseCode bool
	// HeaderAuth replaces jwt_authn with a header-only stand-in: a
	// header_mutation filter that sets the subject header to this value
	// (the load benchmark's Envoy with authentication as cheap as a header
	// filter).
	HeaderAuth string
}

// RenderBootstrap returns shipped (envoy/envoy.yaml, or a variant of it)
// with e applied, as YAML. The result passes the proto validation rules.
func RenderBootstrap(shipped []byte, e Edits) ([]byte, error) {
	var bs bootstrapv3.Bootstrap
	if err := UnmarshalYAML(shipped, &bs); err != nil {
		return nil, fmt.Errorf("failed to decode envoy.yaml: %w", err)
	}
	if err := e.apply(&bs); err != nil {
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

func (e Edits) apply(bs *bootstrapv3.Bootstrap) error {
	if e.Admin != "" {
		if bs.GetAdmin() == nil {
			return fmt.Errorf("envoy.yaml has no admin")
		}
		if err := setAddress(&bs.Admin.Address, e.Admin); err != nil {
			return fmt.Errorf("admin: %w", err)
		}
	}
	listeners := bs.GetStaticResources().GetListeners()
	if len(listeners) != 1 {
		return fmt.Errorf("envoy.yaml should have one listener, has %d", len(listeners))
	}
	if e.Listen != "" {
		if err := setAddress(&listeners[0].Address, e.Listen); err != nil {
			return fmt.Errorf("listener: %w", err)
		}
	}
	for name, addr := range e.Clusters {
		if path, ok := strings.CutPrefix(addr, "unix://"); ok {
			if err := setPipe(bs, name, path); err != nil {
				return err
			}
			continue
		}
		ep, err := ClusterEndpoint(bs, name)
		if err != nil {
			return err
		}
		sa, err := SocketAddress(addr)
		if err != nil {
			return fmt.Errorf("cluster %s: %w", name, err)
		}
		ep.Address = sa.Address
		ep.PortSpecifier = sa.PortSpecifier
	}
	for name, ctx := range e.ClusterTLS {
		c, err := cluster(bs, name)
		if err != nil {
			return err
		}
		tc, err := anypb.New(ctx)
		if err != nil {
			return err
		}
		c.TransportSocket = &corev3.TransportSocket{Name: "envoy.transport_sockets.tls", ConfigType: &corev3.TransportSocket_TypedConfig{TypedConfig: tc}}
	}
	if e.ConfirmRouteTimeout <= 0 && e.ConfirmRetryOn == "" && e.MessageTimeout <= 0 && !e.RawPaths && !e.DropExtProc && !e.ResponseCode && e.HeaderAuth == "" {
		return nil
	}
	return editHCM(listeners[0].GetFilterChains()[0].GetFilters()[0].GetTypedConfig(), func(h *hcmv3.HttpConnectionManager) error {
		if e.ConfirmRouteTimeout > 0 {
			if err := editRoute(h, ConfirmRoute, func(ra *routev3.RouteAction) error {
				ra.Timeout = durationpb.New(e.ConfirmRouteTimeout)
				return nil
			}); err != nil {
				return err
			}
		}
		if e.ConfirmRetryOn != "" {
			if err := editRoute(h, ConfirmRoute, func(ra *routev3.RouteAction) error {
				if ra.GetRetryPolicy() == nil {
					return fmt.Errorf("route %s has no retry_policy", ConfirmRoute)
				}
				ra.RetryPolicy.RetryOn = e.ConfirmRetryOn
				return nil
			}); err != nil {
				return err
			}
		}
		if e.RawPaths {
			h.NormalizePath = nil
			h.MergeSlashes = false
			h.PathWithEscapedSlashesAction = hcmv3.HttpConnectionManager_KEEP_UNCHANGED
		}
		if e.MessageTimeout > 0 {
			if err := setMessageTimeout(h, e.MessageTimeout); err != nil {
				return err
			}
		}
		if e.HeaderAuth != "" {
			if err := replaceJWTWithHeader(h, e.HeaderAuth); err != nil {
				return err
			}
		}
		if e.ResponseCode {
			if err := editExtProc(h, func(ep *extprocv3.ExternalProcessor) { ep.ResponseAttributes = []string{"response.code"} }); err != nil {
				return err
			}
		}
		if e.DropExtProc {
			return dropHTTPFilter(h, ExtProcFilter)
		}
		return nil
	})
}

// ClusterEndpoint is the socket address of the single endpoint of cluster
// name in bs.
func ClusterEndpoint(bs *bootstrapv3.Bootstrap, name string) (*corev3.SocketAddress, error) {
	for _, c := range bs.GetStaticResources().GetClusters() {
		if c.GetName() != name {
			continue
		}
		eps := c.GetLoadAssignment().GetEndpoints()
		if len(eps) != 1 || len(eps[0].GetLbEndpoints()) != 1 {
			return nil, fmt.Errorf("cluster %s of envoy.yaml should have exactly one endpoint", name)
		}
		sa := eps[0].GetLbEndpoints()[0].GetEndpoint().GetAddress().GetSocketAddress()
		if sa == nil {
			return nil, fmt.Errorf("cluster %s of envoy.yaml has no socket address", name)
		}
		return sa, nil
	}
	return nil, fmt.Errorf("envoy.yaml has no cluster %q", name)
}

// cluster is the static cluster name of bs.
func cluster(bs *bootstrapv3.Bootstrap, name string) (*clusterv3.Cluster, error) {
	for _, c := range bs.GetStaticResources().GetClusters() {
		if c.GetName() == name {
			return c, nil
		}
	}
	return nil, fmt.Errorf("envoy.yaml has no cluster %q", name)
}

// setPipe points the single endpoint of cluster name at a unix socket.
func setPipe(bs *bootstrapv3.Bootstrap, name, path string) error {
	c, err := cluster(bs, name)
	if err != nil {
		return err
	}
	eps := c.GetLoadAssignment().GetEndpoints()
	if len(eps) != 1 || len(eps[0].GetLbEndpoints()) != 1 || eps[0].GetLbEndpoints()[0].GetEndpoint() == nil {
		return fmt.Errorf("cluster %s of envoy.yaml should have exactly one endpoint", name)
	}
	eps[0].GetLbEndpoints()[0].GetEndpoint().Address = &corev3.Address{Address: &corev3.Address_Pipe{Pipe: &corev3.Pipe{Path: path}}}
	return nil
}

// IdemgateUpstreamTLS is the idemgate cluster's side of grpc_tls, as
// `idemgate envoy-config` writes it (envoy/pieces): Envoy's client
// certificate and key, idemgate's CA and the SAN its certificate must
// carry (URI with a scheme, DNS otherwise), TLS 1.2 or later, ALPN h2.
func IdemgateUpstreamTLS(certFile, keyFile, caFile, san string) *tlsv3.UpstreamTlsContext {
	file := func(name string) *corev3.DataSource {
		return &corev3.DataSource{Specifier: &corev3.DataSource_Filename{Filename: name}}
	}
	sanType := tlsv3.SubjectAltNameMatcher_DNS
	if strings.Contains(san, "://") {
		sanType = tlsv3.SubjectAltNameMatcher_URI
	}
	return &tlsv3.UpstreamTlsContext{CommonTlsContext: &tlsv3.CommonTlsContext{
		TlsParams:       &tlsv3.TlsParameters{TlsMinimumProtocolVersion: tlsv3.TlsParameters_TLSv1_2},
		AlpnProtocols:   []string{"h2"},
		TlsCertificates: []*tlsv3.TlsCertificate{{CertificateChain: file(certFile), PrivateKey: file(keyFile)}},
		ValidationContextType: &tlsv3.CommonTlsContext_ValidationContext{ValidationContext: &tlsv3.CertificateValidationContext{
			TrustedCa: file(caFile),
			MatchTypedSubjectAltNames: []*tlsv3.SubjectAltNameMatcher{{
				SanType: sanType,
				Matcher: &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Exact{Exact: san}},
			}},
		}},
	}}
}

// setAddress points *a at hostport, in place when it is a socket address
// (its other fields stay as shipped).
func setAddress(a **corev3.Address, hostport string) error {
	sa, err := SocketAddress(hostport)
	if err != nil {
		return err
	}
	if cur := (*a).GetSocketAddress(); cur != nil {
		cur.Address, cur.PortSpecifier = sa.Address, sa.PortSpecifier
		return nil
	}
	*a = &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: sa}}
	return nil
}

// SocketAddress parses host:port.
func SocketAddress(hostport string) (*corev3.SocketAddress, error) {
	host, port, err := net.SplitHostPort(hostport)
	if err != nil {
		return nil, fmt.Errorf("bad address %q: %w", hostport, err)
	}
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil {
		return nil, fmt.Errorf("bad port in %q: %w", hostport, err)
	}
	return &corev3.SocketAddress{Address: host, PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: uint32(p)}}, nil
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
	return editExtProc(h, func(ep *extprocv3.ExternalProcessor) { ep.MessageTimeout = durationpb.New(d) })
}

// editExtProc applies edit to the ext_proc filter's config (wherever the
// composite keeps it).
func editExtProc(h *hcmv3.HttpConnectionManager, edit func(*extprocv3.ExternalProcessor)) error {
	for _, f := range h.GetHttpFilters() {
		if f.GetName() != ExtProcFilter {
			continue
		}
		edited, err := EditWrapped(f.GetTypedConfig(), edit)
		if err != nil {
			return err
		}
		f.ConfigType = &hcmv3.HttpFilter_TypedConfig{TypedConfig: edited}
		return nil
	}
	return fmt.Errorf("envoy.yaml has no %s filter", ExtProcFilter)
}

// dropHTTPFilter removes the named filter from h.
func dropHTTPFilter(h *hcmv3.HttpConnectionManager, name string) error {
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
	return nil
}

// jwtAuthnFilter is the name of envoy.yaml's authentication filter.
const jwtAuthnFilter = "envoy.filters.http.jwt_authn"

// replaceJWTWithHeader puts, where jwt_authn was, a header_mutation filter
// that sets x-idemgate-subject to subject on every request.
func replaceJWTWithHeader(h *hcmv3.HttpConnectionManager, subject string) error {
	cfg, err := anypb.New(&headermutationv3.HeaderMutation{Mutations: &headermutationv3.Mutations{
		RequestMutations: []*mutationrulesv3.HeaderMutation{{Action: &mutationrulesv3.HeaderMutation_Append{Append: &corev3.HeaderValueOption{
			Header:       &corev3.HeaderValue{Key: "x-idemgate-subject", Value: subject},
			AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD,
		}}}},
	}})
	if err != nil {
		return err
	}
	for i, f := range h.GetHttpFilters() {
		if f.GetName() == jwtAuthnFilter {
			h.HttpFilters[i] = &hcmv3.HttpFilter{Name: "header-auth-stand-in", ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: cfg}}
			return nil
		}
	}
	return fmt.Errorf("envoy.yaml has no %s filter", jwtAuthnFilter)
}
