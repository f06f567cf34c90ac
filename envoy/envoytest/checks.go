package envoytest

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	headermutationv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/header_mutation/v3"
	jwtauthnv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/jwt_authn/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	upstreamhttpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// Check is one invariant of an Envoy config that carries idemgate, checked
// against the idemgate.yaml that goes with it.
type Check struct {
	Name string
	Run  func(g *Gateway, c *IdemgateConfig) error
}

// BootstrapChecks are the invariants every shipped bootstrap must hold.
func BootstrapChecks() []Check {
	return []Check{
		{"filters run header_mutation, jwt_authn, ext_proc, router", checkFilterOrder},
		{"a client cannot send its own subject header", checkSubjectStripped},
		{"jwt_authn sets the subject header on every operation", checkJWTSetsSubject},
		{"ext_proc fails closed, processes both bodies buffered", checkExtProc},
		{"ext_proc reaches the idemgate cluster over HTTP/2 with health checks", checkExtProcCluster},
		{"message_timeout fits store.timeout and every route timeout", checkMessageTimeout},
		{"idemgate runs on the operation paths and on no other route's", checkOperationRoutes},
		{"near-miss operation paths never reach an upstream unguarded", checkNearMisses},
		{"per-route configs are keyed by existing filter names", checkPerRouteKeys},
		{"confirm retries only on reset and connect-failure, keeping the key", checkConfirmRoutes},
		{"ttl.in_flight outlives a confirm with all its retries", checkInFlightTTL},
		{"buffer limit equals limits.max_body_bytes", checkBodyLimit},
		{"paths are normalised before routing", checkPathNormalisation},
		{"admin listens on loopback only", checkAdminLoopback},
	}
}

// SafeRetryOn is the only router retry condition set allowed on a confirm: the
// request either never reached the upstream or the connection broke, and the
// retry carries the same Idempotency-Key.
var SafeRetryOn = []string{"connect-failure", "reset"}

// MCPRetryOn is the only retry condition set allowed on an MCP endpoint's
// route (sorted): it also carries tools/calls idemgate does not guard, which
// have no idempotency key, so only a request that never reached the
// upstream may be retried.
var MCPRetryOn = []string{"connect-failure", "reset-before-request"}

func checkFilterOrder(g *Gateway, _ *IdemgateConfig) error {
	want := []string{"HeaderMutation", "JwtAuthentication", "ExternalProcessor", "Router"}
	var got []string
	for _, f := range g.Filters {
		got = append(got, string(f.Config.ProtoReflect().Descriptor().Name()))
	}
	if !slices.Equal(got, want) {
		return fmt.Errorf("http_filters are %v, want %v", got, want)
	}
	return nil
}

func checkSubjectStripped(g *Gateway, c *IdemgateConfig) error {
	if c.Subject.Header == "" {
		return nil // subject from metadata: idemgate never reads a header
	}
	if len(g.Filters) == 0 || !isHeaderMutation(g.Filters[0]) {
		return errors.New("the first HTTP filter must be header_mutation, so nothing reads a client-sent subject")
	}
	if g.HCM.GetHttpFilters()[0].GetDisabled() {
		return errors.New("header_mutation is disabled by default")
	}
	hm := g.Filters[0].Config.(*headermutationv3.HeaderMutation)
	removed := false
	for _, m := range hm.GetMutations().GetRequestMutations() {
		if strings.EqualFold(m.GetRemove(), c.Subject.Header) {
			removed = true
		}
	}
	if !removed {
		return fmt.Errorf("header_mutation does not remove %s from requests", c.Subject.Header)
	}
	name := g.Filters[0].Name
	for _, vh := range g.VirtualHosts() {
		if _, ok := vh.GetTypedPerFilterConfig()[name]; ok {
			return fmt.Errorf("virtual host %q overrides %s", vh.GetName(), name)
		}
		for _, r := range vh.GetRoutes() {
			if _, ok := r.GetTypedPerFilterConfig()[name]; ok {
				return fmt.Errorf("route %q overrides %s", r.GetName(), name)
			}
		}
	}
	return nil
}

