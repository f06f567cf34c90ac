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
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/idemgate/idemgate/internal/jsonx"
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
	// sigTextLen is the length of the MAC in unpadded base64url.
	sigTextLen = (8*sha256.Size + 5) / 6
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
	k, err := r.checkSign(req)
	if err != nil {
		return "", Claims{}, err
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

// checkSign validates a SignRequest and returns the active key.
func (r *KeyRing) checkSign(req SignRequest) (*ringKey, error) {
	if r == nil {
		return nil, errors.New("failed to sign: nil key ring")
	}
	switch {
	case req.Subject == "":
		return nil, errors.New("failed to sign: subject is empty")
	case req.Scope == "" || !utf8.ValidString(req.Scope):
		return nil, errors.New("failed to sign: scope must be a non-empty UTF-8 string")
	case !isLowerHex(req.Nonce, nonceHexLen):
		return nil, errors.New("failed to sign: nonce must be 32 lower-case hex characters (use NewNonce)")
	case !isLowerHex(req.Params.Hash, paramHashLen):
		return nil, errors.New("failed to sign: params hash must be 64 lower-case hex characters (use Selector.Select)")
	case req.Expiry.IsZero():
		return nil, errors.New("failed to sign: expiry is not set")
	}
	k, ok := r.keys[r.active]
	if !ok {
		return nil, errors.New("failed to sign: key ring has no active key (use NewKeyRing)")
	}
	return k, nil
}

// SignToken issues exactly the token Sign issues for req, and its expiry,
// for callers that need nothing else (a preview response): it writes the
// tags straight into the payload instead of building Claims, so a preview
// costs a few allocations rather than one per bound field.
func (r *KeyRing) SignToken(req SignRequest) (token string, expiresAt time.Time, err error) {
	k, err := r.checkSign(req)
	if err != nil {
		return "", time.Time{}, err
	}
	fields := req.Params.Fields
	// The fields' indexes in path byte order (the order of "f").
	var orderBuf [16]int
	order := orderBuf[:0]
	if len(fields) > len(orderBuf) {
		order = make([]int, 0, len(fields))
	}
	for i, f := range fields {
		if f.Path == "" || !utf8.ValidString(f.Path) || strings.IndexByte(f.Path, 0) >= 0 {
			return "", time.Time{}, fmt.Errorf("failed to sign: invalid field path %q", f.Path)
		}
		for _, j := range order {
			if fields[j].Path == f.Path {
				return "", time.Time{}, fmt.Errorf("failed to sign: field %q listed twice", f.Path)
			}
		}
		// Insertion sort: a handful of paths.
		at := len(order)
		for at > 0 && fields[order[at-1]].Path > f.Path {
			at--
		}
		order = slices.Insert(order, at, i)
	}

	sc := r.scratch()
	defer r.release(sc)
	buf := sc.payload[:0]
	buf = append(buf, `{"v":`...)
	buf = strconv.AppendInt(buf, Version, 10)
	buf = append(buf, `,"k":`...)
	buf = AppendJSONString(buf, k.id)
	buf = append(buf, `,"n":`...)
	buf = AppendJSONString(buf, req.Nonce)
	buf = append(buf, `,"exp":`...)
	buf = strconv.AppendInt(buf, req.Expiry.Unix(), 10)
	// Tags are base64url, which JSON strings carry unescaped.
	buf = append(buf, `,"u":"`...)
	buf = k.appendSubjectTag(buf, req.Subject)
	buf = append(buf, `","s":`...)
	buf = AppendJSONString(buf, req.Scope)
	buf = append(buf, `,"p":`...)
	buf = AppendJSONString(buf, req.Params.Hash)
	buf = append(buf, `,"f":{`...)
	kh := k.fieldHashes.get()
	for n, i := range order {
		if n > 0 {
			buf = append(buf, ',')
		}
		buf = AppendJSONString(buf, fields[i].Path)
		buf = append(buf, ':', '"')
		buf = k.appendFieldTag(buf, kh, fields[i].Path, fields[i].Canonical)
		buf = append(buf, '"')
	}
	k.fieldHashes.put(kh)
	buf = append(buf, "}}"...)
	sc.payload = buf

	n := base64.RawURLEncoding.EncodedLen(len(buf))
	tok := make([]byte, n, n+1+sigTextLen)
	base64.RawURLEncoding.Encode(tok, buf)
	mac := computeMAC(k, tok)
	tok = append(tok, '.')
	tok = base64.RawURLEncoding.AppendEncode(tok, mac[:])
	if len(tok) > MaxTokenLength {
		return "", time.Time{}, fmt.Errorf("failed to sign: token would be %d bytes, longer than %d", len(tok), MaxTokenLength)
	}
	return string(tok), time.Unix(req.Expiry.Unix(), 0).UTC(), nil
}

// encodeClaims writes the payload: compact JSON, members in the order
// v k n exp u s p f, strings escaped as in canonical JSON, f keys in byte order.
func encodeClaims(c Claims) []byte {
	buf := make([]byte, 0, 192+len(c.Scope)+32*len(c.FieldTags))
	buf = append(buf, `{"v":`...)
	buf = strconv.AppendInt(buf, int64(c.Version), 10)
	buf = append(buf, `,"k":`...)
	buf = AppendJSONString(buf, c.KeyID)
	buf = append(buf, `,"n":`...)
	buf = AppendJSONString(buf, c.Nonce)
	buf = append(buf, `,"exp":`...)
	buf = strconv.AppendInt(buf, c.Expiry, 10)
	buf = append(buf, `,"u":`...)
	buf = AppendJSONString(buf, c.SubjectTag)
	buf = append(buf, `,"s":`...)
	buf = AppendJSONString(buf, c.Scope)
	buf = append(buf, `,"p":`...)
	buf = AppendJSONString(buf, c.ParamHash)
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
		buf = AppendJSONString(buf, p)
		buf = append(buf, ':')
		buf = AppendJSONString(buf, c.FieldTags[p])
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
	// OmitFieldTags leaves Claims.FieldTags nil. The tags are still checked
	// (an object of strings) and still name the changed fields of a
	// params_changed; a caller that never reads them (the confirm path)
	// saves a map and a string per bound field on every verification.
	OmitFieldTags bool
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
	var sigText [sigTextLen]byte
	if len(sigPart) != len(sigText) || strictB64.DecodedLen(len(sigPart)) != len(sig) {
		return malformed("bad signature encoding")
	}
	copy(sigText[:], sigPart) // decoded without converting (and allocating) the string
	if n, err := strictB64.Decode(sig[:], sigText[:]); err != nil || n != len(sig) {
		return malformed("bad signature encoding")
	}
	sc := r.scratch()
	defer r.release(sc)
	sc.text = append(sc.text[:0], payloadPart...)
	payload, err := strictB64.AppendDecode(sc.payload[:0], sc.text)
	sc.payload = payload
	if err != nil {
		return malformed("bad payload encoding")
	}
	claims, fieldTags, detail := decodeClaims(payload, r, &want)
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
		tags := claims.FieldTags
		if tags == nil {
			// Checked by decodeClaims, and the payload is still ours.
			tags, _ = claimFieldTags(fieldTags, &want)
		}
		return claims, &VerifyError{Reason: ReasonParamsChanged, ChangedFields: k.changedFields(tags, want.Params)}
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
//
// The payload bytes are not kept, except fieldTags: the raw "f", which
// aliases payload, from which Claims.FieldTags is decoded unless
// want.OmitFieldTags. Strings the caller already holds — the ring's key
// ids, the expected scope, parameter hash and field paths — are reused
// instead of copied when the claim spells exactly them; ring and want may
// be nil.
func decodeClaims(payload []byte, ring *KeyRing, want *Expect) (c Claims, fieldTags []byte, detail string) {
	var space [10]jsonx.Member
	members, err := jsonx.MembersInto(space[:0], payload)
	if err != nil {
		var de *jsonx.DuplicateKeyError
		switch {
		case errors.As(err, &de) && len(de.Path) == 1:
			return Claims{}, nil, "payload repeats a member"
		case errors.As(err, &de) && len(de.Path) == 2 && de.Path[0] == "f":
			return Claims{}, nil, `"f" repeats a member`
		case errors.Is(err, jsonx.ErrNotObject):
			return Claims{}, nil, "payload is not a JSON object"
		}
		return Claims{}, nil, "payload is not valid JSON"
	}
	var seen int
	for _, m := range members {
		var bit int
		var bad string
		var raw []byte
		switch string(m.Name) {
		case "v":
			bit = memberV
			var v int64
			v, bad = claimInteger(m.Value, "v")
			c.Version = int(v)
			if bad == "" && int64(c.Version) != v {
				bad = `"v" out of range`
			}
		case "k":
			bit = memberK
			if raw, bad = claimBytes(m.Value, "k"); bad == "" {
				c.KeyID = ring.knownKeyID(raw)
			}
		case "n":
			bit = memberN
			if raw, bad = claimBytes(m.Value, "n"); bad == "" {
				c.Nonce = string(raw)
			}
		case "exp":
			bit = memberExp
			c.Expiry, bad = claimInteger(m.Value, "exp")
		case "u":
			bit = memberU
			if raw, bad = claimBytes(m.Value, "u"); bad == "" {
				c.SubjectTag = string(raw)
			}
		case "s":
			bit = memberS
			if raw, bad = claimBytes(m.Value, "s"); bad == "" {
				c.Scope = want.knownScope(raw)
			}
		case "p":
			bit = memberP
			if raw, bad = claimBytes(m.Value, "p"); bad == "" {
				c.ParamHash = want.knownParamHash(raw)
			}
		case "f":
			bit = memberF
			fieldTags = m.Value
			if want != nil && want.OmitFieldTags {
				if !objectOfStrings(m.Value) {
					bad = badFieldTags
				}
			} else {
				c.FieldTags, bad = claimFieldTags(m.Value, want)
			}
		default:
			return Claims{}, nil, "payload has an unknown member"
		}
		if bad != "" {
			return Claims{}, nil, bad
		}
		seen |= bit
	}
	switch {
	case seen != allMembers:
		return Claims{}, nil, "payload must have exactly the members v k n exp u s p f"
	case !validKeyID(c.KeyID):
		return Claims{}, nil, `"k" is not a key id`
	case !isLowerHex(c.Nonce, nonceHexLen):
		return Claims{}, nil, `"n" must be 32 lower-case hex characters`
	case !isLowerHex(c.ParamHash, paramHashLen):
		return Claims{}, nil, `"p" must be 64 lower-case hex characters`
	}
	return c, fieldTags, ""
}

// knownKeyID returns the ring's own copy of a key id the payload names, or
// a new string for one the ring does not know.
func (r *KeyRing) knownKeyID(raw []byte) string {
	if r != nil {
		if k, ok := r.keys[string(raw)]; ok {
			return k.id
		}
	}
	return string(raw)
}

func (w *Expect) knownScope(raw []byte) string {
	if w != nil && string(raw) == w.Scope {
		return w.Scope
	}
	return string(raw)
}

func (w *Expect) knownParamHash(raw []byte) string {
	if w != nil && w.Params != nil && string(raw) == w.Params.Hash {
		return w.Params.Hash
	}
	return string(raw)
}

// knownPath returns the configured copy of a field path, if it is one.
func (w *Expect) knownPath(raw []byte) string {
	if w != nil && w.Params != nil {
		for _, path := range w.Params.order {
			if string(raw) == path {
				return path
			}
		}
	}
	return string(raw)
}

// claimBytes reads a string member's value (aliasing the payload unless it
// had escapes).
func claimBytes(raw []byte, name string) ([]byte, string) {
	b, ok := jsonx.StringBytes(raw)
	if !ok {
		return nil, fmt.Sprintf("%q must be a string", name)
	}
	return b, ""
}

// claimInteger reads an integer literal: optional '-', digits, no fraction
// or exponent, within int64. raw is a valid JSON value (the payload was
// read strictly), so digits after an optional '-' are a number.
func claimInteger(raw []byte, name string) (int64, string) {
	n, ok := parseInt64(raw)
	if !ok {
		return 0, fmt.Sprintf("%q must be an integer", name)
	}
	return n, ""
}

// parseInt64 reads text as an optional '-' and decimal digits within int64,
// as strconv.ParseInt(text, 10, 64) would, without converting it to a
// string first. A fraction or exponent is refused.
func parseInt64(text []byte) (int64, bool) {
	neg := len(text) > 0 && text[0] == '-'
	digits := text
	limit := uint64(math.MaxInt64)
	if neg {
		digits = text[1:]
		limit++ // -2^63 is in range
	}
	if len(digits) == 0 {
		return 0, false
	}
	var u uint64
	for _, c := range digits {
		if !isDigit(c) {
			return 0, false
		}
		d := uint64(c - '0')
		if u > (limit-d)/10 {
			return 0, false
		}
		u = u*10 + d
	}
	if neg {
		return -int64(u), true // two's complement: -(2^63) wraps to MinInt64
	}
	return int64(u), true
}

const badFieldTags = `"f" must be an object of strings`

// claimFieldTags reads "f": an object whose members are all strings
// (duplicates were refused with the payload).
func claimFieldTags(raw []byte, want *Expect) (map[string]string, string) {
	var space [16]jsonx.Member
	members, err := jsonx.MembersInto(space[:0], raw)
	if err != nil {
		return nil, badFieldTags
	}
	size := len(members)
	if want != nil && want.Params != nil {
		size = len(want.Params.order)
	}
	tags := make(map[string]string, size)
	for _, m := range members {
		tag, ok := jsonx.StringBytes(m.Value)
		if !ok {
			return nil, badFieldTags
		}
		tags[want.knownPath(m.Name)] = string(tag)
	}
	return tags, ""
}

// objectOfStrings reports whether raw, a strict JSON value (read with the
// payload), is an object whose members are all strings, as claimFieldTags
// requires, without decoding it: outside strings such an object holds only
// its own braces, colons, commas and whitespace, and any other value would
// put a bracket, a second brace, a digit, a minus or a letter there.
func objectOfStrings(raw []byte) bool {
	raw = bytes.TrimSpace(raw)
	if len(raw) < 2 || raw[0] != '{' || raw[len(raw)-1] != '}' {
		return false
	}
	inString := false
	for i := 1; i < len(raw)-1; i++ {
		c := raw[i]
		if inString {
			switch c {
			case '\\':
				i++ // the escaped byte cannot end the string
			case '"':
				inString = false
			}
			continue
		}
		switch c {
		case '"':
			inString = true
		case ':', ',', ' ', '\t', '\n', '\r':
		default:
			return false
		}
	}
	return true
}

// base64URLByte marks the bytes of the unpadded base64url alphabet: a
// token's two parts are checked byte by byte on every confirm, and one
// table lookup per byte is cheaper than five range tests.
var base64URLByte = func() (t [256]bool) {
	for c := range 256 {
		t[c] = 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_'
	}
	return t
}()

func isBase64URL(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !base64URLByte[s[i]] {
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
