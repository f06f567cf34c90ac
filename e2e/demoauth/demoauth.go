// Package demoauth mints the JSON Web Tokens used by the idemgate demo and the
// end-to-end tests.
//
// DEMO ONLY. The ES256 private key embedded in this package
// (demo-signing-key.pem) is committed to a public repository. Anyone can mint
// tokens with it. It exists so that the demo and the tests can drive Envoy's
// jwt_authn filter (whose local JWKS is jwks.json, the matching public key)
// without any identity provider. Never configure a real Envoy, a staging
// environment or anything that moves real money to trust the demo-es256 key.
package demoauth

import (
	"crypto/ecdsa"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	_ "embed"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"sync"
	"time"
)

const (
	// Issuer is the iss claim of every demo token; the shipped Envoy config's
	// jwt_authn provider expects exactly this value.
	Issuer = "https://auth.demo.idemgate.invalid"
	// Audience is the aud claim of every demo token.
	Audience = "idemgate-demo"
	// KeyID is the kid header of every demo token and the kid of the only key
	// in the demo JWKS.
	KeyID = "demo-es256"
)

var (
	//go:embed demo-signing-key.pem
	signingKeyPEM []byte

	//go:embed jwks.json
	jwksJSON []byte
)

var loadKey = sync.OnceValues(func() (*ecdsa.PrivateKey, error) {
	block, _ := pem.Decode(signingKeyPEM)
	if block == nil {
		return nil, errors.New("failed to decode the embedded demo signing key: no PEM block")
	}
	parsed, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("failed to parse the embedded demo signing key: %w", err)
	}
	key, ok := parsed.(*ecdsa.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("failed to use the embedded demo signing key: got %T, want an ECDSA key", parsed)
	}
	return key, nil
})

// Mint signs an ES256 JWT for subject with iat = now and exp = now + ttl,
// issued by Issuer for Audience with kid KeyID. A negative ttl yields a token
// that is already expired at now, which tests use on purpose.
func Mint(subject string, ttl time.Duration, now time.Time) (string, error) {
	if subject == "" {
		return "", errors.New("failed to mint a demo token: empty subject")
	}
	key, err := loadKey()
	if err != nil {
		return "", err
	}
	header, err := json.Marshal(struct {
		Alg string `json:"alg"`
		Typ string `json:"typ"`
		Kid string `json:"kid"`
	}{Alg: "ES256", Typ: "JWT", Kid: KeyID})
	if err != nil {
		return "", fmt.Errorf("failed to encode the token header: %w", err)
	}
	claims, err := json.Marshal(struct {
		Iss string `json:"iss"`
		Aud string `json:"aud"`
		Sub string `json:"sub"`
		Iat int64  `json:"iat"`
		Exp int64  `json:"exp"`
	}{Iss: Issuer, Aud: Audience, Sub: subject, Iat: now.Unix(), Exp: now.Add(ttl).Unix()})
	if err != nil {
		return "", fmt.Errorf("failed to encode the token claims: %w", err)
	}
	enc := base64.RawURLEncoding
	signingInput := enc.EncodeToString(header) + "." + enc.EncodeToString(claims)
	digest := sha256.Sum256([]byte(signingInput))
	r, s, err := ecdsa.Sign(rand.Reader, key, digest[:])
	if err != nil {
		return "", fmt.Errorf("failed to sign the demo token: %w", err)
	}
	// JWS ES256 signatures are the fixed-width big-endian R || S, not ASN.1.
	sig := make([]byte, 64)
	r.FillBytes(sig[:32])
	s.FillBytes(sig[32:])
	return signingInput + "." + enc.EncodeToString(sig), nil
}

// JWKS returns the public JWKS (one EC P-256 key, kid KeyID) that verifies
// tokens from Mint. The returned slice is a copy.
func JWKS() []byte {
	return append([]byte(nil), jwksJSON...)
}
