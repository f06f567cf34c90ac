package envoysim

import (
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	mutationrulesv3 "github.com/envoyproxy/go-control-plane/envoy/config/common/mutation_rules/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/access_loggers/file/v3"   // typed_config resolution
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/access_loggers/stream/v3" // typed_config resolution
	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	headermutationv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/header_mutation/v3"
	jwtauthnv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/jwt_authn/v3"
	routerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	upstreamhttpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"sigs.k8s.io/yaml"
)

// FromBootstrap derives a harness Config from a real Envoy v3 static
// bootstrap (YAML). The YAML is decoded strictly (unknown fields are errors,
// typed_config Anys are resolved and validated with ValidateAll) and every
// field the harness does not model is refused with its path, so a config
// that passes runs here as it would in Envoy.
//
// clusterAddrs overrides cluster endpoints by cluster name ("host:port"),
// which is how tests point the bootstrap's fixed ports at random ones;
// clusters not listed keep their load_assignment address. listenAddr, when
// not empty, replaces the listener's address (for example "127.0.0.1:0").
//
// Accepted but without effect in the harness (documented in the package
// doc): admin, node, listener name, stat_prefix, access_log, codec_type
// AUTO/HTTP1, route_config name, cluster type/lb_policy/dns_lookup_family,
// health_checks, upstream_connection_options, HTTP/2 connection_keepalive.
func FromBootstrap(yamlBytes []byte, clusterAddrs map[string]string, listenAddr string) (Config, error) {
	js, err := yaml.YAMLToJSON(yamlBytes)
	if err != nil {
		return Config{}, fmt.Errorf("failed to convert the bootstrap YAML to JSON: %w", err)
	}
	var bs bootstrapv3.Bootstrap
	if err := protojson.Unmarshal(js, &bs); err != nil {
		return Config{}, fmt.Errorf("failed to decode the bootstrap: %w", err)
	}
	if err := bs.ValidateAll(); err != nil {
		return Config{}, fmt.Errorf("invalid bootstrap: %w", err)
	}
	d := &bootstrapDecoder{clusterAddrs: clusterAddrs}
	cfg := d.decode(&bs, listenAddr)
	if err := errors.Join(d.errs...); err != nil {
		return Config{}, fmt.Errorf("bootstrap uses what envoysim does not model: %w", err)
	}
	if _, err := compile(cfg); err != nil {
		return Config{}, err
	}
	return cfg, nil
}

type bootstrapDecoder struct {
	clusterAddrs map[string]string
	errs         []error
	extProcName  string
}

func (d *bootstrapDecoder) fail(format string, args ...any) {
	d.errs = append(d.errs, fmt.Errorf(format, args...))
}

// only refuses every populated field of m not in allowed.
func (d *bootstrapDecoder) only(path string, m proto.Message, allowed ...string) {
	if m == nil || !m.ProtoReflect().IsValid() {
		return
	}
	m.ProtoReflect().Range(func(fd protoreflect.FieldDescriptor, _ protoreflect.Value) bool {
		if !slices.Contains(allowed, string(fd.Name())) {
			d.fail("%s.%s is not modelled", path, fd.Name())
		}
		return true
	})
}

// unpack resolves and validates a typed_config.
func (d *bootstrapDecoder) unpack(path string, a *anypb.Any) proto.Message {
	if a == nil {
		d.fail("%s: typed_config is required", path)
		return nil
	}
	m, err := a.UnmarshalNew()
	if err != nil {
		d.fail("%s: failed to decode %s: %w", path, a.GetTypeUrl(), err)
		return nil
	}
	if v, ok := m.(interface{ ValidateAll() error }); ok {
		if err := v.ValidateAll(); err != nil {
			d.fail("%s: %w", path, err)
		}
	}
	return m
}

func durationOrZero(p *durationpb.Duration) time.Duration {
	if p == nil {
		return 0
	}
	return p.AsDuration()
}

