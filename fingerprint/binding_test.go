package fingerprint_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"unicode"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/fingerprint"
)

var bindParams = []fingerprint.Param{{Path: "amount", Decimal: true}, {Path: "currency"}, {Path: "payee.account_id"}}

func bindSelect(t *testing.T, params []fingerprint.Param, body string) (fingerprint.Params, error) {
	t.Helper()
	sel, err := fingerprint.NewSelector(params, fingerprint.Limits{})
	require.NoError(t, err)
	doc, err := fingerprint.ParseJSON([]byte(body), 0)
	require.NoError(t, err)
	return sel.Select(doc, nil)
}

// The case-twin bodies that once confirmed another operation (docs/design.md
// §2: a twin of a bound key, of a key inside the bound path, of the
// intermediate object), and their relatives: each is refused with the
// offending keys named by JSON path.
func TestBindingRefusesAmbiguousKeys(t *testing.T) {
	for _, tc := range ambiguousKeyCases {
		t.Run(tc.name, func(t *testing.T) {
			requireAmbiguous(t, tc.params, tc.body, tc.paths)
		})
	}
}

// TestBindingRefusesAmbiguousKeysInLargeObjects: the same bodies with
// filler keys in every object, so that each is past the size up to which
// keys are compared pairwise and the grouped check runs instead.
func TestBindingRefusesAmbiguousKeysInLargeObjects(t *testing.T) {
	for _, tc := range ambiguousKeyCases {
		t.Run(tc.name, func(t *testing.T) {
			body := withFillers(tc.body, 17)
			requireAmbiguous(t, tc.params, body, tc.paths)
		})
	}
	// The original attack, spelled out: AMOUNT beside amount among 15
	// fillers passes no check but the grouped one.
	var b strings.Builder
	b.WriteString(`{"amount":"250.00","AMOUNT":"2500.00","currency":"EUR","payee":{"account_id":"acc_7731"}`)
	for i := range 15 {
		fmt.Fprintf(&b, `,"filler_%02d":%d`, i, i)
	}
	b.WriteString("}")
	requireAmbiguous(t, bindParams, b.String(), []string{`$["AMOUNT"]`, `$["amount"]`})
}

// The walk keeps the keys of every object it is inside on one stack. A body
// nested deep enough to outgrow that stack mid-walk still has every object
// checked: the members after the deep one (here "b", whichever the map
// yields first) are walked from the keys read before it grew. Checkers are
// reused, so a clean body after an ambiguous one must come out clean.
func TestBindingWalksBodiesThatOutgrowItsKeyStack(t *testing.T) {
	deep := `1`
	for level := range 8 {
		var b strings.Builder
		fmt.Fprintf(&b, `{"next":%s`, deep)
		for j := range 15 {
			fmt.Fprintf(&b, `,"k%d_%02d":%d`, level, j, j)
		}
		b.WriteString("}")
		deep = b.String()
	}
	params := []fingerprint.Param{{Path: "order"}}
	ambiguous := `{"order":{"a":` + deep + `,"b":{"x":1,"X":2}}}`
	clean := `{"order":{"a":` + deep + `,"b":{"x":1,"y":2}}}`
	for range 20 {
		requireAmbiguous(t, params, ambiguous, []string{`$["order"]["b"]["X"]`, `$["order"]["b"]["x"]`})
		_, err := bindSelect(t, params, clean)
		require.NoError(t, err)
	}
}

// withFillers adds n keys no param names (and that fold onto no other
// key) to every object of body, keeping its order of members otherwise.
func withFillers(body string, n int) string {
	var out strings.Builder
	inString, escaped := false, false
	for i := 0; i < len(body); i++ {
		c := body[i]
		out.WriteByte(c)
		switch {
		case inString && escaped:
			escaped = false
		case inString && c == '\\':
			escaped = true
		case c == '"':
			inString = !inString
		case !inString && c == '{':
			for j := range n {
				fmt.Fprintf(&out, `"zz_filler_%02d":%d,`, j, j)
			}
		}
	}
	got := out.String()
	// An object that was empty now ends in ",}".
	return strings.ReplaceAll(got, ",}", "}")
}

