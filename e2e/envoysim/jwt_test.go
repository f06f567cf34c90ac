package envoysim

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"math/big"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/e2e/demoauth"
)

const subjectHeader = "x-idemgate-subject"

// demoChain is the filter chain of the shipped envoy.yaml: header_mutation
// strips the subject header, jwt_authn verifies and sets it, ext_proc sees it.
func demoChain(withHeaderMutation bool) func(*Config) {
	return func(c *Config) {
		if withHeaderMutation {
			c.HeaderMutation = &HeaderMutation{RequestMutations: []HeaderMutationOp{{Remove: subjectHeader}}}
		}
		c.JWTAuthn = &JWTAuthn{
			Providers: map[string]JWTProvider{"demo": {
				Issuer:            demoauth.Issuer,
				Audiences:         []string{demoauth.Audience},
				FromHeaders:       []JWTHeader{{Name: "Authorization", ValuePrefix: "Bearer "}},
				LocalJWKS:         demoauth.JWKS(),
				PayloadInMetadata: "jwt_payload",
				ClaimToHeaders:    []ClaimToHeader{{HeaderName: subjectHeader, ClaimName: "sub"}},
			}},
			Rules: []JWTRule{
				{Match: RouteMatch{Prefix: "/public"}},
				{Match: RouteMatch{Prefix: "/v1/"}, Requires: &JWTRequirement{ProviderName: "demo"}},
			},
		}
		c.ExtProc.MetadataOptions.ForwardingNamespaces = []string{JWTAuthnMetadataNamespace}
		c.ExtProc.ProcessingMode.ResponseHeaderMode = HeaderSkip
	}
}

func mintDemo(t *testing.T, sub string, ttl time.Duration) string {
	t.Helper()
	tok, err := demoauth.Mint(sub, ttl, time.Now())
	require.NoError(t, err)
	return tok
}

// signJWT builds a token with the given header and claims.
func signJWT(t *testing.T, header, claims map[string]any, sign func(signed []byte) []byte) string {
	t.Helper()
	enc := base64.RawURLEncoding
	h, err := json.Marshal(header)
	require.NoError(t, err)
	c, err := json.Marshal(claims)
	require.NoError(t, err)
	in := enc.EncodeToString(h) + "." + enc.EncodeToString(c)
	return in + "." + enc.EncodeToString(sign([]byte(in)))
}

func es256Signer(t *testing.T, key *ecdsa.PrivateKey) func([]byte) []byte {
	return func(in []byte) []byte {
		d := sha256.Sum256(in)
		r, s, err := ecdsa.Sign(rand.Reader, key, d[:])
		require.NoError(t, err)
		out := make([]byte, 64)
		r.FillBytes(out[:32])
		s.FillBytes(out[32:])
		return out
	}
}

func demoClaims(mod func(map[string]any)) map[string]any {
	now := time.Now().Unix()
	c := map[string]any{"iss": demoauth.Issuer, "aud": demoauth.Audience, "sub": "alice", "iat": now, "exp": now + 600}
	if mod != nil {
		mod(c)
	}
	return c
}

func TestClientSubjectIsStrippedAndReplacedByTheVerifiedSub(t *testing.T) {
	env := requireEnv(t, replyAll(), demoChain(true))
	res := env.do(t, http.MethodPost, "/v1/transfers/confirm", `{}`, map[string]string{
		"Authorization":      "Bearer " + mintDemo(t, "alice", time.Minute),
		"X-Idemgate-Subject": "mallory",
	})
	require.NoError(t, res.err)
	require.Equal(t, 200, res.status)

	rec := env.fp.nextStream(t)
	rec.waitDone(t)
	first := rec.messages()[0]
	var subjects []string
	for _, e := range headerValues(first.GetRequestHeaders().GetHeaders()) {
		require.NotEqual(t, "authorization", e[0], "forward: false removes the token header")
		if e[0] == subjectHeader {
			subjects = append(subjects, e[1])
		}
	}
	require.Equal(t, []string{"alice"}, subjects)
	payload := first.GetMetadataContext().GetFilterMetadata()[JWTAuthnMetadataNamespace].GetFields()["jwt_payload"].GetStructValue()
	require.Equal(t, "alice", payload.GetFields()["sub"].GetStringValue())
	require.Equal(t, demoauth.Issuer, payload.GetFields()["iss"].GetStringValue())

	up := env.upstream.requests()[0]
	require.Equal(t, []string{"alice"}, up.header.Values("X-Idemgate-Subject"))
	require.Empty(t, up.header.Get("Authorization"))
}

