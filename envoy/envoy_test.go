package envoy

import (
	"bytes"
	"encoding/json"
	"os"
	"slices"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	headermutationv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/header_mutation/v3"
	jwtauthnv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/jwt_authn/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
	"sigs.k8s.io/yaml"

	"github.com/idemgate/idemgate/envoy/envoytest"
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
	require.Equal(t, "envoy.filters.http.ext_proc", name)
	tests := []struct {
		path        string
		route       string
		idemgate    bool
		wantCluster string
	}{
		{"/v1/transfers/preview", "transfer_preview", true, "payments"},
		{"/v1/transfers/confirm", "transfer_confirm", true, "payments"},
		{"/v1/transfers/status", "transfer_status", true, "payments"},
		{"/healthz", "healthz", false, ""},
		{"/v1/transfers/confirm/", "operation_near_miss", false, ""},
		{"/V1/TRANSFERS/CONFIRM", "operation_near_miss", false, ""},
		{"/v1/transfers/confirmations", "catch_all", false, "payments"},
		{"/v1/transfers/tr_123", "catch_all", false, "payments"},
		{"/", "catch_all", false, "payments"},
	}
	for _, tt := range tests {
		t.Run(tt.path, func(t *testing.T) {
			m, err := g.RouteFor(tt.path)
			require.NoError(t, err)
			require.Equal(t, tt.route, m.Route.GetName())
			off, err := envoytest.ExtProcDisabled(m.VirtualHost, m.Route, name)
			require.NoError(t, err)
			require.Equal(t, tt.idemgate, !off)
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

// snippet is ext_proc-filter.yaml: three pieces named after where they go.
type snippet struct {
	HTTPFilters          []json.RawMessage          `json:"http_filters"`
	Clusters             []json.RawMessage          `json:"clusters"`
	TypedPerFilterConfig map[string]json.RawMessage `json:"typed_per_filter_config"`
}

func decodeSnippet(t *testing.T) ([]*hcmv3.HttpFilter, []*clusterv3.Cluster, map[string]*anypb.Any) {
	t.Helper()
	js, err := yaml.YAMLToJSONStrict(readFile(t, "ext_proc-filter.yaml"))
	require.NoError(t, err)
	var s snippet
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.DisallowUnknownFields()
	require.NoError(t, dec.Decode(&s), "ext_proc-filter.yaml may only hold http_filters, clusters, typed_per_filter_config")

	var filters []*hcmv3.HttpFilter
	for _, raw := range s.HTTPFilters {
		var f hcmv3.HttpFilter
		require.NoError(t, envoytest.UnmarshalJSON(raw, &f))
		filters = append(filters, &f)
	}
	var clusters []*clusterv3.Cluster
	for _, raw := range s.Clusters {
		var c clusterv3.Cluster
		require.NoError(t, envoytest.UnmarshalJSON(raw, &c))
		clusters = append(clusters, &c)
	}
	perRoute := map[string]*anypb.Any{}
	for key, raw := range s.TypedPerFilterConfig {
		var a anypb.Any
		require.NoError(t, envoytest.UnmarshalJSON(raw, &a))
		perRoute[key] = &a
	}
	return filters, clusters, perRoute
}

func TestFilterSnippetMatchesTheBootstrap(t *testing.T) {
	filters, clusters, perRoute := decodeSnippet(t)
	g, c := loadDemo(t)
	require.Len(t, filters, 1)
	require.Len(t, clusters, 1)
	require.Len(t, perRoute, 1)

	t.Run("the ext_proc filter is envoy.yaml's and passes the checks", func(t *testing.T) {
		unpacked, err := envoytest.UnpackFilters(filters)
		require.NoError(t, err)
		ep, ok := unpacked[0].Config.(*extprocv3.ExternalProcessor)
		require.True(t, ok, "the snippet's filter must be ext_proc")
		require.NoError(t, envoytest.CheckExtProc(ep, c))
		idx := slices.IndexFunc(g.HCM.GetHttpFilters(), func(f *hcmv3.HttpFilter) bool { return f.GetName() == filters[0].GetName() })
		require.GreaterOrEqual(t, idx, 0, "envoy.yaml has no filter named %s", filters[0].GetName())
		require.True(t, proto.Equal(g.HCM.GetHttpFilters()[idx], filters[0]), "snippet and envoy.yaml ext_proc filters differ")
		require.Equal(t, ep.GetGrpcService().GetEnvoyGrpc().GetClusterName(), clusters[0].GetName())
	})
	t.Run("the cluster is envoy.yaml's and passes the checks", func(t *testing.T) {
		require.NoError(t, envoytest.CheckIdemgateCluster(clusters[0], c))
		require.True(t, proto.Equal(g.Clusters[clusters[0].GetName()], clusters[0]), "snippet and envoy.yaml idemgate clusters differ")
	})
	t.Run("the per-route switch is keyed by the filter name and disables it", func(t *testing.T) {
		a, ok := perRoute[filters[0].GetName()]
		require.True(t, ok, "typed_per_filter_config key must equal the filter name %s", filters[0].GetName())
		var per extprocv3.ExtProcPerRoute
		require.NoError(t, a.UnmarshalTo(&per))
		require.True(t, per.GetDisabled())
		m, err := g.RouteFor("/")
		require.NoError(t, err)
		require.True(t, proto.Equal(m.Route.GetTypedPerFilterConfig()[filters[0].GetName()], a),
			"snippet and envoy.yaml catch-all per-route configs differ")
	})
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
		{"catch-all runs idemgate", "idemgate runs on exactly the operation routes", func(t *testing.T, g *envoytest.Gateway, _ *envoytest.IdemgateConfig) {
			route(t, g, "catch_all").TypedPerFilterConfig = nil
		}},
		{"operation path renamed in idemgate.yaml", "idemgate runs on exactly the operation routes", func(t *testing.T, _ *envoytest.Gateway, c *envoytest.IdemgateConfig) {
			c.Operations[0].Confirm.Path = "/v2/transfers/confirm"
		}},
		{"prefix route shadows confirm", "idemgate runs on exactly the operation routes", func(t *testing.T, g *envoytest.Gateway, _ *envoytest.IdemgateConfig) {
			vh := g.VirtualHosts()[0]
			vh.Routes = append([]*routev3.Route{route(t, g, "catch_all")}, vh.Routes...)
		}},
		{"near-miss route removed", "near-miss operation paths never reach an upstream unguarded", func(t *testing.T, g *envoytest.Gateway, _ *envoytest.IdemgateConfig) {
			vh := g.VirtualHosts()[0]
			vh.Routes = slices.DeleteFunc(vh.Routes, func(r *routev3.Route) bool { return r.GetName() == "operation_near_miss" })
		}},
		{"per-route key misspelt", "per-route configs are keyed by existing filter names", func(t *testing.T, g *envoytest.Gateway, _ *envoytest.IdemgateConfig) {
			r := route(t, g, "healthz")
			r.TypedPerFilterConfig["ext_proc"] = r.TypedPerFilterConfig["envoy.filters.http.ext_proc"]
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
