package extproc

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestInjectFields(t *testing.T) {
	fp := []field{{name: "fingerprint", value: "tok"}, {name: "fingerprint_expires_at", value: "2030-01-01T00:00:00Z"}}
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
		out, ok := injectFieldsInto(nil, body, field{name: "fingerprint", value: "v"}, field{name: "fingerprint_expires_at", value: "e"})
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