func checkJWTSetsSubject(g *Gateway, c *IdemgateConfig) error {
	jwt, err := g.JWTAuthn()
	if err != nil {
		return err
	}
	var errs []error
	checked := map[string]bool{}
	for _, path := range c.OperationPaths() {
		provider, err := requiredProvider(jwt, path)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if checked[provider] {
			continue
		}
		checked[provider] = true
		p, ok := jwt.GetProviders()[provider]
		if !ok {
			errs = append(errs, fmt.Errorf("%s requires unknown provider %q", path, provider))
			continue
		}
		if err := CheckJWTProvider(p, c); err != nil {
			errs = append(errs, fmt.Errorf("provider %q: %w", provider, err))
		}
	}
	return errors.Join(errs...)
}

// CheckJWTProvider checks that a verified token of provider p yields the
// subject idemgate reads: the header (set from `sub`, never forwarded raw) or
// the metadata path.
func CheckJWTProvider(p *jwtauthnv3.JwtProvider, c *IdemgateConfig) error {
	var errs []error
	if c.Subject.Header != "" {
		set := slices.ContainsFunc(p.GetClaimToHeaders(), func(h *jwtauthnv3.JwtClaimToHeader) bool {
			return strings.EqualFold(h.GetHeaderName(), c.Subject.Header) && h.GetClaimName() == "sub"
		})
		if !set {
			errs = append(errs, fmt.Errorf("claim_to_headers does not set %s from sub", c.Subject.Header))
		}
	}
	if md := c.Subject.Metadata; md != nil {
		if md.Namespace == "envoy.filters.http.jwt_authn" && !strings.HasPrefix(md.Path, p.GetPayloadInMetadata()+".") {
			errs = append(errs, fmt.Errorf("subject.metadata.path %q does not start at payload_in_metadata %q",
				md.Path, p.GetPayloadInMetadata()))
		}
	}
	if p.GetForward() {
		errs = append(errs, errors.New("forward: true passes the raw token upstream"))
	}
	if p.GetIssuer() == "" || len(p.GetAudiences()) == 0 {
		errs = append(errs, errors.New("issuer and audiences must be pinned"))
	}
	return errors.Join(errs...)
}

// requiredProvider returns the provider a jwt_authn rule requires for path.
// Rules are evaluated in order, first match wins, as in Envoy.
func requiredProvider(jwt *jwtauthnv3.JwtAuthentication, path string) (string, error) {
	for _, rule := range jwt.GetRules() {
		ok, err := routeMatches(rule.GetMatch(), path)
		if err != nil {
			return "", fmt.Errorf("jwt_authn rule: %w", err)
		}
		if !ok {
			continue
		}
		name := rule.GetRequires().GetProviderName()
		if name == "" {
			return "", fmt.Errorf("the jwt_authn rule for %s must require exactly one provider (provider_name)", path)
		}
		return name, nil
	}
	return "", fmt.Errorf("no jwt_authn rule requires a token on %s", path)
}

func checkExtProc(g *Gateway, c *IdemgateConfig) error {
	ep, _, err := g.ExtProc()
	if err != nil {
		return err
	}
	return CheckExtProc(ep, c)
}

