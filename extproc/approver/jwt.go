// Package approver verifies the bearer tokens of the people who approve or
// deny a gated confirm (docs/design.md §10): a JWT signed by a key of a JWKS,
// with ES256, RS256 or EdDSA (never "none", never HMAC), issued by the
// configured issuer for the configured audience, inside its exp/nbf window
// give or take a bounded clock skew. The verified "sub" is the approver.
// Nothing in the token's header chooses how it is checked beyond picking a
// key of the configured set by "kid" and an algorithm that key allows.
package approver

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"strings"
	"time"

	"github.com/idemgate/idemgate/internal/jsonx"
)

// ErrInvalidToken is wrapped by every verification failure.
var ErrInvalidToken = errors.New("invalid approver token")

// Key is one verification key of a JWKS.
type Key struct {
	ID  string
	Alg string // ES256, RS256 or EdDSA
	pub crypto.PublicKey
}

// KeySet is a parsed JWKS.
type KeySet struct {
	Keys []Key
}

type jwk struct {
	Kty string `json:"kty"`
	Kid string `json:"kid"`
	Alg string `json:"alg"`
	Use string `json:"use"`
	Crv string `json:"crv"`
	X   string `json:"x"`
	Y   string `json:"y"`
	N   string `json:"n"`
	E   string `json:"e"`
	D   string `json:"d"`
}

// ParseJWKS reads a JSON Web Key Set ({"keys": [...]}) of public keys: EC
// P-256 (ES256), RSA of at least 2048 bits (RS256) and OKP Ed25519 (EdDSA).
// A symmetric key, a private key, a key for another use or algorithm, and a
// set without keys are errors: the set must say exactly what verifies.
func ParseJWKS(data []byte) (*KeySet, error) {
	var doc struct {
		Keys []jwk `json:"keys"`
	}
	if err := json.Unmarshal(data, &doc); err != nil {
		return nil, fmt.Errorf("JWKS is not JSON: %w", err)
	}
	if len(doc.Keys) == 0 {
		return nil, errors.New("JWKS has no keys")
	}
	set := &KeySet{}
	for i, k := range doc.Keys {
		key, err := parseJWK(k)
		if err != nil {
			return nil, fmt.Errorf("JWKS key %d (kid %q): %w", i, k.Kid, err)
		}
		set.Keys = append(set.Keys, key)
	}
	return set, nil
}

func b64(s string) ([]byte, error) {
	return base64.RawURLEncoding.DecodeString(strings.TrimRight(s, "="))
}

func parseJWK(k jwk) (Key, error) {
	if k.D != "" {
		return Key{}, errors.New("is a private key: publish only public keys")
	}
	if k.Use != "" && k.Use != "sig" {
		return Key{}, fmt.Errorf("use %q is not sig", k.Use)
	}
	key := Key{ID: k.Kid}
	switch k.Kty {
	case "EC":
		if k.Crv != "P-256" {
			return Key{}, fmt.Errorf("curve %q is not supported (P-256)", k.Crv)
		}
		x, errX := b64(k.X)
		y, errY := b64(k.Y)
		if errX != nil || errY != nil || len(x) != 32 || len(y) != 32 {
			return Key{}, errors.New("bad EC coordinates")
		}
		raw := append(append([]byte{4}, x...), y...)
		pub, err := ecdsa.ParseUncompressedPublicKey(elliptic.P256(), raw)
		if err != nil {
			return Key{}, fmt.Errorf("bad EC key: %w", err)
		}
		key.Alg, key.pub = "ES256", pub
	case "RSA":
		n, errN := b64(k.N)
		e, errE := b64(k.E)
		if errN != nil || errE != nil || len(e) == 0 || len(e) > 4 {
			return Key{}, errors.New("bad RSA modulus or exponent")
		}
		pub := &rsa.PublicKey{N: new(big.Int).SetBytes(n), E: int(new(big.Int).SetBytes(e).Int64())}
		if pub.N.BitLen() < 2048 {
			return Key{}, fmt.Errorf("RSA key of %d bits is too short (at least 2048)", pub.N.BitLen())
		}
		key.Alg, key.pub = "RS256", pub
	case "OKP":
		x, err := b64(k.X)
		if k.Crv != "Ed25519" || err != nil || len(x) != ed25519.PublicKeySize {
			return Key{}, errors.New("OKP keys must be Ed25519 with a 32-byte x")
		}
		key.Alg, key.pub = "EdDSA", ed25519.PublicKey(x)
	case "oct":
		return Key{}, errors.New("symmetric (HMAC) keys are refused: an approver token must be signed by a key idemgate cannot sign with")
	default:
		return Key{}, fmt.Errorf("unsupported kty %q (EC, RSA, OKP)", k.Kty)
	}
	if k.Alg != "" && k.Alg != key.Alg {
		return Key{}, fmt.Errorf("alg %q does not fit a %s key (%s)", k.Alg, k.Kty, key.Alg)
	}
	return key, nil
}

