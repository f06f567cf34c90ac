package fingerprint_test

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/fingerprint"
)

const (
	testNonce   = "00112233445566778899aabbccddeeff"
	testSubject = "user-42"
	testScope   = "payments.transfer"
	testBody    = `{"amount":"100.00","currency":"EUR","payee":{"account_id":"DE89"},"memo":"rent"}`
)

var testExpiry = time.Unix(1_753_500_000, 0)

// tokenFixture is a ring where k2 is active and k1 is the previous key.
type tokenFixture struct {
	ring     *fingerprint.KeyRing
	selector *fingerprint.Selector
	params   fingerprint.Params
}

func newTokenFixture(t testing.TB) tokenFixture {
	t.Helper()
	ring, err := fingerprint.NewKeyRing("k2", map[string][]byte{"k1": testKey(1), "k2": testKey(2)})
	require.NoError(t, err)
	sel := mustSelector(t, transferParams, fingerprint.Limits{})
	params, err := selectBody(t, sel, testBody, nil)
	require.NoError(t, err)
	return tokenFixture{ring: ring, selector: sel, params: params}
}

func (f tokenFixture) sign(t testing.TB, mutate func(*fingerprint.SignRequest)) (string, fingerprint.Claims) {
	t.Helper()
	req := fingerprint.SignRequest{Subject: testSubject, Scope: testScope, Params: f.params, Nonce: testNonce, Expiry: testExpiry}
	if mutate != nil {
		mutate(&req)
	}
	tok, claims, err := f.ring.Sign(req)
	require.NoError(t, err)
	return tok, claims
}

func (f tokenFixture) expect(t testing.TB, body string) fingerprint.Expect {
	t.Helper()
	p, err := selectBody(t, f.selector, body, nil)
	require.NoError(t, err)
	return fingerprint.Expect{Subject: testSubject, Scope: testScope, Params: &p}
}

