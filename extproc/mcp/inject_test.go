package mcp

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/internal/jsonx"
)

// AppendInjected rewrites structuredContent and content in place and keeps
// every other byte of the upstream's message, whatever the members' order
// and spacing; what a result lacks is added before its closing brace.
func TestPreviewResultAppendInjected(t *testing.T) {
	fields := []jsonx.Set{{Key: "fingerprint", Text: "tok"}, {Key: "fingerprint_expires_at", Text: "2030-01-01T00:00:00Z"}}
	const block = `{"type":"text","text":"fp tok"}`
	const members = `"fingerprint":"tok","fingerprint_expires_at":"2030-01-01T00:00:00Z"`
	for _, tc := range []struct{ name, msg, want string }{
		{"content first",
			`{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"q"}],"structuredContent":{"fee":"0.50"},"isError":false}}`,
			`{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"q"},` + block + `],"structuredContent":{"fee":"0.50",` + members + `},"isError":false}}`},
		{"structuredContent first, spaced",
			"{ \"result\" : { \"structuredContent\" : { \"fee\" : 1 } ,\n \"content\" : [ {\"type\":\"text\",\"text\":\"q\"} ] } , \"id\" : 1 , \"jsonrpc\" : \"2.0\" }",
			"{ \"result\" : { \"structuredContent\" : { \"fee\" : 1," + members + "} ,\n \"content\" : [{\"type\":\"text\",\"text\":\"q\"}," + block + "] } , \"id\" : 1 , \"jsonrpc\" : \"2.0\" }"},
		{"an upstream's own fingerprint is replaced",
			`{"jsonrpc":"2.0","id":1,"result":{"content":[],"structuredContent":{"fingerprint":"forged","a":1}}}`,
			`{"jsonrpc":"2.0","id":1,"result":{"content":[` + block + `],"structuredContent":{"a":1,` + members + `}}}`},
		{"both absent",
			`{"jsonrpc":"2.0","id":1,"result":{"_meta":{"x":1}}}`,
			`{"jsonrpc":"2.0","id":1,"result":{"_meta":{"x":1},"structuredContent":{` + members + `},"content":[` + block + `]}}`},
		{"empty result",
			`{"jsonrpc":"2.0","id":1,"result":{ }}`,
			`{"jsonrpc":"2.0","id":1,"result":{ "structuredContent":{` + members + `},"content":[` + block + `]}}`},
		{"null structuredContent, content not an array",
			`{"jsonrpc":"2.0","id":1,"result":{"structuredContent":null,"content":"q"}}`,
			`{"jsonrpc":"2.0","id":1,"result":{"structuredContent":{` + members + `},"content":[` + block + `]}}`},
		{"an array has no room for members: the block carries them",
			`{"jsonrpc":"2.0","id":1,"result":{"structuredContent":[1,2]}}`,
			`{"jsonrpc":"2.0","id":1,"result":{"structuredContent":[1,2],"content":[` + block + `]}}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			msg, err := ReadMessage([]byte(tc.msg))
			require.NoError(t, err)
			res, ok := PreviewOf(msg)
			require.True(t, ok)
			prefix := []byte("kept:")
			out := res.AppendInjected(prefix, fields, []byte(block))
			require.Equal(t, "kept:"+tc.want, string(out))
			require.True(t, json.Valid(out[len(prefix):]))
			require.NoError(t, jsonx.Check(out[len(prefix):]), "strict JSON, no name twice")
		})
	}
}

// A result that is not an object is no CallToolResult: nothing is signed
// into it.
func TestPreviewOfNeedsAResultObject(t *testing.T) {
	for _, raw := range []string{
		`{"jsonrpc":"2.0","id":1,"result":"quote"}`,
		`{"jsonrpc":"2.0","id":1,"result":[]}`,
		`{"jsonrpc":"2.0","id":1,"result":null}`,
		`{"jsonrpc":"2.0","id":1,"error":{"code":-32000,"message":"x"}}`,
		`{"jsonrpc":"2.0","id":1,"result":{"isError":true}}`,
		`{"jsonrpc":"2.0","id":1,"result":{"resultType":"task"}}`,
	} {
		msg, err := ReadMessage([]byte(raw))
		require.NoError(t, err)
		_, ok := PreviewOf(msg)
		require.False(t, ok, raw)
	}
}
