// Package attest signs idemgate's execution attestations (docs/design.md
// §11): a compact JWS, EdDSA over Ed25519, that idemgate adds to every
// request it forwards after acquiring a record, so the upstream can refuse
// a confirm that went around idemgate. Its keys are a set of their own —
// one active key signs, every configured key is published in the JWKS —
// and never the fingerprint's HMAC keys. The format and the upstream's
// side live in attest/verify, which imports only the standard library.
package attest

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/idemgate/idemgate/attest/verify"
	"github.com/idemgate/idemgate/internal/jsonx"
)

// SeedBytes is the length of an Ed25519 private key seed: what a key file
// or environment variable holds, base64 (standard or URL alphabet).
const SeedBytes = ed25519.SeedSize

// ErrInvalidKey is wrapped by every key parsing error; no message carries
// key material.
var ErrInvalidKey = errors.New("invalid attestation key")

// ParseSeed decodes a key as stored: base64 (standard or URL alphabet,
// padded or not) of exactly 32 bytes, the form `idemgate keygen` prints.
func ParseSeed(encoded string) (ed25519.PrivateKey, error) {
	s := strings.TrimRight(strings.TrimSpace(encoded), "=")
	if s == "" {
		return nil, fmt.Errorf("%w: empty", ErrInvalidKey)
	}
	enc := base64.RawStdEncoding
	if strings.ContainsAny(s, "-_") {
		if strings.ContainsAny(s, "+/") {
			return nil, fmt.Errorf("%w: mixes the standard and URL base64 alphabets", ErrInvalidKey)
		}
		enc = base64.RawURLEncoding
	}
	seed, err := enc.DecodeString(s)
	if err != nil {
		return nil, fmt.Errorf("%w: not base64", ErrInvalidKey)
	}
	if len(seed) != SeedBytes {
		return nil, fmt.Errorf("%w: %d bytes, need exactly %d (an Ed25519 seed)", ErrInvalidKey, len(seed), SeedBytes)
	}
	return ed25519.NewKeyFromSeed(seed), nil
}

// GenerateSeed returns a new key in the form ParseSeed reads.
func GenerateSeed() (string, error) {
	seed := make([]byte, SeedBytes)
	if _, err := rand.Read(seed); err != nil {
		return "", fmt.Errorf("failed to read random key: %w", err)
	}
	return base64.StdEncoding.EncodeToString(seed), nil
}

// PublicJWK is the public half of key as a JWK with kid.
func PublicJWK(kid string, key ed25519.PrivateKey) verify.JWK {
	return verify.JWK{
		Kty: "OKP", Crv: "Ed25519", Kid: kid, Alg: verify.Algorithm, Use: "sig",
		X: base64.RawURLEncoding.EncodeToString(key.Public().(ed25519.PublicKey)),
	}
}

// Signer holds the attestation keys: active signs, all are published. It
// is immutable and safe for concurrent use; it never prints key material.
type Signer struct {
	active string
	ids    []string // sorted
	keys   map[string]ed25519.PrivateKey
	header string // the protected header, base64url, with the active kid
	jwks   []byte
}

// NewSigner checks the key set: the active key must be among keys.
func NewSigner(active string, keys map[string]ed25519.PrivateKey) (*Signer, error) {
	if _, ok := keys[active]; !ok {
		return nil, fmt.Errorf("active attestation key %q is not configured", active)
	}
	s := &Signer{active: active, keys: keys}
	for id := range keys {
		s.ids = append(s.ids, id)
	}
	slices.Sort(s.ids)
	hdr, err := json.Marshal(struct {
		Alg string `json:"alg"`
		Typ string `json:"typ"`
		Kid string `json:"kid"`
	}{verify.Algorithm, verify.Type, active})
	if err != nil {
		return nil, err
	}
	s.header = base64.RawURLEncoding.EncodeToString(hdr)
	set := verify.JWKS{Keys: make([]verify.JWK, 0, len(s.ids))}
	for _, id := range s.ids {
		set.Keys = append(set.Keys, PublicJWK(id, keys[id]))
	}
	if s.jwks, err = json.Marshal(set); err != nil {
		return nil, err
	}
	return s, nil
}