// forge builds a token around any payload with a correct MAC, using the
// contract's construction directly (HMAC-SHA256 with the configured key over
// the base64url payload text).
func forge(key []byte, payload string) string {
	enc := base64.RawURLEncoding.EncodeToString([]byte(payload))
	m := hmac.New(sha256.New, key)
	m.Write([]byte(enc))
	return enc + "." + base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

func payloadOf(t testing.TB, token string) string {
	t.Helper()
	part, _, _ := strings.Cut(token, ".")
	b, err := base64.RawURLEncoding.DecodeString(part)
	require.NoError(t, err)
	return string(b)
}

func TestSignPayload(t *testing.T) {
	f := newTokenFixture(t)
	tok, claims := f.sign(t, nil)

	require.Equal(t, fingerprint.Version, claims.Version)
	require.Equal(t, "k2", claims.KeyID)
	require.Equal(t, testNonce, claims.Nonce)
	require.Equal(t, testExpiry.Unix(), claims.Expiry)
	require.Equal(t, testScope, claims.Scope)
	require.Equal(t, f.params.Hash, claims.ParamHash)
	wantTag, err := f.ring.SubjectTag("k2", testSubject)
	require.NoError(t, err)
	require.Equal(t, wantTag, claims.SubjectTag)
	require.Len(t, claims.FieldTags, 3)
	for _, path := range []string{"amount", "currency", "payee.account_id"} {
		require.Len(t, claims.FieldTags[path], 12)
	}

	payload := payloadOf(t, tok)
	require.NotContains(t, payload, testSubject, "the token must not carry the subject")
	require.NotContains(t, payload, "DE89", "the token must not carry values")
	// Members in the order v k n exp u s p f, compact.
	var keys []string
	dec := json.NewDecoder(strings.NewReader(payload))
	_, err = dec.Token()
	require.NoError(t, err)
	for dec.More() {
		k, err := dec.Token()
		require.NoError(t, err)
		keys = append(keys, k.(string))
		var skip json.RawMessage
		require.NoError(t, dec.Decode(&skip))
	}
	require.Equal(t, []string{"v", "k", "n", "exp", "u", "s", "p", "f"}, keys)
	require.True(t, strings.HasPrefix(payload, `{"v":1,"k":"k2","n":"`+testNonce+`","exp":1753500000,"u":"`), payload)
	// encoding/json reads it back to the same claims.
	var decoded fingerprint.Claims
	require.NoError(t, json.Unmarshal([]byte(payload), &decoded))
	require.Equal(t, claims, decoded)
	require.NotContains(t, payload, " ", "compact JSON")

	// Deterministic.
	again, _ := f.sign(t, nil)
	require.Equal(t, tok, again)
	require.Equal(t, time.Unix(1_753_500_000, 0).UTC(), claims.ExpiresAt())
}

func TestSignRejects(t *testing.T) {
	f := newTokenFixture(t)
	for _, tc := range []struct {
		name   string
		mutate func(*fingerprint.SignRequest)
	}{
		{"no subject", func(r *fingerprint.SignRequest) { r.Subject = "" }},
		{"no scope", func(r *fingerprint.SignRequest) { r.Scope = "" }},
		{"no nonce", func(r *fingerprint.SignRequest) { r.Nonce = "" }},
		{"upper-case nonce", func(r *fingerprint.SignRequest) { r.Nonce = strings.ToUpper(testNonce) }},
		{"short nonce", func(r *fingerprint.SignRequest) { r.Nonce = testNonce[:30] }},
		{"no params", func(r *fingerprint.SignRequest) { r.Params = fingerprint.Params{} }},
		{"no expiry", func(r *fingerprint.SignRequest) { r.Expiry = time.Time{} }},
		{"duplicate field", func(r *fingerprint.SignRequest) {
			r.Params.Fields = append(r.Params.Fields, r.Params.Fields[0])
		}},
		{"too long", func(r *fingerprint.SignRequest) { r.Scope = strings.Repeat("s", fingerprint.MaxTokenLength) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := fingerprint.SignRequest{Subject: testSubject, Scope: testScope, Params: f.params, Nonce: testNonce, Expiry: testExpiry}
			tc.mutate(&req)
			_, _, err := f.ring.Sign(req)
			require.Error(t, err)
		})
	}
}

func TestVerifyAccepts(t *testing.T) {
	f := newTokenFixture(t)
	tok, signed := f.sign(t, nil)
	for _, tc := range []struct {
		name string
		want fingerprint.Expect
		now  time.Time
	}{
		{"exact params", f.expect(t, testBody), testExpiry.Add(-time.Minute)},
		{"equivalent params", f.expect(t, `{"memo":"other","payee":{"account_id":"DE89"},"currency":"EUR","amount":100}`), testExpiry},
		{"at exp", f.expect(t, testBody), testExpiry},
		{"within the exp second", f.expect(t, testBody), testExpiry.Add(999 * time.Millisecond)},
		{"status: no params, expired allowed", fingerprint.Expect{Subject: testSubject, Scope: testScope, AllowExpired: true}, testExpiry.Add(time.Hour)},
		{"params nil skips p", fingerprint.Expect{Subject: testSubject, Scope: testScope}, testExpiry},
	} {
		t.Run(tc.name, func(t *testing.T) {
			claims, err := f.ring.Verify(tok, tc.want, tc.now)
			require.NoError(t, err)
			require.Equal(t, signed, claims)
		})
	}
}

func TestVerifyRotation(t *testing.T) {
	old, err := fingerprint.NewKeyRing("k1", map[string][]byte{"k1": testKey(1)})
	require.NoError(t, err)
	rotated, err := fingerprint.NewKeyRing("k2", map[string][]byte{"k1": testKey(1), "k2": testKey(2)})
	require.NoError(t, err)
	retired, err := fingerprint.NewKeyRing("k2", map[string][]byte{"k2": testKey(2)})
	require.NoError(t, err)

	f := newTokenFixture(t)
	req := fingerprint.SignRequest{Subject: testSubject, Scope: testScope, Params: f.params, Nonce: testNonce, Expiry: testExpiry}
	want := f.expect(t, testBody)

	oldTok, oldClaims, err := old.Sign(req)
	require.NoError(t, err)
	require.Equal(t, "k1", oldClaims.KeyID)
	newTok, newClaims, err := rotated.Sign(req)
	require.NoError(t, err)
	require.Equal(t, "k2", newClaims.KeyID)
	require.NotEqual(t, oldTok, newTok)

	// After rotation both verify.
	_, err = rotated.Verify(oldTok, want, testExpiry)
	require.NoError(t, err)
	_, err = rotated.Verify(newTok, want, testExpiry)
	require.NoError(t, err)
	// A ring that never had k2 does not know it; one that dropped k1 no longer accepts it.
	_, err = old.Verify(newTok, want, testExpiry)
	requireReason(t, err, fingerprint.ReasonUnknownKey)
	claims, err := retired.Verify(oldTok, want, testExpiry)
	requireReason(t, err, fingerprint.ReasonUnknownKey)
	require.Zero(t, claims, "no claims before the MAC is verified")
	require.NotContains(t, err.Error(), "k1", "the error does not name the key tried")

	// Same id, different secret: the MAC fails.
	impostor, err := fingerprint.NewKeyRing("k1", map[string][]byte{"k1": testKey(9)})
	require.NoError(t, err)
	claims, err = impostor.Verify(oldTok, want, testExpiry)
	requireReason(t, err, fingerprint.ReasonBadMAC)
	require.Zero(t, claims)
	require.Equal(t, "fingerprint rejected: bad_mac", err.Error())
}

func requireReason(t testing.TB, err error, want fingerprint.Reason) *fingerprint.VerifyError {
	t.Helper()
	require.Error(t, err)
	var ve *fingerprint.VerifyError
	require.ErrorAs(t, err, &ve)
	require.Equal(t, want, ve.Reason, err.Error())
	reason, ok := fingerprint.ReasonOf(fmt.Errorf("wrapped: %w", err))
	require.True(t, ok)
	require.Equal(t, want, reason)
	return ve
}

func TestVerifyRejects(t *testing.T) {
	f := newTokenFixture(t)
	tok, signed := f.sign(t, nil)
	payloadPart, sigPart, _ := strings.Cut(tok, ".")
	good := f.expect(t, testBody)
	k2 := testKey(2)
	payload := payloadOf(t, tok)
	withMember := func(old, repl string) string {
		require.Contains(t, payload, old)
		return forge(k2, strings.Replace(payload, old, repl, 1))
	}
	flipLast := func(s string) string {
		last := s[len(s)-1]
		repl := byte('A')
		if last == 'A' {
			repl = 'Q'
		}
		return s[:len(s)-1] + string(repl)
	}

	for _, tc := range []struct {
		name         string
		token        string
		want         fingerprint.Expect
		now          time.Time
		reason       fingerprint.Reason
		changed      []string
		claimsShown  bool
		errorMessage string
	}{
		// Syntax.
		{name: "empty", token: "", reason: fingerprint.ReasonMalformed},
		{name: "no dot", token: payloadPart, reason: fingerprint.ReasonMalformed},
		{name: "empty signature", token: payloadPart + ".", reason: fingerprint.ReasonMalformed},
		{name: "empty payload", token: "." + sigPart, reason: fingerprint.ReasonMalformed},
		{name: "three parts", token: tok + ".x", reason: fingerprint.ReasonMalformed},
		{name: "three parts, empty", token: tok + ".", reason: fingerprint.ReasonMalformed},
		{name: "padding", token: payloadPart + "." + sigPart + "=", reason: fingerprint.ReasonMalformed},
		{name: "padded payload", token: payloadPart + "==." + sigPart, reason: fingerprint.ReasonMalformed},
		{name: "standard alphabet", token: strings.NewReplacer("-", "+", "_", "/").Replace(forceAlphabetChars(t, f, tok)), reason: fingerprint.ReasonMalformed},
		{name: "line break", token: payloadPart + ".\n" + sigPart, reason: fingerprint.ReasonMalformed},
		{name: "space", token: " " + tok, reason: fingerprint.ReasonMalformed},
		{name: "non-zero trailing bits", token: payloadPart + "." + sigPart[:len(sigPart)-1] + string(nextTrailing(sigPart[len(sigPart)-1])), reason: fingerprint.ReasonMalformed},
		{name: "short signature", token: payloadPart + "." + sigPart[:40], reason: fingerprint.ReasonMalformed},
		{name: "long signature", token: payloadPart + "." + sigPart + "AAAA", reason: fingerprint.ReasonMalformed},
		{name: "oversize", token: tok + strings.Repeat("A", fingerprint.MaxTokenLength), reason: fingerprint.ReasonMalformed},
		{name: "payload not JSON", token: forge(k2, "not json"), reason: fingerprint.ReasonMalformed},
		{name: "payload an array", token: forge(k2, `["v",1]`), reason: fingerprint.ReasonMalformed},
		{name: "payload with trailing data", token: forge(k2, payload+" x"), reason: fingerprint.ReasonMalformed},
		{name: "member missing", token: withMember(`,"s":"payments.transfer"`, ``), reason: fingerprint.ReasonMalformed},
		{name: "extra member", token: withMember(`{"v":1,`, `{"v":1,"x":0,`), reason: fingerprint.ReasonMalformed},
		{name: "duplicate member", token: withMember(`{"v":1,`, `{"v":1,"v":1,`), reason: fingerprint.ReasonMalformed},
		{name: "v a string", token: withMember(`"v":1`, `"v":"1"`), reason: fingerprint.ReasonMalformed},
		{name: "v fractional", token: withMember(`"v":1`, `"v":1.0`), reason: fingerprint.ReasonMalformed},
		{name: "exp exponent form", token: withMember(`"exp":1753500000`, `"exp":1.7535e9`), reason: fingerprint.ReasonMalformed},
		{name: "exp overflow", token: withMember(`"exp":1753500000`, `"exp":99999999999999999999`), reason: fingerprint.ReasonMalformed},
		{name: "exp a string", token: withMember(`"exp":1753500000`, `"exp":"1753500000"`), reason: fingerprint.ReasonMalformed},
		{name: "n upper-case", token: withMember(testNonce, strings.ToUpper(testNonce)), reason: fingerprint.ReasonMalformed},
		{name: "n short", token: withMember(testNonce, testNonce[:31]), reason: fingerprint.ReasonMalformed},
		{name: "p not hex", token: withMember(signed.ParamHash, strings.Repeat("g", 64)), reason: fingerprint.ReasonMalformed},
		{name: "k not an id", token: withMember(`"k":"k2"`, `"k":"k 2"`), reason: fingerprint.ReasonMalformed},
		{name: "u null", token: withMember(`"u":"`+signed.SubjectTag+`"`, `"u":null`), reason: fingerprint.ReasonMalformed},
		{name: "f an array", token: forge(k2, payload[:strings.Index(payload, `"f":`)]+`"f":["x"]}`), reason: fingerprint.ReasonMalformed},
		{name: "f value a number", token: withMember(`"amount":"`+signed.FieldTags["amount"]+`"`, `"amount":1`), reason: fingerprint.ReasonMalformed},
		// Key and MAC.
		{name: "unknown key id", token: withMember(`"k":"k2"`, `"k":"k3"`), reason: fingerprint.ReasonUnknownKey},
		{name: "forged MAC", token: payloadPart + "." + flipLast(sigPart[:len(sigPart)-1]) + sigPart[len(sigPart)-1:], reason: fingerprint.ReasonBadMAC, errorMessage: "fingerprint rejected: bad_mac"},
		{name: "signature of another token", token: payloadPart + "." + strings.Split(forge(k2, "{}"), ".")[1], reason: fingerprint.ReasonBadMAC},
		{name: "payload changed, old MAC", token: base64.RawURLEncoding.EncodeToString([]byte(strings.Replace(payload, `"exp":1753500000`, `"exp":1753599999`, 1))) + "." + sigPart, reason: fingerprint.ReasonBadMAC},
		{name: "MAC with another key", token: forge(testKey(1), payload), reason: fingerprint.ReasonBadMAC},
		{name: "MAC over raw payload bytes", token: payloadPart + "." + macOfRaw(k2, payload), reason: fingerprint.ReasonBadMAC},
		// After the MAC, in order v, s, u, exp, p.
		{name: "bad version", token: withMember(`"v":1`, `"v":2`), reason: fingerprint.ReasonBadVersion, claimsShown: true},
		{name: "bad version before scope", token: withMember(`"v":1`, `"v":0`), want: fingerprint.Expect{Subject: testSubject, Scope: "other"}, reason: fingerprint.ReasonBadVersion, claimsShown: true},
		{name: "wrong scope", token: tok, want: fingerprint.Expect{Subject: testSubject, Scope: "payments.refund", Params: good.Params}, reason: fingerprint.ReasonWrongScope, claimsShown: true},
		{name: "wrong scope before subject", token: tok, want: fingerprint.Expect{Subject: "someone-else", Scope: "payments.refund"}, now: testExpiry.Add(time.Hour), reason: fingerprint.ReasonWrongScope, claimsShown: true},
		{name: "wrong subject", token: tok, want: fingerprint.Expect{Subject: "user-43", Scope: testScope, Params: good.Params}, reason: fingerprint.ReasonWrongSubject, claimsShown: true},
		{name: "empty subject", token: tok, want: fingerprint.Expect{Subject: "", Scope: testScope}, reason: fingerprint.ReasonWrongSubject, claimsShown: true},
		{name: "wrong subject before expiry", token: tok, want: fingerprint.Expect{Subject: "user-43", Scope: testScope}, now: testExpiry.Add(time.Hour), reason: fingerprint.ReasonWrongSubject, claimsShown: true},
		{name: "expired one second after exp", token: tok, want: good, now: testExpiry.Add(time.Second), reason: fingerprint.ReasonExpired, claimsShown: true},
		{name: "expired before params", token: tok, want: f.expect(t, `{"amount":"1"}`), now: testExpiry.Add(time.Hour), reason: fingerprint.ReasonExpired, claimsShown: true},
		{name: "status with expired token still checks expiry unless allowed", token: tok, want: fingerprint.Expect{Subject: testSubject, Scope: testScope}, now: testExpiry.Add(time.Second), reason: fingerprint.ReasonExpired, claimsShown: true},
		{name: "params changed: amount", token: tok, want: f.expect(t, `{"amount":"1000.00","currency":"EUR","payee":{"account_id":"DE89"}}`), reason: fingerprint.ReasonParamsChanged, changed: []string{"amount"}, claimsShown: true, errorMessage: "fingerprint rejected: params_changed (changed: amount)"},
		{name: "params changed: payee and currency, configured order", token: tok, want: f.expect(t, `{"payee":{"account_id":"XX00"},"currency":"USD","amount":"100"}`), reason: fingerprint.ReasonParamsChanged, changed: []string{"currency", "payee.account_id"}, claimsShown: true},
		{name: "params changed: field removed", token: tok, want: f.expect(t, `{"amount":"100","currency":"EUR"}`), reason: fingerprint.ReasonParamsChanged, changed: []string{"payee.account_id"}, claimsShown: true},
		{name: "params changed: field nulled", token: tok, want: f.expect(t, `{"amount":"100","currency":null,"payee":{"account_id":"DE89"}}`), reason: fingerprint.ReasonParamsChanged, changed: []string{"currency"}, claimsShown: true},
		{name: "params changed: everything", token: tok, want: f.expect(t, `{}`), reason: fingerprint.ReasonParamsChanged, changed: []string{"amount", "currency", "payee.account_id"}, claimsShown: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want := tc.want
			if want.Scope == "" && want.Subject == "" && want.Params == nil {
				want = good
			}
			now := tc.now
			if now.IsZero() {
				now = testExpiry
			}
			claims, err := f.ring.Verify(tc.token, want, now)
			ve := requireReason(t, err, tc.reason)
			require.Equal(t, tc.changed, ve.ChangedFields)
			// Without Claims.FieldTags (the confirm path): the same answer,
			// the changed fields included, and the claims without the tags.
			lean := want
			lean.OmitFieldTags = true
			leanClaims, leanErr := f.ring.Verify(tc.token, lean, now)
			require.Equal(t, ve, requireReason(t, leanErr, tc.reason), "the same reason, detail and changed fields")
			require.Nil(t, leanClaims.FieldTags)
			leanClaims.FieldTags = claims.FieldTags
			require.Equal(t, claims, leanClaims)
			if tc.claimsShown {
				require.NotZero(t, claims.Nonce, "claims come back once the MAC is verified")
				require.Equal(t, testNonce, claims.Nonce)
			} else {
				require.Zero(t, claims)
			}
			if tc.errorMessage != "" {
				require.Equal(t, tc.errorMessage, err.Error())
			}
			require.NotContains(t, err.Error(), "k2", "no error names the key")
		})
	}
}

