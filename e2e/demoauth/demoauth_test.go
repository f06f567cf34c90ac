package demoauth_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"math/big"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/e2e/demoauth"
)

// requireJWKSKey decodes the single EC key of the demo JWKS into a public key.
func requireJWKSKey(t *testing.T) *ecdsa.PublicKey {
	t.Helper()
	var set struct {
		Keys []struct {
			Kty, Crv, Kid, Alg, X, Y string
		} `json:"keys"`
	}
	require.NoError(t, json.Unmarshal(demoauth.JWKS(), &set))
	require.Len(t, set.Keys, 1)
	k := set.Keys[0]
	require.Equal(t, "EC", k.Kty)
	require.Equal(t, "P-256", k.Crv)
	require.Equal(t, demoauth.KeyID, k.Kid)
	require.Equal(t, "ES256", k.Alg)
	x, err := base64.RawURLEncoding.DecodeString(k.X)
	require.NoError(t, err)
	y, err := base64.RawURLEncoding.DecodeString(k.Y)
	require.NoError(t, err)
	require.Len(t, x, 32)
	require.Len(t, y, 32)
	pub, err := ecdsa.ParseUncompressedPublicKey(elliptic.P256(), append(append([]byte{4}, x...), y...))
	require.NoError(t, err)
	return pub
}

func TestMintVerifiesAgainstJWKS(t *testing.T) {
	pub := requireJWKSKey(t)
	now := time.Unix(1_800_000_000, 0)
	token, err := demoauth.Mint("alice", 10*time.Minute, now)
	require.NoError(t, err)

	parts := strings.Split(token, ".")
	require.Len(t, parts, 3)
	sig, err := base64.RawURLEncoding.DecodeString(parts[2])
	require.NoError(t, err)
	require.Len(t, sig, 64)
	digest := sha256.Sum256([]byte(parts[0] + "." + parts[1]))
	require.True(t, ecdsa.Verify(pub, digest[:], new(big.Int).SetBytes(sig[:32]), new(big.Int).SetBytes(sig[32:])))

	var header map[string]any
	raw, err := base64.RawURLEncoding.DecodeString(parts[0])
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(raw, &header))
	require.Equal(t, map[string]any{"alg": "ES256", "typ": "JWT", "kid": "demo-es256"}, header)

	var claims map[string]any
	raw, err = base64.RawURLEncoding.DecodeString(parts[1])
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(raw, &claims))
	require.Equal(t, map[string]any{
		"iss": "https://auth.demo.idemgate.invalid",
		"aud": "idemgate-demo",
		"sub": "alice",
		"iat": float64(1_800_000_000),
		"exp": float64(1_800_000_600),
	}, claims)
}

func TestMintRejectsEmptySubject(t *testing.T) {
	_, err := demoauth.Mint("", time.Minute, time.Now())
	require.Error(t, err)
}

func TestJWKSReturnsACopy(t *testing.T) {
	a := demoauth.JWKS()
	a[0] = 'X'
	require.NotEqual(t, a[0], demoauth.JWKS()[0])
}
