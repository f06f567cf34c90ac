package extproc

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/extproc/security"
)

// TestOtherSpellingsAndMethodsAreRefused: a request that names a guarded
// path in a way idemgate would not check never reaches the upstream,
// whatever Envoy's routes do with it (a lenient upstream router may run the
// guarded handler for it). Each answer is an envelope naming the exact
// route, with a security event.
func TestOtherSpellingsAndMethodsAreRefused(t *testing.T) {
	e := newEnv(t, nil, nil)
	d := fakeDialer{srv: e.srv}
	body := transferBody(`5`, "EUR", "DE89", "")
	for _, tc := range []struct {
		method, path string
		status       int
		envelope     string
		detail       string
	}{
		{"POST", "/v1/transfers/confirm/", 404, "path_not_exact", "use POST /v1/transfers/confirm"},
		{"POST", "/V1/transfers/confirm", 404, "path_not_exact", "use POST /v1/transfers/confirm"},
		{"POST", "/v1/transfers/confirm;x=1", 404, "path_not_exact", "use POST /v1/transfers/confirm"},
		{"POST", "/v1/transfers/confirm.json", 404, "path_not_exact", "use POST /v1/transfers/confirm"},
		{"POST", "/v1/transfers/c%6Fnfirm", 404, "path_not_exact", "use POST /v1/transfers/confirm"},
		{"POST", "//v1/transfers/confirm", 404, "path_not_exact", "use POST /v1/transfers/confirm"},
		{"POST", "/v1/./transfers/confirm", 404, "path_not_exact", "use POST /v1/transfers/confirm"},
		{"POST", "/v1/x/../transfers/confirm", 404, "path_not_exact", "use POST /v1/transfers/confirm"},
		{"POST", "/v1/transfers/PREVIEW", 404, "path_not_exact", "use POST /v1/transfers/preview"},
		{"POST", "/v1/accounts/%2e%2e/payouts/confirm", 404, "path_not_exact", "use POST /v1/accounts/{account}/payouts/confirm"},
		{"PUT", "/v1/transfers/confirm", 405, "method_not_allowed", "use POST /v1/transfers/confirm"},
		{"PATCH", "/v1/transfers/confirm", 405, "method_not_allowed", "use POST /v1/transfers/confirm"},
		{"DELETE", "/v1/transfers/confirm", 405, "method_not_allowed", "use POST /v1/transfers/confirm"},
		{"GET", "/v1/transfers/confirm", 405, "method_not_allowed", "use POST /v1/transfers/confirm"},
		{"HEAD", "/v1/transfers/confirm", 405, "method_not_allowed", "use POST /v1/transfers/confirm"},
		{"OPTIONS", "/v1/transfers/confirm", 405, "method_not_allowed", "use POST /v1/transfers/confirm"},
		{"POST", "/v1/orders/o1/cancel/status", 405, "method_not_allowed", "use GET /v1/orders/{order}/cancel/status"},
	} {
		t.Run(tc.method+" "+tc.path, func(t *testing.T) {
			req := post(tc.path, "alice", body)
			req.method = tc.method
			if tc.method == "GET" || tc.method == "HEAD" || tc.method == "OPTIONS" {
				req.body = nil
			}
			before := metricValue(t, e.metrics.securityEvents.WithLabelValues(tc.envelope))
			res := do(t, d, req, neverCalled(t))
			require.NotNil(t, res.immediate)
			require.Equal(t, tc.status, res.status)
			env := res.json(t)
			require.Equal(t, tc.envelope, env["status"])
			require.Equal(t, tc.detail, env["detail"])
			require.Equal(t, false, env["retryable"])
			require.Equal(t, before+1, metricValue(t, e.metrics.securityEvents.WithLabelValues(tc.envelope)))
			if tc.status == 405 {
				require.Equal(t, tc.detail[len("use "):len("use ")+len(res.headers["allow"])], res.headers["allow"])
			}
			require.Equal(t, 1, res.replies, "refused at request headers")
		})
	}
	require.Equal(t, float64(0), metricValue(t, e.metrics.passthrough))
}

