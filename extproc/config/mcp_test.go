package config

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

const mcpHead = `
signing: {active_key: k1, keys: {k1: {env: IDEMGATE_TEST_KEY_K1}}}
operations:
`

const mcpGood = mcpHead + `  - name: transfer
    scope: payments.transfer
    mcp: {endpoint: /mcp, preview_tool: transfer_preview, confirm_tool: transfer_confirm, status_tool: transfer_status}
    params: [{path: amount, type: decimal}, currency, payee.account_id]
    result_ref: transfer_id
  - name: refund
    scope: payments.refund
    mcp: {endpoint: /mcp, preview_tool: refund_preview, confirm_tool: refund_confirm, status_tool: refund_status}
    params: [charge_id]
    downstream_idempotency_header: ""
  - name: payout
    scope: payments.payout
    preview: {method: POST, path: /v1/payouts/preview}
    confirm: {method: POST, path: /v1/payouts/confirm}
    status: {method: POST, path: /v1/payouts/status}
    preview_tool: payout_preview
    status_tool: payout_status
    params: [amount]
`

func TestMCPOperation(t *testing.T) {
	rt, warns, err := Parse("mcp.yaml", []byte(mcpGood), "", testOptions())
	require.NoError(t, err)
	require.Empty(t, warns)

	tr := rt.Operations[0]
	require.Equal(t, &MCPTools{Endpoint: "/mcp", PreviewTool: "transfer_preview", ConfirmTool: "transfer_confirm", StatusTool: "transfer_status"}, tr.MCP)
	require.Equal(t, "transfer_preview", tr.PreviewTool, "envelopes name the MCP tools")
	require.Equal(t, "transfer_status", tr.StatusTool)
	require.Equal(t, []string{"result", "structuredContent", "transfer_id"}, tr.ResultRef, "result_ref is inside structuredContent of the stored response")
	require.Equal(t, "transfer_id", tr.ResultRefPath)
	require.Nil(t, rt.Operations[2].MCP)

	ep := rt.MCPEndpoint("POST", "/mcp?x=1")
	require.NotNil(t, ep)
	require.Equal(t, "/mcp", ep.Path)
	require.Len(t, ep.Ops, 2)
	require.Equal(t, Target{Op: tr, Kind: KindConfirm}, ep.Tools["transfer_confirm"])
	require.Equal(t, Target{Op: rt.Operations[1], Kind: KindStatus}, ep.Tools["refund_status"])
	require.Len(t, ep.Tools, 6)
	require.Nil(t, rt.MCPEndpoint("GET", "/mcp"), "only POST carries JSON-RPC")
	require.Nil(t, rt.MCPEndpoint("POST", "/mcp/"))

	_, _, ok := rt.Routes.Match("POST", "/mcp")
	require.False(t, ok, "an MCP endpoint is not an HTTP route")
	_, _, ok = rt.Routes.Match("POST", "/v1/payouts/confirm")
	require.True(t, ok)

	var b strings.Builder
	require.NoError(t, rt.WriteSummary(&b, ProcessSummary{}))
	s := b.String()
	require.Contains(t, s, "mcp      POST /mcp (tools/list: transfer_confirm gains a required fingerprint argument, transfer_status is added)")
	require.Contains(t, s, "confirm  tool transfer_confirm  sends idempotency-key and params._meta[\"io.idemgate/idempotency-key\"], once per fingerprint")
	require.Contains(t, s, "confirm  tool refund_confirm  downstream ignores keys, once per fingerprint")
	require.Contains(t, s, "preview  POST /v1/payouts/preview  tool payout_preview")
}

func TestMCPOnlyOperations(t *testing.T) {
	rt, _, err := Parse("mcp.yaml", []byte(mcpHead+`  - name: transfer
    scope: payments.transfer
    mcp: {endpoint: /mcp, preview_tool: p, confirm_tool: c, status_tool: s}
    params: [amount]
`), "", testOptions())
	require.NoError(t, err)
	_, _, ok := rt.Routes.Match("POST", "/anything")
	require.False(t, ok)
	require.NotNil(t, rt.MCPEndpoint("POST", "/mcp"))
}

// TestMCPTrustUpstreamHeadersNeedsEveryOperation: an endpoint decides from
// the mirrored headers alone only when every operation on it says so.
func TestMCPTrustUpstreamHeadersNeedsEveryOperation(t *testing.T) {
	for _, tc := range []struct {
		first, second string
		want          bool
	}{
		{"", "", false},
		{"trust_upstream_headers: true, ", "", false},
		{"trust_upstream_headers: true, ", "trust_upstream_headers: true, ", true},
	} {
		rt, _, err := Parse("mcp.yaml", []byte(mcpHead+`  - name: transfer
    scope: payments.transfer
    mcp: {`+tc.first+`endpoint: /mcp, preview_tool: transfer_preview, confirm_tool: transfer_confirm, status_tool: transfer_status}
    params: [amount]
  - name: refund
    scope: payments.refund
    mcp: {`+tc.second+`endpoint: /mcp, preview_tool: refund_preview, confirm_tool: refund_confirm, status_tool: refund_status}
    params: [charge_id]
`), "", testOptions())
		require.NoError(t, err)
		require.Equal(t, tc.want, rt.MCPEndpoints["/mcp"].TrustUpstreamHeaders, "%+v", tc)
	}
}

