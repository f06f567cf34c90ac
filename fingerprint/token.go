package fingerprint

import (
	"bytes"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// MaxTokenLength is the longest fingerprint Verify looks at; Sign never
// issues a longer one.
const MaxTokenLength = 4096

// Version is the only token format version ("v").
const Version = 1

const (
	nonceBytes   = 16
	nonceHexLen  = 2 * nonceBytes
	paramHashLen = 2 * sha256.Size
)

// strictB64 decodes base64url without padding and refuses non-zero trailing
// bits, so one token has exactly one spelling. (Line breaks, which the
// decoder would skip, are refused earlier by isBase64URL.)
var strictB64 = base64.RawURLEncoding.Strict()

// Claims is the decoded payload of a fingerprint.
type Claims struct {
	Version    int               `json:"v"`
	KeyID      string            `json:"k"`
	Nonce      string            `json:"n"`
	Expiry     int64             `json:"exp"`
	SubjectTag string            `json:"u"`
	Scope      string            `json:"s"`
	ParamHash  string            `json:"p"`
	FieldTags  map[string]string `json:"f"`
}

// ExpiresAt is the expiry as a time (UTC). The token is valid through the
// whole of that second.
func (c Claims) ExpiresAt() time.Time { return time.Unix(c.Expiry, 0).UTC() }

// NewNonce returns 128 bits from crypto/rand as 32 lower-case hex characters.
func NewNonce() (string, error) {
	var b [nonceBytes]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("failed to read random nonce: %w", err)
	}
	return hex.EncodeToString(b[:]), nil
}

// SignRequest is what a preview binds into a fingerprint.
type SignRequest struct {
	Subject string // the caller's identity; only its keyed tag enters the token
	Scope   string // the operation's scope
	Params  Params // from Selector.Select
	Nonce   string // from NewNonce; required, so Sign stays deterministic
	Expiry  time.Time
}

// Sign issues a fingerprint with the active key. It is deterministic: the
// same request and ring give the same token.
func (r *KeyRing) Sign(req SignRequest) (string, Claims, error) {
	if r == nil {
		return "", Claims{}, errors.New("failed to sign: nil key ring")
	}
	switch {
	case req.Subject == "":
		return "", Claims{}, errors.New("failed to sign: subject is empty")
	case req.Scope == "" || !utf8.ValidString(req.Scope):
		return "", Claims{}, errors.New("failed to sign: scope must be a non-empty UTF-8 string")
	case !isLowerHex(req.Nonce, nonceHexLen):
		return "", Claims{}, errors.New("failed to sign: nonce must be 32 lower-case hex characters (use NewNonce)")
	case !isLowerHex(req.Params.Hash, paramHashLen):
		return "", Claims{}, errors.New("failed to sign: params hash must be 64 lower-case hex characters (use Selector.Select)")
	case req.Expiry.IsZero():
		return "", Claims{}, errors.New("failed to sign: expiry is not set")
	}
	k, ok := r.keys[r.active]
	if !ok {
		return "", Claims{}, errors.New("failed to sign: key ring has no active key (use NewKeyRing)")
	}
	kh := k.fieldHashes.get()
	defer k.fieldHashes.put(kh)
	tags := make(map[string]string, len(req.Params.Fields))
	for _, f := range req.Params.Fields {
		if f.Path == "" || !utf8.ValidString(f.Path) || strings.IndexByte(f.Path, 0) >= 0 {
			return "", Claims{}, fmt.Errorf("failed to sign: invalid field path %q", f.Path)
		}
		if _, dup := tags[f.Path]; dup {
			return "", Claims{}, fmt.Errorf("failed to sign: field %q listed twice", f.Path)
		}
		tags[f.Path] = k.fieldTag(kh, f.Path, f.Canonical)
	}
	claims := Claims{
		Version:    Version,
		KeyID:      k.id,
		Nonce:      req.Nonce,
		Expiry:     req.Expiry.Unix(),
		SubjectTag: k.subjectTag(req.Subject),
		Scope:      req.Scope,
		ParamHash:  req.Params.Hash,
		FieldTags:  tags,
	}
	payload := encodeClaims(claims)
	n := base64.RawURLEncoding.EncodedLen(len(payload))
	token := make([]byte, n, n+1+base64.RawURLEncoding.EncodedLen(sha256.Size))
	base64.RawURLEncoding.Encode(token, payload)
	mac := computeMAC(k, token)
	token = append(token, '.')
	token = base64.RawURLEncoding.AppendEncode(token, mac[:])
	if len(token) > MaxTokenLength {
		return "", Claims{}, fmt.Errorf("failed to sign: token would be %d bytes, longer than %d", len(token), MaxTokenLength)
	}
	return string(token), claims, nil
}

