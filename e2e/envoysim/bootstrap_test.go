package envoysim

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/e2e/demoauth"
)

func requireTestdataBootstrap(t *testing.T) []byte {
	t.Helper()
	b, err := os.ReadFile("testdata/bootstrap.yaml")
	require.NoError(t, err)
	return b
}

func TestFromBootstrapDerivesTheChain(t *testing.T) {
	cfg, err := FromBootstrap(requireTestdataBootstrap(t), map[string]string{"app": "127.0.0.1:9"}, "")
	require.NoError(t, err)

	require.Equal(t, "127.0.0.1:18080", cfg.Listener.Address)
	require.Equal(t, uint32(65536), cfg.Listener.PerConnectionBufferLimitBytes)
	require.Equal(t, Cluster{Address: "127.0.0.1:19000", ConnectTimeout: 250 * time.Millisecond, HTTP2: true}, cfg.Clusters["processor"])
	require.Equal(t, Cluster{Address: "127.0.0.1:9", ConnectTimeout: time.Second}, cfg.Clusters["app"])

	require.Equal(t, []HeaderMutationOp{{Remove: "x-idemgate-subject"}}, cfg.HeaderMutation.RequestMutations)

	p := cfg.JWTAuthn.Providers["demo"]
	require.Equal(t, demoauth.Issuer, p.Issuer)
	require.Equal(t, []string{demoauth.Audience}, p.Audiences)
	require.False(t, p.Forward)
	require.Equal(t, []JWTHeader{{Name: "Authorization", ValuePrefix: "Bearer "}}, p.FromHeaders)
	require.Equal(t, []ClaimToHeader{{HeaderName: "x-idemgate-subject", ClaimName: "sub"}}, p.ClaimToHeaders)
	require.Equal(t, "jwt_payload", p.PayloadInMetadata)
	require.JSONEq(t, string(demoauth.JWKS()), string(p.LocalJWKS))
	require.Equal(t, "/v1/transfers/confirm", cfg.JWTAuthn.Rules[0].Match.Path)
	require.Equal(t, "demo", cfg.JWTAuthn.Rules[0].Requires.ProviderName)

	ep := cfg.ExtProc
	require.Equal(t, "ext_proc", ep.Name)
	require.Equal(t, "processor", ep.GRPCService.ClusterName)
	require.Equal(t, time.Second, *ep.MessageTimeout)
	require.True(t, ep.AllowModeOverride)
	require.False(t, ep.FailureModeAllow)
	require.Equal(t, ProcessingMode{RequestBodyMode: BodyBuffered, ResponseBodyMode: BodyBuffered}, ep.ProcessingMode)
	require.Equal(t, []string{JWTAuthnMetadataNamespace}, ep.MetadataOptions.ForwardingNamespaces)

	routes := cfg.VirtualHosts[0].Routes
	require.Len(t, routes, 3)
	require.Equal(t, "app", routes[0].Cluster)
	require.Equal(t, 2*time.Second, *routes[0].Timeout)
	require.Equal(t, []string{"reset,connect-failure"}, routes[0].RetryPolicy.RetryOn)
	require.Equal(t, uint32(1), *routes[0].RetryPolicy.NumRetries)
	require.Equal(t, &DirectResponse{Status: 200, Body: "ok\n"}, routes[1].DirectResponse)
	require.True(t, routes[1].ExtProcPerRoute.Disabled)
	require.True(t, routes[2].ExtProcPerRoute.Disabled)
	require.Nil(t, routes[0].ExtProcPerRoute)

	cfg, err = FromBootstrap(requireTestdataBootstrap(t), nil, "127.0.0.1:0")
	require.NoError(t, err)
	require.Equal(t, "127.0.0.1:0", cfg.Listener.Address)
}

