package approver

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/hmac"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

var enc = base64.RawURLEncoding

func sign(t *testing.T, alg, kid string, key any, claims map[string]any) string {
	t.Helper()
	h, _ := json.Marshal(map[string]any{"alg": alg, "kid": kid, "typ": "JWT"})
	c, _ := json.Marshal(claims)
	signed := enc.EncodeToString(h) + "." + enc.EncodeToString(c)
	var sig []byte
	switch k := key.(type) {
	case *ecdsa.PrivateKey:
		d := sha256.Sum256([]byte(signed))
		r, s, err := ecdsa.Sign(rand.Reader, k, d[:])
		require.NoError(t, err)
		sig = append(r.FillBytes(make([]byte, 32)), s.FillBytes(make([]byte, 32))...)
	case *rsa.PrivateKey:
		d := sha256.Sum256([]byte(signed))
		var err error
		sig, err = rsa.SignPKCS1v15(rand.Reader, k, crypto.SHA256, d[:])
		require.NoError(t, err)
	case ed25519.PrivateKey:
		sig = ed25519.Sign(k, []byte(signed))
	case []byte:
		m := hmac.New(sha256.New, k)
		m.Write([]byte(signed))
		sig = m.Sum(nil)
	case nil:
	}
	return signed + "." + enc.EncodeToString(sig)
}

// testKeys returns the private keys and a JWKS with their public halves.
func testKeys(t *testing.T) (*ecdsa.PrivateKey, *rsa.PrivateKey, ed25519.PrivateKey, []byte) {
	ec, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	rs, err := rsa.GenerateKey(rand.Reader, 2048)
	require.NoError(t, err)
	edPub, ed, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	raw, err := ec.PublicKey.Bytes()
	require.NoError(t, err)
	jwks := fmt.Sprintf(`{"keys":[
		{"kty":"EC","crv":"P-256","kid":"ec","x":%q,"y":%q},
		{"kty":"RSA","kid":"rsa","alg":"RS256","n":%q,"e":%q},
		{"kty":"OKP","crv":"Ed25519","kid":"ed","x":%q}]}`,
		enc.EncodeToString(raw[1:33]), enc.EncodeToString(raw[33:]),
		enc.EncodeToString(rs.N.Bytes()), enc.EncodeToString([]byte{1, 0, 1}),
		enc.EncodeToString(edPub))
	return ec, rs, ed, []byte(jwks)
}

func TestVerify(t *testing.T) {
	ec, rs, ed, jwks := testKeys(t)
	set, err := ParseJWKS(jwks)
	require.NoError(t, err)
	now := time.Unix(1_800_000_000, 0)
	v := &Verifier{Issuer: "https://idp.example", Audience: "idemgate-approvals", Leeway: 60 * time.Second, Keys: set, Now: func() time.Time { return now }}
	good := func() map[string]any {
		return map[string]any{"iss": "https://idp.example", "aud": "idemgate-approvals", "sub": "alice", "exp": now.Add(time.Minute).Unix()}
	}
	for _, tc := range []struct {
		alg, kid string
		key      any
	}{{"ES256", "ec", ec}, {"RS256", "rsa", rs}, {"EdDSA", "ed", ed}, {"ES256", "", ec}} {
		c, err := v.Verify(sign(t, tc.alg, tc.kid, tc.key, good()))
		require.NoError(t, err, tc.alg)
		require.Equal(t, "alice", c.Subject)
	}
	with := func(k string, val any) map[string]any {
		c := good()
		if val == nil {
			delete(c, k)
		} else {
			c[k] = val
		}
		return c
	}
	bad := map[string]string{
		"none":            sign(t, "none", "ec", nil, good()),
		"hmac with a pub": sign(t, "HS256", "ec", []byte("whatever"), good()),
		"wrong key":       sign(t, "ES256", "rsa", ec, good()),
		"alg of another":  sign(t, "RS256", "ec", rs, good()),
		"issuer":          sign(t, "ES256", "ec", ec, with("iss", "https://evil.example")),
		"audience":        sign(t, "ES256", "ec", ec, with("aud", "other")),
		"no sub":          sign(t, "ES256", "ec", ec, with("sub", nil)),
		"no exp":          sign(t, "ES256", "ec", ec, with("exp", nil)),
		"expired":         sign(t, "ES256", "ec", ec, with("exp", now.Add(-61*time.Second).Unix())),
		"not yet":         sign(t, "ES256", "ec", ec, with("nbf", now.Add(61*time.Second).Unix())),
		"garbage":         "a.b",
	}
	for name, tok := range bad {
		_, err := v.Verify(tok)
		require.ErrorIs(t, err, ErrInvalidToken, name)
	}
	// Inside the leeway.
	_, err = v.Verify(sign(t, "ES256", "ec", ec, with("exp", now.Add(-59*time.Second).Unix())))
	require.NoError(t, err)
	_, err = v.Verify(sign(t, "ES256", "ec", ec, with("aud", []string{"x", "idemgate-approvals"})))
	require.NoError(t, err)
	// A tampered payload keeps the old signature.
	tok := strings.Split(sign(t, "ES256", "ec", ec, good()), ".")
	fb, _ := json.Marshal(with("sub", "mallory"))
	_, err = v.Verify(tok[0] + "." + enc.EncodeToString(fb) + "." + tok[2])
	require.ErrorIs(t, err, ErrInvalidToken)
}

