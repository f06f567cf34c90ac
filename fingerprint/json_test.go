package fingerprint_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/fingerprint"
)

func TestParseJSONValues(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   string
		want any
	}{
		{"object", `{"a":1,"b":[true,false,null],"c":"x"}`, map[string]any{
			"a": json.Number("1"), "b": []any{true, false, nil}, "c": "x",
		}},
		{"surrounding whitespace", " \t\r\n[] \n", []any{}},
		{"empty object", `{}`, map[string]any{}},
		{"scalar string", `"hi"`, "hi"},
		{"scalar null", `null`, nil},
		{"number text kept exactly", `12345678901234567.89`, json.Number("12345678901234567.89")},
		{"number spelling kept", `1.00E+2`, json.Number("1.00E+2")},
		{"absurd number kept as text", `1e999999999999`, json.Number("1e999999999999")},
		{"escapes", `"\"\\\/\b\f\n\r\t\u00e9\u0000"`, "\"\\/\b\f\n\r\t\u00e9\x00"},
		{"surrogate pair", `"\ud83d\ude00"`, "\U0001F600"},
		{"raw UTF-8", `"zürich €"`, "zürich €"},
		{"U+FFFD escaped is fine", `"\ufffd"`, "\ufffd"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := fingerprint.ParseJSON([]byte(tc.in), 0)
			require.NoError(t, err)
			require.Equal(t, tc.want, got.Value())
		})
	}
}

func TestParseJSONRejects(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   string
	}{
		{"empty", ``},
		{"only space", `   `},
		{"trailing data", `{} {}`},
		{"trailing garbage", `1x`},
		{"two values", `1 2`},
		{"duplicate key", `{"amount":1,"amount":1000}`},
		{"duplicate key via escape", `{"a":1,"\u0061":2}`},
		{"unterminated object", `{"a":1`},
		{"unterminated string", `"abc`},
		{"trailing comma object", `{"a":1,}`},
		{"trailing comma array", `[1,]`},
		{"missing colon", `{"a" 1}`},
		{"single quotes", `{'a':1}`},
		{"unquoted key", `{a:1}`},
		{"leading zero", `01`},
		{"plus sign", `+1`},
		{"bare dot", `.5`},
		{"dot without digits", `5.`},
		{"exponent without digits", `1e`},
		{"NaN", `NaN`},
		{"bad literal", `tru`},
		{"raw control character", "\"a\x01b\""},
		{"raw newline in string", "\"a\nb\""},
		{"invalid UTF-8", "\"\xff\""},
		{"UTF-8 encoded surrogate", "\"\xed\xa0\x80\""},
		{"lone high surrogate", `"\ud800"`},
		{"lone low surrogate", `"\udc00"`},
		{"high surrogate then text", `"\ud800abc"`},
		{"two high surrogates", `"\ud800\ud800"`},
		{"bad escape", `"\x41"`},
		{"short unicode escape", `"\u12"`},
		{"byte order mark", "\xef\xbb\xbf{}"},
		{"comment", `{} // x`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := fingerprint.ParseJSON([]byte(tc.in), 0)
			require.ErrorIs(t, err, fingerprint.ErrInvalidJSON)
		})
	}
}

func TestParseJSONDepthLimit(t *testing.T) {
	nested := func(n int) []byte {
		return []byte(strings.Repeat(`{"a":[`, n) + strings.Repeat(`]}`, n))
	}
	// n pairs of {"a":[ nest 2n deep.
	_, err := fingerprint.ParseJSON(nested(16), 32)
	require.NoError(t, err)
	_, err = fingerprint.ParseJSON(nested(17), 32)
	require.ErrorIs(t, err, fingerprint.ErrTooDeep)
	require.ErrorIs(t, err, fingerprint.ErrInvalidJSON)

	// Zero means the default.
	_, err = fingerprint.ParseJSON(nested(fingerprint.DefaultMaxDepth/2), 0)
	require.NoError(t, err)
	_, err = fingerprint.ParseJSON(nested(fingerprint.DefaultMaxDepth/2+1), 0)
	require.ErrorIs(t, err, fingerprint.ErrTooDeep)

	// An absurd limit is capped, and a very deep body fails instead of
	// exhausting the stack.
	deep := []byte(strings.Repeat("[", 1_000_000) + strings.Repeat("]", 1_000_000))
	_, err = fingerprint.ParseJSON(deep, 1<<30)
	require.ErrorIs(t, err, fingerprint.ErrTooDeep)

	// Depth counts containers, not scalars.
	_, err = fingerprint.ParseJSON([]byte(`[1]`), 1)
	require.NoError(t, err)
	_, err = fingerprint.ParseJSON([]byte(`[[1]]`), 1)
	require.ErrorIs(t, err, fingerprint.ErrTooDeep)
}

func TestParseJSONAgreesWithEncodingJSON(t *testing.T) {
	// On well-formed input without duplicates the tree is what encoding/json
	// builds with UseNumber.
	in := `{"amount":"100.00","n":[1,2.50,-3e2],"payee":{"account_id":"DE89 3704","name":"Zoë"},"ok":true,"none":null}`
	got, err := fingerprint.ParseJSON([]byte(in), 0)
	require.NoError(t, err)
	dec := json.NewDecoder(strings.NewReader(in))
	dec.UseNumber()
	var want any
	require.NoError(t, dec.Decode(&want))
	require.Equal(t, want, got.Value())
}
