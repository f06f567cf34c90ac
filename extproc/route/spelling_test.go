package route

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func testGuard(t *testing.T) *Guard {
	t.Helper()
	g, err := NewGuard([]GuardedPath{
		{Path: "/v1/transfers/preview", Methods: []string{"POST"}},
		{Path: "/v1/transfers/confirm", Methods: []string{"POST"}},
		{Path: "/v1/transfers/status", Methods: []string{"POST"}},
		{Path: "/v1/accounts/{account}/payouts/confirm", Methods: []string{"POST"}},
		{Path: "/mcp", Methods: []string{"POST"}},
	})
	require.NoError(t, err)
	return g
}

// TestGuardSpellings: every spelling a lenient upstream router may send to
// the confirm handler is told apart from the exact one.
func TestGuardSpellings(t *testing.T) {
	g := testGuard(t)
	for _, tc := range []struct {
		method, path string
		want         Verdict
		guarded      string
	}{
		{"POST", "/v1/transfers/confirm", Exact, "/v1/transfers/confirm"},
		{"POST", "/v1/transfers/confirm?x=1", Exact, "/v1/transfers/confirm"},
		{"POST", "/mcp", Exact, "/mcp"},
		{"POST", "/v1/accounts/acc-1/payouts/confirm", Exact, "/v1/accounts/{account}/payouts/confirm"},

		{"PUT", "/v1/transfers/confirm", WrongMethod, "/v1/transfers/confirm"},
		{"GET", "/v1/transfers/confirm?amount=1", WrongMethod, "/v1/transfers/confirm"},
		{"HEAD", "/v1/transfers/confirm", WrongMethod, "/v1/transfers/confirm"},
		{"OPTIONS", "/v1/transfers/confirm", WrongMethod, "/v1/transfers/confirm"},
		{"PATCH", "/v1/accounts/a/payouts/confirm", WrongMethod, "/v1/accounts/{account}/payouts/confirm"},
		{"DELETE", "/mcp", WrongMethod, "/mcp"},

		{"POST", "/v1/transfers/confirm/", NearMiss, "/v1/transfers/confirm"},
		{"POST", "/V1/transfers/confirm", NearMiss, "/v1/transfers/confirm"},
		{"POST", "/v1/TRANSFERS/Confirm", NearMiss, "/v1/transfers/confirm"},
		{"POST", "/v1/transfers/confirm;x=1", NearMiss, "/v1/transfers/confirm"},
		{"POST", "/v1/transfers;v=2/confirm", NearMiss, "/v1/transfers/confirm"},
		{"POST", "/v1/transfers/confirm.json", NearMiss, "/v1/transfers/confirm"},
		{"POST", "/v1/transfers/confirm.do.json", NearMiss, "/v1/transfers/confirm"},
		{"POST", "/v1/transfers/c%6Fnfirm", NearMiss, "/v1/transfers/confirm"},
		{"POST", "/v1/transfers/c%256Fnfirm", NearMiss, "/v1/transfers/confirm"},
		{"POST", "/v1/transfers%2Fconfirm", NearMiss, "/v1/transfers/confirm"},
		{"POST", "//v1/transfers/confirm", NearMiss, "/v1/transfers/confirm"},
		{"POST", "/v1//transfers/confirm", NearMiss, "/v1/transfers/confirm"},
		{"POST", "/v1/./transfers/confirm", NearMiss, "/v1/transfers/confirm"},
		{"POST", "/v1/x/../transfers/confirm", NearMiss, "/v1/transfers/confirm"},
		{"POST", "/v1/%2e%2e/v1/transfers/confirm", NearMiss, "/v1/transfers/confirm"},
		{"POST", "/v1\\transfers\\confirm", NearMiss, "/v1/transfers/confirm"},
		{"POST", "/v1/transfers/confirm%20", NearMiss, "/v1/transfers/confirm"},
		{"POST", "/v1/transfers/confirm%00.png", NearMiss, "/v1/transfers/confirm"},
		{"POST", "/v1/tran%C5%BFfers/confirm", NearMiss, "/v1/transfers/confirm"}, // ſ (long s)
		{"POST", "/v1/transfers/conf%C4%B1rm", NearMiss, "/v1/transfers/confirm"}, // ı (dotless i)
		{"GET", "/v1/transfers/confirm/", NearMiss, "/v1/transfers/confirm"},
		{"POST", "/mcp/", NearMiss, "/mcp"},
		{"POST", "/MCP", NearMiss, "/mcp"},
		{"POST", "/mcp;x=1", NearMiss, "/mcp"},
		{"POST", "/v1/accounts/a/PAYOUTS/confirm/", NearMiss, "/v1/accounts/{account}/payouts/confirm"},
		// A path variable that a cleaning router reads as a dot segment.
		{"POST", "/v1/accounts/../payouts/confirm", NearMiss, "/v1/accounts/{account}/payouts/confirm"},
		{"POST", "/v1/accounts/%2e%2e/payouts/confirm", NearMiss, "/v1/accounts/{account}/payouts/confirm"},

		{"POST", "/v1/transfers", Unguarded, ""},
		{"POST", "/v1/transfers/confirmation", Unguarded, ""},
		{"POST", "/v1/transfers/confirm/extra", Unguarded, ""},
		{"GET", "/healthz", Unguarded, ""},
		{"POST", "/mcpx", Unguarded, ""},
		{"GET", "/static/app.js", Unguarded, ""},
	} {
		got, gp := g.Check(tc.method, tc.path)
		require.Equal(t, tc.want, got, "%s %s", tc.method, tc.path)
		require.Equal(t, tc.guarded, gp.Path, "%s %s", tc.method, tc.path)
		if tc.want != Unguarded {
			require.Equal(t, []string{"POST"}, gp.Methods)
		}
	}
}

func TestGuardMergesMethodsOfOnePath(t *testing.T) {
	g, err := NewGuard([]GuardedPath{
		{Path: "/v1/x", Methods: []string{"POST"}},
		{Path: "/v1/x", Methods: []string{"GET", "POST"}},
	})
	require.NoError(t, err)
	v, gp := g.Check("GET", "/v1/x")
	require.Equal(t, Exact, v)
	require.Equal(t, []string{"GET", "POST"}, gp.Methods)
	v, _ = g.Check("PUT", "/v1/x")
	require.Equal(t, WrongMethod, v)
}

func TestLoose(t *testing.T) {
	for in, want := range map[string]string{
		"/v1/Transfers/Confirm.json?x=1": "/v1/transfers/confirm",
		"/a/b/../../c":                   "/c",
		"/../../a":                       "/a",
		"/":                              "/",
		"/a%2":                           "/a%2",
		"/.well-known/x":                 "/.well-known/x",
	} {
		require.Equal(t, want, Loose(in), in)
	}
}

// TestGuardAllocatesNothingForAnExactPath: Check runs on every stream.
func TestGuardAllocatesNothingForAnExactPath(t *testing.T) {
	g := testGuard(t)
	allocs := testing.AllocsPerRun(100, func() {
		if v, _ := g.Check("POST", "/v1/accounts/acc-1/payouts/confirm?x=1"); v != Exact {
			t.Fatal(v)
		}
	})
	require.Zero(t, allocs)
}
