package jsonx_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/internal/jsonx"
)

// strictRefusals are inputs that encoding/json's Valid accepts (or that a
// lax reader would route on) and that the strict definition refuses.
var strictRefusals = map[string]string{
	"duplicate name":          `{"a":1,"a":2}`,
	"duplicate via escape":    `{"a":1,"\u0061":2}`,
	"nested duplicate":        `{"p":{"x":[{"n":1,"n":2}]}}`,
	"invalid UTF-8":           "{\"a\":\"transfer_confirm\xff\"}",
	"invalid UTF-8 in a name": "{\"a\xff\":1}",
	"lone high surrogate":     `{"a":"\ud800"}`,
	"lone low surrogate":      `{"a":"\udc00x"}`,
	"byte order mark":         "\xef\xbb\xbf{}",
	"trailing data":           `{} {}`,
}

func TestCheck(t *testing.T) {
	for name, in := range strictRefusals {
		t.Run(name, func(t *testing.T) {
			require.ErrorIs(t, jsonx.Check([]byte(in)), jsonx.ErrInvalid)
			_, err := jsonx.Members([]byte(in))
			require.ErrorIs(t, err, jsonx.ErrInvalid)
		})
	}
	for _, in := range []string{`{}`, ` [1, "x", {"a":null}] `, `"\ud83d\ude00"`, `-0.5e+3`} {
		require.NoError(t, jsonx.Check([]byte(in)), in)
	}
}

func TestLaxOnlyLetsAmbiguityThrough(t *testing.T) {
	for name, in := range strictRefusals {
		if name == "byte order mark" || name == "trailing data" {
			require.False(t, jsonx.Lax([]byte(in)), name)
			continue
		}
		require.True(t, jsonx.Lax([]byte(in)), name)
	}
	require.False(t, jsonx.Lax([]byte(`{"a":}`)))
}

func TestParseDuplicatePath(t *testing.T) {
	_, err := jsonx.Parse([]byte(`{"p":{"x":[0,{"n":1,"n":2}]}}`), 32)
	var de *jsonx.DuplicateKeyError
	require.True(t, errors.As(err, &de), "%v", err)
	require.Equal(t, []any{"p", "x", 1, "n"}, de.Path)
	require.Equal(t, strings.LastIndex(`{"p":{"x":[0,{"n":1,"n":2}]}}`, `"n"`), de.Offset)
	require.ErrorIs(t, err, jsonx.ErrInvalid)
}

func TestParseTree(t *testing.T) {
	got, err := jsonx.Parse([]byte(` {"a":[1.50,true,false,null],"b":"z\u00fcrich","c":{},"d":"plain"} `), 32)
	require.NoError(t, err)
	require.Equal(t, map[string]any{
		"a": []any{jsonx.Number("1.50"), true, false, nil},
		"b": "zürich", "c": map[string]any{}, "d": "plain",
	}, got)
	_, err = jsonx.Parse([]byte(`[[1]]`), 1)
	require.ErrorIs(t, err, jsonx.ErrTooDeep)
	_, err = jsonx.Parse([]byte(`[1]`), 1)
	require.NoError(t, err)
}

func TestMembers(t *testing.T) {
	ms, err := jsonx.Members([]byte(` { "id" : 7 , "m\u0065thod":"tools/call", "params":{"name":"x"} } `))
	require.NoError(t, err)
	require.Len(t, ms, 3)
	require.Equal(t, "method", ms[1].Key())
	require.Equal(t, `7`, string(jsonx.Lookup(ms, "id")))
	require.Equal(t, `{"name":"x"}`, string(jsonx.Lookup(ms, "params")))
	require.Nil(t, jsonx.Lookup(ms, "nope"))

	_, err = jsonx.Members([]byte(`[1]`))
	require.ErrorIs(t, err, jsonx.ErrNotObject)
	require.Nil(t, jsonx.MemberOf([]byte(`{"a":1,"a":2}`), "a"))

	el, err := jsonx.Elements([]byte(`[ 1, {"a":2} ,"x"]`))
	require.NoError(t, err)
	require.Equal(t, [][]byte{[]byte(`1`), []byte(`{"a":2}`), []byte(`"x"`)}, el)
}