func TestWithoutTheHeaderMutationStepTheClientSubjectSurvives(t *testing.T) {
	env := requireEnv(t, replyAll(), demoChain(false))
	res := env.do(t, http.MethodPost, "/v1/transfers/confirm", `{}`, map[string]string{
		"Authorization":      "Bearer " + mintDemo(t, "alice", time.Minute),
		"X-Idemgate-Subject": "mallory",
	})
	require.NoError(t, res.err)
	// claim_to_headers adds; it does not replace the client's value.
	require.Equal(t, []string{"mallory", "alice"}, env.upstream.requests()[0].header.Values("X-Idemgate-Subject"))
}

func TestBadJWTIs401AndOpensNoStream(t *testing.T) {
	otherKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	demoHeader := map[string]any{"alg": "ES256", "typ": "JWT", "kid": demoauth.KeyID}
	good := mintDemo(t, "alice", time.Minute)
	parts := strings.Split(good, ".")
	tampered := parts[0] + "." + base64.RawURLEncoding.EncodeToString([]byte(`{"iss":"`+demoauth.Issuer+`","aud":"`+demoauth.Audience+`","sub":"mallory"}`)) + "." + parts[2]
	for _, tc := range []struct {
		name       string
		auth       string
		wantStatus int
		wantBody   string
	}{
		{"missing", "", 401, "Jwt is missing"},
		{"not a bearer token", "Basic dXNlcjpwdw==", 401, "Jwt is missing"},
		{"expired", "Bearer " + mintDemo(t, "alice", -10*time.Minute), 401, "Jwt is expired"},
		{"tampered payload", "Bearer " + tampered, 401, "Jwt verification fails"},
		{"signed by another key", "Bearer " + signJWT(t, demoHeader, demoClaims(nil), es256Signer(t, otherKey)), 401, "Jwt verification fails"},
		{"unknown kid", "Bearer " + signJWT(t, map[string]any{"alg": "ES256", "kid": "other"}, demoClaims(nil), es256Signer(t, otherKey)), 401, "Jwks doesn't have key to match kid or alg from Jwt"},
		{"wrong issuer", "Bearer " + signJWT(t, demoHeader, demoClaims(func(c map[string]any) { c["iss"] = "https://evil" }), es256Signer(t, otherKey)), 401, "Jwt issuer is not configured"},
		{"wrong audience", "Bearer " + signJWT(t, demoHeader, demoClaims(func(c map[string]any) { c["aud"] = []string{"other"} }), es256Signer(t, otherKey)), 403, "Audiences in Jwt are not allowed"},
		{"not yet valid", "Bearer " + signJWT(t, demoHeader, demoClaims(func(c map[string]any) { c["nbf"] = time.Now().Unix() + 3600 }), es256Signer(t, otherKey)), 401, "Jwt not yet valid"},
		{"garbage", "Bearer abc.def", 401, "Jwt is not in the form of Header.Payload.Signature with two dots and 3 sections"},
		{"unsupported alg", "Bearer " + signJWT(t, map[string]any{"alg": "none"}, demoClaims(nil), func([]byte) []byte { return []byte("x") }), 401, "Jwt header [alg] is not supported"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := requireEnv(t, replyAll(), demoChain(true))
			hdr := map[string]string{}
			if tc.auth != "" {
				hdr["Authorization"] = tc.auth
			}
			res := env.do(t, http.MethodPost, "/v1/transfers/confirm?x=1", `{}`, hdr)
			require.NoError(t, res.err)
			require.Equal(t, tc.wantStatus, res.status)
			require.Equal(t, tc.wantBody, res.body)
			require.Equal(t, "text/plain", res.header.Get("Content-Type"))
			realm := `Bearer realm="http://` + strings.TrimPrefix(env.url, "http://") + `/v1/transfers/confirm?x=1"`
			if tc.wantBody != "Jwt is missing" {
				realm += `, error="invalid_token"`
			}
			require.Equal(t, realm, res.header.Get("Www-Authenticate"))
			require.Equal(t, jwtDeniedDetails(tc.wantBody), env.waitLogs(t, 1)[0].ResponseCodeDetails)
			require.Equal(t, 0, env.fp.streamCount(), "jwt_authn answers before ext_proc: no stream")
			require.Equal(t, int64(0), env.upstream.hits.Load())
		})
	}
}