func (d *bootstrapDecoder) decode(bs *bootstrapv3.Bootstrap, listenAddr string) Config {
	var cfg Config
	d.only("bootstrap", bs, "admin", "node", "static_resources")
	sr := bs.GetStaticResources()
	d.only("static_resources", sr, "listeners", "clusters")

	cfg.Clusters = map[string]Cluster{}
	for i, c := range sr.GetClusters() {
		name, cl := d.cluster(fmt.Sprintf("clusters[%d]", i), c)
		cfg.Clusters[name] = cl
	}
	for name := range d.clusterAddrs {
		if _, ok := cfg.Clusters[name]; !ok {
			d.fail("clusterAddrs names %q, which the bootstrap does not define", name)
		}
	}

	if len(sr.GetListeners()) != 1 {
		d.fail("static_resources.listeners: exactly one listener is modelled, got %d", len(sr.GetListeners()))
		return cfg
	}
	l := sr.GetListeners()[0]
	lp := "listeners[0]"
	d.only(lp, l, "name", "address", "filter_chains", "per_connection_buffer_limit_bytes")
	if pb := l.GetPerConnectionBufferLimitBytes(); pb != nil {
		cfg.Listener.PerConnectionBufferLimitBytes = pb.GetValue()
	}
	cfg.Listener.Address = listenAddr
	if listenAddr == "" {
		sa := l.GetAddress().GetSocketAddress()
		if sa == nil {
			d.fail("%s.address: a socket_address is required", lp)
		} else {
			cfg.Listener.Address = net.JoinHostPort(sa.GetAddress(), strconv.Itoa(int(sa.GetPortValue())))
		}
	}
	if len(l.GetFilterChains()) != 1 {
		d.fail("%s.filter_chains: exactly one filter chain is modelled", lp)
		return cfg
	}
	fc := l.GetFilterChains()[0]
	d.only(lp+".filter_chains[0]", fc, "name", "filters")
	if len(fc.GetFilters()) != 1 {
		d.fail("%s.filter_chains[0].filters: exactly one network filter (the HTTP connection manager) is modelled", lp)
		return cfg
	}
	nf := fc.GetFilters()[0]
	d.only(lp+".filter_chains[0].filters[0]", nf, "name", "typed_config")
	hcm, ok := d.unpack(lp+".filter_chains[0].filters[0]", nf.GetTypedConfig()).(*hcmv3.HttpConnectionManager)
	if !ok {
		d.fail("%s.filter_chains[0].filters[0]: only envoy.filters.network.http_connection_manager is modelled", lp)
		return cfg
	}
	d.hcm(&cfg, hcm)
	return cfg
}

func (d *bootstrapDecoder) cluster(path string, c *clusterv3.Cluster) (string, Cluster) {
	d.only(path, c, "name", "type", "connect_timeout", "load_assignment", "typed_extension_protocol_options",
		"upstream_connection_options", "health_checks", "lb_policy", "dns_lookup_family", "http2_protocol_options")
	cl := Cluster{ConnectTimeout: durationOrZero(c.GetConnectTimeout())}
	if c.GetHttp2ProtocolOptions() != nil {
		cl.HTTP2 = true
	}
	for key, a := range c.GetTypedExtensionProtocolOptions() {
		p := fmt.Sprintf("%s.typed_extension_protocol_options[%s]", path, key)
		opts, ok := d.unpack(p, a).(*upstreamhttpv3.HttpProtocolOptions)
		if !ok {
			d.fail("%s: only envoy.extensions.upstreams.http.v3.HttpProtocolOptions is modelled", p)
			continue
		}
		d.only(p, opts, "explicit_http_config", "common_http_protocol_options")
		d.only(p+".common_http_protocol_options", opts.GetCommonHttpProtocolOptions(), "idle_timeout")
		ex := opts.GetExplicitHttpConfig()
		if ex == nil {
			d.fail("%s: only explicit_http_config is modelled", p)
			continue
		}
		if h2 := ex.GetHttp2ProtocolOptions(); h2 != nil {
			d.only(p+".explicit_http_config.http2_protocol_options", h2, "connection_keepalive")
			cl.HTTP2 = true
		}
		d.only(p+".explicit_http_config.http_protocol_options", ex.GetHttpProtocolOptions())
	}
	addr := d.clusterAddrs[c.GetName()]
	if addr == "" {
		eps := c.GetLoadAssignment().GetEndpoints()
		if len(eps) != 1 || len(eps[0].GetLbEndpoints()) != 1 {
			d.fail("%s (%s): exactly one endpoint is modelled (or pass its address in clusterAddrs)", path, c.GetName())
		} else if sa := eps[0].GetLbEndpoints()[0].GetEndpoint().GetAddress().GetSocketAddress(); sa != nil {
			addr = net.JoinHostPort(sa.GetAddress(), strconv.Itoa(int(sa.GetPortValue())))
		} else {
			d.fail("%s (%s): the endpoint needs a socket_address", path, c.GetName())
		}
	}
	cl.Address = addr
	return c.GetName(), cl
}