// encodeClaims writes the payload: compact JSON, members in the order
// v k n exp u s p f, strings escaped as in canonical JSON, f keys in byte order.
func encodeClaims(c Claims) []byte {
	buf := make([]byte, 0, 192+len(c.Scope)+32*len(c.FieldTags))
	buf = append(buf, `{"v":`...)
	buf = strconv.AppendInt(buf, int64(c.Version), 10)
	buf = append(buf, `,"k":`...)
	buf = appendQuoted(buf, c.KeyID)
	buf = append(buf, `,"n":`...)
	buf = appendQuoted(buf, c.Nonce)
	buf = append(buf, `,"exp":`...)
	buf = strconv.AppendInt(buf, c.Expiry, 10)
	buf = append(buf, `,"u":`...)
	buf = appendQuoted(buf, c.SubjectTag)
	buf = append(buf, `,"s":`...)
	buf = appendQuoted(buf, c.Scope)
	buf = append(buf, `,"p":`...)
	buf = appendQuoted(buf, c.ParamHash)
	buf = append(buf, `,"f":{`...)
	paths := make([]string, 0, len(c.FieldTags))
	for p := range c.FieldTags {
		paths = append(paths, p)
	}
	slices.Sort(paths)
	for i, p := range paths {
		if i > 0 {
			buf = append(buf, ',')
		}
		buf = appendQuoted(buf, p)
		buf = append(buf, ':')
		buf = appendQuoted(buf, c.FieldTags[p])
	}
	return append(buf, "}}"...)
}

// Reason says why Verify rejected a fingerprint.
type Reason string

// The reasons, in the order Verify checks them.
const (
	ReasonMalformed     Reason = "malformed"
	ReasonUnknownKey    Reason = "unknown_key"
	ReasonBadMAC        Reason = "bad_mac"
	ReasonBadVersion    Reason = "bad_version"
	ReasonWrongScope    Reason = "wrong_scope"
	ReasonWrongSubject  Reason = "wrong_subject"
	ReasonExpired       Reason = "expired"
	ReasonParamsChanged Reason = "params_changed"
)

// VerifyError is the only error type Verify returns.
type VerifyError struct {
	Reason Reason
	// ChangedFields is set for ReasonParamsChanged: the param paths, as
	// written in the config and in configured order, whose value or presence
	// differs from what was signed. It may be empty if the hash differs but
	// no field tag does (a token signed under a different params config).
	ChangedFields []string

	detail string // what was malformed; never key material or MAC bytes
}

func (e *VerifyError) Error() string {
	msg := "fingerprint rejected: " + string(e.Reason)
	if e.detail != "" {
		msg += " (" + e.detail + ")"
	}
	if len(e.ChangedFields) > 0 {
		msg += " (changed: " + strings.Join(e.ChangedFields, ", ") + ")"
	}
	return msg
}

// ReasonOf returns the Reason of a *VerifyError in err's chain.
func ReasonOf(err error) (Reason, bool) {
	var ve *VerifyError
	if errors.As(err, &ve) {
		return ve.Reason, true
	}
	return "", false
}

func malformed(detail string) (Claims, error) {
	return Claims{}, &VerifyError{Reason: ReasonMalformed, detail: detail}
}

// Expect is what the confirm (or status) request says the fingerprint must
// be bound to.
type Expect struct {
	Subject string
	Scope   string
	// Params of the confirm request; nil skips the "p" check (the status tool).
	Params *Params
	// AllowExpired skips the expiry check (the status tool may ask late).
	AllowExpired bool
}