func TestParseJWKSRefuses(t *testing.T) {
	for name, doc := range map[string]string{
		"empty":    `{"keys":[]}`,
		"oct":      `{"keys":[{"kty":"oct","k":"c2VjcmV0"}]}`,
		"private":  `{"keys":[{"kty":"OKP","crv":"Ed25519","x":"11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo","d":"nWGxne_9WmC6hEr0kuwsxERJxWl7MmkZcDusAxyuf2A"}]}`,
		"enc use":  `{"keys":[{"kty":"OKP","crv":"Ed25519","use":"enc","x":"11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo"}]}`,
		"bad alg":  `{"keys":[{"kty":"OKP","crv":"Ed25519","alg":"HS256","x":"11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo"}]}`,
		"not json": `nope`,
	} {
		_, err := ParseJWKS([]byte(doc))
		require.Error(t, err, name)
	}
}

func TestRemoteJWKSCachesAndRefreshesOnRotation(t *testing.T) {
	ec, _, ed, jwks := testKeys(t)
	var (
		mu      sync.Mutex
		fetches int
		body    = []byte(`{"keys":[{"kty":"OKP","crv":"Ed25519","kid":"old","x":"11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo"}]}`)
		down    bool
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		fetches++
		if down {
			http.Error(w, "down", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write(body)
	}))
	defer srv.Close()
	now := time.Unix(1_800_000_000, 0)
	clock := func() time.Time { return now }
	remote := &RemoteJWKS{URL: srv.URL, Cache: time.Minute, MinRefresh: 10 * time.Second, Now: clock}
	v := &Verifier{Issuer: "https://idp.example", Audience: "a", Remote: remote, Now: clock}
	claims := map[string]any{"iss": "https://idp.example", "aud": "a", "sub": "alice", "exp": now.Add(time.Hour).Unix()}

	// The IdP rotates to the test set: the unknown kid refreshes early.
	_, err := v.Verify(sign(t, "EdDSA", "ed", ed, claims))
	require.ErrorIs(t, err, ErrInvalidToken, "the first set does not hold kid ed")
	mu.Lock()
	body = jwks
	mu.Unlock()
	now = now.Add(11 * time.Second)
	c, err := v.Verify(sign(t, "EdDSA", "ed", ed, claims))
	require.NoError(t, err)
	require.Equal(t, "alice", c.Subject)
	for range 5 {
		_, err = v.Verify(sign(t, "ES256", "ec", ec, claims))
		require.NoError(t, err)
	}
	mu.Lock()
	require.Equal(t, 2, fetches, "cached between refreshes")
	down = true
	mu.Unlock()

	// Past the cache life with the IdP down: the cached set still verifies.
	now = now.Add(2 * time.Minute)
	_, err = v.Verify(sign(t, "ES256", "ec", ec, claims))
	require.NoError(t, err)

	// Nothing cached and the IdP down: no token verifies.
	cold := &Verifier{Issuer: "https://idp.example", Audience: "a", Remote: &RemoteJWKS{URL: srv.URL, Now: clock}, Now: clock}
	_, err = cold.Verify(sign(t, "ES256", "ec", ec, claims))
	require.ErrorIs(t, err, ErrKeysUnavailable)
	require.NotErrorIs(t, err, ErrInvalidToken)
}

// TestVerifyStepUpClaims: acr, amr and auth_time come through as the token
// says; a payload with a claim twice (read differently by different
// parsers) is refused.
func TestVerifyStepUpClaims(t *testing.T) {
	_, _, ed, jwks := testKeys(t)
	set, err := ParseJWKS(jwks)
	require.NoError(t, err)
	now := time.Unix(1_800_000_000, 0)
	v := &Verifier{Issuer: "https://idp.example", Audience: "a", Keys: set, Now: func() time.Time { return now }}
	tok := sign(t, "EdDSA", "ed", ed, map[string]any{"iss": "https://idp.example", "aud": "a", "sub": "alice",
		"exp": now.Add(time.Minute).Unix(), "acr": "urn:example:sca", "amr": []string{"hwk", "pin"}, "auth_time": now.Add(-time.Minute).Unix()})
	c, err := v.Verify(tok)
	require.NoError(t, err)
	require.Equal(t, "urn:example:sca", c.ACR)
	require.Equal(t, []string{"hwk", "pin"}, c.AMR)
	require.True(t, c.AuthTime.Equal(now.Add(-time.Minute)))

	plain := sign(t, "EdDSA", "ed", ed, map[string]any{"iss": "https://idp.example", "aud": "a", "sub": "alice", "exp": now.Add(time.Minute).Unix()})
	c, err = v.Verify(plain)
	require.NoError(t, err)
	require.Empty(t, c.ACR)
	require.True(t, c.AuthTime.IsZero())

	// The same signature scheme over a payload with "sub" twice.
	h := enc.EncodeToString([]byte(`{"alg":"EdDSA","kid":"ed"}`))
	p := enc.EncodeToString(fmt.Appendf(nil, `{"iss":"https://idp.example","aud":"a","sub":"bob","sub":"alice","exp":%d}`, now.Add(time.Minute).Unix()))
	dup := h + "." + p + "." + enc.EncodeToString(ed25519.Sign(ed, []byte(h+"."+p)))
	_, err = v.Verify(dup)
	require.ErrorIs(t, err, ErrInvalidToken)
	require.ErrorContains(t, err, "not strict JSON")
}