// CheckExtProc checks the ext_proc filter config on its own: it never fails
// open, uses the processing modes idemgate is written for, lets idemgate
// override them, and gives idemgate enough time per message.
func CheckExtProc(ep *extprocv3.ExternalProcessor, c *IdemgateConfig) error {
	var errs []error
	if ep.GetFailureModeAllow() {
		errs = append(errs, errors.New("failure_mode_allow must be false: never fail open on a confirm"))
	}
	pm := ep.GetProcessingMode()
	want := &extprocv3.ProcessingMode{
		RequestHeaderMode:   extprocv3.ProcessingMode_SEND,
		ResponseHeaderMode:  extprocv3.ProcessingMode_SEND,
		RequestBodyMode:     extprocv3.ProcessingMode_BUFFERED,
		ResponseBodyMode:    extprocv3.ProcessingMode_BUFFERED,
		RequestTrailerMode:  extprocv3.ProcessingMode_SKIP,
		ResponseTrailerMode: extprocv3.ProcessingMode_SKIP,
	}
	if pm.GetRequestHeaderMode() != want.RequestHeaderMode || pm.GetResponseHeaderMode() != want.ResponseHeaderMode ||
		pm.GetRequestBodyMode() != want.RequestBodyMode || pm.GetResponseBodyMode() != want.ResponseBodyMode ||
		pm.GetRequestTrailerMode() != want.RequestTrailerMode || pm.GetResponseTrailerMode() != want.ResponseTrailerMode {
		errs = append(errs, fmt.Errorf("processing_mode is {%v}, want {%v}", pm, want))
	}
	if !ep.GetAllowModeOverride() {
		errs = append(errs, errors.New("allow_mode_override must be true: idemgate skips bodies it does not need"))
	}
	if ep.GetObservabilityMode() || ep.GetSendBodyWithoutWaitingForHeaderResponse() || ep.GetDisableImmediateResponse() {
		errs = append(errs, errors.New("observability_mode, send_body_without_waiting_for_header_response and disable_immediate_response must stay off"))
	}
	if ep.GetMessageTimeout() == nil {
		errs = append(errs, errors.New("message_timeout must be written out (Envoy's default is 200 ms, below store.timeout)"))
	} else if mt, st := ep.GetMessageTimeout().AsDuration(), time.Duration(c.Store.Timeout); mt < 4*st {
		errs = append(errs, fmt.Errorf("message_timeout %v is below 4 × store.timeout (%v)", mt, st))
	}
	gs := ep.GetGrpcService()
	if gs.GetEnvoyGrpc().GetClusterName() == "" {
		errs = append(errs, errors.New("grpc_service must be envoy_grpc with a cluster_name"))
	}
	if gs.GetTimeout() != nil {
		errs = append(errs, errors.New("grpc_service.timeout must be unset: the stream lives for the whole request; message_timeout bounds each message"))
	}
	for _, op := range c.Operations {
		if op.ReadsResponseCode() && !slices.Contains(ep.GetResponseAttributes(), "response.code") {
			errs = append(errs, fmt.Errorf("response_attributes must include response.code: operation %s's preview skips its response headers (fingerprint_header: false, or mcp.preview_response_headers: false) and reads the status from it (without it every such preview goes unsigned)", op.Name))
			break
		}
	}
	if md := c.Subject.Metadata; md != nil && !slices.Contains(ep.GetMetadataOptions().GetForwardingNamespaces().GetUntyped(), md.Namespace) {
		errs = append(errs, fmt.Errorf("metadata_options.forwarding_namespaces.untyped must include %s (subject.metadata)", md.Namespace))
	}
	return errors.Join(errs...)
}

func checkExtProcCluster(g *Gateway, c *IdemgateConfig) error {
	ep, _, err := g.ExtProc()
	if err != nil {
		return err
	}
	name := ep.GetGrpcService().GetEnvoyGrpc().GetClusterName()
	cl, ok := g.Clusters[name]
	if !ok {
		return fmt.Errorf("ext_proc names cluster %q, which is not defined", name)
	}
	return CheckIdemgateCluster(cl, c)
}

