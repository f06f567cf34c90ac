package envoysim

import (
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
)

// HeaderSendMode and BodySendMode are the ext_proc processing-mode enums.
type (
	HeaderSendMode = extprocfilterv3.ProcessingMode_HeaderSendMode
	BodySendMode   = extprocfilterv3.ProcessingMode_BodySendMode
)

// Processing-mode values, named as in processing_mode.proto.
const (
	HeaderDefault = extprocfilterv3.ProcessingMode_DEFAULT
	HeaderSend    = extprocfilterv3.ProcessingMode_SEND
	HeaderSkip    = extprocfilterv3.ProcessingMode_SKIP

	BodyNone               = extprocfilterv3.ProcessingMode_NONE
	BodyStreamed           = extprocfilterv3.ProcessingMode_STREAMED
	BodyBuffered           = extprocfilterv3.ProcessingMode_BUFFERED
	BodyBufferedPartial    = extprocfilterv3.ProcessingMode_BUFFERED_PARTIAL
	BodyFullDuplexStreamed = extprocfilterv3.ProcessingMode_FULL_DUPLEX_STREAMED
)

// AppendAction is HeaderValueOption.append_action, honoured by the
// header_mutation filter (and, as in Envoy, ignored by ext_proc).
type AppendAction = corev3.HeaderValueOption_HeaderAppendAction

// RouteCacheAction is ExternalProcessor.route_cache_action.
type RouteCacheAction = extprocfilterv3.ExternalProcessor_RouteCacheAction

// DefaultExtProcFilterName is the filter name, and so the per-route config key,
// used when ExtProc.Name is empty.
const DefaultExtProcFilterName = "envoy.filters.http.ext_proc"

// Config is the harness configuration. Every field mirrors the Envoy v3 field
// it models (named in its comment); zero values mean Envoy's defaults.
type Config struct {
	Listener Listener
	HCM      HCM
	// HeaderMutation is envoy.filters.http.header_mutation; nil = absent.
	HeaderMutation *HeaderMutation
	// JWTAuthn is envoy.filters.http.jwt_authn; nil = absent.
	JWTAuthn *JWTAuthn
	// ExtProc is envoy.filters.http.ext_proc; nil = absent.
	ExtProc *ExtProc
	// Router is envoy.filters.http.router (always last).
	Router Router
	// VirtualHosts is HCM route_config.virtual_hosts.
	VirtualHosts []VirtualHost
	// Clusters maps cluster name to where it lives.
	Clusters map[string]Cluster
}

// Listener models the fields of config.listener.v3.Listener that matter here.
type Listener struct {
	// Address is the socket address Start listens on when given "".
	Address string
	// PerConnectionBufferLimitBytes is the filter-manager buffer limit for
	// both directions (BUFFERED bodies); 0 means Envoy's 1 MiB.
	PerConnectionBufferLimitBytes uint32
}

// HCM models HttpConnectionManager fields.
type HCM struct {
	// GenerateRequestID is generate_request_id; nil means true.
	GenerateRequestID *bool
	// PreserveExternalRequestID is preserve_external_request_id.
	PreserveExternalRequestID bool
	// UseRemoteAddress is use_remote_address: x-forwarded-for gets the peer
	// address, x-forwarded-proto is overwritten, every request is external.
	UseRemoteAddress bool
	// MaxRequestHeadersKB is max_request_headers_kb; 0 means 60.
	MaxRequestHeadersKB uint32
	// MaxHeadersCount is common_http_protocol_options.max_headers_count; 0 means 100.
	MaxHeadersCount uint32
	// ServerName is server_name; "" means "envoy".
	ServerName string
	// NormalizePath is normalize_path (RFC 3986 path normalisation before
	// filters and routing).
	NormalizePath bool
	// MergeSlashes is merge_slashes.
	MergeSlashes bool
	// PathWithEscapedSlashesAction is path_with_escaped_slashes_action.
	PathWithEscapedSlashesAction EscapedSlashesAction
	// HeadersWithUnderscoresAction is
	// common_http_protocol_options.headers_with_underscores_action.
	HeadersWithUnderscoresAction UnderscoresAction
}

