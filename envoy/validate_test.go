package envoy

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"sigs.k8s.io/yaml"

	"github.com/idemgate/idemgate/envoy/envoytest"
)

// The pinned Envoy (.envoy-version) validates every Envoy config this
// directory and docker-compose.yaml ship. The strict decoding in the other
// tests cannot see what only Envoy knows: that a route's cluster exists, that
// a filter accepts its config at load time, that a command line parses.

func TestEnvoyYAMLPassesEnvoyValidate(t *testing.T) {
	bin := envoytest.RequireEnvoy(t)
	_, err := envoytest.ValidateConfig(bin, BootstrapYAML(), t.TempDir())
	require.NoError(t, err)
}

// snippetBootstrap is the smallest Envoy that an operator might already run
// (a listener whose connection manager routes everything to an app, with a
// router and nothing else) with the three pieces of ext_proc-filter.yaml
// pasted where its header says: the filter right before the router, the
// cluster beside the app's, the per-route switch on the route that is not an
// operation.
func snippetBootstrap(t *testing.T, snippet []byte) []byte {
	t.Helper()
	js, err := yaml.YAMLToJSONStrict(snippet)
	require.NoError(t, err)
	var pieces struct {
		HTTPFilters          []json.RawMessage          `json:"http_filters"`
		Clusters             []json.RawMessage          `json:"clusters"`
		TypedPerFilterConfig map[string]json.RawMessage `json:"typed_per_filter_config"`
	}
	require.NoError(t, json.Unmarshal(js, &pieces))
	require.NotEmpty(t, pieces.HTTPFilters)
	require.NotEmpty(t, pieces.Clusters)
	require.NotEmpty(t, pieces.TypedPerFilterConfig)

	raw := func(s string) json.RawMessage { return json.RawMessage(s) }
	filters := append(pieces.HTTPFilters, raw(`{"name":"envoy.filters.http.router","typed_config":{"@type":"type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}`))
	clusters := append([]json.RawMessage{raw(`{"name":"app","type":"STATIC","connect_timeout":"1s",
		"load_assignment":{"cluster_name":"app","endpoints":[{"lb_endpoints":[{"endpoint":{"address":{"socket_address":{"address":"127.0.0.1","port_value":8081}}}}]}]}}`)},
		pieces.Clusters...)
	routes := []any{
		map[string]any{"name": "transfer_confirm", "match": map[string]any{"path": "/v1/transfers/confirm"}, "route": map[string]any{"cluster": "app", "timeout": "10s"}},
		map[string]any{"name": "everything_else", "match": map[string]any{"prefix": "/"}, "route": map[string]any{"cluster": "app"},
			"typed_per_filter_config": pieces.TypedPerFilterConfig},
	}
	bootstrap := map[string]any{
		"static_resources": map[string]any{
			"listeners": []any{map[string]any{
				"name":    "existing",
				"address": map[string]any{"socket_address": map[string]any{"address": "127.0.0.1", "port_value": 10000}},
				"filter_chains": []any{map[string]any{"filters": []any{map[string]any{
					"name": "envoy.filters.network.http_connection_manager",
					"typed_config": map[string]any{
						"@type":       "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
						"stat_prefix": "existing",
						"route_config": map[string]any{"virtual_hosts": []any{map[string]any{
							"name": "app", "domains": []string{"*"}, "routes": routes,
						}}},
						"http_filters": filters,
					},
				}}}},
			}},
			"clusters": clusters,
		},
	}
	out, err := json.Marshal(bootstrap)
	require.NoError(t, err)
	return out
}

func TestFilterSnippetPassesEnvoyValidateInsideABootstrap(t *testing.T) {
	bin := envoytest.RequireEnvoy(t)
	bootstrap := snippetBootstrap(t, FilterSnippetYAML())
	_, err := envoytest.ValidateConfig(bin, bootstrap, t.TempDir())
	require.NoError(t, err, "bootstrap:\n%s", bootstrap)
}

// TestComposeEnvoyPassesEnvoyValidate validates what docker-compose's envoy
// service runs: the file it mounts at its -c path, with its command's flags.
func TestComposeEnvoyPassesEnvoyValidate(t *testing.T) {
	bin := envoytest.RequireEnvoy(t)
	svc := loadCompose(t).Services["envoy"]
	require.NotEmpty(t, svc.Command)
	require.Equal(t, "envoy", svc.Command[0], "the image's envoy binary")
	src, ok := mountSource(svc, flagValue(svc.Command, "-c"))
	require.True(t, ok, "the -c path of the envoy service is not mounted")
	cfg := readFile(t, filepath.Join("..", src))
	_, err := envoytest.ValidateCommand(bin, cfg, t.TempDir(), svc.Command[1:])
	require.NoError(t, err)
}

// TestEnvoyValidateRejectsBrokenConfigs shows the validation above can fail,
// on mistakes the strict decoding lets through and on ones it catches too.
// Two mistakes Envoy 1.40's validate mode does NOT catch, so the envoytest
// checks stay their guard: an ext_proc grpc_service naming a cluster that
// does not exist (the client is made per stream, at request time), and a
// typed_per_filter_config key that names no filter (checkExtProcCluster and
// checkPerRouteKeys).
func TestEnvoyValidateRejectsBrokenConfigs(t *testing.T) {
	bin := envoytest.RequireEnvoy(t)
	for _, tc := range []struct {
		name, old, new, want string
		decodes              bool // whether envoytest's strict decoding accepts it
	}{
		{"a route to a cluster that does not exist", "cluster: payments   # idemgate answers status", "cluster: paymnets   # idemgate answers status",
			"unknown cluster 'paymnets'", true},
		{"a misspelt ext_proc field", "message_timeout: 1s", "message_timeoutt: 1s", "message_timeoutt", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			shipped := string(BootstrapYAML())
			require.Equal(t, 1, strings.Count(shipped, tc.old), "the mutation must hit exactly one place")
			broken := []byte(strings.Replace(shipped, tc.old, tc.new, 1))
			_, decodeErr := envoytest.DecodeBootstrap(broken)
			require.Equal(t, tc.decodes, decodeErr == nil, "strict decoding: %v", decodeErr)
			out, err := envoytest.ValidateConfig(bin, broken, t.TempDir())
			require.Error(t, err)
			require.Contains(t, out, tc.want)
		})
	}
	t.Run("the snippet's per-route switch with the filter's own type", func(t *testing.T) {
		snippet := string(FilterSnippetYAML())
		per := "ext_proc.v3.ExtProcPerRoute"
		require.Equal(t, 1, strings.Count(snippet, per))
		broken := strings.Replace(snippet, per, "ext_proc.v3.ExternalProcessor", 1)
		out, err := envoytest.ValidateConfig(bin, snippetBootstrap(t, []byte(broken)), t.TempDir())
		require.Error(t, err)
		// protobuf varies the spaces in its messages on purpose.
		require.Regexp(t, `no\s+such\s+field:\s+'disabled'`, out)
	})
}

func TestFlagsThatValidateModeCannotCheckAreRefused(t *testing.T) {
	// A deployment that passes its config inline would otherwise be
	// validated against the file alone.
	_, err := envoytest.ValidateCommand("/nonexistent/envoy", nil, t.TempDir(), []string{"--config-yaml", "{}"})
	require.ErrorContains(t, err, "--config-yaml")
}
