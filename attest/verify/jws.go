package verify

import (
	"bytes"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// maxTokenBytes bounds what is decoded: an attestation is a few hundred
// bytes; the params list makes it grow slowly.
const maxTokenBytes = 16 << 10

// JWK is one public key of a JWKS (RFC 7517, OKP keys of RFC 8037).
type JWK struct {
	Kty string `json:"kty"`
	Crv string `json:"crv"`
	X   string `json:"x"`
	Kid string `json:"kid"`
	Alg string `json:"alg,omitempty"`
	Use string `json:"use,omitempty"`
}

// JWKS is a JSON Web Key Set, as idemgate serves at /.well-known/jwks.json.
type JWKS struct {
	Keys []JWK `json:"keys"`
}

// KeySet is the public keys an attestation may be signed with, by kid.
type KeySet map[string]ed25519.PublicKey

// ParseJWKS reads a JWKS holding Ed25519 keys. Other keys are refused, not
// skipped: a set the verifier cannot fully read is a misconfiguration.
func ParseJWKS(data []byte) (KeySet, error) {
	var set JWKS
	if err := json.Unmarshal(data, &set); err != nil {
		return nil, fmt.Errorf("jwks: %w", err)
	}
	if len(set.Keys) == 0 {
		return nil, errors.New("jwks: no keys")
	}
	out := make(KeySet, len(set.Keys))
	for _, k := range set.Keys {
		if k.Kty != "OKP" || k.Crv != "Ed25519" || (k.Alg != "" && k.Alg != Algorithm) || (k.Use != "" && k.Use != "sig") {
			return nil, fmt.Errorf("jwks: key %q is not an Ed25519 signing key", k.Kid)
		}
		x, err := base64.RawURLEncoding.DecodeString(k.X)
		if err != nil || len(x) != ed25519.PublicKeySize {
			return nil, fmt.Errorf("jwks: key %q: bad x", k.Kid)
		}
		if k.Kid == "" {
			return nil, errors.New("jwks: a key has no kid")
		}
		if _, dup := out[k.Kid]; dup {
			return nil, fmt.Errorf("jwks: kid %q twice", k.Kid)
		}
		out[k.Kid] = ed25519.PublicKey(x)
	}
	return out, nil
}

// jwsHeader is the protected header; alg and typ are fixed, so a token
// signed for something else (alg none, HS256 with the public key as
// secret, another JWT type) never verifies.
type jwsHeader struct {
	Alg string `json:"alg"`
	Typ string `json:"typ"`
	Kid string `json:"kid"`
}

// Reasons a verification fails, as logged and answered (the detail stays
// in logs).
var (
	ErrMissing    = errors.New("missing attestation")
	ErrMalformed  = errors.New("malformed attestation")
	ErrUnknownKey = errors.New("attestation signed by an unknown key")
	ErrSignature  = errors.New("attestation signature invalid")
	ErrExpired    = errors.New("attestation expired")
	ErrRequest    = errors.New("attestation is for another request")
	ErrParams     = errors.New("body params differ from the attested ones")
	// ErrKeysStale: the JWKS could not be re-fetched for longer than
	// MaxAge + MaxStale, so no key of it is trusted any more.
	ErrKeysStale = errors.New("attestation keys are stale: the JWKS could not be re-fetched")
)

// parseToken checks a compact JWS and returns its verified claims. keys
// looks up a kid (nil when unknown).
func parseToken(token string, keys func(kid string) ed25519.PublicKey) (*Claims, string, error) {
	if len(token) > maxTokenBytes {
		return nil, "", ErrMalformed
	}
	h, rest, ok1 := strings.Cut(token, ".")
	p, s, ok2 := strings.Cut(rest, ".")
	if !ok1 || !ok2 || strings.Contains(s, ".") {
		return nil, "", ErrMalformed
	}
	hb, err1 := base64.RawURLEncoding.DecodeString(h)
	sig, err2 := base64.RawURLEncoding.DecodeString(s)
	if err1 != nil || err2 != nil {
		return nil, "", ErrMalformed
	}
	var hdr jwsHeader
	dec := json.NewDecoder(bytes.NewReader(hb))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&hdr); err != nil || hdr.Alg != Algorithm || hdr.Typ != Type || hdr.Kid == "" {
		return nil, "", ErrMalformed
	}
	pub := keys(hdr.Kid)
	if pub == nil {
		return nil, hdr.Kid, ErrUnknownKey
	}
	if !ed25519.Verify(pub, []byte(token[:len(h)+1+len(p)]), sig) {
		return nil, hdr.Kid, ErrSignature
	}
	pb, err := base64.RawURLEncoding.DecodeString(p)
	if err != nil {
		return nil, hdr.Kid, ErrMalformed
	}
	c, err := decodeClaims(pb)
	if err != nil {
		return nil, hdr.Kid, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	return c, hdr.Kid, nil
}