// TestVerifyLengthLimit: a token of exactly MaxTokenLength is read; a
// longer one with a valid MAC is refused before anything is decoded.
func TestVerifyLengthLimit(t *testing.T) {
	f := newTokenFixture(t)
	_, signed := f.sign(t, nil)
	build := func(tokenLen int) string {
		// token = base64url(payload) "." 43 characters; pad the scope.
		payloadChars := tokenLen - 1 - 43
		require.NotEqual(t, 1, payloadChars%4, "not a base64 length")
		payloadBytes := payloadChars * 3 / 4
		base := fmt.Sprintf(`{"v":1,"k":"k2","n":"%s","exp":%d,"u":"%s","s":"","p":"%s","f":{}}`,
			testNonce, signed.Expiry, signed.SubjectTag, signed.ParamHash)
		scope := strings.Repeat("s", payloadBytes-len(base))
		tok := forge(testKey(2), strings.Replace(base, `"s":""`, `"s":"`+scope+`"`, 1))
		require.Len(t, tok, tokenLen)
		return tok
	}
	want := fingerprint.Expect{Subject: testSubject, Scope: testScope}
	claims, err := f.ring.Verify(build(fingerprint.MaxTokenLength), want, testExpiry)
	requireReason(t, err, fingerprint.ReasonWrongScope) // read, MAC checked
	require.Equal(t, testNonce, claims.Nonce)
	claims, err = f.ring.Verify(build(fingerprint.MaxTokenLength+2), want, testExpiry)
	requireReason(t, err, fingerprint.ReasonMalformed)
	require.Zero(t, claims)
}