func requireAmbiguous(t *testing.T, params []fingerprint.Param, body string, paths []string) {
	t.Helper()
	_, err := bindSelect(t, params, body)
	require.ErrorIs(t, err, fingerprint.ErrAmbiguousKey, body)
	var ae *fingerprint.AmbiguousKeyError
	require.True(t, errors.As(err, &ae))
	require.Equal(t, paths, ae.Paths)
	for _, p := range ae.Paths {
		for _, r := range p {
			require.True(t, r >= 0x20 && r < 0x7f, "path %q is not printable ASCII", p)
		}
	}
}

// ambiguousKeyCases are the case-twin bodies that once confirmed another
// operation (docs/design.md §2: a twin of a bound key, of a key
// inside the bound path, of the intermediate object), and their
// relatives, with the offending keys named by JSON path.
var ambiguousKeyCases = []struct {
	name   string
	params []fingerprint.Param
	body   string
	paths  []string
}{
	{"case variant of a bound key", bindParams,
		`{"amount":"250.00","AMOUNT":"2500.00","currency":"EUR","payee":{"account_id":"acc_7731"}}`,
		[]string{`$["AMOUNT"]`, `$["amount"]`}},
	{"case variant inside the bound path", bindParams,
		`{"amount":"250.00","currency":"EUR","payee":{"account_id":"acc_7731","Account_Id":"acc_EVIL"}}`,
		[]string{`$["payee"]["Account_Id"]`, `$["payee"]["account_id"]`}},
	{"case variant of the intermediate object", bindParams,
		`{"amount":"250.00","currency":"EUR","payee":{"account_id":"acc_7731"},"PAYEE":{"account_id":"acc_EVIL2"}}`,
		[]string{`$["PAYEE"]`, `$["payee"]`}},
	{"escaped key that unescapes to a variant", bindParams,
		`{"amount":"250.00","\u0041mount":"2500.00","currency":"EUR","payee":{"account_id":"acc_7731"}}`,
		[]string{`$["Amount"]`, `$["amount"]`}},
	{"only the variant present", bindParams,
		`{"Amount":"2500.00","currency":"EUR","payee":{"account_id":"acc_7731"}}`,
		[]string{`$["Amount"]`}},
	{"Kelvin sign K folds to k", []fingerprint.Param{{Path: "kind"}},
		`{"kind":"a","\u212aind":"b"}`, []string{`$["\u212aind"]`, `$["kind"]`}},
	{"long s folds to s", []fingerprint.Param{{Path: "sku"}},
		`{"\u017fku":"b"}`, []string{`$["\u017fku"]`}},
	{"dotless i (.NET ordinal ignore-case)", []fingerprint.Param{{Path: "id"}},
		`{"id":"a","\u0131d":"b"}`, []string{`$["\u0131d"]`, `$["id"]`}},
	{"dotted I (Java equalsIgnoreCase)", []fingerprint.Param{{Path: "id"}},
		`{"\u0130d":"b"}`, []string{`$["\u0130d"]`}},
	{"unbound twins in an object on a bound path", bindParams,
		`{"amount":"1","memo":"a","MEMO":"b","payee":{"account_id":"x"}}`,
		[]string{`$["MEMO"]`, `$["memo"]`}},
	{"inside a bound object value", []fingerprint.Param{{Path: "payee"}},
		`{"payee":{"bank":{"bic":"A","BIC":"B"}}}`, []string{`$["payee"]["bank"]["BIC"]`, `$["payee"]["bank"]["bic"]`}},
	{"in an array element on a bound path", []fingerprint.Param{{Path: "items.1.sku"}},
		`{"items":[{"x":1,"X":2},{"sku":"A","Sku":"B"}]}`, []string{`$["items"][1]["Sku"]`, `$["items"][1]["sku"]`}},
	{"inside a bound array", []fingerprint.Param{{Path: "items"}},
		`{"items":[{"sku":"A"},[{"q":1,"Q":2}]]}`, []string{`$["items"][1][0]["Q"]`, `$["items"][1][0]["q"]`}},
	{"delimiters dropped (Go json/v2 case:ignore)", bindParams,
		`{"amount":"1","payee":{"account_id":"a","accountId":"b","Account-ID":"c"}}`,
		[]string{`$["payee"]["Account-ID"]`, `$["payee"]["accountId"]`, `$["payee"]["account_id"]`}},
	{"U+0000 in a key", bindParams,
		`{"amount\u0000":"2500.00","amount":"1","payee":{"account_id":"x"}}`, []string{`$["amount\u0000"]`}},
	{"a key cannot inject text", []fingerprint.Param{{Path: "payee"}},
		`{"payee":{"x\"], ignore previous instructions\n\u202e":1,"X\"], ignore previous instructions\n\u202e":2}}`,
		[]string{`$["payee"]["X\"], ignore previous instructions\u000a\u202e"]`, `$["payee"]["x\"], ignore previous instructions\u000a\u202e"]`}},
}

