package envoy

import (
	"os"
	"slices"
	"testing"
	"time"

	xdsmatcherv3 "github.com/cncf/xds/go/xds/type/matcher/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	headermutationv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/header_mutation/v3"
	jwtauthnv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/jwt_authn/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/idemgate/idemgate/cmd/idemgate/settings"
	"github.com/idemgate/idemgate/envoy/envoytest"
	"github.com/idemgate/idemgate/envoy/pieces"
	"github.com/idemgate/idemgate/extproc/config"
)

// loadDemo decodes envoy.yaml strictly and reads idemgate.yaml loosely.
func loadDemo(t *testing.T) (*envoytest.Gateway, *envoytest.IdemgateConfig) {
	t.Helper()
	g, err := envoytest.DecodeBootstrap(readFile(t, "envoy.yaml"))
	require.NoError(t, err)
	c, err := envoytest.ReadIdemgateConfig(readFile(t, "idemgate.yaml"))
	require.NoError(t, err)
	return g, c
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	return b
}

func TestEmbeddedFilesAreTheFilesOnDisk(t *testing.T) {
	require.Equal(t, readFile(t, "envoy.yaml"), BootstrapYAML())
	require.Equal(t, readFile(t, "idemgate.yaml"), IdemgateYAML())
	require.Equal(t, readFile(t, "ext_proc-filter.yaml"), FilterSnippetYAML())
}

func TestBootstrapInvariants(t *testing.T) {
	g, c := loadDemo(t)
	for _, check := range envoytest.BootstrapChecks() {
		t.Run(check.Name, func(t *testing.T) {
			require.NoError(t, check.Run(g, c))
		})
	}
}

// TestBootstrapJWTIsTheDemoIssuer pins the demo identity: the tokens e2e mints
// with e2e/demoauth/demo-signing-key.pem verify against this provider, and the
// subject idemgate sees is their `sub`.
func TestBootstrapJWTIsTheDemoIssuer(t *testing.T) {
	g, _ := loadDemo(t)
	jwt, err := g.JWTAuthn()
	require.NoError(t, err)
	require.Len(t, jwt.GetProviders(), 1)
	p := jwt.GetProviders()["demo"]
	require.NotNil(t, p, "provider must be named demo")
	require.Equal(t, "https://auth.demo.idemgate.invalid", p.GetIssuer())
	require.Equal(t, []string{"idemgate-demo"}, p.GetAudiences())
	require.Equal(t, string(readFile(t, "../e2e/demoauth/jwks.json")), p.GetLocalJwks().GetInlineString(),
		"local_jwks.inline_string must be e2e/demoauth/jwks.json byte for byte")
	require.Len(t, p.GetFromHeaders(), 1)
	require.Equal(t, "Authorization", p.GetFromHeaders()[0].GetName())
	require.Equal(t, "Bearer ", p.GetFromHeaders()[0].GetValuePrefix())
	require.False(t, p.GetForward())
	require.Equal(t, "jwt_payload", p.GetPayloadInMetadata())
	require.Len(t, p.GetClaimToHeaders(), 1)
	require.Equal(t, "x-idemgate-subject", p.GetClaimToHeaders()[0].GetHeaderName())
	require.Equal(t, "sub", p.GetClaimToHeaders()[0].GetClaimName())

	hm, ok := g.Filters[0].Config.(*headermutationv3.HeaderMutation)
	require.True(t, ok)
	require.Equal(t, "x-idemgate-subject", hm.GetMutations().GetRequestMutations()[0].GetRemove())
}

// TestBootstrapRoutesAsDocumented walks the paths a reader of envoy.yaml would
// try and checks where each one lands.
func TestBootstrapRoutesAsDocumented(t *testing.T) {
	g, _ := loadDemo(t)
	_, name, err := g.ExtProc()
	require.NoError(t, err)
	require.Equal(t, envoytest.ExtProcFilter, name)
	tests := []struct {
		path        string
		route       string
		idemgate    bool
		wantCluster string
	}{
		{"/v1/transfers/preview", "transfer_preview", true, "payments"},
		{"/v1/transfers/confirm", "transfer_confirm", true, "payments"},
		{"/v1/transfers/status", "transfer_status", true, "payments"},
		{"/mcp", "transfer_mcp", true, "payments"},
		{"/healthz", "healthz", false, ""},
		// Near misses reach the catch-all with idemgate running: it refuses them.
		{"/v1/transfers/confirm/", "catch_all", true, "payments"},
		{"/V1/TRANSFERS/CONFIRM", "catch_all", true, "payments"},
		{"/mcp;x=1", "catch_all", true, "payments"},
		{"/v1/transfers/tr_123", "catch_all", false, "payments"},
		{"/", "catch_all", false, "payments"},
	}
	for _, tt := range tests {
		t.Run(tt.path, func(t *testing.T) {
			m, err := g.RouteFor(tt.path)
			require.NoError(t, err)
			require.Equal(t, tt.route, m.Route.GetName())
			runs, err := g.ExtProcRunsOn(tt.path, m)
			require.NoError(t, err)
			require.Equal(t, tt.idemgate, runs)
			require.Equal(t, tt.wantCluster, m.Route.GetRoute().GetCluster())
		})
	}
}