func (d *bootstrapDecoder) hcm(cfg *Config, h *hcmv3.HttpConnectionManager) {
	const p = "http_connection_manager"
	d.only(p, h, "stat_prefix", "codec_type", "access_log", "use_remote_address", "generate_request_id",
		"preserve_external_request_id", "normalize_path", "merge_slashes", "path_with_escaped_slashes_action",
		"common_http_protocol_options", "max_request_headers_kb", "server_name", "route_config", "http_filters")
	if ct := h.GetCodecType(); ct != hcmv3.HttpConnectionManager_AUTO && ct != hcmv3.HttpConnectionManager_HTTP1 {
		d.fail("%s.codec_type %s is not modelled (the harness front is HTTP/1.1)", p, ct)
	}
	cfg.HCM.UseRemoteAddress = h.GetUseRemoteAddress().GetValue()
	if g := h.GetGenerateRequestId(); g != nil {
		v := g.GetValue()
		cfg.HCM.GenerateRequestID = &v
	}
	cfg.HCM.PreserveExternalRequestID = h.GetPreserveExternalRequestId()
	cfg.HCM.NormalizePath = h.GetNormalizePath().GetValue()
	cfg.HCM.MergeSlashes = h.GetMergeSlashes()
	cfg.HCM.PathWithEscapedSlashesAction = h.GetPathWithEscapedSlashesAction()
	cfg.HCM.ServerName = h.GetServerName()
	if kb := h.GetMaxRequestHeadersKb(); kb != nil {
		cfg.HCM.MaxRequestHeadersKB = kb.GetValue()
	}
	cp := h.GetCommonHttpProtocolOptions()
	d.only(p+".common_http_protocol_options", cp, "headers_with_underscores_action", "max_headers_count", "idle_timeout")
	cfg.HCM.HeadersWithUnderscoresAction = cp.GetHeadersWithUnderscoresAction()
	if mc := cp.GetMaxHeadersCount(); mc != nil {
		cfg.HCM.MaxHeadersCount = mc.GetValue()
	}

	// Filters first: the ext_proc filter name is the per-route config key.
	d.httpFilters(cfg, h.GetHttpFilters())

	rc := h.GetRouteConfig()
	if rc == nil {
		d.fail("%s: an inline route_config is required (RDS is not modelled)", p)
		return
	}
	d.only(p+".route_config", rc, "name", "virtual_hosts")
	for i, vh := range rc.GetVirtualHosts() {
		cfg.VirtualHosts = append(cfg.VirtualHosts, d.virtualHost(fmt.Sprintf("%s.route_config.virtual_hosts[%d]", p, i), vh))
	}
}

// httpFilters maps http_filters to the chain the harness runs, in Envoy's
// order: header_mutation, jwt_authn, ext_proc, router (each at most once).
func (d *bootstrapDecoder) httpFilters(cfg *Config, filters []*hcmv3.HttpFilter) {
	order := []string{"header_mutation", "jwt_authn", "ext_proc", "router"}
	last := -1
	for i, f := range filters {
		p := fmt.Sprintf("http_filters[%d] (%s)", i, f.GetName())
		d.only(p, f, "name", "typed_config")
		kind := ""
		switch m := d.unpack(p, f.GetTypedConfig()).(type) {
		case nil:
			continue
		case *headermutationv3.HeaderMutation:
			kind = "header_mutation"
			cfg.HeaderMutation = d.headerMutation(p, m)
		case *jwtauthnv3.JwtAuthentication:
			kind = "jwt_authn"
			cfg.JWTAuthn = d.jwtAuthn(p, m)
		case *extprocfilterv3.ExternalProcessor:
			kind = "ext_proc"
			d.extProcName = f.GetName()
			cfg.ExtProc = d.extProc(p, m)
			cfg.ExtProc.Name = f.GetName()
		case *routerv3.Router:
			kind = "router"
			d.only(p, m, "suppress_envoy_headers")
			cfg.Router.SuppressEnvoyHeaders = m.GetSuppressEnvoyHeaders()
		default:
			d.fail("%s: filter type %s is not modelled", p, f.GetTypedConfig().GetTypeUrl())
			continue
		}
		idx := slices.Index(order, kind)
		if idx <= last {
			d.fail("%s: the harness runs header_mutation, jwt_authn, ext_proc, router in this order, each at most once", p)
		}
		last = idx
	}
	if last != len(order)-1 {
		d.fail("http_filters: envoy.filters.http.router must be the last filter")
	}
}