// EscapedSlashesAction is HttpConnectionManager.PathWithEscapedSlashesAction.
type EscapedSlashesAction = hcmv3.HttpConnectionManager_PathWithEscapedSlashesAction

// UnderscoresAction is HttpProtocolOptions.HeadersWithUnderscoresAction.
type UnderscoresAction = corev3.HttpProtocolOptions_HeadersWithUnderscoresAction

// HeaderMutation models extensions.filters.http.header_mutation.v3.HeaderMutation
// (mutations.request_mutations / response_mutations).
type HeaderMutation struct {
	RequestMutations  []HeaderMutationOp
	ResponseMutations []HeaderMutationOp
}

// HeaderMutationOp is config.common.mutation_rules.v3.HeaderMutation: exactly
// one of Remove or Append.
type HeaderMutationOp struct {
	Remove string
	Append *HeaderValueOption
}

// HeaderValueOption is config.core.v3.HeaderValueOption with a literal value.
type HeaderValueOption struct {
	Key            string
	Value          string
	AppendAction   AppendAction
	KeepEmptyValue bool
}

// JWTAuthn models extensions.filters.http.jwt_authn.v3.JwtAuthentication.
type JWTAuthn struct {
	Providers map[string]JWTProvider
	// Rules are evaluated in order; the first whose Match matches decides.
	Rules []JWTRule
}

// JWTProvider models JwtProvider with a local (inline) JWKS.
type JWTProvider struct {
	Issuer    string
	Audiences []string
	// Forward keeps the token header; false (the default) removes it after
	// a successful verification.
	Forward bool
	// FromHeaders lists token locations; empty means Envoy's defaults
	// (Authorization "Bearer " and the access_token query parameter).
	FromHeaders []JWTHeader
	FromParams  []string
	// LocalJWKS is local_jwks.inline_string: a JWKS document (EC P-256/384/521
	// and RSA keys are supported).
	LocalJWKS []byte
	// PayloadInMetadata names the key under the dynamic-metadata namespace
	// envoy.filters.http.jwt_authn that receives the claims.
	PayloadInMetadata string
	ClaimToHeaders    []ClaimToHeader
	// ClockSkewSeconds is clock_skew_seconds; nil means 60.
	ClockSkewSeconds *uint32
}

// JWTHeader is JwtHeader.
type JWTHeader struct {
	Name        string
	ValuePrefix string
}

// ClaimToHeader is JwtClaimToHeader.
type ClaimToHeader struct {
	HeaderName string
	ClaimName  string
}

// JWTRule is RequirementRule; a nil Requires means no requirement.
type JWTRule struct {
	Match    RouteMatch
	Requires *JWTRequirement
}

// JWTRequirement is the subset of JwtRequirement modelled: provider_name,
// provider_and_audiences, allow_missing and allow_missing_or_failed.
type JWTRequirement struct {
	ProviderName string
	// Audiences, when non-empty, replaces the provider's audiences
	// (provider_and_audiences).
	Audiences            []string
	AllowMissing         bool
	AllowMissingOrFailed bool
}

// ProcessingMode is extensions.filters.http.ext_proc.v3.ProcessingMode.
type ProcessingMode struct {
	RequestHeaderMode   HeaderSendMode
	ResponseHeaderMode  HeaderSendMode
	RequestBodyMode     BodySendMode
	ResponseBodyMode    BodySendMode
	RequestTrailerMode  HeaderSendMode
	ResponseTrailerMode HeaderSendMode
}

func (m ProcessingMode) toProto() *extprocfilterv3.ProcessingMode {
	return &extprocfilterv3.ProcessingMode{
		RequestHeaderMode:   m.RequestHeaderMode,
		ResponseHeaderMode:  m.ResponseHeaderMode,
		RequestBodyMode:     m.RequestBodyMode,
		ResponseBodyMode:    m.ResponseBodyMode,
		RequestTrailerMode:  m.RequestTrailerMode,
		ResponseTrailerMode: m.ResponseTrailerMode,
	}
}

