package jsonx_test

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/internal/jsonx"
)

// injectFieldsInto is the preview injection as extproc calls it.
func injectFieldsInto(dst, body []byte, fields ...jsonx.Set) ([]byte, bool) {
	out, err := jsonx.Splice(dst, body, fields...)
	return out, err == nil
}

func TestInjectFields(t *testing.T) {
	fp := []jsonx.Set{{Key: "fingerprint", Text: "tok"}, {Key: "fingerprint_expires_at", Text: "2030-01-01T00:00:00Z"}}
	for _, tc := range []struct {
		name string
		body string
		want string
		ok   bool
	}{
		{name: "empty object", body: `{}`, want: `{"fingerprint":"tok","fingerprint_expires_at":"2030-01-01T00:00:00Z"}`, ok: true},
		{name: "empty object with space", body: " { \n } \n", want: " { \n \"fingerprint\":\"tok\",\"fingerprint_expires_at\":\"2030-01-01T00:00:00Z\"} \n", ok: true},
		{name: "append keeps bytes", body: `{"amount": 100.00, "nested": {"fingerprint": 1, "s": "}\"{"}, "arr": [1, {"a": [2]}]}`,
			want: `{"amount": 100.00, "nested": {"fingerprint": 1, "s": "}\"{"}, "arr": [1, {"a": [2]}],"fingerprint":"tok","fingerprint_expires_at":"2030-01-01T00:00:00Z"}`, ok: true},
		{name: "pretty printed", body: "{\n  \"a\": 1\n}\n", want: "{\n  \"a\": 1,\"fingerprint\":\"tok\",\"fingerprint_expires_at\":\"2030-01-01T00:00:00Z\"}\n", ok: true},
		{name: "replaces existing", body: `{"fingerprint": "upstream", "a": true, "fingerprint_expires_at": null, "b": [null]}`,
			want: `{"a": true,"b": [null],"fingerprint":"tok","fingerprint_expires_at":"2030-01-01T00:00:00Z"}`, ok: true},
		{name: "replaces escaped key", body: `{"\u0066ingerprint": "x"}`, want: `{"fingerprint":"tok","fingerprint_expires_at":"2030-01-01T00:00:00Z"}`, ok: true},
		{name: "array", body: `[1,2]`},
		{name: "string", body: `"x"`},
		{name: "invalid", body: `{"a":}`},
		{name: "trailing garbage", body: `{} x`},
		{name: "empty", body: ``},
		// Stricter than the json.Valid check this replaced: a body some
		// parsers read two ways gets no fingerprint spliced in (the
		// preview then carries it in the header only).
		{name: "duplicate key", body: `{"a":1,"a":2}`},
		{name: "duplicate fingerprint key", body: `{"fingerprint":"x","fingerprint":"y"}`},
		{name: "invalid UTF-8", body: "{\"a\":\"\xff\"}"},
		{name: "lone surrogate", body: `{"a":"\ud800"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, ok := injectFieldsInto(nil, []byte(tc.body), fp...)
			require.Equal(t, tc.ok, ok)
			if !ok {
				return
			}
			require.Equal(t, tc.want, string(out))
			var m map[string]any
			require.NoError(t, json.Unmarshal(out, &m))
			require.Equal(t, "tok", m["fingerprint"])
		})
	}
}

func FuzzInjectFields(f *testing.F) {
	for _, s := range []string{`{}`, `{"a":1}`, `{"fingerprint":{"x":[1,"}"]},"b":"\\"}`, `[]`, `{"a":"\u0066"}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		out, ok := injectFieldsInto(nil, body, jsonx.Set{Key: "fingerprint", Text: "v"}, jsonx.Set{Key: "fingerprint_expires_at", Text: "e"})
		if !ok {
			return
		}
		var m map[string]any
		if err := json.Unmarshal(out, &m); err != nil {
			t.Fatalf("invalid output %q from %q: %v", out, body, err)
		}
		if m["fingerprint"] != "v" || m["fingerprint_expires_at"] != "e" {
			t.Fatalf("fields missing in %q", out)
		}
	})
}