func (d *bootstrapDecoder) headerMutation(p string, m *headermutationv3.HeaderMutation) *HeaderMutation {
	d.only(p, m, "mutations")
	d.only(p+".mutations", m.GetMutations(), "request_mutations", "response_mutations")
	conv := func(path string, muts []*mutationrulesv3.HeaderMutation) []HeaderMutationOp {
		var out []HeaderMutationOp
		for i, hm := range muts {
			mp := fmt.Sprintf("%s[%d]", path, i)
			switch {
			case hm.GetRemove() != "":
				out = append(out, HeaderMutationOp{Remove: hm.GetRemove()})
			case hm.GetAppend() != nil:
				a := hm.GetAppend()
				d.only(mp+".append", a, "header", "append_action", "keep_empty_value")
				d.only(mp+".append.header", a.GetHeader(), "key", "value", "raw_value")
				v := a.GetHeader().GetValue()
				if len(a.GetHeader().GetRawValue()) > 0 {
					v = string(a.GetHeader().GetRawValue())
				}
				if strings.Contains(v, "%") {
					d.fail("%s: substitution formatters in header values are not modelled", mp)
				}
				out = append(out, HeaderMutationOp{Append: &HeaderValueOption{
					Key: a.GetHeader().GetKey(), Value: v, AppendAction: a.GetAppendAction(), KeepEmptyValue: a.GetKeepEmptyValue(),
				}})
			default:
				d.fail("%s: only remove and append are modelled", mp)
			}
		}
		return out
	}
	return &HeaderMutation{
		RequestMutations:  conv(p+".mutations.request_mutations", m.GetMutations().GetRequestMutations()),
		ResponseMutations: conv(p+".mutations.response_mutations", m.GetMutations().GetResponseMutations()),
	}
}

func (d *bootstrapDecoder) routeMatch(p string, m *routev3.RouteMatch) RouteMatch {
	d.only(p, m, "prefix", "path", "safe_regex", "case_sensitive")
	rm := RouteMatch{Prefix: m.GetPrefix(), Path: m.GetPath()}
	if sr := m.GetSafeRegex(); sr != nil {
		d.only(p+".safe_regex", sr, "regex", "google_re2")
		rm.SafeRegex = sr.GetRegex()
	}
	if cs := m.GetCaseSensitive(); cs != nil && !cs.GetValue() {
		if rm.SafeRegex != "" {
			d.fail("%s: case_sensitive does not apply to safe_regex", p)
		}
		rm.CaseInsensitive = true
	}
	return rm
}

