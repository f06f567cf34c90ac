package config

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// upstreamTimeoutConfig is a config with an HTTP operation (its extra
// fields opFields) and an MCP operation, neither with upstream_timeout
// unless opFields sets it; top is added at the top level.
func upstreamTimeoutConfig(top, opFields string) []byte {
	return []byte(`signing: {active_key: k1, keys: {k1: {env: IDEMGATE_TEST_KEY_K1}}}
` + top + `
operations:
  - {name: t, scope: s, preview: {method: POST, path: /p}, confirm: {method: POST, path: /c}, status: {method: POST, path: /s}, preview_tool: a, status_tool: b, params: [x]` + opFields + `}
  - {name: m, scope: m, mcp: {endpoint: /mcp, preview_tool: mp, confirm_tool: mc, status_tool: ms}, params: [x]}
`)
}

// An operation without upstream_timeout gets a bounded default (never the
// "no timeout" Envoy reads into 0s), short enough that the in_flight rule
// holds for it with the operation's retries; 0s is refused.
func TestUpstreamTimeoutDefault(t *testing.T) {
	for _, tc := range []struct {
		name, top, opFields string
		wantHTTP, wantMCP   time.Duration
	}{
		{"default in_flight", "", "", DefaultUpstreamTimeout, DefaultUpstreamTimeout},
		{"default in_flight, retries", "", ", upstream_retries: 1", DefaultUpstreamTimeout, DefaultUpstreamTimeout},
		{"short in_flight, retries", "ttl: {in_flight: 30s}", ", upstream_retries: 2", 5 * time.Second, 15 * time.Second},
		{"very short in_flight", "ttl: {in_flight: 3s}", "", time.Second, time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rt, warns, err := Parse("f.yaml", upstreamTimeoutConfig(tc.top, tc.opFields), "", testOptions())
			require.NoError(t, err)
			require.Equal(t, tc.wantHTTP, rt.Operations[0].UpstreamTimeout)
			require.Equal(t, tc.wantMCP, rt.Operations[1].UpstreamTimeout)
			for _, w := range warns {
				require.NotContains(t, w.Error(), "should exceed upstream_timeout", "the default keeps the in_flight rule true")
			}
		})
	}
	_, _, err := Parse("f.yaml", upstreamTimeoutConfig("", ", upstream_timeout: 0s"), "", testOptions())
	require.ErrorContains(t, err, "operations[0].upstream_timeout: must be positive, got 0s")
}
