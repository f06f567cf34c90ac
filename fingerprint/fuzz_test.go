package fingerprint_test

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf16"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/fingerprint"
)

// FuzzVerify checks that Verify never panics and never accepts a token the
// ring did not sign: the only tokens that pass are byte-identical to ones
// Sign issued. The second input is a payload given a valid MAC with the
// active key, to exercise everything after the MAC check.
func FuzzVerify(f *testing.F) {
	fx := newTokenFixture(f)
	// For forged payloads: a ring holding only the key that made the MAC, so
	// any other "k" is unknown and "k2" always has a genuine MAC.
	only2, err := fingerprint.NewKeyRing("k2", map[string][]byte{"k2": testKey(2)})
	require.NoError(f, err)
	old, err := fingerprint.NewKeyRing("k1", map[string][]byte{"k1": testKey(1)})
	require.NoError(f, err)

	issued := map[string]bool{}
	for i, ring := range []*fingerprint.KeyRing{fx.ring, old} {
		for j := range 3 {
			tok, _, err := ring.Sign(fingerprint.SignRequest{
				Subject: testSubject, Scope: testScope, Params: fx.params,
				Nonce: fmt.Sprintf("%031x%d", i, j), Expiry: testExpiry.Add(time.Duration(j) * time.Second),
			})
			require.NoError(f, err)
			issued[tok] = true
		}
	}
	want := fx.expect(f, testBody)
	status := fingerprint.Expect{Subject: testSubject, Scope: testScope, AllowExpired: true}

	tokens := slices.Sorted(func(yield func(string) bool) {
		for tok := range issued {
			if !yield(tok) {
				return
			}
		}
	})
	for _, tok := range tokens {
		payload, err := base64.RawURLEncoding.DecodeString(tok[:strings.IndexByte(tok, '.')])
		require.NoError(f, err)
		f.Add(tok, payload)
		f.Add(tok[:len(tok)-1]+"A", []byte(`{}`))
		f.Add(tok+"=", []byte(`[]`))
		f.Add(strings.ReplaceAll(tok, "-", "+"), []byte(`{"v":1}`))
	}
	f.Add("", []byte(""))
	f.Add("a.b.c", []byte(`{"v":1,"k":"k2","n":"00112233445566778899aabbccddeeff","exp":1,"u":"","s":"","p":"","f":{}}`))
	f.Add(strings.Repeat("A", fingerprint.MaxTokenLength+1), []byte("null"))

	f.Fuzz(func(t *testing.T, token string, payload []byte) {
		for _, expect := range []fingerprint.Expect{want, status} {
			claims, err := fx.ring.Verify(token, expect, testExpiry)
			if err == nil {
				require.True(t, issued[token], "accepted a token that Sign did not issue: %q", token)
				continue
			}
			var ve *fingerprint.VerifyError
			require.ErrorAs(t, err, &ve)
			switch ve.Reason {
			case fingerprint.ReasonMalformed, fingerprint.ReasonUnknownKey, fingerprint.ReasonBadMAC:
				require.Zero(t, claims, "claims before the MAC is verified")
			default:
				// Past the MAC: only issued tokens get here.
				require.True(t, issued[token], "MAC accepted on a token Sign did not issue: %q", token)
			}
		}

		// A payload with a genuine MAC: Verify reads it without panicking and
		// accepts it only if every claim checks out.
		forged := forge(testKey(2), string(payload))
		claims, err := only2.Verify(forged, want, testExpiry)
		// Leaving the field tags out changes nothing else: not what is
		// refused, not why, not the changed fields.
		lean := want
		lean.OmitFieldTags = true
		leanClaims, leanErr := only2.Verify(forged, lean, testExpiry)
		require.Equal(t, err == nil, leanErr == nil, "%q", payload)
		if err != nil {
			require.Equal(t, err.Error(), leanErr.Error(), "%q", payload)
			var ve, leanVE *fingerprint.VerifyError
			require.ErrorAs(t, err, &ve)
			require.ErrorAs(t, leanErr, &leanVE)
			require.Equal(t, ve, leanVE, "%q: the same reason, detail and changed fields", payload)
		}
		require.Nil(t, leanClaims.FieldTags)
		leanClaims.FieldTags = claims.FieldTags
		require.Equal(t, claims, leanClaims, "%q", payload)
		if len(forged) > fingerprint.MaxTokenLength {
			requireReason(t, err, fingerprint.ReasonMalformed)
			return
		}
		if err == nil {
			require.Equal(t, fingerprint.Version, claims.Version)
			require.Equal(t, "k2", claims.KeyID)
			require.Equal(t, testScope, claims.Scope)
			require.Equal(t, fx.params.Hash, claims.ParamHash)
			require.GreaterOrEqual(t, claims.Expiry, testExpiry.Unix())
			tag, err := only2.SubjectTag("k2", testSubject)
			require.NoError(t, err)
			require.Equal(t, tag, claims.SubjectTag)
			return
		}
		var ve *fingerprint.VerifyError
		require.ErrorAs(t, err, &ve)
		if ve.Reason != fingerprint.ReasonMalformed && ve.Reason != fingerprint.ReasonUnknownKey {
			require.NotEqual(t, fingerprint.ReasonBadMAC, ve.Reason, "the MAC is genuine")
			require.Equal(t, "k2", claims.KeyID, "claims come back after the MAC")
		}
	})
}