func (d *bootstrapDecoder) jwtAuthn(p string, m *jwtauthnv3.JwtAuthentication) *JWTAuthn {
	d.only(p, m, "providers", "rules")
	ja := &JWTAuthn{Providers: map[string]JWTProvider{}}
	for name, pr := range m.GetProviders() {
		pp := fmt.Sprintf("%s.providers[%s]", p, name)
		d.only(pp, pr, "issuer", "audiences", "forward", "from_headers", "from_params", "local_jwks",
			"payload_in_metadata", "claim_to_headers", "clock_skew_seconds")
		prov := JWTProvider{
			Issuer:            pr.GetIssuer(),
			Audiences:         pr.GetAudiences(),
			Forward:           pr.GetForward(),
			FromParams:        pr.GetFromParams(),
			PayloadInMetadata: pr.GetPayloadInMetadata(),
		}
		if pr.GetClockSkewSeconds() != 0 {
			v := pr.GetClockSkewSeconds()
			prov.ClockSkewSeconds = &v
		}
		for _, h := range pr.GetFromHeaders() {
			prov.FromHeaders = append(prov.FromHeaders, JWTHeader{Name: h.GetName(), ValuePrefix: h.GetValuePrefix()})
		}
		for i, c := range pr.GetClaimToHeaders() {
			d.only(fmt.Sprintf("%s.claim_to_headers[%d]", pp, i), c, "header_name", "claim_name")
			prov.ClaimToHeaders = append(prov.ClaimToHeaders, ClaimToHeader{HeaderName: c.GetHeaderName(), ClaimName: c.GetClaimName()})
		}
		lj := pr.GetLocalJwks()
		switch {
		case lj.GetInlineString() != "":
			prov.LocalJWKS = []byte(lj.GetInlineString())
		case len(lj.GetInlineBytes()) > 0:
			prov.LocalJWKS = lj.GetInlineBytes()
		default:
			d.fail("%s: only local_jwks with inline_string or inline_bytes is modelled", pp)
		}
		ja.Providers[name] = prov
	}
	for i, r := range m.GetRules() {
		rp := fmt.Sprintf("%s.rules[%d]", p, i)
		d.only(rp, r, "match", "requires")
		rule := JWTRule{Match: d.routeMatch(rp+".match", r.GetMatch())}
		if req := r.GetRequires(); req != nil {
			jr := &JWTRequirement{}
			switch {
			case req.GetProviderName() != "":
				jr.ProviderName = req.GetProviderName()
			case req.GetProviderAndAudiences() != nil:
				jr.ProviderName = req.GetProviderAndAudiences().GetProviderName()
				jr.Audiences = req.GetProviderAndAudiences().GetAudiences()
			case req.GetAllowMissing() != nil:
				jr.AllowMissing = true
			case req.GetAllowMissingOrFailed() != nil:
				jr.AllowMissingOrFailed = true
			default:
				d.fail("%s.requires: only provider_name, provider_and_audiences, allow_missing and allow_missing_or_failed are modelled", rp)
			}
			rule.Requires = jr
		}
		ja.Rules = append(ja.Rules, rule)
	}
	return ja
}

func (d *bootstrapDecoder) grpcService(p string, g *corev3.GrpcService) GRPCService {
	d.only(p, g, "envoy_grpc", "initial_metadata")
	d.only(p+".envoy_grpc", g.GetEnvoyGrpc(), "cluster_name")
	if g.GetEnvoyGrpc() == nil {
		d.fail("%s: only envoy_grpc is modelled", p)
	}
	gs := GRPCService{ClusterName: g.GetEnvoyGrpc().GetClusterName()}
	for _, hv := range g.GetInitialMetadata() {
		gs.InitialMetadata = append(gs.InitialMetadata, HeaderKV{Key: hv.GetKey(), Value: hv.GetValue()})
	}
	return gs
}

func (d *bootstrapDecoder) stringMatchers(p string, ms []*matcherv3.StringMatcher) []StringMatcher {
	var out []StringMatcher
	for i, m := range ms {
		mp := fmt.Sprintf("%s[%d]", p, i)
		d.only(mp, m, "exact", "prefix", "suffix", "contains", "safe_regex", "ignore_case")
		sm := StringMatcher{Exact: m.GetExact(), Prefix: m.GetPrefix(), Suffix: m.GetSuffix(), Contains: m.GetContains(), IgnoreCase: m.GetIgnoreCase()}
		if r := m.GetSafeRegex(); r != nil {
			sm.SafeRegex = r.GetRegex()
		}
		out = append(out, sm)
	}
	return out
}