func TestBootstrapConfirmRouteNumbers(t *testing.T) {
	g, c := loadDemo(t)
	m, err := g.RouteFor("/v1/transfers/confirm")
	require.NoError(t, err)
	ra := m.Route.GetRoute()
	require.Equal(t, "reset,connect-failure", ra.GetRetryPolicy().GetRetryOn())
	require.EqualValues(t, 1, ra.GetRetryPolicy().GetNumRetries().GetValue())
	require.Equal(t, 10*time.Second, ra.GetTimeout().AsDuration())
	ep, _, err := g.ExtProc()
	require.NoError(t, err)
	require.Equal(t, time.Second, ep.GetMessageTimeout().AsDuration())
	require.Equal(t, 250*time.Millisecond, time.Duration(c.Store.Timeout))
	// 2 tries × 10s + 1 backoff of at most 1s + 2 response messages × 1s.
	require.Equal(t, 23*time.Second, envoytest.ConfirmBudget(ra, ep.GetMessageTimeout().AsDuration()))
	require.Equal(t, 2*time.Minute, time.Duration(c.TTL.InFlight))
}

// TestFilterSnippetIsTheGeneratorsOutput: ext_proc-filter.yaml is what
// `idemgate envoy-config --config envoy/idemgate.yaml` prints, byte for byte,
// so the paths a user pastes cannot drift from the operations.
func TestFilterSnippetIsTheGeneratorsOutput(t *testing.T) {
	s, _, err := settings.Load("idemgate.yaml", config.Options{Offline: true})
	require.NoError(t, err)
	out, err := pieces.Render(s.Runtime, pieces.Options{ConfigPath: "envoy/idemgate.yaml", IdemgateAddress: "127.0.0.1:50051", UpstreamCluster: envoytest.PaymentsCluster})
	require.NoError(t, err)
	require.Equal(t, string(out), string(FilterSnippetYAML()),
		"regenerate: go run ./cmd/idemgate envoy-config --config envoy/idemgate.yaml > envoy/ext_proc-filter.yaml")
}

// TestFilterSnippetIsInTheBootstrap: envoy.yaml carries every piece of
// ext_proc-filter.yaml unchanged, so the demo, e2e and the benchmarks run
// exactly what a user pastes.
func TestFilterSnippetIsInTheBootstrap(t *testing.T) {
	p, err := envoytest.DecodePieces(FilterSnippetYAML())
	require.NoError(t, err)
	g, c := loadDemo(t)
	require.NoError(t, envoytest.CheckCarriesPieces(g, p))
	require.Len(t, p.FiltersBeforeAuthentication, 1)
	require.Len(t, p.Filters, 1)
	require.Len(t, p.Clusters, 1)
	unpacked, err := envoytest.UnpackFilters(p.Filters)
	require.NoError(t, err)
	ep, ok := unpacked[0].Config.(*extprocv3.ExternalProcessor)
	require.True(t, ok, "the filter piece wraps ext_proc")
	require.NoError(t, envoytest.CheckExtProc(ep, c))
	require.NoError(t, envoytest.CheckIdemgateCluster(p.Clusters[0], c))

	// The check is not vacuous.
	g.HCM.LocalReplyConfig = nil
	require.ErrorContains(t, envoytest.CheckCarriesPieces(g, p), "local_reply_config")
}

