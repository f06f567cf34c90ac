package e2e

import (
	"context"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/e2e/internal/stack"
	"github.com/idemgate/idemgate/e2e/payments"
)

// mcpPython returns the interpreter of .ci/mcp-python.sh, which installs the
// official MCP Python SDK into the git-ignored .mcp-python/ when missing.
// Without it the test is skipped, unless IDEMGATE_REQUIRE_SERVICES=1 (make
// test), where that is a failure.
func mcpPython(t *testing.T) string {
	t.Helper()
	script, err := filepath.Abs(filepath.Join("..", ".ci", "mcp-python.sh"))
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, script).Output()
	if err != nil {
		msg := "the MCP Python SDK is not available (" + script + "): " + err.Error()
		var ee *exec.ExitError
		if errorsAs(err, &ee) {
			msg += ": " + strings.TrimSpace(string(ee.Stderr))
		}
		if os.Getenv("IDEMGATE_REQUIRE_SERVICES") == "1" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	return strings.TrimSpace(string(out))
}

func errorsAs(err error, target **exec.ExitError) bool {
	ee, ok := err.(*exec.ExitError)
	if ok {
		*target = ee
	}
	return ok
}

// pySeen is what the Python agent saw of one tool call.
type pySeen struct {
	IsError    bool           `json:"is_error"`
	Structured map[string]any `json:"structured"`
	Texts      []string       `json:"texts"`
	Meta       map[string]any `json:"meta"`
}

// TestMCPPythonSDK runs an agent on the official Python SDK (a client nobody
// here wrote) against the front: it must see the fingerprint argument and
// the status tool, preview, confirm once, get the retry replayed and the
// drifted amount refused as isError results it can show the model.
func TestMCPPythonSDK(t *testing.T) {
	if testing.Short() {
		t.Skip("e2e: needs services and the MCP Python SDK; skipped with -short")
	}
	mcpPython(t) // the SDK installed (or the test failed) before the stacks start
	for _, c := range []struct {
		name, mode string
		sse        bool
	}{
		{"2026-07-28 json", "auto", false},
		{"legacy sse", "legacy", true},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := startStack(t, stack.Options{})
			s.Payments.SetMCPStreaming(c.sse)
			a := startPyAgent(t, s, "bob")
			tools := a.connectMode("main", c.mode)
			args := map[string]any{"amount": "42.00", "currency": "EUR", "payee": map[string]any{"account_id": "acct_py"}, "memo": "books"}
			var seen struct {
				Tools                                  map[string]map[string]any
				Preview, Confirm, Retry, Drift, Status pySeen
			}
			seen.Tools = tools
			seen.Preview = *a.result(a.call("main", payments.MCPPreviewTool, args))
			args["fingerprint"] = seen.Preview.Structured["fingerprint"]
			seen.Confirm = *a.result(a.call("main", payments.MCPConfirmTool, args))
			args["memo"] = "books, again"
			seen.Retry = *a.result(a.call("main", payments.MCPConfirmTool, args))
			drifted := maps.Clone(args)
			drifted["amount"] = "4200.00"
			seen.Drift = *a.result(a.call("main", payments.MCPConfirmTool, drifted))
			seen.Status = *a.result(a.call("main", "transfer_status", map[string]any{"fingerprint": args["fingerprint"]}))

			require.Contains(t, seen.Tools, "transfer_status")
			confirmSchema := seen.Tools[payments.MCPConfirmTool]
			require.Contains(t, confirmSchema["required"], "fingerprint")
			require.Contains(t, confirmSchema["properties"], "fingerprint")

			fp, _ := seen.Preview.Structured["fingerprint"].(string)
			require.NotEmpty(t, fp)
			require.Contains(t, seen.Preview.Texts[len(seen.Preview.Texts)-1], fp)

			require.False(t, seen.Confirm.IsError, "%+v", seen.Confirm)
			transferID := seen.Confirm.Structured["transfer_id"]
			require.NotEmpty(t, transferID)

			require.False(t, seen.Retry.IsError)
			require.Equal(t, "already_completed", seen.Retry.Structured["status"])
			require.Equal(t, transferID, seen.Retry.Structured["result_ref"])
			require.Equal(t, true, seen.Retry.Meta["io.idemgate/replayed"])

			require.True(t, seen.Drift.IsError)
			require.Equal(t, "params_changed", seen.Drift.Structured["status"])
			require.Contains(t, seen.Drift.Texts[0], "transfer_preview")

			require.False(t, seen.Status.IsError)
			require.Equal(t, "completed", seen.Status.Structured["status"])
			require.Equal(t, 1, s.Payments.Executions(), "one execution")
		})
	}
}