// TestVerifyParamsChangedAddedField covers a field absent at preview and
// present at confirm.
func TestVerifyParamsChangedAddedField(t *testing.T) {
	f := newTokenFixture(t)
	params, err := selectBody(t, f.selector, `{"amount":"5","payee":{"account_id":"DE89"}}`, nil)
	require.NoError(t, err)
	tok, claims := f.sign(t, func(r *fingerprint.SignRequest) { r.Params = params })
	require.NotContains(t, claims.FieldTags, "currency")
	_, err = f.ring.Verify(tok, f.expect(t, `{"amount":"5","currency":"EUR","payee":{"account_id":"DE89"}}`), testExpiry)
	ve := requireReason(t, err, fingerprint.ReasonParamsChanged)
	require.Equal(t, []string{"currency"}, ve.ChangedFields)
}

// TestVerifyParamsChangedConfigDrift: fields the token knows but the current
// config does not are listed after the configured ones, sorted.
func TestVerifyParamsChangedConfigDrift(t *testing.T) {
	f := newTokenFixture(t)
	tok, _ := f.sign(t, nil)
	narrower := mustSelector(t, []fingerprint.Param{{Path: "currency"}, {Path: "amount", Decimal: true}}, fingerprint.Limits{})
	p, err := selectBody(t, narrower, testBody, nil)
	require.NoError(t, err)
	_, err = f.ring.Verify(tok, fingerprint.Expect{Subject: testSubject, Scope: testScope, Params: &p}, testExpiry)
	ve := requireReason(t, err, fingerprint.ReasonParamsChanged)
	require.Equal(t, []string{"payee.account_id"}, ve.ChangedFields)
}

