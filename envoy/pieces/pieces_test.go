package pieces_test

import (
	"strings"
	"testing"

	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/cmd/idemgate/settings"
	"github.com/idemgate/idemgate/envoy/envoytest"
	"github.com/idemgate/idemgate/envoy/pieces"
	"github.com/idemgate/idemgate/extproc/config"
)

// templatedConfig has a templated operation whose downstream ignores keys,
// and reads the subject from jwt_authn metadata.
const templatedConfig = `
signing: {active_key: k1, keys: {k1: {env: IDEMGATE_TEST_KEY}}}
subject: {metadata: {namespace: envoy.filters.http.jwt_authn, path: jwt_payload.sub}}
store: {timeout: 400ms}
operations:
  - name: payout
    scope: payments.payout
    preview: {method: POST, path: "/v1/accounts/{account}/payouts/preview"}
    confirm: {method: POST, path: "/v1/accounts/{account}/payouts/confirm"}
    status: {method: POST, path: "/v1/accounts/{account}/payouts/status"}
    preview_tool: payout_preview
    status_tool: payout_status
    params: [path.account, amount]
    downstream_idempotency_header: ""
    upstream_timeout: 7s
    upstream_retries: 2
`

func parse(t *testing.T, yaml string) *settings.Settings {
	t.Helper()
	s, _, err := settings.Parse("test.yaml", []byte(yaml), t.TempDir(), config.Options{Offline: true})
	require.NoError(t, err)
	return s
}

// renderRaw is Render's YAML for yaml.
func renderRaw(t *testing.T, yaml string, o pieces.Options) []byte {
	t.Helper()
	out, err := pieces.Render(parse(t, yaml).Runtime, o)
	require.NoError(t, err)
	return out
}

// render is Render's output for yaml, decoded strictly.
func render(t *testing.T, yaml string, o pieces.Options) *envoytest.Pieces {
	t.Helper()
	out := renderRaw(t, yaml, o)
	p, err := envoytest.DecodePieces(out)
	require.NoError(t, err, "%s", out)
	return p
}

func TestTemplatedPathsAndMetadataSubject(t *testing.T) {
	p := render(t, templatedConfig, pieces.Options{ConfigPath: "test.yaml", IdemgateAddress: "10.0.0.7:7000", UpstreamCluster: "api"})

	require.Empty(t, p.FiltersBeforeAuthentication, "no header to strip when the subject is metadata")
	filters, err := envoytest.UnpackFilters(p.Filters)
	require.NoError(t, err)
	ep := filters[0].Config.(*extprocv3.ExternalProcessor)
	require.Equal(t, []string{"envoy.filters.http.jwt_authn"}, ep.GetMetadataOptions().GetForwardingNamespaces().GetUntyped())
	require.Equal(t, "2s", ep.GetMessageTimeout().AsDuration().String(), "4 x store.timeout, rounded to seconds")
	for path, want := range map[string]bool{
		"/v1/accounts/a1/payouts/confirm": true, "/V1/ACCOUNTS/a1/PAYOUTS/confirm/": true, "/v1/accounts/a1/payouts/confirm.json": true,
		"/v1/accounts/a%2f1/payouts/confirm": true, "/v1/accounts/a1": false, "/v1/accounts/a1/payouts": false,
	} {
		runs, err := filters[0].RunsFor(path)
		require.NoError(t, err)
		require.Equal(t, want, runs, path)
	}

	host, port, err := envoytest.SingleEndpoint(p.Clusters[0])
	require.NoError(t, err)
	require.Equal(t, "10.0.0.7", host)
	require.EqualValues(t, 7000, port)

	byName := map[string]*routev3.Route{}
	for _, r := range p.Routes {
		byName[r.GetName()] = r
		require.Equal(t, "api", r.GetRoute().GetCluster())
	}
	confirm := byName["payout_confirm"]
	require.NotNil(t, confirm)
	require.Equal(t, `/v1/accounts/[^/?#]+/payouts/confirm`, confirm.GetMatch().GetSafeRegex().GetRegex())
	require.Equal(t, "7s", confirm.GetRoute().GetTimeout().AsDuration().String())
	require.Equal(t, "connect-failure,reset-before-request", confirm.GetRoute().GetRetryPolicy().GetRetryOn(),
		"a downstream that ignores keys is never retried after the request may have arrived")
	require.EqualValues(t, 2, confirm.GetRoute().GetRetryPolicy().GetNumRetries().GetValue())
	require.Nil(t, byName["payout_preview"].GetRoute().GetRetryPolicy())
}