func TestFromBootstrapRefusesWhatItDoesNotModel(t *testing.T) {
	base := string(requireTestdataBootstrap(t))
	for _, tc := range []struct {
		name    string
		old     string
		new     string
		wantErr string
	}{
		{"unknown field", "stat_prefix: ingress", "stat_prefix: ingress\n          not_a_field: 1", "not_a_field"},
		{"observability mode", "message_timeout: 1s", "message_timeout: 1s\n              observability_mode: true", "observability_mode is not modelled"},
		{"send body early", "message_timeout: 1s", "message_timeout: 1s\n              send_body_without_waiting_for_header_response: true", "send_body_without_waiting_for_header_response"},
		{"full duplex", "request_body_mode: BUFFERED,", "request_body_mode: FULL_DUPLEX_STREAMED, request_trailer_mode: SEND,", "FULL_DUPLEX_STREAMED is not modelled"},
		{"buffered partial", "request_body_mode: BUFFERED,", "request_body_mode: BUFFERED_PARTIAL,", "BUFFERED_PARTIAL is not modelled"},
		{"grpc timeout", "grpc_service: {envoy_grpc: {cluster_name: processor}}", "grpc_service: {envoy_grpc: {cluster_name: processor}, timeout: 1s}", "grpc_service.timeout is not modelled"},
		{"typed metadata forwarding", "untyped: [envoy.filters.http.jwt_authn]", "typed: [envoy.filters.http.jwt_authn]", "forwarding_namespaces.typed is not modelled"},
		{"per-try timeout", `retry_policy: {retry_on: "reset,connect-failure", num_retries: 1}`, `retry_policy: {retry_on: "reset", per_try_timeout: 1s}`, "per_try_timeout is not modelled"},
		{"prefix rewrite", "route: {cluster: app}", "route: {cluster: app, prefix_rewrite: /x}", "prefix_rewrite is not modelled"},
		{"remote jwks", "local_jwks:\n                    inline_string:", "remote_jwks: {http_uri: {uri: 'https://x/jwks', cluster: app, timeout: 1s}}\n                  local_jwks_unused:\n                    inline_string:", "local_jwks_unused"},
		{"filter order", "- name: strip-subject", "- name: late\n            typed_config:\n              \"@type\": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router\n          - name: strip-subject", "in this order, each at most once"},
		{"unmodelled filter", "- name: strip-subject", "- name: cors\n            typed_config:\n              \"@type\": type.googleapis.com/envoy.extensions.filters.http.cors.v3.Cors\n          - name: strip-subject", "envoy.extensions.filters.http.cors.v3.Cors"},
		{"per-route key of another filter", "                  ext_proc:\n                    \"@type\": type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExtProcPerRoute\n                    disabled: true\n              - name: rest", "                  jwt:\n                    \"@type\": type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExtProcPerRoute\n                    disabled: true\n              - name: rest", "only per-route config for the ext_proc filter"},
		{"HTTP/2 codec", "stat_prefix: ingress", "stat_prefix: ingress\n          codec_type: HTTP2", "codec_type HTTP2 is not modelled"},
		{"ext_proc cluster without HTTP/2", "explicit_http_config: {http2_protocol_options: {}}", "explicit_http_config: {http_protocol_options: {}}", "must be HTTP/2"},
		{"header value formatter", "- remove: x-idemgate-subject", "- append: {header: {key: x-a, value: '%REQ(:path)%'}}", "substitution formatters"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Contains(t, base, tc.old, "the fixture changed")
			_, err := FromBootstrap([]byte(strings.Replace(base, tc.old, tc.new, 1)), nil, "")
			require.Error(t, err)
			require.Contains(t, err.Error(), tc.wantErr)
		})
	}
}

func TestNewRefusesUnmodelledConfig(t *testing.T) {
	good := baseConfig("127.0.0.1:1", "127.0.0.1:2")
	for _, tc := range []struct {
		name    string
		mutate  func(*Config)
		wantErr string
	}{
		{"observability", func(c *Config) { c.ExtProc.ObservabilityMode = true }, "observability_mode"},
		{"send body early", func(c *Config) { c.ExtProc.SendBodyWithoutWaitingForHeaderResponse = true }, "send_body_without_waiting_for_header_response"},
		{"full duplex", func(c *Config) { c.ExtProc.ProcessingMode.ResponseBodyMode = BodyFullDuplexStreamed }, "FULL_DUPLEX_STREAMED"},
		{"per-route partial", func(c *Config) {
			c.VirtualHosts[0].Routes[0].ExtProcPerRoute = &ExtProcPerRoute{ProcessingMode: &ProcessingMode{RequestBodyMode: BodyBufferedPartial}}
		}, "BUFFERED_PARTIAL"},
		{"route cache conflict", func(c *Config) {
			c.ExtProc.DisableClearRouteCache = true
			c.ExtProc.RouteCacheAction = 1
		}, "mutually exclusive"},
		{"unknown cluster", func(c *Config) { c.VirtualHosts[0].Routes[0].Cluster = "nope" }, `unknown cluster "nope"`},
		{"grpc cluster not HTTP/2", func(c *Config) { c.Clusters["extproc"] = Cluster{Address: "127.0.0.1:1"} }, "must be HTTP/2"},
		{"retry_on", func(c *Config) {
			c.VirtualHosts[0].Routes[0].RetryPolicy = &RetryPolicy{RetryOn: []string{"cancelled"}}
		}, `retry_on "cancelled"`},
		{"bad jwks", func(c *Config) {
			c.JWTAuthn = &JWTAuthn{Providers: map[string]JWTProvider{"p": {LocalJWKS: []byte("{")}}}
		}, "failed to parse the JWKS"},
		{"wildcard domain", func(c *Config) { c.VirtualHosts[0].Domains = []string{"*.example.com"} }, "wildcard domain"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := good
			cfg.ExtProc = new(ExtProc)
			*cfg.ExtProc = *good.ExtProc
			cfg.VirtualHosts = []VirtualHost{good.VirtualHosts[0]}
			cfg.VirtualHosts[0].Routes = append([]Route(nil), good.VirtualHosts[0].Routes...)
			cfg.Clusters = map[string]Cluster{}
			for k, v := range good.Clusters {
				cfg.Clusters[k] = v
			}
			tc.mutate(&cfg)
			_, err := New(cfg)
			require.Error(t, err)
			require.Contains(t, err.Error(), tc.wantErr)
		})
	}
}
