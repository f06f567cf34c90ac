package fingerprint_test

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/fingerprint"
)

func canonicalOf(t *testing.T, body string) string {
	t.Helper()
	v, err := fingerprint.ParseJSON([]byte(body), 0)
	require.NoError(t, err)
	c, err := fingerprint.Canonicalize(v)
	require.NoError(t, err)
	return string(c)
}

func TestCanonicalize(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   string
		want string
	}{
		{"keys sorted by bytes", `{"b":1,"a":2,"B":3,"aa":4,"é":5,"z":6}`, `{"B":3,"a":2,"aa":4,"b":1,"z":6,"é":5}`},
		{"whitespace removed", "{ \"a\" : [ 1 , 2 ] ,\n\"b\" : { } }", `{"a":[1,2],"b":{}}`},
		{"null members removed", `{"a":null,"b":1}`, `{"b":1}`},
		{"nested null members removed", `{"a":{"x":null,"y":{"z":null}}}`, `{"a":{"y":{}}}`},
		{"nulls in arrays kept", `[null,1,null]`, `[null,1,null]`},
		{"array order kept", `[3,1,2]`, `[3,1,2]`},
		{"nested arrays and objects", `[{"b":[{"d":1,"c":2}],"a":null}]`, `[{"b":[{"c":2,"d":1}]}]`},
		{"numbers canonical everywhere", `{"a":[1.0,1e2,-0,0.10],"b":{"c":12345678901234567.890}}`, `{"a":[1,100,0,0.1],"b":{"c":12345678901234567.89}}`},
		{"strings are not numbers", `["1.0","100.00"]`, `["1.0","100.00"]`},
		{"strings byte for byte, not NFC", `"e\u0301"`, "\"e\u0301\""},
		{"keys byte for byte, not NFC", `{"e\u0301":1,"\u00e9":2}`, "{\"e\u0301\":1,\"\u00e9\":2}"},
		{"escaping", `"\u0001\b\f\n\r\t\"\\/<>&\u007f\u2028\u2029"`, `"\u0001\b\f\n\r\t\"\\/<>&` + "\x7f" + `\u2028\u2029"`},
		{"non-ASCII raw", `"\u20ac\ud83d\ude00"`, "\"€\U0001F600\""},
		{"top-level null", `null`, `null`},
		{"booleans", `[true,false]`, `[true,false]`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, canonicalOf(t, tc.in))
		})
	}
}

func TestCanonicalizeEquivalences(t *testing.T) {
	for _, tc := range []struct {
		name string
		a, b string
	}{
		{"key order", `{"amount":1,"currency":"EUR","payee":{"id":"x","bank":"y"}}`, `{"payee":{"bank":"y","id":"x"},"currency":"EUR","amount":1}`},
		{"number spelling", `{"a":1,"b":0.1}`, `{"a":1.00,"b":0.10}`},
		{"number exponent", `[1,1.0,1.00,1e0,10e-1,0.1e1]`, `[1,1,1,1,1,1]`},
		{"null vs absent", `{"a":1,"b":null}`, `{"a":1}`},
		{"escape spelling", `"\u0041\/"`, `"A/"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, canonicalOf(t, tc.a), canonicalOf(t, tc.b))
		})
	}
	for _, tc := range []struct {
		name string
		a, b string
	}{
		{"array order", `[1,2]`, `[2,1]`},
		{"null position in array", `[null,1]`, `[1,null]`},
		{"17 vs 18 significant digits", `12345678901234567.8`, `12345678901234567.89`},
		{"string vs number", `"1"`, `1`},
		{"case", `"eur"`, `"EUR"`},
		{"NFD vs NFC (byte for byte, the binding rule)", `"acc_cafe\u0301"`, `"acc_caf\u00e9"`},
		{"NFD vs NFC keys", `{"e\u0301":1}`, `{"\u00e9":1}`},
	} {
		t.Run("differ/"+tc.name, func(t *testing.T) {
			require.NotEqual(t, canonicalOf(t, tc.a), canonicalOf(t, tc.b))
		})
	}
}

func TestCanonicalizeRejects(t *testing.T) {
	t.Run("invalid UTF-8 string", func(t *testing.T) {
		_, err := fingerprint.Canonicalize("\xff")
		require.ErrorIs(t, err, fingerprint.ErrUnsupportedValue)
	})
	t.Run("out of range number", func(t *testing.T) {
		_, err := fingerprint.Canonicalize(json.Number("1e1000000000"))
		require.ErrorIs(t, err, fingerprint.ErrNumberOutOfRange)
	})
	t.Run("invalid json.Number", func(t *testing.T) {
		_, err := fingerprint.Canonicalize(json.Number("1.2.3"))
		require.ErrorIs(t, err, fingerprint.ErrInvalidDecimal)
	})
	t.Run("unsupported Go type", func(t *testing.T) {
		_, err := fingerprint.Canonicalize(struct{}{})
		require.ErrorIs(t, err, fingerprint.ErrUnsupportedValue)
	})
	t.Run("cycle", func(t *testing.T) {
		cyclic := []any{nil}
		cyclic[0] = cyclic
		_, err := fingerprint.Canonicalize(cyclic)
		require.ErrorIs(t, err, fingerprint.ErrTooDeep)
	})
}

func TestCanonicalizeGoValues(t *testing.T) {
	got, err := fingerprint.Canonicalize(map[string]any{"f": 0.1, "i": 42, "u": uint64(7), "big": 1e21, "neg": int64(-3)})
	require.NoError(t, err)
	require.Equal(t, `{"big":1e+21,"f":0.1,"i":42,"neg":-3,"u":7}`, string(got))
}

// TestCanonicalizeMatchesEncodingJSON checks the documented promise: Go's
// encoding/json with SetEscapeHTML(false) reproduces the canonical bytes from
// the normalised tree.
func TestCanonicalizeMatchesEncodingJSON(t *testing.T) {
	var all strings.Builder
	for r := rune(0); r < 0x300; r++ {
		all.WriteRune(r)
	}
	all.WriteString("\u2028\u2029\ufeff\U0001F600")
	tree := map[string]any{
		"s":            all.String(),
		all.String():   "key with every low rune",
		"n":            []any{json.Number("1e+21"), json.Number("0.1"), json.Number("-12.5")},
		"nested":       map[string]any{"b": true, "a": []any{nil, "x"}},
		"<html>&stuff": "<b>",
	}
	got, err := fingerprint.Canonicalize(tree)
	require.NoError(t, err)
	require.Equal(t, encodingJSON(t, tree), string(got))
}

func encodingJSON(t *testing.T, v any) string {
	t.Helper()
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	require.NoError(t, enc.Encode(v))
	return strings.TrimSuffix(buf.String(), "\n")
}