func processingModeFromProto(p *extprocfilterv3.ProcessingMode) ProcessingMode {
	return ProcessingMode{
		RequestHeaderMode:   p.GetRequestHeaderMode(),
		ResponseHeaderMode:  p.GetResponseHeaderMode(),
		RequestBodyMode:     p.GetRequestBodyMode(),
		ResponseBodyMode:    p.GetResponseBodyMode(),
		RequestTrailerMode:  p.GetRequestTrailerMode(),
		ResponseTrailerMode: p.GetResponseTrailerMode(),
	}
}

// ExtProc models extensions.filters.http.ext_proc.v3.ExternalProcessor.
type ExtProc struct {
	// Name is the HTTP filter name, the key of per-route configs; "" means
	// DefaultExtProcFilterName.
	Name string
	// GRPCService is grpc_service.envoy_grpc (+ initial_metadata).
	GRPCService GRPCService
	// FailureModeAllow is failure_mode_allow.
	FailureModeAllow bool
	// ProcessingMode is processing_mode (zero value = Envoy's defaults:
	// headers SEND, bodies NONE, trailers SKIP).
	ProcessingMode ProcessingMode
	// RequestAttributes and ResponseAttributes are the attribute expressions.
	RequestAttributes  []string
	ResponseAttributes []string
	// MessageTimeout is message_timeout; nil means 200 ms.
	MessageTimeout *time.Duration
	// MaxMessageTimeout is max_message_timeout; 0 disables
	// override_message_timeout.
	MaxMessageTimeout time.Duration
	// MutationRules is mutation_rules (the header-mutation checker).
	MutationRules MutationRules
	// ForwardRules is forward_rules.
	ForwardRules ForwardRules
	// AllowModeOverride is allow_mode_override.
	AllowModeOverride bool
	// AllowedOverrideModes is allowed_override_modes.
	AllowedOverrideModes []ProcessingMode
	// DisableImmediateResponse is disable_immediate_response.
	DisableImmediateResponse bool
	// MetadataOptions is metadata_options (untyped namespaces only).
	MetadataOptions MetadataOptions
	// DisableClearRouteCache and RouteCacheAction gate clear_route_cache.
	DisableClearRouteCache bool
	RouteCacheAction       RouteCacheAction
	// StatusOnError is status_on_error.code; 0 means 500.
	StatusOnError int

	// ObservabilityMode and SendBodyWithoutWaitingForHeaderResponse are not
	// modelled: New refuses a Config that sets them.
	ObservabilityMode                       bool
	SendBodyWithoutWaitingForHeaderResponse bool
}

// GRPCService is config.core.v3.GrpcService with envoy_grpc.
type GRPCService struct {
	ClusterName     string
	InitialMetadata []HeaderKV
}

// HeaderKV is a header key and value (config.core.v3.HeaderValue).
type HeaderKV struct {
	Key   string
	Value string
}

// MutationRules is config.common.mutation_rules.v3.HeaderMutationRules.
type MutationRules struct {
	AllowAllRouting    bool
	AllowEnvoy         bool
	DisallowSystem     bool
	DisallowAll        bool
	DisallowIsError    bool
	AllowExpression    string
	DisallowExpression string
}

// ForwardRules is ExternalProcessor.forward_rules.
type ForwardRules struct {
	AllowedHeaders    []StringMatcher
	DisallowedHeaders []StringMatcher
}

// StringMatcher is type.matcher.v3.StringMatcher; exactly one pattern is set.
type StringMatcher struct {
	Exact      string
	Prefix     string
	Suffix     string
	Contains   string
	SafeRegex  string
	IgnoreCase bool
}

// MetadataOptions is ExternalProcessor.metadata_options (untyped lists).
type MetadataOptions struct {
	ForwardingNamespaces []string
	ReceivingNamespaces  []string
}

// ExtProcPerRoute is ExtProcPerRoute (disabled, or overrides).
type ExtProcPerRoute struct {
	Disabled bool
	// ProcessingMode is overrides.processing_mode: it replaces the whole mode.
	ProcessingMode *ProcessingMode
	// GRPCService is overrides.grpc_service.
	GRPCService *GRPCService
	// GRPCInitialMetadata is overrides.grpc_initial_metadata, merged by key.
	GRPCInitialMetadata []HeaderKV
	// ForwardingNamespaces / ReceivingNamespaces replace the filter's lists
	// when non-nil (overrides.metadata_options).
	ForwardingNamespaces []string
	ReceivingNamespaces  []string
	// FailureModeAllow is overrides.failure_mode_allow.
	FailureModeAllow *bool
}

