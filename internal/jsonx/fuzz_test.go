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