// FuzzCanonicalize checks, for any body ParseJSON accepts: no panic; the
// canonical form is a fixed point (canonicalize(parse(c)) == c); it is what
// encoding/json writes for the same tree; and a respelling of the body (keys
// reversed, whitespace, strings with \u escapes, numbers in other
// equal spellings) canonicalises to the same bytes. Numbers keep their exact
// value.
func FuzzCanonicalize(f *testing.F) {
	for _, seed := range []string{
		`{"amount":"100.00","currency":"EUR","payee":{"account_id":"DE89"}}`,
		`{"b":1,"a":[1.0,1e2,-0,0.10,null,{"z":null,"y":"e\u0301"}]}`,
		`[12345678901234567.89,12345678901234567.8,1e21,1e-7,0.000001,9007199254740993]`,
		`"\u0000\u001f\"\\\/<>&\u2028\u2029\ud83d\ude00"`,
		`{"\u00e9":1,"e\u0301x":2,"Z":{"a":{"b":{"c":[[[]]]}}}}`,
		`1e999999999`,
		`-0.0e-0`,
		`{"a":1e1000000000}`,
		`{"e\u0301":1,"\u00e9":2}`,
		`[true,false,null,"",{}]`,
	} {
		f.Add([]byte(seed), uint8(0))
		f.Add([]byte(seed), uint8(0xFF))
	}
	sel, err := fingerprint.NewSelector([]fingerprint.Param{{Path: "amount", Decimal: true}, {Path: "a"}, {Path: "b.0"}, {Path: "payee.account_id"}, {Path: "path.id"}}, fingerprint.Limits{})
	require.NoError(f, err)

	f.Fuzz(func(t *testing.T, body []byte, style uint8) {
		doc, err := fingerprint.ParseJSON(body, 0)
		if err != nil {
			require.ErrorIs(t, err, fingerprint.ErrInvalidJSON)
			return
		}
		// Select never panics either; its errors name a param, or are the
		// binding rule's refusal of a key that folds onto a bound one.
		if _, err := sel.Select(doc, map[string]string{"id": string(body)}); err != nil && !errors.Is(err, fingerprint.ErrAmbiguousKey) {
			require.Contains(t, err.Error(), "param ")
		}

		canonical, err := fingerprint.Canonicalize(doc)
		if err != nil {
			require.True(t, errors.Is(err, fingerprint.ErrNumberOutOfRange) || errors.Is(err, fingerprint.ErrUnsupportedValue), "unexpected error %v", err)
			return
		}

		again, err := fingerprint.ParseJSON(canonical, fingerprint.HardMaxDepth)
		require.NoError(t, err)
		c2, err := fingerprint.Canonicalize(again)
		require.NoError(t, err)
		require.Equal(t, string(canonical), string(c2), "not idempotent")

		dec := json.NewDecoder(strings.NewReader(string(canonical)))
		dec.UseNumber()
		var tree any
		require.NoError(t, dec.Decode(&tree))
		require.Equal(t, string(canonical), encodingJSON(t, tree), "differs from encoding/json")

		var sb strings.Builder
		respell(&sb, doc.Value(), style)
		other, err := fingerprint.ParseJSON([]byte(sb.String()), fingerprint.HardMaxDepth)
		require.NoError(t, err, "respelling %q", sb.String())
		c3, err := fingerprint.Canonicalize(other)
		require.NoError(t, err)
		require.Equal(t, string(canonical), string(c3), "respelling %q", sb.String())

		requireSameNumbers(t, doc.Value(), again.Value())
	})
}

