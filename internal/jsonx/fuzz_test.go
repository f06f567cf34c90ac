package jsonx_test

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/internal/jsonx"
)

// FuzzString: String answers what json.Unmarshal answers, except that it
// refuses what the strict definition refuses (invalid UTF-8, a lone
// surrogate), which encoding/json replaces with U+FFFD.
func FuzzString(f *testing.F) {
	for _, s := range []string{`"tools/call"`, `"caf\u00e9"`, "\"\xff\"", `"a\"b"`, `"\ud800"`, `"\ud83d\ude00"`, ` "x" `, `"`, `1`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		got, ok := jsonx.String(raw)
		var want string
		trimmed := bytes.TrimSpace(raw)
		wantOK := len(trimmed) > 0 && trimmed[0] == '"' && json.Unmarshal(trimmed, &want) == nil
		if ok {
			require.True(t, wantOK, "%q", raw)
			require.Equal(t, want, got, "%q", raw)
			return
		}
		if wantOK {
			require.Error(t, jsonx.Check(trimmed), "%q: refused, yet strict", raw)
			require.True(t, jsonx.Lax(trimmed), "%q: refused for its grammar, which encoding/json accepts", raw)
		}
	})
}

// FuzzMembers: on input the strict reader accepts, Members finds what
// encoding/json finds, and Edit with nothing to change keeps the value.
func FuzzMembers(f *testing.F) {
	for _, s := range []string{`{}`, `{"a":1,"b":[1,{"c":"\u0041"}]}`, ` {"x" : "y"} `, `{"a":1,"a":2}`, `[1]`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		ms, err := jsonx.Members(raw)
		if err != nil {
			return
		}
		var want map[string]json.RawMessage
		require.NoError(t, json.Unmarshal(raw, &want), "%q", raw)
		require.Len(t, ms, len(want))
		for _, m := range ms {
			require.Equal(t, string(want[m.Key()]), string(m.Value))
		}
		var a, b any
		require.NoError(t, json.Unmarshal(raw, &a))
		require.NoError(t, json.Unmarshal(jsonx.Edit(raw, nil), &b))
		require.Equal(t, a, b)
	})
}

// FuzzReadInner: ReadInner accepts exactly what ReadNested accepts and
// reads the same members, inner ones included; only the depth is left out.
func FuzzReadInner(f *testing.F) {
	for _, s := range []string{`{}`, `{"id":1,"result":{"content":[{"type":"text"}],"structuredContent":{"a":[[1]]}}}`, `{"result":[1]}`, `{"result":{"a":1,"a":2}}`, `{"a":{"b":{}}}`, `[1]`, "{\"result\":\"\xff\"}"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		want, wantErr := jsonx.ReadNested(raw, "result")
		got, err := jsonx.ReadInner(raw, "result")
		require.Equal(t, wantErr == nil, err == nil, "%q: %v vs %v", raw, wantErr, err)
		require.Zero(t, got.Depth)
		require.Equal(t, len(want.Members), len(got.Members), "%q", raw)
		for i := range want.Members {
			require.Equal(t, string(want.Members[i].Value), string(got.Members[i].Value), "%q", raw)
		}
		require.Equal(t, len(want.Inner), len(got.Inner), "%q", raw)
		for i := range want.Inner {
			require.Equal(t, want.Inner[i].Key(), got.Inner[i].Key(), "%q", raw)
			require.Equal(t, string(want.Inner[i].Value), string(got.Inner[i].Value), "%q", raw)
		}
	})
}

// FuzzWrittenAsIs: what WrittenAsIs lets through, AppendString writes
// unchanged between its quotes (so a template may be filled by copying).
func FuzzWrittenAsIs(f *testing.F) {
	for _, s := range []string{"eyJ2IjoxfQ.sig-_", "2026-12-07T03:00:00Z", `a"b`, `a\b`, "tab\there", "caf\u00e9", "\u2028", "\xff", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if jsonx.WrittenAsIs(s) {
			require.Equal(t, `"`+s+`"`, string(jsonx.AppendString(nil, s)))
		}
	})
}
