package demoauth

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
)

// ApproverKey signs the EdDSA JWTs idemgate's approvers.jwt verifies: the
// bearer tokens an SSO proxy in front of approval_listen would set. Unlike
// the embedded ES256 key it is generated for each run and never stored; a
// run hands idemgate its JWKS and mints approvers' tokens with it.
type ApproverKey struct {
	kid  string
	priv ed25519.PrivateKey
}

// NewApproverKey generates a key. kid, when not empty, names it in the JWKS
// and in every token header.
func NewApproverKey(kid string) (*ApproverKey, error) {
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("failed to generate an approvers' key: %w", err)
	}
	return &ApproverKey{kid: kid, priv: priv}, nil
}

// JWKS is the public key set (one OKP Ed25519 key) that verifies its tokens.
func (k *ApproverKey) JWKS() []byte {
	key := map[string]string{
		"kty": "OKP", "crv": "Ed25519", "alg": "EdDSA", "use": "sig",
		"x": base64.RawURLEncoding.EncodeToString(k.priv.Public().(ed25519.PublicKey)),
	}
	if k.kid != "" {
		key["kid"] = k.kid
	}
	out, _ := json.Marshal(map[string]any{"keys": []any{key}}) // strings only: cannot fail
	return out
}

// Mint signs an EdDSA JWT carrying claims as they are (the caller picks iss,
// aud, sub, exp, and leaves out or spoils what a test refuses).
func (k *ApproverKey) Mint(claims map[string]any) (string, error) {
	header := map[string]string{"alg": "EdDSA", "typ": "JWT"}
	if k.kid != "" {
		header["kid"] = k.kid
	}
	h, err := json.Marshal(header)
	if err != nil {
		return "", err
	}
	c, err := json.Marshal(claims)
	if err != nil {
		return "", fmt.Errorf("failed to encode the approver token's claims: %w", err)
	}
	b64 := base64.RawURLEncoding
	signing := b64.EncodeToString(h) + "." + b64.EncodeToString(c)
	return signing + "." + b64.EncodeToString(ed25519.Sign(k.priv, []byte(signing))), nil
}
