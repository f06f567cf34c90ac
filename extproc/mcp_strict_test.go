package extproc

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestMCPRoutingIsStrict: MCP routing reads method, tool name and id with
// the binding rule's strictness (internal/jsonx). A message that only a lax
// parser reads — which an upstream may be — is refused; before, it was
// routed by a lax reading and could pass through as unguarded.
func TestMCPRoutingIsStrict(t *testing.T) {
	e := newMCPEnv(t, "")
	d := fakeDialer{srv: e.srv}
	const alice = "user-alice"

	for name, body := range map[string]string{
		// json.Valid accepts these; a lax upstream reads the name with
		// U+FFFD or the lone surrogate and may map it onto the confirm
		// tool, idemgate read it as no guarded tool.
		"invalid UTF-8 in the tool name":  "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/call\",\"params\":{\"name\":\"transfer_confirm\xff\",\"arguments\":{\"amount\":1}}}",
		"lone surrogate in the tool name": `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"transfer_confirm\ud800","arguments":{"amount":1}}}`,
		// Most parsers keep the last duplicate, some the first.
		"duplicate name":   `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"weather","arguments":{},"name":"transfer_confirm"}}`,
		"duplicate method": `{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"name":"transfer_confirm","arguments":{}},"method":"tools/call"}`,
		"duplicate id":     `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"weather","arguments":{}},"id":2}`,
		// An unguarded call is read as strictly: the message is refused as
		// a whole, not routed on what a lax reading says.
		"invalid UTF-8 in an unguarded call's arguments": "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/call\",\"params\":{\"name\":\"weather\",\"arguments\":{\"city\":\"\xff\"}}}",
		"a batch with invalid UTF-8 in a tool name":      "[{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/call\",\"params\":{\"name\":\"transfer_confirm\xff\"}}]",
	} {
		t.Run(name, func(t *testing.T) {
			res := do(t, d, mcpPost(alice, []byte(body)), neverCalled(t))
			protocolError(t, res, 400, -32600)
		})
	}

	t.Run("a guarded call with a lone surrogate in _meta is invalid params", func(t *testing.T) {
		res := do(t, d, mcpPost(alice, rpc(`3`, "tools/call", `{"name":"transfer_preview","arguments":`+transferArgs(`1`, "")+`,"_meta":{"note":"\udc00"}}`)), neverCalled(t))
		r := toolResult(t, res, `3`, "invalid_params", true)
		require.Contains(t, r["structuredContent"].(map[string]any)["detail"], "invalid JSON")
		require.Contains(t, e.logs.String(), "reason=ambiguous_key")
	})

	t.Run("an upstream preview result with a duplicate key is not signed", func(t *testing.T) {
		// Which isError counts is up to the client's parser: idemgate
		// does not take the message for the result it signs into.
		reply := func(map[string]string, []byte) upstreamReply {
			return upstreamReply{status: 200, headers: []header{{"content-type", "application/json"}},
				body: []byte(`{"jsonrpc":"2.0","id":4,"result":{"content":[],"isError":false,"isError":true}}`)}
		}
		res := do(t, d, mcpPost(alice, rpc(`4`, "tools/call", callParams("transfer_preview", transferArgs(`1`, "")))), reply)
		require.Nil(t, res.immediate)
		require.NotContains(t, string(res.body), "fingerprint")
	})
}