// Router models extensions.filters.http.router.v3.Router.
type Router struct {
	// SuppressEnvoyHeaders drops x-envoy-upstream-service-time and
	// x-envoy-expected-rq-timeout-ms.
	SuppressEnvoyHeaders bool
}

// VirtualHost is config.route.v3.VirtualHost.
type VirtualHost struct {
	Name string
	// Domains supports exact host names (with or without port) and "*".
	Domains []string
	Routes  []Route
	// ExtProcPerRoute is typed_per_filter_config[ext_proc filter name].
	ExtProcPerRoute *ExtProcPerRoute
}

// Route is config.route.v3.Route with a RouteAction to one cluster, or a
// direct_response.
type Route struct {
	Name    string
	Match   RouteMatch
	Cluster string
	// DirectResponse answers without an upstream (Cluster must be empty).
	DirectResponse *DirectResponse
	// Timeout is route.timeout; nil means 15 s, 0 disables it.
	Timeout     *time.Duration
	RetryPolicy *RetryPolicy
	// ExtProcPerRoute is typed_per_filter_config[ext_proc filter name].
	ExtProcPerRoute *ExtProcPerRoute
}

// DirectResponse is config.route.v3.DirectResponseAction.
type DirectResponse struct {
	Status int
	Body   string
}

// RouteMatch is config.route.v3.RouteMatch with exactly one of prefix, path
// or safe_regex (a full match of the path without the query).
type RouteMatch struct {
	Prefix    string
	Path      string
	SafeRegex string
	// CaseInsensitive is case_sensitive: false (prefix and path only).
	CaseInsensitive bool

	re *regexp.Regexp
}

// RetryPolicy is config.route.v3.RetryPolicy.
type RetryPolicy struct {
	// RetryOn lists conditions: reset, connect-failure, 5xx, gateway-error,
	// retriable-status-codes (others are refused).
	RetryOn []string
	// NumRetries is num_retries; nil means 1.
	NumRetries           *uint32
	RetriableStatusCodes []int
	// BaseInterval and MaxInterval are retry_back_off; 0 means 25 ms and
	// 10 × base.
	BaseInterval time.Duration
	MaxInterval  time.Duration
}

// Cluster is where a cluster's single endpoint lives.
type Cluster struct {
	// Address is host:port.
	Address string
	// ConnectTimeout is connect_timeout; 0 means 5 s.
	ConnectTimeout time.Duration
	// HTTP2 says the cluster speaks HTTP/2 (required for the ext_proc
	// cluster; upstream clusters must be HTTP/1.1 here).
	HTTP2 bool
}

func boolPtr(b bool) *bool { return &b }

// runtime holds the validated, compiled configuration.
type runtime struct {
	cfg          Config
	bufferLimit  int
	maxHeadersKB int
	maxHeaders   int
	serverName   string
	generateID   bool
	vhosts       []*compiledVHost
	headerMut    *HeaderMutation
	jwt          *jwtFilterConfig
	extProc      *extProcConfig
	retryOnKnown map[string]bool
}

type compiledVHost struct {
	vh     *VirtualHost
	routes []*compiledRoute
}

type compiledRoute struct {
	vhost   *compiledVHost
	route   *Route
	timeout time.Duration
	retry   *compiledRetry
	// extProcPerRoute is the vhost → route merge of ExtProcPerRoute; nil
	// when neither level configures ext_proc.
	extProcPerRoute *ExtProcPerRoute
}

type compiledRetry struct {
	on          map[string]bool
	numRetries  int
	codes       map[int]bool
	base, limit time.Duration
}

// extProcConfig is the compiled ext_proc filter config.
type extProcConfig struct {
	ExtProc
	name           string
	messageTimeout time.Duration
	checker        *checker
	allowed        []stringMatcher
	disallowed     []stringMatcher
	statusOnError  int
}

var knownRetryOn = setOf("reset", "connect-failure", "5xx", "gateway-error", "retriable-status-codes", "refused-stream")

