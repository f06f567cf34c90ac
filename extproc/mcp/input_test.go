package mcp

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
)

func call(t *testing.T, params string) Request {
	t.Helper()
	req, f := ParseRequest([]byte(`{"jsonrpc":"2.0","id":3,"method":"tools/call","params":`+params+`}`), guardedTools, 32)
	require.Nil(t, f)
	require.NoError(t, req.Refused)
	return req
}

// TestInputRound: the capability, the state and the responses are read as
// the client sent them; what is not one JSON shape only is a fault.
func TestInputRound(t *testing.T) {
	in, f := call(t, `{"name":"transfer_confirm","arguments":{},"_meta":{"io.modelcontextprotocol/clientCapabilities":{"elicitation":{"form":{},"url":{}}}},
		"inputResponses":{"io.idemgate/approval":{"action":"accept"}},"requestState":"igs1.x"}`).Input()
	require.Nil(t, f)
	require.True(t, in.URLElicitation)
	require.True(t, in.HasState)
	require.Equal(t, "igs1.x", in.State)
	require.True(t, in.HasApprovalResponse())
	require.True(t, in.OnlyApprovalResponse())

	for params, urlMode := range map[string]bool{
		`{"name":"transfer_confirm"}`: false,
		`{"name":"transfer_confirm","_meta":{"io.modelcontextprotocol/clientCapabilities":{"elicitation":{"form":{}}}}}`:  false,
		`{"name":"transfer_confirm","_meta":{"io.modelcontextprotocol/clientCapabilities":{"elicitation":{"url":true}}}}`: false,
		`{"name":"transfer_confirm","_meta":{"io.modelcontextprotocol/clientCapabilities":{"elicitation":{}},"url":{}}}`:  false,
		`{"name":"transfer_confirm","_meta":{"io.modelcontextprotocol/clientCapabilities":{"elicitation":{"url":{}}}}}`:   true,
	} {
		in, f := call(t, params).Input()
		require.Nil(t, f)
		require.Equal(t, urlMode, in.URLElicitation, params)
		require.False(t, in.HasState)
	}
	in, f = call(t, `{"name":"transfer_confirm","inputResponses":{"io.idemgate/approval":{},"other":{}}}`).Input()
	require.Nil(t, f)
	require.False(t, in.OnlyApprovalResponse())

	for _, params := range []string{
		`{"name":"transfer_confirm","requestState":7}`,
		`{"name":"transfer_confirm","requestState":null}`,
		`{"name":"transfer_confirm","inputResponses":[]}`,
		`{"name":"transfer_confirm","inputResponses":"x"}`,
		`{"name":"transfer_confirm","requestState":"a","RequestState":"b"}`,
		`{"name":"transfer_confirm","inputResponses":{},"inputresponses":{}}`,
	} {
		_, f := call(t, params).Input()
		require.NotNil(t, f, params)
		require.Equal(t, InvalidParams, f.Code, params)
	}
}

// TestForwardBodyStripsInput: the upstream gets neither idemgate's input
// responses nor its state; everything else keeps its bytes.
func TestForwardBodyStripsInput(t *testing.T) {
	req := call(t, `{"name":"transfer_confirm","arguments":{"a":1,"fingerprint":"f"},"inputResponses":{"io.idemgate/approval":{"action":"accept"}},"_meta":{"k":"v"},"requestState":"igs1.x"}`)
	fwd := ForwardBody(req, req.Arguments, "fingerprint", true)
	require.Equal(t, `{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"transfer_confirm","arguments":{"a":1},"_meta":{"k":"v"}}}`, string(fwd))
	kept := ForwardBody(req, req.Arguments, "fingerprint", false)
	require.Contains(t, string(kept), `"requestState":"igs1.x"`)
}

func TestInputRequired(t *testing.T) {
	var got map[string]any
	require.NoError(t, json.Unmarshal(InputRequired("https://a.example/approvals/apr_1", `approve "1500.00"`, "igs1.s"), &got))
	require.Equal(t, map[string]any{
		"resultType": "input_required",
		"inputRequests": map[string]any{"io.idemgate/approval": map[string]any{"method": "elicitation/create",
			"params": map[string]any{"mode": "url", "url": "https://a.example/approvals/apr_1", "message": `approve "1500.00"`}}},
		"requestState": "igs1.s",
	}, got)
}