// TestExtProcRunsExactlyWhereAPathCanNameAnOperation evaluates the filter's
// matcher as Envoy does: every spelling of an operation path runs idemgate,
// every other path skips it.
func TestExtProcRunsExactlyWhereAPathCanNameAnOperation(t *testing.T) {
	p, err := envoytest.DecodePieces(FilterSnippetYAML())
	require.NoError(t, err)
	unpacked, err := envoytest.UnpackFilters(p.Filters)
	require.NoError(t, err)
	f := unpacked[0]
	for path, want := range map[string]bool{
		"/v1/transfers/confirm": true, "/v1/transfers/confirm?x=1": true, "/V1/Transfers/CONFIRM": true,
		"/v1/transfers/confirm/": true, "/v1/transfers/confirm;x": true, "/v1/transfers/confirm.json": true,
		"/v1/transfers/c%6Fnfirm": true, "//v1/transfers/confirm": true, "/v1/./transfers/confirm": true,
		"/v1/x/../transfers/confirm": true, `/v1\transfers\confirm`: true, "/v1/transfers/conf\u0131rm": true,
		"/mcp": true, "/MCP/": true, "/v1/transfers/preview": true, "/v1/transfers/status": true,
		"/": false, "/healthz": false, "/v1/transfers": false, "/v1/accounts/a1": false,
		"/search?q=a%20b": false, "/v1/transfers?next=/v1/transfers/confirm": false,
	} {
		runs, err := f.RunsFor(path)
		require.NoError(t, err)
		require.Equal(t, want, runs, path)
	}
}