// compile validates c and returns its runtime form; every problem is reported.
func compile(c Config) (*runtime, error) {
	var errs []error
	// Copy the slices compile annotates (compiled regexes), so the caller's
	// Config is never modified.
	vhs := make([]VirtualHost, len(c.VirtualHosts))
	for i, vh := range c.VirtualHosts {
		vh.Routes = slices.Clone(vh.Routes)
		vhs[i] = vh
	}
	c.VirtualHosts = vhs
	rt := &runtime{cfg: c, headerMut: c.HeaderMutation}

	rt.bufferLimit = int(c.Listener.PerConnectionBufferLimitBytes)
	if rt.bufferLimit == 0 {
		rt.bufferLimit = 1 << 20
	}
	rt.maxHeadersKB = int(c.HCM.MaxRequestHeadersKB)
	if rt.maxHeadersKB == 0 {
		rt.maxHeadersKB = 60
	}
	rt.maxHeaders = int(c.HCM.MaxHeadersCount)
	if rt.maxHeaders == 0 {
		rt.maxHeaders = 100
	}
	rt.serverName = c.HCM.ServerName
	if rt.serverName == "" {
		rt.serverName = "envoy"
	}
	rt.generateID = c.HCM.GenerateRequestID == nil || *c.HCM.GenerateRequestID

	for name, cl := range c.Clusters {
		if cl.Address == "" {
			errs = append(errs, fmt.Errorf("cluster %q: no address", name))
		}
	}

	if c.HeaderMutation != nil {
		for i, op := range slices.Concat(c.HeaderMutation.RequestMutations, c.HeaderMutation.ResponseMutations) {
			if (op.Remove == "") == (op.Append == nil) {
				errs = append(errs, fmt.Errorf("header_mutation: mutation %d must set exactly one of remove or append", i))
			}
			if op.Append != nil && (!headerNameIsValid(op.Append.Key) || !headerValueIsValid(op.Append.Value)) {
				errs = append(errs, fmt.Errorf("header_mutation: mutation %d: invalid header %q", i, op.Append.Key))
			}
		}
	}

	if c.JWTAuthn != nil {
		jc, err := compileJWT(c.JWTAuthn)
		if err != nil {
			errs = append(errs, err)
		}
		rt.jwt = jc
	}

	if c.ExtProc != nil {
		ep, err := compileExtProc(c.ExtProc, c.Clusters)
		if err != nil {
			errs = append(errs, err)
		}
		rt.extProc = ep
	}

	if len(c.VirtualHosts) == 0 {
		errs = append(errs, errors.New("route_config: at least one virtual host is required"))
	}
	for i := range c.VirtualHosts {
		vh := &c.VirtualHosts[i]
		cv := &compiledVHost{vh: vh}
		if len(vh.Domains) == 0 {
			errs = append(errs, fmt.Errorf("virtual host %q: no domains", vh.Name))
		}
		for _, d := range vh.Domains {
			if d != "*" && strings.Contains(d, "*") {
				errs = append(errs, fmt.Errorf("virtual host %q: wildcard domain %q is not modelled (only exact names and \"*\")", vh.Name, d))
			}
		}
		if err := checkPerRoute(vh.ExtProcPerRoute, c.ExtProc, c.Clusters); err != nil {
			errs = append(errs, fmt.Errorf("virtual host %q: %w", vh.Name, err))
		}
		for j := range vh.Routes {
			r := &vh.Routes[j]
			cr, err := compileRoute(cv, r, c)
			if err != nil {
				errs = append(errs, fmt.Errorf("virtual host %q route %d (%s): %w", vh.Name, j, r.Name, err))
			}
			cv.routes = append(cv.routes, cr)
		}
		rt.vhosts = append(rt.vhosts, cv)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("invalid envoysim config: %w", err)
	}
	return rt, nil
}