func TestRenderRefusesWhatItCannotWrite(t *testing.T) {
	s, _, err := settings.Parse("test.yaml", []byte(templatedConfig), t.TempDir(), config.Options{Offline: true})
	require.NoError(t, err)
	for _, o := range []pieces.Options{
		{IdemgateAddress: "no-port", UpstreamCluster: "api"},
		{IdemgateAddress: "127.0.0.1:99999", UpstreamCluster: "api"},
		{IdemgateAddress: "127.0.0.1:50051"},
	} {
		_, err := pieces.Render(s.Runtime, o)
		require.Error(t, err, "%+v", o)
	}
}

// mcpConfig has an MCP operation with retries and an HTTP operation that
// sets no upstream_timeout.
const mcpConfig = `
signing: {active_key: k1, keys: {k1: {env: IDEMGATE_TEST_KEY}}}
operations:
  - name: transfer
    scope: payments.transfer
    preview: {method: POST, path: /v1/transfers/preview}
    confirm: {method: POST, path: /v1/transfers/confirm}
    status: {method: POST, path: /v1/transfers/status}
    preview_tool: transfer_preview
    status_tool: transfer_status
    params: [amount]
  - name: transfer_mcp
    scope: payments.transfer.mcp
    mcp: {endpoint: /mcp, preview_tool: p, confirm_tool: c, status_tool: s}
    params: [amount]
    upstream_timeout: 20s
    upstream_retries: 2
`

// An operation without upstream_timeout gets the default route timeout,
// never 0s (Envoy: no timeout); the MCP route writes its operation's
// upstream_retries, retrying only what never reached the upstream.
func TestRouteTimeoutsAndMCPRetries(t *testing.T) {
	p := render(t, mcpConfig, pieces.Options{ConfigPath: "test.yaml", IdemgateAddress: "127.0.0.1:50051", UpstreamCluster: "api"})
	byName := map[string]*routev3.Route{}
	for _, r := range p.Routes {
		byName[r.GetName()] = r
		require.Positive(t, r.GetRoute().GetTimeout().AsDuration(), "route %s has no timeout", r.GetName())
	}
	require.Equal(t, config.DefaultUpstreamTimeout, byName["transfer_confirm"].GetRoute().GetTimeout().AsDuration())
	require.Equal(t, config.DefaultUpstreamTimeout, byName["transfer_preview"].GetRoute().GetTimeout().AsDuration())
	mcp := byName["transfer_mcp"].GetRoute()
	require.Equal(t, "20s", mcp.GetTimeout().AsDuration().String())
	require.Equal(t, pieces.MCPRetryOn, mcp.GetRetryPolicy().GetRetryOn())
	require.EqualValues(t, 2, mcp.GetRetryPolicy().GetNumRetries().GetValue())
}

// A preview whose fingerprint lives in the body only reads the upstream's
// status from the response.code attribute: the filter asks for it then,
// and only then.
func TestResponseCodeAttributeForABodyOnlyPreview(t *testing.T) {
	o := pieces.Options{ConfigPath: "test.yaml", IdemgateAddress: "10.0.0.7:7000", UpstreamCluster: "api"}
	attrs := func(yaml string) []string {
		filters, err := envoytest.UnpackFilters(render(t, yaml, o).Filters)
		require.NoError(t, err)
		return filters[0].Config.(*extprocv3.ExternalProcessor).GetResponseAttributes()
	}
	require.Empty(t, attrs(templatedConfig))
	bodyOnly := strings.Replace(templatedConfig, `path: "/v1/accounts/{account}/payouts/preview"}`, `path: "/v1/accounts/{account}/payouts/preview", fingerprint_header: false}`, 1)
	require.NotEqual(t, templatedConfig, bodyOnly)
	require.Equal(t, []string{"response.code"}, attrs(bodyOnly))

	require.Empty(t, attrs(mcpConfig))
	mcpBodyOnly := strings.Replace(mcpConfig, "mcp: {endpoint: /mcp,", "mcp: {preview_response_headers: false, endpoint: /mcp,", 1)
	require.NotEqual(t, mcpConfig, mcpBodyOnly)
	require.Equal(t, []string{"response.code"}, attrs(mcpBodyOnly), "an MCP preview whose response headers are skipped")
}