func TestMCPBadConfigs(t *testing.T) {
	cases := []struct {
		name string
		yaml string
		want []string
	}{
		{"routes and mcp", `  - name: t
    scope: s
    preview: {method: POST, path: /p}
    mcp: {endpoint: /mcp, preview_tool: p, confirm_tool: c, status_tool: s}
    preview_tool: p
    params: [amount]
`, []string{
			"mcp.yaml:6:15: operations[0].preview: an operation is either HTTP routes or mcp, not both: remove preview (the MCP endpoint carries preview, confirm and status)",
			"mcp.yaml:8:19: operations[0].preview_tool: an MCP operation names its tools under mcp: use mcp.preview_tool",
		}},
		{"missing and bad fields", `  - name: t
    scope: s
    mcp: {endpoint: "mcp?x", confirm_tool: "bad tool", status_tool: s}
    params: [path.id, amount]
    replay: raw
`, []string{
			"mcp.yaml:6:11: operations[0].mcp.preview_tool: required: the upstream tool that quotes (its results get the fingerprint)",
			"mcp.yaml:6:44: operations[0].mcp.confirm_tool: invalid tool name \"bad tool\" (1-128 characters of A-Z a-z 0-9 _ . : / -)",
			"mcp.yaml:6:21: operations[0].mcp.endpoint: invalid endpoint \"mcp?x\": a path starting with / without query or {variables}",
			"mcp.yaml:8:13: operations[0].replay: an MCP operation always replays as a tool result (replay: raw would send the original JSON-RPC id, which the client no longer waits for)",
			"mcp.yaml:7:14: operations[0].params[0]: path.id: an MCP operation has no path variables; params are paths inside params.arguments",
		}},
		{"same tool twice", `  - name: t
    scope: s
    mcp: {endpoint: /mcp, preview_tool: x, confirm_tool: x, status_tool: s}
    params: [amount]
  - name: u
    scope: u
    mcp: {endpoint: /mcp, preview_tool: p2, confirm_tool: c2, status_tool: s}
    params: [amount]
`, []string{
			"mcp.yaml:6:58: operations[0].mcp.confirm_tool: tool \"x\" is already mcp.preview_tool: the three tools must differ",
			"mcp.yaml:10:76: operations[1].mcp.status_tool: tool \"s\" on /mcp is already a tool of operation \"t\"",
		}},
		{"endpoint is an HTTP route", `  - name: t
    scope: s
    preview: {method: POST, path: /mcp}
    confirm: {method: POST, path: /c}
    status: {method: POST, path: /s}
    preview_tool: p
    status_tool: q
    params: [amount]
  - name: u
    scope: u
    mcp: {endpoint: /mcp, preview_tool: p2, confirm_tool: c2, status_tool: s2}
    params: [amount]
`, []string{
			"mcp.yaml:14:21: operations[1].mcp.endpoint: POST /mcp is also the preview route of operation \"t\"",
		}},
		{"unknown key", `  - name: t
    scope: s
    mcp: {endpoint: /mcp, preview_tool: p, confirm_tool: c, status_tool: s, tools: []}
    params: [amount]
`, []string{
			"mcp.yaml:6:77: operations[0].mcp.tools: unknown key \"tools\" (known keys: confirm_tool, endpoint, preview_response_headers, preview_tool, status_tool, trust_upstream_headers)",
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			require.ElementsMatch(t, tc.want, parseErrors(t, "mcp.yaml", mcpHead+tc.yaml, testOptions()))
		})
	}
}

// mcp.preview_response_headers is on unless turned off; off, the
// operation's preview reads response.code (the filter must send it, and
// idemgate decodes attributes), and check-config says so.
func TestMCPPreviewResponseHeaders(t *testing.T) {
	rt, _, err := Parse("mcp.yaml", []byte(mcpGood), "", testOptions())
	require.NoError(t, err)
	require.False(t, rt.Operations[0].PreviewStatusFromAttribute())
	require.False(t, rt.ReadsResponseCode())

	off := strings.Replace(mcpGood, "mcp: {endpoint: /mcp, preview_tool: transfer_preview,", "mcp: {preview_response_headers: false, endpoint: /mcp, preview_tool: transfer_preview,", 1)
	require.NotEqual(t, mcpGood, off)
	rt, _, err = Parse("mcp.yaml", []byte(off), "", testOptions())
	require.NoError(t, err)
	require.True(t, rt.Operations[0].PreviewStatusFromAttribute())
	require.False(t, rt.Operations[1].PreviewStatusFromAttribute(), "per operation")
	require.True(t, rt.ReadsResponseCode())
	var b strings.Builder
	require.NoError(t, rt.WriteSummary(&b, ProcessSummary{}))
	require.Contains(t, b.String(), "its response headers skipped: the status is Envoy's response.code (3 ext_proc messages)")

	_, _, err = Parse("mcp.yaml", []byte(strings.Replace(off, "preview_response_headers: false", "preview_response_headers: nope", 1)), "", testOptions())
	require.ErrorContains(t, err, "mcp.yaml:6:37: operations[0].mcp.preview_response_headers: must be true or false")
}
