package extproc

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/extproc/mcp"
	"github.com/idemgate/idemgate/internal/extprocdriver"
	"github.com/idemgate/idemgate/state/memory"
)

// mcpBodyOnlyEnv serves mcpConfigYAML with the transfer operation's
// mcp.preview_response_headers: false (the refund operation on the same
// endpoint keeps the default).
func mcpBodyOnlyEnv(t testing.TB) *env {
	t.Helper()
	yaml := strings.Replace(mcpConfigYAML, "mcp: {endpoint: /mcp, preview_tool: transfer_preview,",
		"mcp: {preview_response_headers: false, endpoint: /mcp, preview_tool: transfer_preview,", 1)
	require.NotEqual(t, mcpConfigYAML, yaml)
	e := newEnv(t, nil, nil)
	e.cfg = testConfig(t, yaml)
	e.useStore(t, memory.New(memory.Options{Now: e.clock.Now}))
	return e
}

func transferPreviewCall(amount string) httpRequest {
	return mcpPost("user-alice", rpc(`1`, "tools/call", callParams("transfer_preview", transferArgs(amount, ""))), modern("tools/call", "transfer_preview")...)
}

// A 2026-07-28 call of the preview tool costs 3 messages: its response
// headers are switched off at the request headers (Mcp-Name names the
// tool), the status comes as response.code on the response body, the
// framing is read from the body, and the fingerprint confirms once. JSON
// and event-stream answers alike.
func TestMCPPreviewWithoutResponseHeaders(t *testing.T) {
	for _, sse := range []bool{false, true} {
		t.Run(map[bool]string{false: "json", true: "sse"}[sse], func(t *testing.T) {
			e := mcpBodyOnlyEnv(t)
			d := fakeDialer{srv: e.srv}
			up := newMCPServer(sse)
			res := doWith(t, responseCodeFilter, d, transferPreviewCall(`7`), up.handle)
			require.Nil(t, res.immediate, string(res.body))
			require.Equal(t, 3, res.replies, "request headers, request body, response body")
			require.NotZero(t, res.marks&extprocdriver.MarkModeOverride)
			require.Zero(t, res.marks&extprocdriver.MarkDroppedHeaderMutation, "no header is set that Envoy would drop")
			r := finalMessage(t, res.body)["result"].(map[string]any)
			fp, _ := r["structuredContent"].(map[string]any)["fingerprint"].(string)
			require.NotEmpty(t, fp, string(res.body))
			require.Len(t, r["content"], 2, "the upstream's text block and idemgate's")
			require.Equal(t, 1.0, metricValue(t, e.metrics.decisions.WithLabelValues("transfer", "preview", "signed")))

			res = doWith(t, responseCodeFilter, d, mcpPost("user-alice", rpc(`2`, "tools/call", callParams("transfer_confirm", transferArgs(`7`, fp))), modern("tools/call", "transfer_confirm")...), up.handle)
			require.Nil(t, res.immediate, string(res.body))
			require.Equal(t, 4, res.replies, "a confirm keeps its response headers")
			require.Equal(t, 1, up.Executions())
		})
	}
}

// What keeps all four messages: an operation without the setting on the
// same endpoint, and a call whose headers do not name the tool (a client
// before 2026-07-28 sends no Mcp-Name; the body decides, too late to switch
// the response headers off). Both are signed as before.
func TestMCPPreviewKeepsResponseHeadersUnlessNamed(t *testing.T) {
	e := mcpBodyOnlyEnv(t)
	d := fakeDialer{srv: e.srv}
	up := newMCPServer(false)
	for name, req := range map[string]httpRequest{
		"another operation": mcpPost("user-alice", rpc(`1`, "tools/call", callParams("refund_preview", `{"charge_id":"ch_1"}`)), modern("tools/call", "refund_preview")...),
		"an older client":   mcpPost("user-alice", rpc(`1`, "tools/call", callParams("transfer_preview", transferArgs(`7`, "")))),
	} {
		res := doWith(t, responseCodeFilter, d, req, up.handle)
		require.Nil(t, res.immediate, name)
		require.Equal(t, 4, res.replies, name)
		sc := finalMessage(t, res.body)["result"].(map[string]any)["structuredContent"].(map[string]any)
		require.NotEmpty(t, sc["fingerprint"], name)
	}
}

// Without a 2xx response.code nothing is signed: an error status passes
// unchanged, and a filter without the attribute (an attachment lacking
// response_attributes: [response.code]) gets an unsigned answer, logged,
// so no confirm can follow. A body the headers disagree with is refused
// before the upstream whatever the mode.
func TestMCPPreviewWithoutResponseHeadersSignsOnlyA2xxItCanSee(t *testing.T) {
	e := mcpBodyOnlyEnv(t)
	d := fakeDialer{srv: e.srv}
	up := newMCPServer(false)
	unavailable := func(map[string]string, []byte) upstreamReply {
		return upstreamReply{status: 503, headers: []header{{"content-type", "application/json"}}, body: []byte(`{"jsonrpc":"2.0","id":1,"error":{"code":-32603,"message":"busy"}}`)}
	}
	res := doWith(t, responseCodeFilter, d, transferPreviewCall(`7`), unavailable)
	require.Equal(t, 503, res.status)
	require.Equal(t, 3, res.replies)
	require.JSONEq(t, `{"jsonrpc":"2.0","id":1,"error":{"code":-32603,"message":"busy"}}`, string(res.body))
	require.Equal(t, 1.0, metricValue(t, e.metrics.decisions.WithLabelValues("transfer", "preview", "passed_through")))

	res = doWith(t, testFilter, d, transferPreviewCall(`7`), up.handle)
	require.Nil(t, res.immediate)
	require.Equal(t, 3, res.replies, "the response headers are still skipped")
	r := finalMessage(t, res.body)["result"].(map[string]any)
	require.NotContains(t, r["structuredContent"], "fingerprint", "passed through unsigned")
	require.Len(t, r["content"], 1)
	require.Equal(t, 1.0, metricValue(t, e.metrics.decisions.WithLabelValues("transfer", "preview", "status_unknown")))
	require.Contains(t, e.logs.String(), "response_attributes: [response.code]")

	called := false
	res = doWith(t, responseCodeFilter, d, mcpPost("user-alice", rpc(`1`, "tools/call", callParams("transfer_confirm", transferArgs(`7`, ""))), modern("tools/call", "transfer_preview")...),
		func(map[string]string, []byte) upstreamReply { called = true; return upstreamReply{status: 200} })
	protocolError(t, res, 400, float64(mcp.HeaderMismatch))
	require.False(t, called)
}
