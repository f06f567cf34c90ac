package extproc

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestParseSSE(t *testing.T) {
	body := []byte("\xEF\xBB\xBF: comment\r\nid: 1\r\ndata: {\"a\":\r\ndata:1}\r\n\r\n" +
		"data:x\rretry: 5\r\r" +
		"event: ping\n\n" + // no data: not dispatched
		"data: cut")
	evs := parseSSE(body)
	require.Len(t, evs, 2)
	require.Equal(t, "{\"a\":\n1}", string(evs[0].data))
	require.Equal(t, []string{": comment", "id: 1"}, []string{string(evs[0].other[0]), string(evs[0].other[1])})
	require.Equal(t, "x", string(evs[1].data))
	require.Equal(t, "data:x\rretry: 5\r\r", string(body[evs[1].start:evs[1].end]))

	out := sseReplace(body, evs[1], []byte(`{"b":2}`))
	require.Equal(t, string(body[:evs[1].start])+"retry: 5\ndata: {\"b\":2}\n\n"+string(body[evs[1].end:]), string(out))
}

func TestRawJSON(t *testing.T) {
	obj := []byte(` {"id": "x\u0041", "params" : {"name":"t","arguments":{"a":1,"fingerprint":"f"}}, "n": [1, {"}":"]"}]}`)
	ms, ok := objectMembers(obj)
	require.True(t, ok)
	require.Equal(t, []string{"id", "params", "n"}, []string{ms[0].key, ms[1].key, ms[2].key})
	require.Equal(t, `"x\u0041"`, string(member(ms, "id")), "raw bytes kept")
	require.Equal(t, `[1, {"}":"]"}]`, string(member(ms, "n")))

	args := memberOf(member(ms, "params"), "arguments")
	require.Equal(t, `{"a":1}`, string(editObject(args, []string{"fingerprint"})))
	require.Equal(t, `{"a":2,"fingerprint":"f","b":true}`, string(editObject(args, nil, rawSet{"a", []byte("2")}, rawSet{"b", []byte("true")})))
	require.Equal(t, `[1,2]`, string(appendElements([]byte(" [ 1 ] "), []byte("2"))))
	require.Equal(t, `[2]`, string(appendElements(nil, []byte("2"))))
	require.Equal(t, `[2]`, string(appendElements([]byte("[]"), []byte("2"))))

	_, ok = objectMembers([]byte(`{"a":}`))
	require.False(t, ok)
	require.True(t, sameID([]byte(`"xA"`), []byte(`"x\u0041"`)))
	require.True(t, sameID([]byte(`7`), []byte(`7.0`)))
	require.False(t, sameID([]byte(`7`), []byte(`"7"`)))
	require.False(t, sameID(nil, []byte(`null`)))

	for in, want := range map[string]string{"transfer_confirm": "transfer_confirm", "=?base64?dMOp?=": "té"} {
		got, ok := decodeMCPHeader(in)
		require.True(t, ok)
		require.Equal(t, want, got)
	}
	for _, in := range []string{"=?base64?***?=", "=?base64?dA==", "t\x01"} {
		_, ok := decodeMCPHeader(in)
		require.False(t, ok, in)
	}
}

// TestJSONStringAgreesWithEncodingJSON: the fast path for plain strings
// answers what json.Unmarshal answers, for every input.
func TestJSONStringAgreesWithEncodingJSON(t *testing.T) {
	for _, raw := range []string{
		`"tools/call"`, `"transfer_preview"`, `""`, `"caf\u00e9"`, `"a\"b"`, `"tab\there"`, "\"raw\ttab\"",
		"\"bad \xff utf8\"", `"unterminated`, `"`, `12`, `null`, ` "spaced" `, `"é"`,
	} {
		checkJSONString(t, []byte(raw))
	}
}

func FuzzJSONString(f *testing.F) {
	for _, s := range []string{`"tools/call"`, `"caf\u00e9"`, "\"\xff\"", `"a\"b"`} {
		f.Add([]byte(s))
	}
	f.Fuzz(checkJSONString)
}

func checkJSONString(t *testing.T, raw []byte) {
	got, ok := jsonString(raw)
	var want string
	trimmed := bytes.TrimSpace(raw)
	wantOK := len(trimmed) > 0 && trimmed[0] == '"' && json.Unmarshal(trimmed, &want) == nil
	require.Equal(t, wantOK, ok, "%q", raw)
	if ok {
		require.Equal(t, want, got, "%q", raw)
	}
}