// CheckIdemgateCluster checks the cluster ext_proc streams to: a static
// address equal to idemgate's grpc_listen, explicit HTTP/2 with keepalive, and
// gRPC health checks.
func CheckIdemgateCluster(cl *clusterv3.Cluster, c *IdemgateConfig) error {
	var errs []error
	if cl.GetType() != clusterv3.Cluster_STATIC {
		errs = append(errs, fmt.Errorf("cluster %q is %v, want STATIC (idemgate sits next to Envoy)", cl.GetName(), cl.GetType()))
	}
	host, port, err := SingleEndpoint(cl)
	if err != nil {
		errs = append(errs, err)
	} else if err := sameAddress(host, port, c.GRPCListen); err != nil {
		errs = append(errs, fmt.Errorf("cluster %q: %w", cl.GetName(), err))
	}
	var opts upstreamhttpv3.HttpProtocolOptions
	raw, ok := cl.GetTypedExtensionProtocolOptions()["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]
	switch {
	case !ok:
		errs = append(errs, errors.New("no HttpProtocolOptions: the gRPC cluster must be explicitly HTTP/2"))
	case raw.UnmarshalTo(&opts) != nil:
		errs = append(errs, fmt.Errorf("HttpProtocolOptions key holds %s", raw.GetTypeUrl()))
	default:
		h2 := opts.GetExplicitHttpConfig().GetHttp2ProtocolOptions()
		if h2 == nil {
			errs = append(errs, errors.New("explicit_http_config.http2_protocol_options is not set"))
		} else if ka := h2.GetConnectionKeepalive(); ka.GetInterval() == nil || ka.GetTimeout() == nil {
			errs = append(errs, errors.New("http2_protocol_options.connection_keepalive needs interval and timeout"))
		}
	}
	hasGRPCCheck := slices.ContainsFunc(cl.GetHealthChecks(), func(h *corev3.HealthCheck) bool {
		return h.GetGrpcHealthCheck() != nil
	})
	if !hasGRPCCheck {
		errs = append(errs, errors.New("no grpc_health_check (grpc.health.v1)"))
	}
	return errors.Join(errs...)
}

// sameAddress checks an Envoy endpoint against a Go listen address; a listen
// address without a host (":50051") listens everywhere, so any host matches.
func sameAddress(host string, port uint32, listen string) error {
	lh, lp, err := HostPort(listen)
	if err != nil {
		return err
	}
	if port != lp || (lh != "" && lh != "0.0.0.0" && lh != "::" && lh != host) {
		return fmt.Errorf("endpoint %s:%d is not idemgate's grpc_listen %s", host, port, listen)
	}
	return nil
}

func checkMessageTimeout(g *Gateway, _ *IdemgateConfig) error {
	ep, _, err := g.ExtProc()
	if err != nil {
		return err
	}
	var errs []error
	for _, vh := range g.VirtualHosts() {
		for _, r := range vh.GetRoutes() {
			if err := MessageTimeoutFits(ep, r); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// MessageTimeoutFits checks that ext_proc gives up on idemgate before the
// route gives up on the whole request, so a slow idemgate shows as Envoy's 504
// from ext_proc and never as a cut upstream call.
func MessageTimeoutFits(ep *extprocv3.ExternalProcessor, r *routev3.Route) error {
	ra := r.GetRoute()
	if ra == nil {
		return nil
	}
	mt := ep.GetMessageTimeout().AsDuration()
	if t := RouteTimeout(ra); t != 0 && mt >= t {
		return fmt.Errorf("route %q: timeout %v is not above message_timeout %v", r.GetName(), t, mt)
	}
	return nil
}

// ExtProcRunsOn reports whether ext_proc runs for a request to path that
// Envoy routes to route m: the filter's matcher lets it run (RunsFor) and the
// route does not disable it.
func (g *Gateway) ExtProcRunsOn(path string, m Match) (bool, error) {
	f, err := g.extProcFilter()
	if err != nil {
		return false, err
	}
	runs, err := f.RunsFor(path)
	if err != nil || !runs {
		return false, err
	}
	off, err := ExtProcDisabled(m.VirtualHost, m.Route, f.Name)
	return !off, err
}

// extProcFilter is the ext_proc filter with its matcher.
func (g *Gateway) extProcFilter() (Filter, error) {
	for _, f := range g.Filters {
		if _, ok := f.Config.(*extprocv3.ExternalProcessor); ok {
			return f, nil
		}
	}
	return Filter{}, errors.New("no ext_proc filter")
}

func checkOperationRoutes(g *Gateway, c *IdemgateConfig) error {
	var errs []error
	for _, p := range c.OperationPaths() {
		m, err := g.RouteFor(p)
		if err != nil {
			errs = append(errs, fmt.Errorf("operation path %s: %w", p, err))
			continue
		}
		if m.Route.GetMatch().GetPath() != p {
			errs = append(errs, fmt.Errorf("%s is served by route %q, listed before its own route", p, m.Route.GetName()))
		}
		runs, err := g.ExtProcRunsOn(p, m)
		switch {
		case err != nil:
			errs = append(errs, err)
		case !runs:
			errs = append(errs, fmt.Errorf("operation path %s: idemgate does not run on it", p))
		}
	}
	// Attaching costs nothing elsewhere: a path a route names that is not an
	// operation path opens no ext_proc stream.
	for _, vh := range g.VirtualHosts() {
		for _, r := range vh.GetRoutes() {
			probe := r.GetMatch().GetPath()
			if probe == "" {
				probe = r.GetMatch().GetPrefix()
			}
			if probe == "" || slices.Contains(c.OperationPaths(), probe) || nearMissOf(probe, c.OperationPaths()) {
				continue
			}
			runs, err := g.ExtProcRunsOn(probe, Match{VirtualHost: vh, Route: r})
			switch {
			case err != nil:
				errs = append(errs, err)
			case runs:
				errs = append(errs, fmt.Errorf("route %q: idemgate runs for %s, which is not an operation path", r.GetName(), probe))
			}
		}
	}
	return errors.Join(errs...)
}

// nearMissOf reports whether probe spells one of paths some other way
// (case, a suffix): such a route may run idemgate, which refuses it.
func nearMissOf(probe string, paths []string) bool {
	for _, p := range paths {
		if strings.HasPrefix(strings.ToLower(probe), strings.ToLower(p)) {
			return true
		}
	}
	return false
}

// NearMisses are spellings of an operation path that Envoy does not route to
// the operation but that some upstream frameworks treat as the same endpoint.
// Encoded spellings, "//" and dot segments are not among them: the shipped
// connection managers normalise those before routing (checkPathNormalisation),
// and the matcher's own test covers them for one that does not.
func NearMisses(path string) []string {
	out := []string{path + "/", path + "/x", path + ";a=b", path + ".json", strings.ToUpper(path)}
	if i := strings.LastIndex(path, "/"); i >= 0 && i+1 < len(path) {
		out = append(out, path[:i+1]+strings.ToUpper(path[i+1:i+2])+path[i+2:])
	}
	return out
}

// checkNearMisses: every other spelling of an operation path is answered by
// Envoy itself (no route, a direct response) or reaches idemgate, which
// refuses it; none reaches a cluster with idemgate skipped.
func checkNearMisses(g *Gateway, c *IdemgateConfig) error {
	var errs []error
	for _, p := range c.OperationPaths() {
		for _, probe := range NearMisses(p) {
			m, err := g.RouteFor(probe)
			if err != nil || m.Route.GetRoute() == nil {
				continue // Envoy answers itself
			}
			runs, err := g.ExtProcRunsOn(probe, m)
			switch {
			case err != nil:
				errs = append(errs, err)
			case !runs:
				errs = append(errs, fmt.Errorf("%s reaches cluster %q through route %q with idemgate skipped",
					probe, m.Route.GetRoute().GetCluster(), m.Route.GetName()))
			}
		}
	}
	return errors.Join(errs...)
}

func checkPerRouteKeys(g *Gateway, _ *IdemgateConfig) error {
	_, epName, err := g.ExtProc()
	if err != nil {
		return err
	}
	names := map[string]bool{}
	for _, f := range g.Filters {
		names[f.Name] = true
	}
	var errs []error
	check := func(where string, cfgs map[string]*anypb.Any) {
		for key, a := range cfgs {
			if !names[key] {
				errs = append(errs, fmt.Errorf("%s: typed_per_filter_config key %q names no HTTP filter", where, key))
			}
			if a.MessageIs(&extprocv3.ExtProcPerRoute{}) && key != epName {
				errs = append(errs, fmt.Errorf("%s: ExtProcPerRoute keyed %q, but the ext_proc filter is named %q", where, key, epName))
			}
		}
	}
	for _, vh := range g.VirtualHosts() {
		check("virtual host "+vh.GetName(), vh.GetTypedPerFilterConfig())
		for _, r := range vh.GetRoutes() {
			check("route "+r.GetName(), r.GetTypedPerFilterConfig())
		}
	}
	return errors.Join(errs...)
}

func checkConfirmRoutes(g *Gateway, c *IdemgateConfig) error {
	var errs []error
	for _, op := range c.Operations {
		m, err := g.RouteFor(op.ConfirmPath())
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if err := CheckConfirmRoute(g.HCM.GetRouteConfig(), m, op); err != nil {
			errs = append(errs, fmt.Errorf("operation %s: %w", op.Name, err))
		}
	}
	return errors.Join(errs...)
}

// CheckConfirmRoute checks the route a confirm takes: a finite timeout equal
// to the operation's upstream_timeout, its own retry policy retrying only on
// reset/connect-failure (an MCP endpoint: only before the request reached
// the upstream) as often as upstream_retries says, and nothing that
// rewrites or drops the idempotency header idemgate sets (a retry must carry
// the same key).
func CheckConfirmRoute(rc *routev3.RouteConfiguration, m Match, op Operation) error {
	ra := m.Route.GetRoute()
	if ra == nil {
		return fmt.Errorf("route %q does not forward the confirm upstream", m.Route.GetName())
	}
	var errs []error
	t := RouteTimeout(ra)
	if t == 0 {
		errs = append(errs, errors.New("confirm route needs a finite timeout (ttl.in_flight is checked against it)"))
	}
	if op.UpstreamTimeout != 0 && t != time.Duration(op.UpstreamTimeout) {
		errs = append(errs, fmt.Errorf("route timeout %v differs from upstream_timeout %v", t, time.Duration(op.UpstreamTimeout)))
	}
	rp := ra.GetRetryPolicy()
	if rp == nil {
		errs = append(errs, errors.New("confirm route must carry its own retry_policy (else the virtual host's applies)"))
	} else {
		on := strings.Split(strings.ReplaceAll(rp.GetRetryOn(), " ", ""), ",")
		slices.Sort(on)
		want := SafeRetryOn
		if op.MCP != nil {
			want = MCPRetryOn
		}
		if !slices.Equal(on, want) {
			errs = append(errs, fmt.Errorf("retry_on %q, want exactly %q", rp.GetRetryOn(), strings.Join(want, ",")))
		}
		if len(rp.GetRetriableStatusCodes()) > 0 || len(rp.GetRetriableHeaders()) > 0 {
			errs = append(errs, errors.New("retriable_status_codes/headers would retry answers idemgate must record"))
		}
		if op.UpstreamRetries != nil && int(numRetries(rp)) != *op.UpstreamRetries {
			errs = append(errs, fmt.Errorf("num_retries %d differs from upstream_retries %d", numRetries(rp), *op.UpstreamRetries))
		}
	}
	if h := op.IdempotencyHeader(); h != "" {
		for _, level := range []struct {
			name   string
			remove []string
			add    []*corev3.HeaderValueOption
		}{
			{"route_config", rc.GetRequestHeadersToRemove(), rc.GetRequestHeadersToAdd()},
			{"virtual host", m.VirtualHost.GetRequestHeadersToRemove(), m.VirtualHost.GetRequestHeadersToAdd()},
			{"route", m.Route.GetRequestHeadersToRemove(), m.Route.GetRequestHeadersToAdd()},
		} {
			for _, r := range level.remove {
				if strings.EqualFold(r, h) {
					errs = append(errs, fmt.Errorf("%s removes %s, which idemgate sets", level.name, h))
				}
			}
			for _, a := range level.add {
				if strings.EqualFold(a.GetHeader().GetKey(), h) {
					errs = append(errs, fmt.Errorf("%s sets %s, which idemgate sets", level.name, h))
				}
			}
		}
	}
	return errors.Join(errs...)
}

func numRetries(rp *routev3.RetryPolicy) uint32 {
	if rp.GetNumRetries() == nil {
		return 1 // Envoy's default
	}
	return rp.GetNumRetries().GetValue()
}

// ConfirmBudget is the longest a confirm can hold its IN_FLIGHT lease as Envoy
// is configured: every try running to the route timeout (conservative: the
// route timeout bounds all tries together, but a per_try_timeout setup would
// not), the backoff before each retry, and the response-headers and
// response-body messages to idemgate after the upstream answers.
func ConfirmBudget(ra *routev3.RouteAction, messageTimeout time.Duration) time.Duration {
	tries := time.Duration(1)
	backoff := time.Duration(0)
	if rp := ra.GetRetryPolicy(); rp != nil {
		n := time.Duration(numRetries(rp))
		tries += n
		maxBackoff := 250 * time.Millisecond // Envoy: 10 × the 25 ms default base
		if bo := rp.GetRetryBackOff(); bo != nil {
			switch {
			case bo.GetMaxInterval() != nil:
				maxBackoff = bo.GetMaxInterval().AsDuration()
			case bo.GetBaseInterval() != nil:
				maxBackoff = 10 * bo.GetBaseInterval().AsDuration()
			}
		}
		backoff = n * maxBackoff
	}
	return tries*RouteTimeout(ra) + backoff + 2*messageTimeout
}

func checkInFlightTTL(g *Gateway, c *IdemgateConfig) error {
	ep, _, err := g.ExtProc()
	if err != nil {
		return err
	}
	var errs []error
	for _, op := range c.Operations {
		m, err := g.RouteFor(op.ConfirmPath())
		if err != nil {
			errs = append(errs, err)
			continue
		}
		budget := ConfirmBudget(m.Route.GetRoute(), ep.GetMessageTimeout().AsDuration())
		if ttl := time.Duration(c.TTL.InFlight); ttl <= budget {
			errs = append(errs, fmt.Errorf("operation %s: ttl.in_flight %v is not above the confirm's worst case %v", op.Name, ttl, budget))
		}
	}
	return errors.Join(errs...)
}

func checkBodyLimit(g *Gateway, c *IdemgateConfig) error {
	limit := g.Listener.GetPerConnectionBufferLimitBytes()
	if limit == nil || int64(limit.GetValue()) != c.Limits.MaxBodyBytes {
		return fmt.Errorf("listener per_connection_buffer_limit_bytes is %v, want limits.max_body_bytes = %d",
			limit, c.Limits.MaxBodyBytes)
	}
	var errs []error
	for _, vh := range g.VirtualHosts() {
		if err := noLargerBuffer("virtual host "+vh.GetName(), vh, c.Limits.MaxBodyBytes); err != nil {
			errs = append(errs, err)
		}
		for _, r := range vh.GetRoutes() {
			if err := noLargerBuffer("route "+r.GetName(), r, c.Limits.MaxBodyBytes); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// bufferLimits is what VirtualHost and Route share: per-route body buffer
// limits that would let Envoy buffer more than idemgate accepts.
type bufferLimits interface {
	GetRequestBodyBufferLimit() *wrapperspb.UInt64Value
	GetPerRequestBufferLimitBytes() *wrapperspb.UInt32Value
}

func noLargerBuffer(where string, l bufferLimits, limit int64) error {
	if v := l.GetRequestBodyBufferLimit(); v != nil && v.GetValue() > uint64(limit) {
		return fmt.Errorf("%s: request_body_buffer_limit %d exceeds limits.max_body_bytes %d", where, v.GetValue(), limit)
	}
	if v := l.GetPerRequestBufferLimitBytes(); v != nil && int64(v.GetValue()) > limit {
		return fmt.Errorf("%s: per_request_buffer_limit_bytes %d exceeds limits.max_body_bytes %d", where, v.GetValue(), limit)
	}
	return nil
}

func checkPathNormalisation(g *Gateway, _ *IdemgateConfig) error {
	h := g.HCM
	var errs []error
	if !h.GetNormalizePath().GetValue() {
		errs = append(errs, errors.New("normalize_path must be true"))
	}
	if !h.GetMergeSlashes() {
		errs = append(errs, errors.New("merge_slashes must be true"))
	}
	switch h.GetPathWithEscapedSlashesAction() {
	case hcmv3.HttpConnectionManager_UNESCAPE_AND_REDIRECT, hcmv3.HttpConnectionManager_UNESCAPE_AND_FORWARD,
		hcmv3.HttpConnectionManager_REJECT_REQUEST:
	default:
		errs = append(errs, fmt.Errorf("path_with_escaped_slashes_action %v lets %%2F spell a path the routes do not see",
			h.GetPathWithEscapedSlashesAction()))
	}
	if h.GetCommonHttpProtocolOptions().GetHeadersWithUnderscoresAction() != corev3.HttpProtocolOptions_REJECT_REQUEST {
		errs = append(errs, errors.New("headers_with_underscores_action must be REJECT_REQUEST"))
	}
	return errors.Join(errs...)
}

func checkAdminLoopback(g *Gateway, _ *IdemgateConfig) error {
	admin := g.Bootstrap.GetAdmin()
	if admin == nil {
		return nil
	}
	if a := admin.GetAddress().GetSocketAddress().GetAddress(); a != "127.0.0.1" && a != "::1" {
		return fmt.Errorf("admin listens on %q; it must stay on loopback", a)
	}
	return nil
}