// Verify checks token in the order syntax, key id, MAC, v, s, u, exp, p and
// returns the first failure as a *VerifyError. now is truncated to whole
// seconds: the token is valid while now <= exp. Once the MAC has been
// verified the decoded Claims are returned even with an error, so the caller
// can log the nonce or answer a status request.
func (r *KeyRing) Verify(token string, want Expect, now time.Time) (Claims, error) {
	if r == nil {
		return malformed("no key ring")
	}
	if len(token) > MaxTokenLength {
		return malformed("too long")
	}
	payloadPart, sigPart, ok := strings.Cut(token, ".")
	if !ok || strings.IndexByte(sigPart, '.') >= 0 {
		return malformed("not two dot-separated parts")
	}
	if !isBase64URL(payloadPart) || !isBase64URL(sigPart) {
		return malformed("not unpadded base64url")
	}
	var sig [sha256.Size]byte
	if strictB64.DecodedLen(len(sigPart)) != len(sig) {
		return malformed("bad signature encoding")
	}
	if n, err := strictB64.Decode(sig[:], []byte(sigPart)); err != nil || n != len(sig) {
		return malformed("bad signature encoding")
	}
	payload, err := strictB64.DecodeString(payloadPart)
	if err != nil {
		return malformed("bad payload encoding")
	}
	claims, detail := decodeClaims(payload)
	if detail != "" {
		return malformed(detail)
	}
	k, ok := r.keys[claims.KeyID]
	if !ok {
		return Claims{}, &VerifyError{Reason: ReasonUnknownKey}
	}
	mac := computeMAC(k, payloadPart)
	if !hmac.Equal(mac[:], sig[:]) {
		return Claims{}, &VerifyError{Reason: ReasonBadMAC}
	}

	// The MAC holds: from here on the claims are ours and are returned.
	if claims.Version != Version {
		return claims, &VerifyError{Reason: ReasonBadVersion}
	}
	if claims.Scope != want.Scope {
		return claims, &VerifyError{Reason: ReasonWrongScope}
	}
	if want.Subject == "" || subtle.ConstantTimeCompare([]byte(k.subjectTag(want.Subject)), []byte(claims.SubjectTag)) != 1 {
		return claims, &VerifyError{Reason: ReasonWrongSubject}
	}
	if !want.AllowExpired && now.Unix() > claims.Expiry {
		return claims, &VerifyError{Reason: ReasonExpired}
	}
	if want.Params != nil && subtle.ConstantTimeCompare([]byte(want.Params.Hash), []byte(claims.ParamHash)) != 1 {
		return claims, &VerifyError{Reason: ReasonParamsChanged, ChangedFields: k.changedFields(claims.FieldTags, want.Params)}
	}
	return claims, nil
}

// changedFields lists, in configured order, the params whose presence or tag
// differs between the token and got. Paths the token knows but the current
// config does not come last, sorted.
func (k *ringKey) changedFields(signed map[string]string, got *Params) []string {
	order := got.order
	if order == nil {
		for _, f := range got.Fields {
			order = append(order, f.Path)
		}
	}
	current := make(map[string][]byte, len(got.Fields))
	for _, f := range got.Fields {
		current[f.Path] = f.Canonical
	}
	kh := k.fieldHashes.get()
	defer k.fieldHashes.put(kh)
	var changed []string
	known := make(map[string]bool, len(order))
	for _, path := range order {
		known[path] = true
		tag, inToken := signed[path]
		canonical, inRequest := current[path]
		switch {
		case !inToken && !inRequest:
		case inToken != inRequest:
			changed = append(changed, path)
		case subtle.ConstantTimeCompare([]byte(k.fieldTag(kh, path, canonical)), []byte(tag)) != 1:
			changed = append(changed, path)
		}
	}
	var unknown []string
	for path := range signed {
		if !known[path] {
			unknown = append(unknown, path)
		}
	}
	slices.Sort(unknown)
	return append(changed, unknown...)
}

// Claim members, as bits for duplicate and completeness checks.
const (
	memberV = 1 << iota
	memberK
	memberN
	memberExp
	memberU
	memberS
	memberP
	memberF
	allMembers = 1<<iota - 1
)

