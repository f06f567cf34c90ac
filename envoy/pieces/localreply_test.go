package pieces_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/idemgate/idemgate/envoy/envoytest"
	"github.com/idemgate/idemgate/envoy/pieces"
)

// TestTooLargeMapperThroughEnvoy: the pieces' local_reply_config, run by the
// pinned Envoy, turns a 413 on every spelling idemgate guards (any case, a
// trailing "/", a query) into the request_too_large envelope, and leaves a
// 413 elsewhere alone. Every route answers a direct 413, which Envoy sends
// as a local reply through the mappers, as it does its buffer-overflow 413.
func TestTooLargeMapperThroughEnvoy(t *testing.T) {
	bin := envoytest.RequireEnvoy(t)
	p := render(t, templatedConfig, pieces.Options{ConfigPath: "test.yaml", IdemgateAddress: "127.0.0.1:50051", UpstreamCluster: "api"})
	lrc, err := protojson.Marshal(p.LocalReplyConfig)
	require.NoError(t, err)
	bootstrap := fmt.Sprintf(`{"static_resources": {"listeners": [{"name": "l", "address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}},
  "filter_chains": [{"filters": [{"name": "hcm", "typed_config": {
    "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
    "stat_prefix": "t", "local_reply_config": %s,
    "http_filters": [{"name": "envoy.filters.http.router", "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}],
    "route_config": {"virtual_hosts": [{"name": "all", "domains": ["*"], "routes": [
      {"match": {"prefix": "/"}, "direct_response": {"status": 413, "body": {"inline_string": "Payload Too Large"}}}]}]}}}]}]}]},
 "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}}}}`, lrc)
	e, err := envoytest.Start(t.Context(), envoytest.Options{Bin: bin, Bootstrap: []byte(bootstrap), Dir: t.TempDir()})
	require.NoError(t, err)
	t.Cleanup(func() { _ = e.Stop(0) })

	for path, envelope := range map[string]bool{
		"/v1/accounts/a1/payouts/confirm":         true,
		"/V1/Accounts/a1/PAYOUTS/Confirm":         true,
		"/v1/accounts/a1/payouts/confirm/":        true,
		"/v1/accounts/a1/payouts/preview/?x=1":    true,
		"/v1/accounts/a1/payouts/status?x=1":      true,
		"/v1/accounts/a1/payouts/confirm/x":       false,
		"/v1/accounts/a1/payouts/confirmation":    false,
		"/v1/accounts/a1/payouts":                 false,
		"/elsewhere/v1/accounts/a/payouts/status": false,
	} {
		resp, err := http.Post("http://"+e.ListenAddr+path, "application/json", nil)
		require.NoError(t, err, path)
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.NoError(t, err)
		require.Equal(t, http.StatusRequestEntityTooLarge, resp.StatusCode, path)
		var env struct {
			Status string `json:"status"`
		}
		if envelope {
			require.NoError(t, json.Unmarshal(body, &env), "%s: %s", path, body)
			require.Equal(t, "request_too_large", env.Status, path)
		} else {
			require.Equal(t, "Payload Too Large", string(body), path)
		}
	}
}
