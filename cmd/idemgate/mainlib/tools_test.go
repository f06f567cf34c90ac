package mainlib

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestToolsCommand: `idemgate tools` prints the definitions of the shipped
// config in each format (the tooldefs golden files, which tooldefs checks
// against each provider's shape), needs no secret, and refuses bad input.
func TestToolsCommand(t *testing.T) {
	// envoy/idemgate.yaml reads its key from IDEMGATE_KEY_K1: unset here, and
	// the command must not need it.
	t.Setenv("IDEMGATE_KEY_K1", "")
	os.Unsetenv("IDEMGATE_KEY_K1")
	for _, f := range []string{"openai", "anthropic", "mcp"} {
		t.Run(f, func(t *testing.T) {
			var out, errOut bytes.Buffer
			require.NoError(t, Main(t.Context(), []string{"tools", "--config", "../../../envoy/idemgate.yaml", "--format", f}, &out, &errOut), errOut.String())
			want, err := os.ReadFile("../../../extproc/tooldefs/testdata/envoy-idemgate." + f + ".json")
			require.NoError(t, err)
			require.Equal(t, string(want), out.String())
		})
	}
	t.Run("usage", func(t *testing.T) {
		for _, args := range [][]string{
			{"tools"},
			{"tools", "--config", "../../../envoy/idemgate.yaml"},
			{"tools", "--format", "mcp"},
			{"tools", "--bogus"},
		} {
			var out, errOut bytes.Buffer
			require.ErrorIs(t, Main(t.Context(), args, &out, &errOut), ErrUsage, "%v", args)
			require.Empty(t, out.String())
		}
		var out bytes.Buffer
		require.NoError(t, Main(t.Context(), []string{"help"}, &out, &bytes.Buffer{}))
		require.Contains(t, out.String(), "idemgate tools --config FILE --format openai|anthropic|mcp")
	})
	t.Run("unknown format", func(t *testing.T) {
		var out, errOut bytes.Buffer
		err := Main(t.Context(), []string{"tools", "--config", "../../../envoy/idemgate.yaml", "--format", "gemini"}, &out, &errOut)
		require.ErrorContains(t, err, "unknown format")
		require.Empty(t, out.String())
	})
	t.Run("a config with problems", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "idemgate.yaml")
		require.NoError(t, os.WriteFile(path, []byte("operations: []\nbogus: 1\n"), 0o600))
		var out, errOut bytes.Buffer
		err := Main(t.Context(), []string{"tools", "--config", path, "--format", "openai"}, &out, &errOut)
		require.ErrorContains(t, err, "problem(s)")
		require.Contains(t, errOut.String(), "bogus")
		require.Empty(t, out.String())
	})
	t.Run("a tool name a provider refuses", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "idemgate.yaml")
		require.NoError(t, os.WriteFile(path, []byte(`signing: {active_key: k1, keys: {k1: {env: K1}}}
operations:
  - name: transfer
    scope: payments.transfer
    preview: {method: POST, path: /v1/transfers/preview}
    confirm: {method: POST, path: /v1/transfers/confirm}
    status:  {method: POST, path: /v1/transfers/status}
    preview_tool: payments.transfer_preview
    status_tool: transfer_status
    params: [amount]
`), 0o600))
		var out, errOut bytes.Buffer
		require.ErrorContains(t, Main(t.Context(), []string{"tools", "--config", path, "--format", "openai"}, &out, &errOut), "payments.transfer_preview")
		require.Empty(t, out.String())
		out.Reset()
		require.NoError(t, Main(t.Context(), []string{"tools", "--config", path, "--format", "mcp"}, &out, &errOut), "MCP allows dots")
		require.Contains(t, out.String(), `"name": "payments.transfer_confirm"`)
	})
}
