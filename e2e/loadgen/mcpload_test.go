package main

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestMCPCallBodyIsAToolsCall(t *testing.T) {
	body := mcpCallBody(42, mcpConfirmTool, confirmBody([]byte(previewBody), "tok"))
	var call mcpCall
	require.NoError(t, json.Unmarshal(body, &call))
	require.Equal(t, "42", string(call.ID))
	require.Equal(t, "tools/call", call.Method)
	require.Equal(t, mcpConfirmTool, call.Params.Name)
	require.JSONEq(t, `"tok"`, string(call.Params.Arguments["fingerprint"]))
	require.JSONEq(t, `"1250.00"`, string(call.Params.Arguments["amount"]))
	require.Equal(t, "42", string(mcpRequestID(body)))
	require.Nil(t, mcpRequestID([]byte(previewBody)), "an HTTP body is not read as MCP")
}

// TestClassifyMCP: the marks need a result for the request's own id; a
// fingerprint counts only inside structuredContent.
func TestClassifyMCP(t *testing.T) {
	signed := `{"jsonrpc":"2.0","id":7,"result":{"content":[],"structuredContent":{"quote_id":"q","fingerprint":"v1.x","fingerprint_expires_at":"t"}}}`
	for _, c := range []struct {
		name, body, want string
	}{
		{"result", `{"jsonrpc":"2.0","id":7,"result":{"content":[]}}`, " " + markRPC},
		{"signed", signed, " " + markSigned + " " + markRPC},
		{"another id", `{"jsonrpc":"2.0","id":70,"result":{"content":[]}}`, ""},
		{"error", `{"jsonrpc":"2.0","id":7,"error":{"code":-32602,"message":"x"}}`, ""},
		{"fingerprint outside structuredContent", `{"jsonrpc":"2.0","id":7,"result":{"content":[{"type":"text","text":"\"fingerprint\":\"x\""}]}}`, " " + markRPC},
	} {
		t.Run(c.name, func(t *testing.T) {
			require.Equal(t, c.want, classifyMCP([]byte(c.body), []byte("7")))
		})
	}
}