// TestUnguardedPathsPassUntouched: paths that no lenient router reads as a
// guarded one go on with one message and every later phase switched off.
func TestUnguardedPathsPassUntouched(t *testing.T) {
	e := newEnv(t, nil, nil)
	d := fakeDialer{srv: e.srv}
	for _, path := range []string{"/v1/transfers", "/v1/transfers/confirmation", "/v1/transfers/confirm/extra", "/healthz", "/v1/orders/o1/cancel/status/x"} {
		called := false
		res := do(t, d, post(path, "alice", []byte(`{}`)), func(map[string]string, []byte) upstreamReply {
			called = true
			return upstreamReply{status: 200}
		})
		require.Nil(t, res.immediate, path)
		require.True(t, called, path)
		require.Equal(t, 1, res.replies, path)
	}
}

// TestConfirmWithRetryHeadersIsRefused: Envoy honours x-envoy-retry-on and
// its siblings from a client it counts as internal, and ext_proc never sees
// a router retry: one checked confirm could run several times.
func TestConfirmWithRetryHeadersIsRefused(t *testing.T) {
	e := newEnv(t, nil, nil)
	d := fakeDialer{srv: e.srv}
	fp := preview(t, d, "alice", `5`)
	for _, h := range []string{"x-envoy-retry-on", "x-envoy-max-retries", "x-envoy-upstream-rq-timeout-ms"} {
		res := do(t, d, post("/v1/transfers/confirm", "alice", transferBody(`5`, "EUR", "DE89", fp), header{h, "5xx"}), neverCalled(t))
		require.Equal(t, 400, res.status, h)
		require.Equal(t, "header_not_allowed", res.json(t)["status"], h)
		require.Equal(t, h, res.json(t)["detail"], h)
	}
	require.Equal(t, float64(3), metricValue(t, e.metrics.securityEvents.WithLabelValues(security.ReasonHeaderNotAllowed)))
	// The fingerprint was not consumed: the plain confirm executes once.
	p := newPayments()
	res := do(t, d, post("/v1/transfers/confirm", "alice", transferBody(`5`, "EUR", "DE89", fp)), p.handle)
	require.Nil(t, res.immediate)
	require.Equal(t, 1, p.Executions())
}

// TestMCPEndpointSpellings: the MCP endpoint is guarded like a route; its
// bodiless GET (the server-to-client stream) and DELETE (session end) go on.
func TestMCPEndpointSpellings(t *testing.T) {
	e := newMCPEnv(t, "")
	d := fakeDialer{srv: e.srv}
	for _, path := range []string{"/mcp/", "/MCP", "/mcp;x=1", "/mcp.json", "/%6dcp"} {
		req := mcpPost("alice", rpc("1", "tools/call", callParams("transfer_confirm", transferArgs("5", ""))))
		req.path = path
		res := do(t, d, req, neverCalled(t))
		require.Equal(t, 404, res.status, path)
	}
	for _, method := range []string{"PUT", "PATCH"} {
		req := mcpPost("alice", rpc("1", "tools/call", callParams("transfer_confirm", transferArgs("5", ""))))
		req.method = method
		res := do(t, d, req, neverCalled(t))
		require.Equal(t, 405, res.status, method)
	}
	// A GET or DELETE with a body could still be read as a call.
	req := mcpPost("alice", rpc("1", "tools/call", callParams("transfer_confirm", transferArgs("5", ""))))
	req.method = "GET"
	require.Equal(t, 405, do(t, d, req, neverCalled(t)).status)
	for _, method := range []string{"GET", "DELETE"} {
		called := false
		res := do(t, d, httpRequest{method: method, path: "/mcp", headers: []header{{"x-idemgate-subject", "alice"}}}, func(map[string]string, []byte) upstreamReply {
			called = true
			return upstreamReply{status: 405}
		})
		require.True(t, called, method)
		require.Nil(t, res.immediate, method)
	}
}