func compileRoute(cv *compiledVHost, r *Route, c Config) (*compiledRoute, error) {
	var errs []error
	cr := &compiledRoute{vhost: cv, route: r, timeout: 15 * time.Second}
	if err := r.Match.compile(); err != nil {
		errs = append(errs, err)
	}
	switch {
	case r.DirectResponse != nil:
		if r.Cluster != "" {
			errs = append(errs, errors.New("a direct_response route has no cluster"))
		}
		if r.DirectResponse.Status < 200 || r.DirectResponse.Status > 599 {
			errs = append(errs, fmt.Errorf("direct_response status %d is out of range", r.DirectResponse.Status))
		}
	case c.Clusters[r.Cluster] == (Cluster{}):
		errs = append(errs, fmt.Errorf("unknown cluster %q", r.Cluster))
	case c.Clusters[r.Cluster].HTTP2:
		errs = append(errs, fmt.Errorf("cluster %q: HTTP/2 upstreams are not modelled (the router speaks HTTP/1.1)", r.Cluster))
	}
	if r.Timeout != nil {
		cr.timeout = *r.Timeout
	}
	if rp := r.RetryPolicy; rp != nil {
		cr.retry = &compiledRetry{on: map[string]bool{}, numRetries: 1, codes: map[int]bool{}, base: 25 * time.Millisecond}
		for _, on := range rp.RetryOn {
			for _, cond := range strings.Split(on, ",") {
				cond = strings.TrimSpace(cond)
				if !knownRetryOn[cond] {
					errs = append(errs, fmt.Errorf("retry_on %q is not modelled", cond))
				}
				cr.retry.on[cond] = true
			}
		}
		if rp.NumRetries != nil {
			cr.retry.numRetries = int(*rp.NumRetries)
		}
		for _, code := range rp.RetriableStatusCodes {
			cr.retry.codes[code] = true
		}
		if rp.BaseInterval > 0 {
			cr.retry.base = rp.BaseInterval
		}
		cr.retry.limit = 10 * cr.retry.base
		if rp.MaxInterval > 0 {
			cr.retry.limit = rp.MaxInterval
		}
	}
	if err := checkPerRoute(r.ExtProcPerRoute, c.ExtProc, c.Clusters); err != nil {
		errs = append(errs, err)
	}
	cr.extProcPerRoute = mergePerRoute(cv.vh.ExtProcPerRoute, r.ExtProcPerRoute)
	return cr, errors.Join(errs...)
}

// mergePerRoute merges ExtProcPerRoute like FilterConfigPerRoute's merge
// constructor: the more specific level wins per field; a more specific
// disabled clears the processing mode.
func mergePerRoute(less, more *ExtProcPerRoute) *ExtProcPerRoute {
	switch {
	case less == nil && more == nil:
		return nil
	case less == nil:
		cp := *more
		if cp.Disabled {
			cp.ProcessingMode = nil
		}
		return &cp
	case more == nil:
		cp := *less
		if cp.Disabled {
			cp.ProcessingMode = nil
		}
		return &cp
	}
	m := ExtProcPerRoute{Disabled: more.Disabled}
	if !more.Disabled {
		m.ProcessingMode = less.ProcessingMode
		if more.ProcessingMode != nil {
			m.ProcessingMode = more.ProcessingMode
		}
	}
	m.GRPCService = less.GRPCService
	if more.GRPCService != nil {
		m.GRPCService = more.GRPCService
	}
	m.GRPCInitialMetadata = mergeMetadata(less.GRPCInitialMetadata, more.GRPCInitialMetadata)
	m.ForwardingNamespaces = less.ForwardingNamespaces
	if more.ForwardingNamespaces != nil {
		m.ForwardingNamespaces = more.ForwardingNamespaces
	}
	m.ReceivingNamespaces = less.ReceivingNamespaces
	if more.ReceivingNamespaces != nil {
		m.ReceivingNamespaces = more.ReceivingNamespaces
	}
	m.FailureModeAllow = less.FailureModeAllow
	if more.FailureModeAllow != nil {
		m.FailureModeAllow = more.FailureModeAllow
	}
	return &m
}

// mergeMetadata replaces entries with the same key or appends.
func mergeMetadata(base, over []HeaderKV) []HeaderKV {
	out := slices.Clone(base)
	for _, h := range over {
		found := false
		for i := range out {
			if out[i].Key == h.Key {
				out[i] = h
				found = true
			}
		}
		if !found {
			out = append(out, h)
		}
	}
	return out
}