// respell writes v as JSON text that is equal under the canonical rules but
// spelled differently. style picks the variations.
func respell(sb *strings.Builder, v any, style uint8) {
	switch v := v.(type) {
	case map[string]any:
		keys := make([]string, 0, len(v))
		for k := range v {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		slices.Reverse(keys)
		sb.WriteString("{ ")
		for i, k := range keys {
			if i > 0 {
				sb.WriteString(" ,\n")
			}
			respellString(sb, k, style)
			sb.WriteString(" :\t")
			respell(sb, v[k], style+uint8(i))
		}
		const extra = "\x00extra-null-member"
		if _, taken := v[extra]; !taken && style&1 == 1 {
			// An extra null member changes nothing.
			if len(keys) > 0 {
				sb.WriteString(",")
			}
			sb.WriteString(`"\u0000extra-null-member":null`)
		}
		sb.WriteString(" }")
	case []any:
		sb.WriteString("[ ")
		for i, e := range v {
			if i > 0 {
				sb.WriteString(" , ")
			}
			respell(sb, e, style+uint8(i))
		}
		sb.WriteString(" ]")
	case string:
		respellString(sb, v, style)
	case json.Number:
		sb.WriteString(respellNumber(string(v), style))
	case bool:
		sb.WriteString(strconv.FormatBool(v))
	case nil:
		sb.WriteString("null")
	}
}

// respellString writes s with every non-ASCII rune and '/' as \u or \/
// escapes when style asks for it. (Not in another normalisation form:
// strings compare byte for byte.)
func respellString(sb *strings.Builder, s string, style uint8) {
	sb.WriteByte('"')
	for _, r := range s {
		switch {
		case r == '"' || r == '\\':
			sb.WriteByte('\\')
			sb.WriteRune(r)
		case r == '/' && style&4 == 4:
			sb.WriteString(`\/`)
		case r < 0x20 || (r >= 0x80 && style&4 == 4):
			if r > 0xFFFF {
				hi, lo := utf16.EncodeRune(r)
				fmt.Fprintf(sb, `\u%04X\u%04x`, hi, lo)
			} else {
				fmt.Fprintf(sb, `\u%04x`, r)
			}
		default:
			sb.WriteRune(r)
		}
	}
	sb.WriteByte('"')
}

// respellNumber returns another JSON spelling of the same decimal.
func respellNumber(text string, style uint8) string {
	neg := strings.HasPrefix(text, "-")
	text = strings.TrimPrefix(text, "-")
	mantissa, expText, _ := strings.Cut(strings.ToLower(text), "e")
	intPart, frac, _ := strings.Cut(mantissa, ".")
	exp, _ := strconv.ParseInt(strings.TrimLeft(strings.TrimLeft(expText, "+"), "0"), 10, 64)
	if strings.HasPrefix(expText, "-") {
		exp, _ = strconv.ParseInt("-"+strings.TrimLeft(expText[1:], "0"), 10, 64)
	}
	digits := strings.TrimLeft(intPart+frac, "0")
	exp -= int64(len(frac))
	if digits == "" {
		if style&8 == 8 {
			return "-0.000e" + strconv.Itoa(int(style)) // -0 == 0
		}
		return "0e-" + strconv.Itoa(int(style))
	}
	sign := ""
	if neg {
		sign = "-"
	}
	switch style % 3 {
	case 0: // 0.<digits>e<exp+len>
		return sign + "0." + digits + "0e" + strconv.FormatInt(exp+int64(len(digits)), 10)
	case 1: // <digits>00E<exp-2>
		return sign + digits + "00E" + strconv.FormatInt(exp-2, 10)
	default: // <d>.<rest>000e+<exp+len-1>
		x := exp + int64(len(digits)) - 1
		plus := ""
		if x >= 0 {
			plus = "+"
		}
		return sign + digits[:1] + "." + digits[1:] + "000e" + plus + strconv.FormatInt(x, 10)
	}
}

// requireSameNumbers walks two trees of the same shape (before and after
// canonicalisation) and compares the numbers' exact values where they are
// small enough for math/big.
func requireSameNumbers(t *testing.T, before, after any) {
	switch b := before.(type) {
	case map[string]any:
		a := after.(map[string]any)
		for k, v := range b {
			if v == nil {
				continue
			}
			requireSameNumbers(t, v, a[k])
		}
	case []any:
		a := after.([]any)
		require.Len(t, a, len(b))
		for i := range b {
			requireSameNumbers(t, b[i], a[i])
		}
	case json.Number:
		a := string(after.(json.Number))
		if len(b) > 200 || len(a) > 200 || hugeExponent(string(b)) || hugeExponent(a) {
			return
		}
		x, ok := new(big.Rat).SetString(string(b))
		require.True(t, ok)
		y, ok := new(big.Rat).SetString(a)
		require.True(t, ok)
		require.Zero(t, x.Cmp(y), "%s canonicalised to %s", b, a)
	}
}

func hugeExponent(s string) bool {
	_, e, ok := strings.Cut(strings.ToLower(s), "e")
	if !ok {
		return false
	}
	n, err := strconv.Atoi(e)
	return err != nil || n > 300 || n < -300
}