// TestDecodingIsStrict shows that UnmarshalYAML fails the way Envoy would.
func TestDecodingIsStrict(t *testing.T) {
	tests := []struct {
		name string
		yaml string
	}{
		{"unknown field", `{name: c, connect_timeout: 1s, type: STATIC, conect_timeout: 1s}`},
		{"duplicate key", "name: c\nname: d\n"},
		{"wrong type", `{name: c, connect_timeout: soon}`},
		{"validation rule", `{name: "", type: STATIC}`},
		{"validation rule inside an Any", `{name: c, typed_extension_protocol_options: {envoy.extensions.upstreams.http.v3.HttpProtocolOptions: {"@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions, explicit_http_config: {http2_protocol_options: {max_concurrent_streams: 0}}}}}`},
		{"unregistered typed_config", `{name: c, typed_extension_protocol_options: {x: {"@type": type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua}}}`},
		{"unknown field inside an Any", `{name: c, typed_extension_protocol_options: {x: {"@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions, explicit_http2: {}}}}`},
		{"TypedStruct escape hatch", `{name: c, typed_extension_protocol_options: {x: {"@type": type.googleapis.com/xds.type.v3.TypedStruct, type_url: type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions, value: {bogus: 1}}}}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var c clusterv3.Cluster
			err := envoytest.UnmarshalYAML([]byte(tt.yaml), &c)
			require.Error(t, err)
			t.Log(err)
		})
	}
	var ok clusterv3.Cluster
	require.NoError(t, envoytest.UnmarshalYAML([]byte(`{name: c, type: STATIC, connect_timeout: 1s}`), &ok))
}

// TestChecksCatchBrokenConfigs breaks envoy.yaml one way at a time and expects
// exactly the check that guards that property to fail: the invariants are
// not vacuous.
func TestChecksCatchBrokenConfigs(t *testing.T) {
	tests := []struct {
		name  string
		check string
		edit  func(t *testing.T, g *envoytest.Gateway, c *envoytest.IdemgateConfig)
	}{
		{"fail open", "ext_proc fails closed, processes both bodies buffered", func(t *testing.T, g *envoytest.Gateway, _ *envoytest.IdemgateConfig) {
			extProc(t, g).FailureModeAllow = true
		}},
		{"response body not processed", "ext_proc fails closed, processes both bodies buffered", func(t *testing.T, g *envoytest.Gateway, _ *envoytest.IdemgateConfig) {
			extProc(t, g).ProcessingMode.ResponseBodyMode = extprocv3.ProcessingMode_STREAMED
		}},
		{"mode override off", "ext_proc fails closed, processes both bodies buffered", func(t *testing.T, g *envoytest.Gateway, _ *envoytest.IdemgateConfig) {
			extProc(t, g).AllowModeOverride = false
		}},
		{"body-only preview without response.code", "ext_proc fails closed, processes both bodies buffered", func(t *testing.T, _ *envoytest.Gateway, c *envoytest.IdemgateConfig) {
			// The shipped filter asks for no attribute: idemgate.yaml switching
			// a preview to fingerprint_header: false needs envoy-config again.
			off := false
			c.Operations[0].Preview.FingerprintHeader = &off
		}},
		{"gRPC timeout set", "ext_proc fails closed, processes both bodies buffered", func(t *testing.T, g *envoytest.Gateway, _ *envoytest.IdemgateConfig) {
			extProc(t, g).GrpcService.Timeout = durationpb.New(time.Second)
		}},
		{"message_timeout below the store budget", "ext_proc fails closed, processes both bodies buffered", func(t *testing.T, _ *envoytest.Gateway, c *envoytest.IdemgateConfig) {
			c.Store.Timeout = envoytest.Duration(300 * time.Millisecond)
		}},
		{"message_timeout above a route timeout", "message_timeout fits store.timeout and every route timeout", func(t *testing.T, g *envoytest.Gateway, _ *envoytest.IdemgateConfig) {
			route(t, g, "transfer_status").GetRoute().Timeout = durationpb.New(time.Second)
		}},
		{"subject header not stripped", "a client cannot send its own subject header", func(t *testing.T, g *envoytest.Gateway, _ *envoytest.IdemgateConfig) {
			g.Filters[0].Config.(*headermutationv3.HeaderMutation).Mutations.RequestMutations = nil
		}},
		{"filters reordered", "filters run header_mutation, jwt_authn, ext_proc, router", func(t *testing.T, g *envoytest.Gateway, _ *envoytest.IdemgateConfig) {
			g.Filters[1], g.Filters[2] = g.Filters[2], g.Filters[1]
		}},
		{"jwt sets another header", "jwt_authn sets the subject header on every operation", func(t *testing.T, g *envoytest.Gateway, _ *envoytest.IdemgateConfig) {
			jwt, err := g.JWTAuthn()
			require.NoError(t, err)
			jwt.Providers["demo"].ClaimToHeaders[0].HeaderName = "x-user"
		}},
		{"jwt not required on confirm", "jwt_authn sets the subject header on every operation", func(t *testing.T, g *envoytest.Gateway, _ *envoytest.IdemgateConfig) {
			jwt, err := g.JWTAuthn()
			require.NoError(t, err)
			jwt.Rules = slices.DeleteFunc(jwt.Rules, func(r *jwtauthnv3.RequirementRule) bool {
				return r.GetMatch().GetPath() == "/v1/transfers/confirm"
			})
		}},
		{"idemgate runs on every path", "idemgate runs on the operation paths and on no other route's", func(t *testing.T, g *envoytest.Gateway, _ *envoytest.IdemgateConfig) {
			extProcFilter(t, g).Matcher = nil
		}},
		{"operation path renamed in idemgate.yaml", "idemgate runs on the operation paths and on no other route's", func(t *testing.T, _ *envoytest.Gateway, c *envoytest.IdemgateConfig) {
			c.Operations[0].Confirm.Path = "/v2/transfers/confirm"
		}},
		{"prefix route shadows confirm", "idemgate runs on the operation paths and on no other route's", func(t *testing.T, g *envoytest.Gateway, _ *envoytest.IdemgateConfig) {
			vh := g.VirtualHosts()[0]
			vh.Routes = append([]*routev3.Route{route(t, g, "catch_all")}, vh.Routes...)
		}},
		{"catch-all disables idemgate", "near-miss operation paths never reach an upstream unguarded", func(t *testing.T, g *envoytest.Gateway, _ *envoytest.IdemgateConfig) {
			route(t, g, "catch_all").TypedPerFilterConfig = map[string]*anypb.Any{envoytest.ExtProcFilter: disabledPerRoute(t)}
		}},
		{"matcher matches the exact paths only", "near-miss operation paths never reach an upstream unguarded", func(t *testing.T, g *envoytest.Gateway, _ *envoytest.IdemgateConfig) {
			// Each operation path exactly (what per-route enabling would give):
			// the near misses on the catch-all skip idemgate.
			or := extProcFilter(t, g).Matcher.GetMatcherList().GetMatchers()[0].GetPredicate().GetOrMatcher()
			for _, p := range or.Predicate[1:] {
				vm := p.GetSinglePredicate().GetValueMatch()
				vm.MatchPattern = &xdsmatcherv3.StringMatcher_Exact{Exact: vm.GetPrefix()}
			}
		}},
		{"per-route key misspelt", "per-route configs are keyed by existing filter names", func(t *testing.T, g *envoytest.Gateway, _ *envoytest.IdemgateConfig) {
			route(t, g, "healthz").TypedPerFilterConfig = map[string]*anypb.Any{"ext_proc": disabledPerRoute(t)}
		}},
		{"confirm retries on 5xx", "confirm retries only on reset and connect-failure, keeping the key", func(t *testing.T, g *envoytest.Gateway, _ *envoytest.IdemgateConfig) {
			route(t, g, "transfer_confirm").GetRoute().RetryPolicy.RetryOn = "5xx,reset"
		}},
		{"confirm drops the idempotency key", "confirm retries only on reset and connect-failure, keeping the key", func(t *testing.T, g *envoytest.Gateway, _ *envoytest.IdemgateConfig) {
			route(t, g, "transfer_confirm").RequestHeadersToRemove = []string{"idempotency-key"}
		}},
		{"retries differ from upstream_retries", "confirm retries only on reset and connect-failure, keeping the key", func(t *testing.T, g *envoytest.Gateway, _ *envoytest.IdemgateConfig) {
			route(t, g, "transfer_confirm").GetRoute().RetryPolicy.NumRetries = wrapperspb.UInt32(3)
		}},
		{"in_flight shorter than the confirm", "ttl.in_flight outlives a confirm with all its retries", func(t *testing.T, _ *envoytest.Gateway, c *envoytest.IdemgateConfig) {
			c.TTL.InFlight = envoytest.Duration(20 * time.Second)
		}},
		{"buffer larger than max_body_bytes", "buffer limit equals limits.max_body_bytes", func(t *testing.T, g *envoytest.Gateway, _ *envoytest.IdemgateConfig) {
			g.Listener.PerConnectionBufferLimitBytes = wrapperspb.UInt32(4 << 20)
		}},
		{"escaped slashes kept", "paths are normalised before routing", func(t *testing.T, g *envoytest.Gateway, _ *envoytest.IdemgateConfig) {
			g.HCM.PathWithEscapedSlashesAction = hcmv3.HttpConnectionManager_KEEP_UNCHANGED
		}},
		{"admin on all interfaces", "admin listens on loopback only", func(t *testing.T, g *envoytest.Gateway, _ *envoytest.IdemgateConfig) {
			g.Bootstrap.Admin.Address.GetSocketAddress().Address = "0.0.0.0"
		}},
		{"cluster without HTTP/2", "ext_proc reaches the idemgate cluster over HTTP/2 with health checks", func(t *testing.T, g *envoytest.Gateway, _ *envoytest.IdemgateConfig) {
			g.Clusters["idemgate"].TypedExtensionProtocolOptions = nil
		}},
		{"cluster without health checks", "ext_proc reaches the idemgate cluster over HTTP/2 with health checks", func(t *testing.T, g *envoytest.Gateway, _ *envoytest.IdemgateConfig) {
			g.Clusters["idemgate"].HealthChecks = []*corev3.HealthCheck{}
		}},
		{"cluster not at grpc_listen", "ext_proc reaches the idemgate cluster over HTTP/2 with health checks", func(t *testing.T, _ *envoytest.Gateway, c *envoytest.IdemgateConfig) {
			c.GRPCListen = "127.0.0.1:50052"
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g, c := loadDemo(t)
			tt.edit(t, g, c)
			seen := false
			for _, check := range envoytest.BootstrapChecks() {
				err := check.Run(g, c)
				if check.Name == tt.check {
					seen = true
					require.Error(t, err, "check %q should catch this", check.Name)
					t.Log(err)
				}
			}
			require.True(t, seen, "no check named %q", tt.check)
		})
	}
}

func extProc(t *testing.T, g *envoytest.Gateway) *extprocv3.ExternalProcessor {
	t.Helper()
	ep, _, err := g.ExtProc()
	require.NoError(t, err)
	return ep
}

func extProcFilter(t *testing.T, g *envoytest.Gateway) *envoytest.Filter {
	t.Helper()
	for i := range g.Filters {
		if g.Filters[i].Name == envoytest.ExtProcFilter {
			return &g.Filters[i]
		}
	}
	t.Fatalf("no filter %q", envoytest.ExtProcFilter)
	return nil
}

func disabledPerRoute(t *testing.T) *anypb.Any {
	t.Helper()
	a, err := anypb.New(&extprocv3.ExtProcPerRoute{Override: &extprocv3.ExtProcPerRoute_Disabled{Disabled: true}})
	require.NoError(t, err)
	return a
}

func route(t *testing.T, g *envoytest.Gateway, name string) *routev3.Route {
	t.Helper()
	for _, vh := range g.VirtualHosts() {
		for _, r := range vh.GetRoutes() {
			if r.GetName() == name {
				return r
			}
		}
	}
	t.Fatalf("no route %q", name)
	return nil
}
