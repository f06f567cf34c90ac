package mcp

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/extproc/envelope"
)

func TestParseSSE(t *testing.T) {
	body := []byte("\xEF\xBB\xBF: comment\r\nid: 1\r\ndata: {\"a\":\r\ndata:1}\r\n\r\n" +
		"data:x\rretry: 5\r\r" +
		"event: ping\n\n" + // no data: not dispatched
		"data: cut")
	evs := ParseSSE(body)
	require.Len(t, evs, 2)
	require.Equal(t, "{\"a\":\n1}", string(evs[0].Data))
	require.Equal(t, []string{": comment", "id: 1"}, []string{string(evs[0].other[0]), string(evs[0].other[1])})
	require.Equal(t, "x", string(evs[1].Data))
	require.Equal(t, "data:x\rretry: 5\r\r", string(body[evs[1].Start:evs[1].End]))

	out := ReplaceEvent(body, evs[1], []byte(`{"b":2}`))
	require.Equal(t, string(body[:evs[1].Start])+"retry: 5\ndata: {\"b\":2}\n\n"+string(body[evs[1].End:]), string(out))
}

func TestSameID(t *testing.T) {
	require.True(t, SameID([]byte(`"xA"`), []byte(`"x\u0041"`)))
	require.True(t, SameID([]byte(`7`), []byte(`7.0`)))
	require.False(t, SameID([]byte(`7`), []byte(`"7"`)))
	require.False(t, SameID(nil, []byte(`null`)))
}

func TestDecodeNameHeader(t *testing.T) {
	for in, want := range map[string]string{"transfer_confirm": "transfer_confirm", "=?base64?dMOp?=": "té"} {
		got, ok := DecodeNameHeader(in)
		require.True(t, ok)
		require.Equal(t, want, got)
	}
	for _, in := range []string{"=?base64?***?=", "=?base64?dA==", "t\x01"} {
		_, ok := DecodeNameHeader(in)
		require.False(t, ok, in)
	}
}

func TestFraming(t *testing.T) {
	require.Equal(t, `{"jsonrpc":"2.0","id":"x\u0041","result":{}}`, string(Result([]byte(` "x\u0041" `), []byte(`{}`))))
	require.Equal(t, `{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"Parse \"error\""}}`, string(Error(nil, ParseError, `Parse "error"`)))
}

func guardedTools(name string) bool { return name == "transfer_confirm" || name == "transfer_preview" }

func TestParseRequest(t *testing.T) {
	req, f := ParseRequest([]byte(` {"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"transfer_confirm","arguments":{"a":1},"_meta":{"k":"v"}}} `), guardedTools, 32)
	require.Nil(t, f)
	require.NoError(t, req.Refused)
	require.Equal(t, "tools/call", req.Method)
	require.Equal(t, "transfer_confirm", req.Name)
	require.Equal(t, `7`, string(req.ID))
	require.Equal(t, `{"a":1}`, string(req.Arguments))

	fwd := ForwardBody(req, []byte(`{"a":1,"fingerprint":"f"}`), "fingerprint", false)
	require.Equal(t, `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"transfer_confirm","arguments":{"a":1},"_meta":{"k":"v"}}}`, string(fwd))
}