func (d *bootstrapDecoder) extProc(p string, m *extprocfilterv3.ExternalProcessor) *ExtProc {
	d.only(p, m, "grpc_service", "failure_mode_allow", "processing_mode", "request_attributes", "response_attributes",
		"message_timeout", "max_message_timeout", "stat_prefix", "mutation_rules", "forward_rules", "allow_mode_override",
		"allowed_override_modes", "disable_immediate_response", "metadata_options", "disable_clear_route_cache",
		"route_cache_action", "status_on_error", "observability_mode", "send_body_without_waiting_for_header_response")
	if m.GetGrpcService() == nil {
		d.fail("%s: grpc_service is required (http_service is not modelled)", p)
	}
	ep := &ExtProc{
		GRPCService:                             d.grpcService(p+".grpc_service", m.GetGrpcService()),
		FailureModeAllow:                        m.GetFailureModeAllow(),
		ProcessingMode:                          processingModeFromProto(m.GetProcessingMode()),
		RequestAttributes:                       m.GetRequestAttributes(),
		ResponseAttributes:                      m.GetResponseAttributes(),
		MaxMessageTimeout:                       durationOrZero(m.GetMaxMessageTimeout()),
		AllowModeOverride:                       m.GetAllowModeOverride(),
		DisableImmediateResponse:                m.GetDisableImmediateResponse(),
		DisableClearRouteCache:                  m.GetDisableClearRouteCache(),
		RouteCacheAction:                        m.GetRouteCacheAction(),
		StatusOnError:                           int(m.GetStatusOnError().GetCode()),
		ObservabilityMode:                       m.GetObservabilityMode(),
		SendBodyWithoutWaitingForHeaderResponse: m.GetSendBodyWithoutWaitingForHeaderResponse(),
	}
	if mt := m.GetMessageTimeout(); mt != nil {
		v := mt.AsDuration()
		ep.MessageTimeout = &v
	}
	for _, om := range m.GetAllowedOverrideModes() {
		ep.AllowedOverrideModes = append(ep.AllowedOverrideModes, processingModeFromProto(om))
	}
	if mr := m.GetMutationRules(); mr != nil {
		d.only(p+".mutation_rules", mr, "allow_all_routing", "allow_envoy", "disallow_system", "disallow_all",
			"allow_expression", "disallow_expression", "disallow_is_error")
		ep.MutationRules = MutationRules{
			AllowAllRouting:    mr.GetAllowAllRouting().GetValue(),
			AllowEnvoy:         mr.GetAllowEnvoy().GetValue(),
			DisallowSystem:     mr.GetDisallowSystem().GetValue(),
			DisallowAll:        mr.GetDisallowAll().GetValue(),
			DisallowIsError:    mr.GetDisallowIsError().GetValue(),
			AllowExpression:    mr.GetAllowExpression().GetRegex(),
			DisallowExpression: mr.GetDisallowExpression().GetRegex(),
		}
	}
	if fr := m.GetForwardRules(); fr != nil {
		d.only(p+".forward_rules", fr, "allowed_headers", "disallowed_headers")
		ep.ForwardRules = ForwardRules{
			AllowedHeaders:    d.stringMatchers(p+".forward_rules.allowed_headers", fr.GetAllowedHeaders().GetPatterns()),
			DisallowedHeaders: d.stringMatchers(p+".forward_rules.disallowed_headers", fr.GetDisallowedHeaders().GetPatterns()),
		}
	}
	if mo := m.GetMetadataOptions(); mo != nil {
		d.only(p+".metadata_options", mo, "forwarding_namespaces", "receiving_namespaces")
		d.only(p+".metadata_options.forwarding_namespaces", mo.GetForwardingNamespaces(), "untyped")
		d.only(p+".metadata_options.receiving_namespaces", mo.GetReceivingNamespaces(), "untyped")
		ep.MetadataOptions = MetadataOptions{
			ForwardingNamespaces: mo.GetForwardingNamespaces().GetUntyped(),
			ReceivingNamespaces:  mo.GetReceivingNamespaces().GetUntyped(),
		}
	}
	return ep
}