// ActiveKeyID is the kid that signs.
func (s *Signer) ActiveKeyID() string { return s.active }

// KeyIDs are every published kid, sorted.
func (s *Signer) KeyIDs() []string { return slices.Clone(s.ids) }

// JWKS is the public key set as served at /.well-known/jwks.json.
func (s *Signer) JWKS() []byte { return slices.Clone(s.jwks) }

// Sign returns the compact JWS of c, signed by the active key.
func (s *Signer) Sign(c *verify.Claims) (string, error) {
	payload := appendClaims(make([]byte, 0, 512), c)
	enc := base64.RawURLEncoding
	buf := make([]byte, 0, len(s.header)+1+enc.EncodedLen(len(payload))+1+enc.EncodedLen(ed25519.SignatureSize))
	buf = append(buf, s.header...)
	buf = append(buf, '.')
	buf = enc.AppendEncode(buf, payload)
	sig := ed25519.Sign(s.keys[s.active], buf)
	buf = append(buf, '.')
	buf = enc.AppendEncode(buf, sig)
	return string(buf), nil
}

// LogValue shows key ids only.
func (s *Signer) LogValue() slog.Value {
	return slog.GroupValue(slog.String("active", s.active), slog.Any("keys", s.ids))
}

// String shows key ids only.
func (s *Signer) String() string {
	return fmt.Sprintf("attest.Signer{active: %s, keys: %v}", s.active, s.ids)
}

// GoString shows key ids only.
func (s *Signer) GoString() string { return s.String() }

// appendClaims writes c as the JSON object encoding/json would write for
// verify.Claims' tags (the same members in the same order, omitempty
// honoured, pv's keys sorted), with the project's one string writer: Sign
// runs on every attested confirm, where the request path writes JSON with
// internal/jsonx only.
func appendClaims(buf []byte, c *verify.Claims) []byte {
	str := func(name, v string) {
		buf = append(buf, ',', '"')
		buf = append(buf, name...)
		buf = append(buf, '"', ':')
		buf = jsonx.AppendString(buf, v)
	}
	num := func(name string, v int64) {
		buf = append(buf, ',', '"')
		buf = append(buf, name...)
		buf = append(buf, '"', ':')
		buf = strconv.AppendInt(buf, v, 10)
	}
	buf = append(buf, `{"v":`...)
	buf = strconv.AppendInt(buf, int64(c.Version), 10)
	str("iss", c.Issuer)
	str("idk", c.Key)
	str("scope", c.Scope)
	str("ph", c.ParamHash)
	buf = append(buf, `,"params":`...)
	if c.Params == nil {
		buf = append(buf, "null"...)
	} else {
		buf = append(buf, '[')
		for i, p := range c.Params {
			if i > 0 {
				buf = append(buf, ',')
			}
			buf = append(buf, `{"path":`...)
			buf = jsonx.AppendString(buf, p.Path)
			if p.Type != "" {
				buf = append(buf, `,"type":`...)
				buf = jsonx.AppendString(buf, p.Type)
			}
			if p.Normalize != "" {
				buf = append(buf, `,"normalize":`...)
				buf = jsonx.AppendString(buf, p.Normalize)
			}
			buf = append(buf, '}')
		}
		buf = append(buf, ']')
	}
	if len(c.PathVars) > 0 {
		buf = append(buf, `,"pv":{`...)
		for i, k := range slices.Sorted(maps.Keys(c.PathVars)) {
			if i > 0 {
				buf = append(buf, ',')
			}
			buf = jsonx.AppendString(buf, k)
			buf = append(buf, ':')
			buf = jsonx.AppendString(buf, c.PathVars[k])
		}
		buf = append(buf, '}')
	}
	if c.MCPTool != "" {
		str("mcp_tool", c.MCPTool)
	}
	str("htm", c.Method)
	str("htu", c.Path)
	str("sub", c.Subject)
	str("own", c.Owner)
	num("fen", c.Fence)
	num("iat", c.IssuedAt)
	num("exp", c.Expiry)
	return append(buf, '}')
}