func TestVerifyNeverPanicsOnNilRing(t *testing.T) {
	var r *fingerprint.KeyRing
	_, err := r.Verify("a.b", fingerprint.Expect{}, testExpiry)
	requireReason(t, err, fingerprint.ReasonMalformed)
	_, _, err = r.Sign(fingerprint.SignRequest{})
	require.Error(t, err)

	// A zero KeyRing (not from NewKeyRing) knows no keys and signs nothing.
	f := newTokenFixture(t)
	tok, _ := f.sign(t, nil)
	zero := &fingerprint.KeyRing{}
	_, err = zero.Verify(tok, f.expect(t, testBody), testExpiry)
	requireReason(t, err, fingerprint.ReasonUnknownKey)
	_, _, err = zero.Sign(fingerprint.SignRequest{Subject: testSubject, Scope: testScope, Params: f.params, Nonce: testNonce, Expiry: testExpiry})
	require.ErrorContains(t, err, "no active key")
}

func TestNewNonce(t *testing.T) {
	seen := map[string]bool{}
	for range 100 {
		n, err := fingerprint.NewNonce()
		require.NoError(t, err)
		require.Regexp(t, `^[0-9a-f]{32}$`, n)
		require.False(t, seen[n])
		seen[n] = true
	}
}

// forceAlphabetChars returns a token that contains '-' or '_' so the
// standard-alphabet replacement really changes it: it re-signs with nonces
// until one does.
func forceAlphabetChars(t testing.TB, f tokenFixture, tok string) string {
	t.Helper()
	for i := 0; !strings.ContainsAny(tok, "-_"); i++ {
		require.Less(t, i, 256)
		tok, _ = f.sign(t, func(r *fingerprint.SignRequest) { r.Nonce = fmt.Sprintf("%032x", i) })
	}
	return tok
}