func checkPerRoute(pr *ExtProcPerRoute, ep *ExtProc, clusters map[string]Cluster) error {
	if pr == nil {
		return nil
	}
	if ep == nil {
		return errors.New("ext_proc per-route config without an ext_proc filter")
	}
	var errs []error
	if pr.ProcessingMode != nil {
		errs = append(errs, checkModeModelled("overrides.processing_mode", *pr.ProcessingMode))
	}
	if pr.GRPCService != nil {
		errs = append(errs, checkGRPCCluster(pr.GRPCService.ClusterName, clusters))
	}
	return errors.Join(errs...)
}

func checkModeModelled(what string, m ProcessingMode) error {
	var errs []error
	for _, bm := range []BodySendMode{m.RequestBodyMode, m.ResponseBodyMode} {
		if bm == BodyBufferedPartial || bm == BodyFullDuplexStreamed {
			errs = append(errs, fmt.Errorf("%s: body mode %s is not modelled by envoysim", what, bm))
		}
	}
	return errors.Join(errs...)
}

func checkGRPCCluster(name string, clusters map[string]Cluster) error {
	cl, ok := clusters[name]
	if !ok {
		return fmt.Errorf("grpc_service: unknown cluster %q", name)
	}
	if !cl.HTTP2 {
		return fmt.Errorf("grpc_service: cluster %q must be HTTP/2 (EnvoyGrpc over HTTP/1.1 fails every call)", name)
	}
	return nil
}

func compileExtProc(e *ExtProc, clusters map[string]Cluster) (*extProcConfig, error) {
	var errs []error
	ec := &extProcConfig{ExtProc: *e, name: e.Name, messageTimeout: 200 * time.Millisecond, statusOnError: 500}
	if ec.name == "" {
		ec.name = DefaultExtProcFilterName
	}
	if e.MessageTimeout != nil {
		ec.messageTimeout = *e.MessageTimeout
		if ec.messageTimeout < 0 || ec.messageTimeout > time.Hour {
			errs = append(errs, errors.New("ext_proc: message_timeout must be within 0..3600s"))
		}
	}
	if e.StatusOnError != 0 {
		if e.StatusOnError < 200 || e.StatusOnError > 599 {
			errs = append(errs, fmt.Errorf("ext_proc: status_on_error %d is not an HTTP error status", e.StatusOnError))
		}
		ec.statusOnError = e.StatusOnError
	}
	errs = append(errs, checkGRPCCluster(e.GRPCService.ClusterName, clusters))
	if e.ObservabilityMode {
		errs = append(errs, errors.New("ext_proc: observability_mode is not modelled by envoysim"))
	}
	if e.SendBodyWithoutWaitingForHeaderResponse {
		errs = append(errs, errors.New("ext_proc: send_body_without_waiting_for_header_response is not modelled by envoysim"))
	}
	if e.DisableClearRouteCache && e.RouteCacheAction != extprocfilterv3.ExternalProcessor_DEFAULT {
		errs = append(errs, errors.New("ext_proc: disable_clear_route_cache and a non-DEFAULT route_cache_action are mutually exclusive"))
	}
	if e.DisableClearRouteCache {
		ec.RouteCacheAction = extprocfilterv3.ExternalProcessor_RETAIN
	}
	errs = append(errs, checkModeModelled("ext_proc: processing_mode", e.ProcessingMode))
	for i, m := range e.AllowedOverrideModes {
		errs = append(errs, checkModeModelled(fmt.Sprintf("ext_proc: allowed_override_modes[%d]", i), m))
	}
	ch, err := newChecker(e.MutationRules)
	if err != nil {
		errs = append(errs, fmt.Errorf("ext_proc: mutation_rules: %w", err))
	}
	ec.checker = ch
	for _, m := range e.ForwardRules.AllowedHeaders {
		sm, err := compileStringMatcher(m)
		errs = append(errs, err)
		ec.allowed = append(ec.allowed, sm)
	}
	for _, m := range e.ForwardRules.DisallowedHeaders {
		sm, err := compileStringMatcher(m)
		errs = append(errs, err)
		ec.disallowed = append(ec.disallowed, sm)
	}
	return ec, errors.Join(errs...)
}

