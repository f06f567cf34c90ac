package envoy

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

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

// snippetBootstrap is the smallest Envoy an operator might already run (a
// listener whose connection manager routes everything to an app) with every
// piece of ext_proc-filter.yaml pasted where its header says.
func snippetBootstrap(t *testing.T, snippet []byte) []byte {
	t.Helper()
	out, err := envoytest.PasteIntoBootstrap(snippet, envoytest.PasteOptions{UpstreamAddr: "127.0.0.1:8081"})
	require.NoError(t, err)
	return out
}

func TestFilterSnippetPassesEnvoyValidateInsideABootstrap(t *testing.T) {
	bin := envoytest.RequireEnvoy(t)
	bootstrap := snippetBootstrap(t, FilterSnippetYAML())
	_, err := envoytest.ValidateConfig(bin, bootstrap, t.TempDir())
	require.NoError(t, err, "bootstrap:\n%s", bootstrap)
	g, err := envoytest.DecodeBootstrap(bootstrap)
	require.NoError(t, err)
	c, err := envoytest.ReadIdemgateConfig(IdemgateYAML())
	require.NoError(t, err)
	for _, check := range []string{"idemgate runs on the operation paths and on no other route's", "near-miss operation paths never reach an upstream unguarded"} {
		for _, ch := range envoytest.BootstrapChecks() {
			if ch.Name == check {
				require.NoError(t, ch.Run(g, c), check)
			}
		}
	}
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
		{"a route to a cluster that does not exist", "cluster: payments\n                  timeout: 15s", "cluster: paymnets\n                  timeout: 15s",
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
	t.Run("the snippet's matcher action with another type", func(t *testing.T) {
		snippet := string(FilterSnippetYAML())
		action := "composite.v3.ExecuteFilterAction"
		require.Equal(t, 1, strings.Count(snippet, action))
		broken := strings.Replace(snippet, action, "composite.v3.ExecuteFilterActio", 1)
		_, err := envoytest.PasteIntoBootstrap([]byte(broken), envoytest.PasteOptions{UpstreamAddr: "127.0.0.1:8081"})
		require.NoError(t, err, "pasting does not decode the Anys")
		out, err := envoytest.ValidateConfig(bin, snippetBootstrap(t, []byte(broken)), t.TempDir())
		require.Error(t, err)
		require.Contains(t, out, "ExecuteFilterActio")
	})
}

func TestFlagsThatValidateModeCannotCheckAreRefused(t *testing.T) {
	// A deployment that passes its config inline would otherwise be
	// validated against the file alone.
	_, err := envoytest.ValidateCommand("/nonexistent/envoy", nil, t.TempDir(), []string{"--config-yaml", "{}"})
	require.ErrorContains(t, err, "--config-yaml")
}