// nextTrailing returns a base64url character that decodes to the same bytes
// as c in the last position of a 43-character (32-byte) encoding but has a
// non-zero trailing bit.
func nextTrailing(c byte) byte {
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
	i := strings.IndexByte(alphabet, c)
	return alphabet[i|1]
}

func macOfRaw(key []byte, payload string) string {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(payload))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// TestKeyRingConcurrentUse signs and verifies from many goroutines at once
// (the ring pools HMAC states); run with -race. Every goroutine must get the
// same tokens and verdicts as a serial run.
func TestKeyRingConcurrentUse(t *testing.T) {
	f := newTokenFixture(t)
	want := f.expect(t, testBody)
	changed := f.expect(t, `{"amount":"1","currency":"EUR","payee":{"account_id":"DE89"}}`)
	serial := make([]string, 16)
	for i := range serial {
		serial[i], _ = f.sign(t, func(r *fingerprint.SignRequest) { r.Nonce = fmt.Sprintf("%032x", i) })
	}
	errs := make(chan error, 8)
	for g := range 8 {
		go func() {
			errs <- func() error {
				for round := range 50 {
					i := (g + round) % len(serial)
					tok, _, err := f.ring.Sign(fingerprint.SignRequest{Subject: testSubject, Scope: testScope, Params: f.params, Nonce: fmt.Sprintf("%032x", i), Expiry: testExpiry})
					if err != nil {
						return err
					}
					if tok != serial[i] {
						return fmt.Errorf("goroutine %d: token %d differs", g, i)
					}
					if _, err := f.ring.Verify(tok, want, testExpiry); err != nil {
						return err
					}
					_, err = f.ring.Verify(tok, changed, testExpiry)
					var ve *fingerprint.VerifyError
					if !errors.As(err, &ve) || ve.Reason != fingerprint.ReasonParamsChanged || !slices.Equal(ve.ChangedFields, []string{"amount"}) {
						return fmt.Errorf("goroutine %d: want params_changed [amount], got %v", g, err)
					}
				}
				return nil
			}()
		}()
	}
	for range 8 {
		require.NoError(t, <-errs)
	}
}
