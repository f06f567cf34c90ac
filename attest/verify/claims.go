package verify

import (
	"bytes"
	"encoding/json"
	"fmt"
)

// The wire names.
const (
	// Header carries the attestation on the forwarded request. Named like
	// the Idempotency-Key it attests (draft-ietf-httpapi-idempotency-key-
	// header), without an X- prefix (RFC 6648).
	Header = "Idempotency-Attestation"
	// MCPMetaKey is the params._meta member of an MCP tools/call that
	// carries the same attestation (MCP reserves reverse-DNS prefixes in
	// _meta for implementations).
	MCPMetaKey = "io.idemgate/attestation"
	// Algorithm is the JWS alg: Ed25519 (RFC 8037), deterministic and
	// available in every standard crypto library the verifiers use.
	Algorithm = "EdDSA"
	// Type is the JWS typ, so an attestation is never mistaken for (or
	// accepted as) another JWT signed by the same keys.
	Type = "idemgate-attestation+jwt"
	// Issuer is the iss claim.
	Issuer = "idemgate"
	// Version is the v claim of this format.
	Version = 1
)

// Claims is an attestation's payload. Every field is signed; a verifier
// trusts Params and PathVars only after the signature verified.
type Claims struct {
	Version int    `json:"v"`
	Issuer  string `json:"iss"`
	// Key is the idempotency key (the fingerprint's nonce) the upstream
	// also receives in its idempotency header.
	Key   string `json:"idk"`
	Scope string `json:"scope"`
	// ParamHash is the canonical param hash idemgate verified (the
	// fingerprint's p).
	ParamHash string `json:"ph"`
	// Params are the operation's bound params, so the verifier recomputes
	// ParamHash from the body without a copy of idemgate's config.
	Params []Param `json:"params"`
	// PathVars are the path template's variables idemgate read from Path
	// (only when a param is path.<name>). Path binds them: the upstream's
	// router reads them from the same bytes.
	PathVars map[string]string `json:"pv,omitempty"`
	// MCPTool is set for an MCP tools/call: the tool name, whose
	// params.arguments hold the params.
	MCPTool string `json:"mcp_tool,omitempty"`
	// Method and Path are the request line as forwarded (Path with its
	// query string), compared byte for byte (DPoP's htm/htu names).
	Method string `json:"htm"`
	Path   string `json:"htu"`
	// Subject is the subject tag (a keyed tag, never the user id).
	Subject string `json:"sub"`
	// Owner and Fence identify this attempt at the record (a takeover's
	// re-send has a higher fence).
	Owner    string `json:"own"`
	Fence    int64  `json:"fen"`
	IssuedAt int64  `json:"iat"`
	Expiry   int64  `json:"exp"`
}

// check reports a payload that is not this format.
func (c *Claims) check() error {
	switch {
	case c.Version != Version:
		return fmt.Errorf("version %d, want %d", c.Version, Version)
	case c.Issuer != Issuer:
		return fmt.Errorf("issuer %q", c.Issuer)
	case c.Key == "" || c.Scope == "" || c.ParamHash == "" || c.Method == "" || c.Path == "":
		return fmt.Errorf("a required claim is empty")
	case c.Expiry < c.IssuedAt:
		return fmt.Errorf("exp before iat")
	}
	return nil
}

// decodeClaims reads a payload strictly: unknown members are refused, so a
// future format is not half-understood.
func decodeClaims(payload []byte) (*Claims, error) {
	if _, err := parseJSON(payload); err != nil {
		return nil, err // duplicate members, bad UTF-8
	}
	var c Claims
	dec := json.NewDecoder(bytes.NewReader(payload))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		return nil, err
	}
	if err := c.check(); err != nil {
		return nil, err
	}
	return &c, nil
}