// TestParseRequestIsStrict: what a lax reader would route is refused,
// never passed on as an unguarded message.
func TestParseRequestIsStrict(t *testing.T) {
	call := func(params string) []byte {
		return []byte(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":` + params + `}`)
	}
	for name, tc := range map[string]struct {
		body []byte
		code int // 0: Refused (a guarded call answered as invalid params)
	}{
		"invalid UTF-8 in the tool name":           {call("{\"name\":\"transfer_confirm\xff\",\"arguments\":{}}"), InvalidRequest},
		"lone surrogate in the tool name":          {call(`{"name":"transfer_confirm\ud800","arguments":{}}`), InvalidRequest},
		"duplicate name":                           {call(`{"name":"weather","name":"transfer_confirm","arguments":{}}`), InvalidRequest},
		"duplicate method":                         {[]byte(`{"jsonrpc":"2.0","id":1,"method":"tools/list","method":"tools/call","params":{"name":"transfer_confirm"}}`), InvalidRequest},
		"duplicate id":                             {[]byte(`{"jsonrpc":"2.0","id":1,"id":2,"method":"tools/call","params":{"name":"weather"}}`), InvalidRequest},
		"invalid UTF-8 in an unguarded call":       {call("{\"name\":\"weather\",\"arguments\":{\"city\":\"\xff\"}}"), InvalidRequest},
		"duplicate in a guarded call's arguments":  {call(`{"name":"transfer_confirm","arguments":{"amount":1,"amount":2}}`), 0},
		"lone surrogate in a guarded call's _meta": {call(`{"name":"transfer_preview","arguments":{},"_meta":{"x":"\udc00"}}`), 0},
		"too deep for a guarded call":              {call(`{"name":"transfer_preview","arguments":{"a":` + strings.Repeat("[", 40) + strings.Repeat("]", 40) + `}}`), 0},
		"not JSON":                                 {[]byte(`{"id":1,`), ParseError},
	} {
		t.Run(name, func(t *testing.T) {
			req, f := ParseRequest(tc.body, guardedTools, 32)
			if tc.code == 0 {
				require.Nil(t, f)
				require.Error(t, req.Refused)
				return
			}
			require.NotNil(t, f)
			require.Equal(t, tc.code, f.Code, f.Message)
		})
	}
	f := CheckBatch([]byte("[{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/call\",\"params\":{\"name\":\"transfer_confirm\xff\"}}]"), guardedTools)
	require.NotNil(t, f)
	require.Equal(t, InvalidRequest, f.Code)
}

func TestOutcome(t *testing.T) {
	for msg, want := range map[string]Outcome{
		`{"id":1,"result":{"content":[]}}`:                  Done,
		`{"id":1,"result":{"resultType":"task"}}`:           Done,
		`{"id":1,"result":{"isError":true}}`:                Failed,
		`{"id":1,"error":{"code":-32602,"message":"x"}}`:    Failed,
		`{"id":1,"error":{"code":-32603,"message":"x"}}`:    Ambiguous,
		`{"id":1,"result":{"resultType":"input_required"}}`: Ambiguous,
	} {
		m, err := ReadMessage([]byte(msg))
		require.NoError(t, err)
		got, _ := OutcomeOf(m)
		require.Equal(t, want, got, msg)
	}
}

func TestFinalIsStrict(t *testing.T) {
	_, _, found := Final([]byte(`{"jsonrpc":"2.0","id":1,"result":{}}`), false, []byte(`1`))
	require.True(t, found)
	// A response some parsers read two ways is not taken for the answer:
	// a preview is then passed through unsigned, a confirm's outcome is
	// unknown.
	_, _, found = Final([]byte(`{"jsonrpc":"2.0","id":1,"result":{"isError":false,"isError":true}}`), false, []byte(`1`))
	require.False(t, found)
}

// TestPreviewBlockFill: filling the block rendered once gives what
// rendering the filled text gives, for the shipped texts and for texts with
// braces, escapes and repeated or missing placeholders; a value that would
// need escaping takes the general way and stays correct.
func TestPreviewBlockFill(t *testing.T) {
	texts := []string{
		envelope.MCPTexts("en", envelope.MCPTool{PreviewTool: "p", ConfirmTool: "c", StatusTool: "s", Field: "fingerprint"}).PreviewBlock,
		envelope.MCPTexts("zh", envelope.MCPTool{PreviewTool: "p", ConfirmTool: "c", StatusTool: "s", Field: "fingerprint"}).PreviewBlock,
		"{{fingerprint}} {expires_at}{fingerprint}\t\"quoted\" \\ {expires} {",
		"no placeholder at all",
	}
	for _, text := range texts {
		for _, v := range [][2]string{
			{"eyJ2IjoxfQ.c2ln-_", "2026-12-07T10:00:00Z"},
			{"a\"b\\c\n\u2028é", "{fingerprint}"},
		} {
			want := TextBlock(nil, strings.ReplaceAll(strings.ReplaceAll(text, "{expires_at}", v[1]), "{fingerprint}", v[0]))
			if v[1] == "{fingerprint}" {
				// One pass: a value is never scanned for placeholders.
				r := strings.NewReplacer("{fingerprint}", v[0], "{expires_at}", v[1])
				want = TextBlock(nil, r.Replace(text))
			}
			got := NewPreviewBlock(text).Fill(v[0], v[1])
			require.Equal(t, string(want), string(got), "%q with %q", text, v)
			var block struct{ Type, Text string }
			require.NoError(t, json.Unmarshal(got, &block))
		}
	}
}

// A JSON-RPC response is an object: anything else is read as events.
func TestSniffEventStream(t *testing.T) {
	for body, sse := range map[string]bool{
		`{"jsonrpc":"2.0","id":1,"result":{}}`: false,
		" \r\n\t{\"jsonrpc\":\"2.0\"}":         false,
		"event: message\ndata: {}\n\n":         true,
		"data: {}\n\n":                         true,
		": keep-alive\n\ndata: {}\n\n":         true,
		"\xEF\xBB\xBFdata: {}\n\n":             true,
		"":                                     true,
		`[{"jsonrpc":"2.0"}]`:                  true,
	} {
		require.Equal(t, sse, SniffEventStream([]byte(body)), "%q", body)
	}
}