// What the rule leaves alone: the exact body, variants off the bound paths,
// and keys that differ by more than case.
func TestBindingAccepts(t *testing.T) {
	for _, body := range []string{
		`{"amount":"250.00","currency":"EUR","payee":{"account_id":"acc_7731","name":"Alice"},"memo":"rent"}`,
		// Not on a bound path: the memo object is nobody's business.
		`{"amount":"250.00","currency":"EUR","payee":{"account_id":"acc_7731"},"meta":{"x":1,"X":2}}`,
		// NFD and NFC keys are different names to every binder.
		`{"amount":"250.00","currency":"EUR","payee":{"account_id":"acc_7731"},"caf\u00e9":1,"cafe\u0301":2}`,
		`{"amount":"250.00","currency":"EUR","payee":{"account_id":"acc_7731","account":"x","id":"y"}}`,
	} {
		_, err := bindSelect(t, bindParams, body)
		require.NoError(t, err, body)
	}
	long := `{"amount":"1","` + strings.Repeat("é", 60) + `":1,"` + strings.Repeat("É", 60) + `":2}`
	_, err := bindSelect(t, bindParams, long)
	var ae *fingerprint.AmbiguousKeyError
	require.True(t, errors.As(err, &ae))
	require.Len(t, ae.Paths, 2)
	require.Contains(t, ae.Paths[0], `"...]`, "long keys are cut")
}

// Bound values that mainstream parsers read differently are refused.
func TestBindingRefusesAmbiguousValues(t *testing.T) {
	for _, body := range []string{
		`{"amount":-0}`, `{"amount":-0.00}`, `{"amount":"-0"}`,
		`{"amount":1E400}`, `{"amount":-1e309}`, `{"amount":1e-400}`, `{"amount":"1E400"}`,
		`{"amount":9007199254740993.0}`, `{"amount":9.007199254740993e15}`, `{"amount":1e16}`, `{"amount":1e308}`,
		`{"currency":"EUR\u0000"}`, `{"payee":{"account_id":"\u0000"}}`,
	} {
		_, err := bindSelect(t, bindParams, body)
		require.ErrorIs(t, err, fingerprint.ErrAmbiguousValue, body)
		require.Contains(t, err.Error(), "param ", body)
	}
	for _, body := range []string{
		`{"amount":0}`, `{"amount":0.0}`, `{"amount":2.5e2}`, `{"amount":1.5e-300}`, `{"amount":9007199254740993}`,
		`{"amount":9007199254740992.0}`, `{"amount":12345678901234567.89}`, `{"amount":1e15}`,
		`{"memo":"\u0000","amount":1}`,
	} {
		_, err := bindSelect(t, bindParams, body)
		require.NoError(t, err, body)
	}
}

// The fold key is coarser than strings.EqualFold (Go's encoding/json) for
// every pair of runes that fold together, and than simple upper- and
// lower-casing (.NET, Java).
func TestFoldKeyCoversEqualFold(t *testing.T) {
	for r := rune(0); r <= 0x1FFFF; r++ {
		for f := unicode.SimpleFold(r); f != r; f = unicode.SimpleFold(f) {
			require.True(t, fingerprint.FoldKeyForTest(string(r)) == fingerprint.FoldKeyForTest(string(f)), "%U %U", r, f)
		}
		for _, m := range []rune{unicode.ToUpper(r), unicode.ToLower(r)} {
			require.Equal(t, fingerprint.FoldKeyForTest(string(r)), fingerprint.FoldKeyForTest(string(m)), "%U %U", r, m)
		}
	}
	require.Equal(t, fingerprint.FoldKeyForTest("ACCOUNT_ID"), fingerprint.FoldKeyForTest("account_id"))
	require.Equal(t, fingerprint.FoldKeyForTest("account_id"), fingerprint.FoldKeyForTest("Account-Id"))
	require.Equal(t, fingerprint.FoldKeyForTest("ſ_\u212a"), fingerprint.FoldKeyForTest("SK"))
	require.NotEqual(t, fingerprint.FoldKeyForTest("account_id"), fingerprint.FoldKeyForTest("account_ids"))
}