func (s *KeySet) has(kid string) bool {
	for _, k := range s.Keys {
		if k.ID == kid {
			return true
		}
	}
	return false
}

// Verifier checks approver tokens against Keys, or, when Keys is nil, the
// keys of Remote.
type Verifier struct {
	Issuer   string
	Audience string
	Leeway   time.Duration
	Keys     *KeySet
	Remote   *RemoteJWKS
	// Now is the clock (time.Now when nil).
	Now func() time.Time
}

// Claims is what a verified token says about the approver.
type Claims struct {
	Subject string
	Expiry  time.Time
	// ACR, AMR and AuthTime say how and when the person authenticated
	// (OpenID Connect Core §2; RFC 9470 step-up): empty and zero when the
	// token does not say.
	ACR      string
	AMR      []string
	AuthTime time.Time
}

// Verify checks token and returns its claims, or an error wrapping
// ErrInvalidToken that says why (for the security event; the caller
// answers 401 whatever the reason).
func (v *Verifier) Verify(token string) (Claims, error) {
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		return Claims{}, fmt.Errorf("%w: not a compact JWS", ErrInvalidToken)
	}
	hb, err := b64(parts[0])
	if err != nil {
		return Claims{}, fmt.Errorf("%w: bad header encoding", ErrInvalidToken)
	}
	var hdr struct {
		Alg  string `json:"alg"`
		Kid  string `json:"kid"`
		Crit []any  `json:"crit"`
	}
	if jsonx.Check(hb) != nil {
		// A duplicate member (two algs, two kids) is read differently by
		// different parsers: refused, as every JSON idemgate reads.
		return Claims{}, fmt.Errorf("%w: header is not strict JSON", ErrInvalidToken)
	}
	if err := json.Unmarshal(hb, &hdr); err != nil {
		return Claims{}, fmt.Errorf("%w: bad header", ErrInvalidToken)
	}
	if len(hdr.Crit) > 0 {
		return Claims{}, fmt.Errorf("%w: crit header not understood", ErrInvalidToken)
	}
	sig, err := b64(parts[2])
	if err != nil {
		return Claims{}, fmt.Errorf("%w: bad signature encoding", ErrInvalidToken)
	}
	signed := []byte(parts[0] + "." + parts[1])
	keys := v.Keys
	if keys == nil {
		if v.Remote == nil {
			return Claims{}, fmt.Errorf("%w: no keys configured", ErrKeysUnavailable)
		}
		if keys, err = v.Remote.Keys(false); err != nil {
			return Claims{}, err
		}
		if hdr.Kid != "" && !keys.has(hdr.Kid) {
			// The IdP may have rotated: refresh early (rate-limited).
			if keys, err = v.Remote.Keys(true); err != nil {
				return Claims{}, err
			}
		}
	}
	verified := false
	for _, k := range keys.Keys {
		if k.Alg != hdr.Alg || (hdr.Kid != "" && k.ID != hdr.Kid) {
			continue
		}
		if verifySig(k, signed, sig) {
			verified = true
			break
		}
	}
	if !verified {
		return Claims{}, fmt.Errorf("%w: no key of the JWKS verifies it (alg %q, kid %q)", ErrInvalidToken, hdr.Alg, hdr.Kid)
	}
	pb, err := b64(parts[1])
	if err != nil {
		return Claims{}, fmt.Errorf("%w: bad payload encoding", ErrInvalidToken)
	}
	var c struct {
		Iss string          `json:"iss"`
		Sub string          `json:"sub"`
		Aud json.RawMessage `json:"aud"`
		Exp *float64        `json:"exp"`
		Nbf *float64        `json:"nbf"`
		ACR *string         `json:"acr"`
		AMR []string        `json:"amr"`
		// AuthTime is a pointer so that 0 (1970) stays distinguishable
		// from absent; both are too old for any step-up.
		AuthTime *float64 `json:"auth_time"`
	}
	if jsonx.Check(pb) != nil {
		return Claims{}, fmt.Errorf("%w: payload is not strict JSON (a duplicate claim?)", ErrInvalidToken)
	}
	if err := json.Unmarshal(pb, &c); err != nil {
		return Claims{}, fmt.Errorf("%w: bad payload", ErrInvalidToken)
	}
	if c.Iss != v.Issuer {
		return Claims{}, fmt.Errorf("%w: issuer %q", ErrInvalidToken, c.Iss)
	}
	if !hasAudience(c.Aud, v.Audience) {
		return Claims{}, fmt.Errorf("%w: audience does not include %q", ErrInvalidToken, v.Audience)
	}
	if c.Sub == "" {
		return Claims{}, fmt.Errorf("%w: no sub", ErrInvalidToken)
	}
	if c.Exp == nil {
		return Claims{}, fmt.Errorf("%w: no exp", ErrInvalidToken)
	}
	now := time.Now()
	if v.Now != nil {
		now = v.Now()
	}
	exp := time.Unix(int64(*c.Exp), 0)
	if !now.Before(exp.Add(v.Leeway)) {
		return Claims{}, fmt.Errorf("%w: expired at %s", ErrInvalidToken, exp.UTC().Format(time.RFC3339))
	}
	if c.Nbf != nil {
		if nbf := time.Unix(int64(*c.Nbf), 0); now.Add(v.Leeway).Before(nbf) {
			return Claims{}, fmt.Errorf("%w: not valid before %s", ErrInvalidToken, nbf.UTC().Format(time.RFC3339))
		}
	}
	out := Claims{Subject: c.Sub, Expiry: exp, AMR: c.AMR}
	if c.ACR != nil {
		out.ACR = *c.ACR
	}
	if c.AuthTime != nil {
		out.AuthTime = time.Unix(int64(*c.AuthTime), 0)
	}
	return out, nil
}

func hasAudience(raw json.RawMessage, want string) bool {
	var one string
	if json.Unmarshal(raw, &one) == nil {
		return one == want
	}
	var many []string
	if json.Unmarshal(raw, &many) == nil {
		for _, a := range many {
			if a == want {
				return true
			}
		}
	}
	return false
}

func verifySig(k Key, signed, sig []byte) bool {
	switch pub := k.pub.(type) {
	case *ecdsa.PublicKey:
		if len(sig) != 64 {
			return false
		}
		h := sha256.Sum256(signed)
		r, s := new(big.Int).SetBytes(sig[:32]), new(big.Int).SetBytes(sig[32:])
		return ecdsa.Verify(pub, h[:], r, s)
	case *rsa.PublicKey:
		h := sha256.Sum256(signed)
		return rsa.VerifyPKCS1v15(pub, crypto.SHA256, h[:], sig) == nil
	case ed25519.PublicKey:
		return ed25519.Verify(pub, signed, sig)
	}
	return false
}