// decodeClaims parses a payload: one JSON object with exactly the members
// v k n exp u s p f (any order, no duplicates, nothing else), v and exp
// integer literals within range, the others strings except f, an object of
// strings; k a valid key id, n and p lower-case hex of the right length. It
// returns a description of the first problem, never key material.
func decodeClaims(payload []byte) (Claims, string) {
	p := jsonParser{data: payload}
	var c Claims
	var seen int
	p.skipSpace()
	if p.pos >= len(p.data) || p.data[p.pos] != '{' {
		return Claims{}, "payload is not a JSON object"
	}
	p.pos++
	p.skipSpace()
	for p.pos < len(p.data) && p.data[p.pos] != '}' {
		if seen != 0 {
			if p.data[p.pos] != ',' {
				return Claims{}, "payload is not a JSON object"
			}
			p.pos++
			p.skipSpace()
		}
		name, ok := p.memberName()
		if !ok {
			return Claims{}, "payload is not a JSON object"
		}
		var bit int
		var bad string
		switch name {
		case "v":
			bit = memberV
			var v int64
			v, bad = p.claimInteger("v")
			c.Version = int(v)
			if bad == "" && int64(c.Version) != v {
				bad = `"v" out of range`
			}
		case "k":
			bit = memberK
			c.KeyID, bad = p.claimString("k")
		case "n":
			bit = memberN
			c.Nonce, bad = p.claimString("n")
		case "exp":
			bit = memberExp
			c.Expiry, bad = p.claimInteger("exp")
		case "u":
			bit = memberU
			c.SubjectTag, bad = p.claimString("u")
		case "s":
			bit = memberS
			c.Scope, bad = p.claimString("s")
		case "p":
			bit = memberP
			c.ParamHash, bad = p.claimString("p")
		case "f":
			bit = memberF
			c.FieldTags, bad = p.claimFieldTags()
		default:
			return Claims{}, "payload has an unknown member"
		}
		if bad != "" {
			return Claims{}, bad
		}
		if seen&bit != 0 {
			return Claims{}, "payload repeats a member"
		}
		seen |= bit
		p.skipSpace()
	}
	if p.pos >= len(p.data) {
		return Claims{}, "payload is not a JSON object"
	}
	p.pos++ // '}'
	p.skipSpace()
	switch {
	case p.pos != len(p.data):
		return Claims{}, "payload has data after the object"
	case seen != allMembers:
		return Claims{}, "payload must have exactly the members v k n exp u s p f"
	case !validKeyID(c.KeyID):
		return Claims{}, `"k" is not a key id`
	case !isLowerHex(c.Nonce, nonceHexLen):
		return Claims{}, `"n" must be 32 lower-case hex characters`
	case !isLowerHex(c.ParamHash, paramHashLen):
		return Claims{}, `"p" must be 64 lower-case hex characters`
	}
	return c, ""
}

// memberName reads an object key and the ':' after it.
func (p *jsonParser) memberName() (string, bool) {
	if p.pos >= len(p.data) || p.data[p.pos] != '"' {
		return "", false
	}
	name, err := p.string()
	if err != nil {
		return "", false
	}
	p.skipSpace()
	if p.pos >= len(p.data) || p.data[p.pos] != ':' {
		return "", false
	}
	p.pos++
	p.skipSpace()
	return name, true
}

func (p *jsonParser) claimString(name string) (string, string) {
	if p.pos >= len(p.data) || p.data[p.pos] != '"' {
		return "", fmt.Sprintf("%q must be a string", name)
	}
	s, err := p.string()
	if err != nil {
		return "", "payload is not valid JSON"
	}
	return s, ""
}

// claimInteger reads an integer literal: optional '-', digits, no fraction
// or exponent, within int64.
func (p *jsonParser) claimInteger(name string) (int64, string) {
	bad := fmt.Sprintf("%q must be an integer", name)
	if p.pos >= len(p.data) || (p.data[p.pos] != '-' && !isDigit(p.data[p.pos])) {
		return 0, bad
	}
	start := p.pos
	if _, err := p.number(); err != nil {
		return 0, bad
	}
	text := p.data[start:p.pos]
	if bytes.ContainsAny(text, ".eE") {
		return 0, bad
	}
	n, err := strconv.ParseInt(string(text), 10, 64)
	if err != nil {
		return 0, bad
	}
	return n, ""
}

// claimFieldTags reads "f": an object whose members are all strings.
func (p *jsonParser) claimFieldTags() (map[string]string, string) {
	const bad = `"f" must be an object of strings`
	if p.pos >= len(p.data) || p.data[p.pos] != '{' {
		return nil, bad
	}
	p.pos++
	tags := make(map[string]string)
	p.skipSpace()
	for p.pos < len(p.data) && p.data[p.pos] != '}' {
		if len(tags) > 0 {
			if p.data[p.pos] != ',' {
				return nil, bad
			}
			p.pos++
			p.skipSpace()
		}
		path, ok := p.memberName()
		if !ok {
			return nil, bad
		}
		tag, why := p.claimString("f")
		if why != "" {
			return nil, bad
		}
		if _, dup := tags[path]; dup {
			return nil, `"f" repeats a member`
		}
		tags[path] = tag
		p.skipSpace()
	}
	if p.pos >= len(p.data) {
		return nil, bad
	}
	p.pos++ // '}'
	return tags, ""
}

func isBase64URL(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || isDigit(c) || c == '-' || c == '_') {
			return false
		}
	}
	return true
}

func isLowerHex(s string, n int) bool {
	if len(s) != n {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(isDigit(c) || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}