// stringMatcher is a compiled StringMatcher.
type stringMatcher func(string) bool

func compileStringMatcher(m StringMatcher) (stringMatcher, error) {
	set := 0
	for _, s := range []string{m.Exact, m.Prefix, m.Suffix, m.Contains, m.SafeRegex} {
		if s != "" {
			set++
		}
	}
	if set != 1 {
		return nil, errors.New("string matcher must set exactly one pattern")
	}
	fold := func(s string) string {
		if m.IgnoreCase {
			return strings.ToLower(s)
		}
		return s
	}
	switch {
	case m.Exact != "":
		return func(s string) bool { return fold(s) == fold(m.Exact) }, nil
	case m.Prefix != "":
		return func(s string) bool { return strings.HasPrefix(fold(s), fold(m.Prefix)) }, nil
	case m.Suffix != "":
		return func(s string) bool { return strings.HasSuffix(fold(s), fold(m.Suffix)) }, nil
	case m.Contains != "":
		return func(s string) bool { return strings.Contains(fold(s), fold(m.Contains)) }, nil
	}
	re, err := regexp.Compile("^(?:" + m.SafeRegex + ")$")
	if err != nil {
		return nil, fmt.Errorf("safe_regex %q: %w", m.SafeRegex, err)
	}
	return re.MatchString, nil
}

// forwardAllowed implements MutationUtils::headerCanBeForwarded.
func (ec *extProcConfig) forwardAllowed(key string) bool {
	in := func(ms []stringMatcher) bool {
		return slices.ContainsFunc(ms, func(m stringMatcher) bool { return m(key) })
	}
	if len(ec.disallowed) > 0 && in(ec.disallowed) {
		return false
	}
	return len(ec.allowed) == 0 || in(ec.allowed)
}

// compile checks the match and compiles safe_regex.
func (m *RouteMatch) compile() error {
	set := 0
	for _, v := range []string{m.Prefix, m.Path, m.SafeRegex} {
		if v != "" {
			set++
		}
	}
	if set != 1 {
		return errors.New("match must set exactly one of prefix, path or safe_regex")
	}
	if m.SafeRegex != "" {
		re, err := regexp.Compile("^(?:" + m.SafeRegex + ")$")
		if err != nil {
			return fmt.Errorf("safe_regex %q: %w", m.SafeRegex, err)
		}
		m.re = re
	}
	return nil
}

// matches implements RouteMatch against the :path header: prefix compares
// the whole value (query included), path and safe_regex compare it without
// the query.
func (m RouteMatch) matches(path string) bool {
	if m.SafeRegex != "" {
		p, _, _ := strings.Cut(path, "?")
		re := m.re
		if re == nil {
			re = regexp.MustCompile("^(?:" + m.SafeRegex + ")$")
		}
		return re.MatchString(p)
	}
	eq := func(a, b string) bool {
		if m.CaseInsensitive {
			return strings.EqualFold(a, b)
		}
		return a == b
	}
	if m.Path != "" {
		p, _, _ := strings.Cut(path, "?")
		return eq(p, m.Path)
	}
	return len(path) >= len(m.Prefix) && eq(path[:len(m.Prefix)], m.Prefix)
}

// findRoute picks the virtual host by :authority and the first matching route.
func (rt *runtime) findRoute(authority, path string) *compiledRoute {
	host := strings.ToLower(authority)
	var vh *compiledVHost
	for _, v := range rt.vhosts {
		for _, d := range v.vh.Domains {
			d = strings.ToLower(d)
			if d == host || (!strings.Contains(d, ":") && stripPort(host) == d) {
				vh = v
				break
			}
		}
		if vh != nil {
			break
		}
	}
	if vh == nil {
		for _, v := range rt.vhosts {
			if slices.Contains(v.vh.Domains, "*") {
				vh = v
				break
			}
		}
	}
	if vh == nil {
		return nil
	}
	for _, r := range vh.routes {
		if r.route.Match.matches(path) {
			return r
		}
	}
	return nil
}

func stripPort(host string) string {
	if i := strings.LastIndexByte(host, ':'); i >= 0 && !strings.Contains(host[i:], "]") {
		return host[:i]
	}
	return host
}