func TestRoutesWithoutARequirementSkipVerification(t *testing.T) {
	env := requireEnv(t, replyAll(), demoChain(true))
	res := env.do(t, http.MethodGet, "/public/info", "", map[string]string{"Authorization": "Bearer not-even-a-jwt"})
	require.NoError(t, res.err)
	require.Equal(t, 200, res.status)
	require.Equal(t, "Bearer not-even-a-jwt", env.upstream.requests()[0].header.Get("Authorization"))
}

func TestAllowMissingAndAllowMissingOrFailed(t *testing.T) {
	expired := "Bearer " + mintDemo(t, "alice", -10*time.Minute)
	for _, tc := range []struct {
		name       string
		req        JWTRequirement
		auth       string
		wantStatus int
	}{
		{"allow_missing: missing passes", JWTRequirement{AllowMissing: true}, "", 200},
		{"allow_missing: invalid fails", JWTRequirement{AllowMissing: true}, expired, 401},
		{"allow_missing_or_failed: invalid passes", JWTRequirement{AllowMissingOrFailed: true}, expired, 200},
		{"allow_missing: valid sets the subject", JWTRequirement{AllowMissing: true}, "Bearer " + mintDemo(t, "bob", time.Minute), 200},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := requireEnv(t, replyAll(), func(c *Config) {
				demoChain(true)(c)
				req := tc.req
				c.JWTAuthn.Rules = []JWTRule{{Match: RouteMatch{Prefix: "/"}, Requires: &req}}
			})
			hdr := map[string]string{}
			if tc.auth != "" {
				hdr["Authorization"] = tc.auth
			}
			res := env.do(t, http.MethodGet, "/v1/x", "", hdr)
			require.NoError(t, res.err)
			require.Equal(t, tc.wantStatus, res.status)
			if strings.Contains(tc.name, "valid sets") {
				require.Equal(t, "bob", env.upstream.requests()[0].header.Get("X-Idemgate-Subject"))
			}
		})
	}
}

func TestRS256Tokens(t *testing.T) {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	require.NoError(t, err)
	jwks, err := json.Marshal(map[string]any{"keys": []map[string]string{{
		"kty": "RSA", "kid": "rsa-1", "alg": "RS256",
		"n": base64.RawURLEncoding.EncodeToString(key.N.Bytes()),
		"e": base64.RawURLEncoding.EncodeToString(big.NewInt(int64(key.E)).Bytes()),
	}}})
	require.NoError(t, err)
	sign := func(in []byte) []byte {
		d := sha256.Sum256(in)
		sig, err := rsa.SignPKCS1v15(rand.Reader, key, crypto.SHA256, d[:])
		require.NoError(t, err)
		return sig
	}
	env := requireEnv(t, replyAll(), func(c *Config) {
		demoChain(true)(c)
		p := c.JWTAuthn.Providers["demo"]
		p.LocalJWKS = jwks
		c.JWTAuthn.Providers["demo"] = p
	})
	tok := signJWT(t, map[string]any{"alg": "RS256", "kid": "rsa-1"}, demoClaims(func(c map[string]any) { c["sub"] = "carol" }), sign)
	res := env.do(t, http.MethodGet, "/v1/x", "", map[string]string{"Authorization": "Bearer " + tok})
	require.NoError(t, res.err)
	require.Equal(t, 200, res.status)
	require.Equal(t, "carol", env.upstream.requests()[0].header.Get("X-Idemgate-Subject"))

	es := mintDemo(t, "alice", time.Minute)
	res = env.do(t, http.MethodGet, "/v1/x", "", map[string]string{"Authorization": "Bearer " + es})
	require.Equal(t, 401, res.status)
	require.Equal(t, "Jwks doesn't have key to match kid or alg from Jwt", res.body)
}
