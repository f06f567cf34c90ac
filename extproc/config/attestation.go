package config

import (
	"bytes"
	"crypto/ed25519"
	"fmt"
	"strings"
	"time"

	"github.com/idemgate/idemgate/attest"
	"github.com/idemgate/idemgate/attest/verify"
)

// Attestation is the attestation section of idemgate.yaml (docs/design.md
// §11): the Ed25519 keys that sign what idemgate forwards after ACQUIRED.
// Absent, nothing is attested (check-config's summary says so).
type Attestation struct {
	ActiveKey string               `yaml:"active_key"`
	Keys      map[string]KeySource `yaml:"keys"`
	TTL       string               `yaml:"ttl"`
	Header    string               `yaml:"header"`
}

// AttestationSettings is the compiled attestation section.
type AttestationSettings struct {
	Signer *attest.Signer
	// Header is the lower-case request header that carries the JWS.
	Header string
	// TTL is each attestation's life (exp - iat): it must cover the
	// upstream's handling plus Envoy's retries, which re-send it.
	TTL time.Duration
	// KeySources describes where each key came from (no material).
	KeySources map[string]string
}

// DefaultAttestationTTL is attestation.ttl's default.
const DefaultAttestationTTL = 60 * time.Second

// offlineAttestationKey is the stand-in attestation key of an offline
// check: well-formed, known to everyone, and not offlineKey (which would
// trip the "same as a fingerprint key" check).
const offlineAttestationKey = "b2ZmbGluZS1hdHRlc3RhdGlvbi1zdGFuZC1pbi1rZXk="

// attestation compiles the section; fingerprintKeys are the signing keys'
// bytes, which no attestation key may equal.
func (c *compiler) attestation(a *Attestation, fingerprintKeys [][]byte) *AttestationSettings {
	if a == nil {
		// Off. Not a warning, so configs from before attestations check
		// clean; the summary says it is off and docs/attestation.md says why to turn
		// it on.
		return nil
	}
	out := &AttestationSettings{Header: DefaultAttestationHeader, KeySources: map[string]string{}}
	if a.Header != "" {
		if !validHeaderName(a.Header) {
			c.errorf(p("attestation", "header"), "%q is not an HTTP header name", a.Header)
		}
		out.Header = strings.ToLower(a.Header)
	}
	out.TTL = c.duration(p("attestation", "ttl"), a.TTL, DurationRule{Default: DefaultAttestationTTL})
	if out.TTL > 10*time.Minute {
		c.warnf(p("attestation", "ttl"), "%s is long: an attestation is meant to live for one request and its retries", out.TTL)
	}
	sec := keySection{name: "attestation", what: "attestation key", example: "a1: {env: IDEMGATE_ATTEST_KEY_A1} (generate one with `idemgate keygen --attestation a1`)", standIn: offlineAttestationKey}
	keys, sources, ok := readKeys(c, sec, a.ActiveKey, a.Keys, func(path []any, from, text string) (ed25519.PrivateKey, bool) {
		key, err := attest.ParseSeed(text)
		if err != nil {
			c.errorf(path, "key from %s: %v (generate one with `idemgate keygen --attestation ID`)", from, err)
			return nil, false
		}
		for _, fk := range fingerprintKeys {
			if bytes.Equal(fk, key.Seed()) {
				// One key for two jobs: whoever verifies attestations would
				// hold what forges fingerprints (HMAC) — and vice versa.
				c.errorf(path, "key from %s is also a fingerprint signing key: attestation keys must be their own", from)
				return nil, false
			}
		}
		return key, true
	})
	out.KeySources = sources
	if !ok {
		return nil
	}
	s, err := attest.NewSigner(a.ActiveKey, keys)
	if err != nil {
		c.errorf(p("attestation"), "%v", err)
		return nil
	}
	out.Signer = s
	return out
}

// DefaultAttestationHeader is the lower-case default of attestation.header.
var DefaultAttestationHeader = strings.ToLower(verify.Header)

// summary is check-config's attest line.
func (a *AttestationSettings) summary() string {
	if a == nil {
		return "off: the upstream cannot tell a confirm idemgate checked from one that went around it"
	}
	var keys []string
	for _, id := range a.Signer.KeyIDs() {
		k := id + " (" + a.KeySources[id] + ")"
		if id == a.Signer.ActiveKeyID() {
			k += " active"
		} else {
			k += " verify-only"
		}
		keys = append(keys, k)
	}
	return fmt.Sprintf("header %s, ttl %s, keys %s", a.Header, a.TTL, strings.Join(keys, ", "))
}