func (d *bootstrapDecoder) perFilterConfig(p string, cfgs map[string]*anypb.Any) *ExtProcPerRoute {
	var out *ExtProcPerRoute
	for key, a := range cfgs {
		kp := fmt.Sprintf("%s.typed_per_filter_config[%s]", p, key)
		if key != d.extProcName {
			d.fail("%s: only per-route config for the ext_proc filter (%q) is modelled", kp, d.extProcName)
			continue
		}
		pr, ok := d.unpack(kp, a).(*extprocfilterv3.ExtProcPerRoute)
		if !ok {
			d.fail("%s: want an ExtProcPerRoute", kp)
			continue
		}
		out = &ExtProcPerRoute{Disabled: pr.GetDisabled()}
		ov := pr.GetOverrides()
		d.only(kp+".overrides", ov, "processing_mode", "grpc_service", "grpc_initial_metadata", "metadata_options", "failure_mode_allow")
		if pm := ov.GetProcessingMode(); pm != nil {
			m := processingModeFromProto(pm)
			out.ProcessingMode = &m
		}
		if gs := ov.GetGrpcService(); gs != nil {
			g := d.grpcService(kp+".overrides.grpc_service", gs)
			out.GRPCService = &g
		}
		for _, hv := range ov.GetGrpcInitialMetadata() {
			out.GRPCInitialMetadata = append(out.GRPCInitialMetadata, HeaderKV{Key: hv.GetKey(), Value: hv.GetValue()})
		}
		if mo := ov.GetMetadataOptions(); mo != nil {
			d.only(kp+".overrides.metadata_options", mo, "forwarding_namespaces", "receiving_namespaces")
			if mo.GetForwardingNamespaces() != nil {
				out.ForwardingNamespaces = append([]string{}, mo.GetForwardingNamespaces().GetUntyped()...)
			}
			if mo.GetReceivingNamespaces() != nil {
				out.ReceivingNamespaces = append([]string{}, mo.GetReceivingNamespaces().GetUntyped()...)
			}
		}
		if fm := ov.GetFailureModeAllow(); fm != nil {
			v := fm.GetValue()
			out.FailureModeAllow = &v
		}
	}
	return out
}

func (d *bootstrapDecoder) virtualHost(p string, vh *routev3.VirtualHost) VirtualHost {
	d.only(p, vh, "name", "domains", "routes", "typed_per_filter_config")
	out := VirtualHost{Name: vh.GetName(), Domains: vh.GetDomains(), ExtProcPerRoute: d.perFilterConfig(p, vh.GetTypedPerFilterConfig())}
	for i, r := range vh.GetRoutes() {
		rp := fmt.Sprintf("%s.routes[%d] (%s)", p, i, r.GetName())
		d.only(rp, r, "name", "match", "route", "direct_response", "typed_per_filter_config")
		route := Route{Name: r.GetName(), Match: d.routeMatch(rp+".match", r.GetMatch()),
			ExtProcPerRoute: d.perFilterConfig(rp, r.GetTypedPerFilterConfig())}
		switch {
		case r.GetDirectResponse() != nil:
			dr := r.GetDirectResponse()
			d.only(rp+".direct_response", dr, "status", "body")
			d.only(rp+".direct_response.body", dr.GetBody(), "inline_string", "inline_bytes")
			body := dr.GetBody().GetInlineString()
			if b := dr.GetBody().GetInlineBytes(); len(b) > 0 {
				body = string(b)
			}
			route.DirectResponse = &DirectResponse{Status: int(dr.GetStatus()), Body: body}
		case r.GetRoute() != nil:
			ra := r.GetRoute()
			d.only(rp+".route", ra, "cluster", "timeout", "retry_policy")
			route.Cluster = ra.GetCluster()
			if ra.GetTimeout() != nil {
				t := ra.GetTimeout().AsDuration()
				route.Timeout = &t
			}
			if rpol := ra.GetRetryPolicy(); rpol != nil {
				pp := rp + ".route.retry_policy"
				d.only(pp, rpol, "retry_on", "num_retries", "retry_back_off", "retriable_status_codes")
				pol := &RetryPolicy{RetryOn: []string{rpol.GetRetryOn()}}
				if n := rpol.GetNumRetries(); n != nil {
					v := n.GetValue()
					pol.NumRetries = &v
				}
				for _, c := range rpol.GetRetriableStatusCodes() {
					pol.RetriableStatusCodes = append(pol.RetriableStatusCodes, int(c))
				}
				if bo := rpol.GetRetryBackOff(); bo != nil {
					d.only(pp+".retry_back_off", bo, "base_interval", "max_interval")
					pol.BaseInterval = durationOrZero(bo.GetBaseInterval())
					pol.MaxInterval = durationOrZero(bo.GetMaxInterval())
				}
				route.RetryPolicy = pol
			}
		default:
			d.fail("%s: only route and direct_response actions are modelled", rp)
		}
		out.Routes = append(out.Routes, route)
	}
	return out
}