func TestString(t *testing.T) {
	for in, want := range map[string]string{`"a"`: "a", `"\u0041\n"`: "A\n", `"zü"`: "zü", `"\ud83d\ude00"`: "\U0001F600"} {
		got, ok := jsonx.String([]byte(in))
		require.True(t, ok, in)
		require.Equal(t, want, got)
	}
	for _, in := range []string{`1`, `"\ud800"`, "\"a\xff\"", `"a`, `"a"b`} {
		_, ok := jsonx.String([]byte(in))
		require.False(t, ok, in)
	}
}

func TestEditAndSplice(t *testing.T) {
	require.Equal(t, `{"a":1,"b":"x","c":true}`,
		string(jsonx.Edit([]byte(`{"a": 1, "b":2, "drop":3}`), []string{"drop"}, jsonx.Set{Key: "b", Text: "x"}, jsonx.Set{Key: "c", Raw: []byte("true")})))
	require.Equal(t, `{"k":1}`, string(jsonx.Edit([]byte(`not json`), nil, jsonx.Set{Key: "k", Raw: []byte("1")})))

	out, err := jsonx.Splice(nil, []byte(`{ "x" : [1, 2] }`), jsonx.Set{Key: "fp", Text: "t\"ok"})
	require.NoError(t, err)
	require.Equal(t, `{ "x" : [1, 2],"fp":"t\"ok"}`, string(out))
	_, err = jsonx.Splice(nil, []byte(`{"fp":"old","x":1,"f\u0070":"old2"}`), jsonx.Set{Key: "fp", Text: "new"})
	require.Error(t, err, "a duplicate (via escape) is refused")
	out, err = jsonx.Splice(nil, []byte(`{"fp":"old", "x":1}`), jsonx.Set{Key: "fp", Text: "new"})
	require.NoError(t, err)
	require.Equal(t, `{"x":1,"fp":"new"}`, string(out))
	out, err = jsonx.Splice(nil, []byte(`{}`), jsonx.Set{Key: "fp", Text: "new"})
	require.NoError(t, err)
	require.Equal(t, `{"fp":"new"}`, string(out))
	_, err = jsonx.Splice(nil, []byte(`[]`), jsonx.Set{Key: "fp", Text: "new"})
	require.ErrorIs(t, err, jsonx.ErrNotObject)

	require.Equal(t, `[1, 2,3]`, string(jsonx.AppendElements([]byte(` [1, 2] `), []byte(`3`))))
	require.Equal(t, `[3]`, string(jsonx.AppendElements(nil, []byte(`3`))))
}

func TestCompact(t *testing.T) {
	require.Equal(t, `{"a":[1,2]}`, string(jsonx.Compact([]byte("{\"a\":\n[1,\r\n2]}"))))
}

func TestReadNested(t *testing.T) {
	raw := []byte(` {"id" : 7, "params" :  {"name":"t", "arguments": {"a":[1,{"b":null}]} , "_meta":{}}, "x":[[]], "s":"\u0041"} `)
	n, err := jsonx.ReadNested(raw, "params")
	require.NoError(t, err)
	want, err := jsonx.Members(raw)
	require.NoError(t, err)
	require.Equal(t, want, n.Members, "the same members as Members, value bytes included")
	inner, err := jsonx.Members(jsonx.Lookup(want, "params"))
	require.NoError(t, err)
	require.Len(t, n.Inner, len(inner))
	for i := range inner {
		require.Equal(t, inner[i].Name, n.Inner[i].Name)
		require.Equal(t, string(inner[i].Value), string(n.Inner[i].Value))
	}
	require.Equal(t, 5, n.Depth)

	n, err = jsonx.ReadNested([]byte(`{"params":[1],"id":1}`), "params")
	require.NoError(t, err)
	require.Nil(t, n.Inner)
	require.Equal(t, 2, n.Depth)

	for name, in := range strictRefusals {
		_, err := jsonx.ReadNested([]byte(in), "a")
		require.ErrorIs(t, err, jsonx.ErrInvalid, name)
	}
	_, err = jsonx.ReadNested([]byte(`[]`), "a")
	require.ErrorIs(t, err, jsonx.ErrNotObject)
	require.Len(t, jsonx.LaxNested([]byte(`{"p":{"n":1,"n":2},"p":3}`), "p").Members, 2)
}
