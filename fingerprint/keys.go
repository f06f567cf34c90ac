package fingerprint

import (
	"crypto/hkdf"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"hash"
	"log/slog"
	"slices"
	"strings"
	"sync"
)

// MinKeyBytes is the minimum length of a signing key.
const MinKeyBytes = 32

// ErrInvalidKey is returned for key material or key ids that cannot be used.
// Its messages never contain key material.
var ErrInvalidKey = errors.New("invalid key")

// Labels for the sub-keys derived from every configured key with HKDF-Expand
// (RFC 5869, SHA-256, the configured key as PRK, 32 bytes). Each use of a key
// gets its own sub-key; the MAC itself uses the configured key directly, as
// docs/design.md §2 specifies. The labels contain '/' and HKDF appends 0x01,
// neither of which can occur in the base64url text the MAC is computed over,
// so no MAC input ever equals a derivation input.
const (
	subjectTagLabel = "idemgate/fingerprint/v1/subject-tag"
	fieldTagLabel   = "idemgate/fingerprint/v1/field-tag"
)

const (
	subjectTagBytes = 16 // 128 bits; base64url: 22 characters
	fieldTagBytes   = 9  // 72 bits; base64url: 12 characters
	maxKeyIDLength  = 64
)

// ParseKey decodes a key as stored in IDEMGATE_KEY_* or a key file: base64
// in the standard or URL alphabet, padded or not, surrounding whitespace
// ignored. Keys shorter than MinKeyBytes are rejected.
func ParseKey(encoded string) ([]byte, error) {
	s := strings.TrimSpace(encoded)
	if s == "" {
		return nil, fmt.Errorf("%w: empty", ErrInvalidKey)
	}
	urlAlphabet := strings.ContainsAny(s, "-_")
	if urlAlphabet && strings.ContainsAny(s, "+/") {
		return nil, fmt.Errorf("%w: mixes the standard and URL base64 alphabets", ErrInvalidKey)
	}
	enc := base64.RawStdEncoding
	if urlAlphabet {
		enc = base64.RawURLEncoding
	}
	// Padding is optional: drop it and decode unpadded.
	key, err := enc.DecodeString(strings.TrimRight(s, "="))
	if err != nil {
		// Never echo the input: it is a secret.
		return nil, fmt.Errorf("%w: not base64", ErrInvalidKey)
	}
	if len(key) < MinKeyBytes {
		return nil, fmt.Errorf("%w: %d bytes, need at least %d", ErrInvalidKey, len(key), MinKeyBytes)
	}
	return key, nil
}

// GenerateKey returns 32 random bytes from crypto/rand in standard padded
// base64, the form ParseKey reads and `idemgate keygen` prints.
func GenerateKey() (string, error) {
	key := make([]byte, MinKeyBytes)
	if _, err := rand.Read(key); err != nil {
		return "", fmt.Errorf("failed to read random key: %w", err)
	}
	return base64.StdEncoding.EncodeToString(key), nil
}

// KeyRing holds the signing keys: the active one signs, all of them verify.
// It is immutable and safe for concurrent use. It never prints its secrets
// (String, GoString and LogValue show key ids only).
type KeyRing struct {
	active string
	ids    []string // sorted
	keys   map[string]*ringKey

	// scratchPool holds *verifyScratch: Verify decodes the payload into
	// pooled buffers, since nothing in Claims aliases them. (A pointer, so
	// that a KeyRing value can still be copied, e.g. by fmt.)
	scratchPool *sync.Pool
}

// verifyScratch is Verify's working memory: the payload text and its
// decoded bytes.
type verifyScratch struct {
	text    []byte
	payload []byte
}

func (r *KeyRing) scratch() *verifyScratch {
	if r.scratchPool != nil {
		if sc, ok := r.scratchPool.Get().(*verifyScratch); ok {
			return sc
		}
	}
	return &verifyScratch{}
}

func (r *KeyRing) release(sc *verifyScratch) {
	if r.scratchPool == nil || cap(sc.text) > maxPooledInput || cap(sc.payload) > maxPooledInput {
		return
	}
	r.scratchPool.Put(sc)
}

// ringKey is one configured key and its derived sub-keys, computed once.
// Keyed HMAC states are pooled per use, so signing and verifying do not
// re-key SHA-256 on every call.
type ringKey struct {
	id         string
	mac        []byte
	subjectKey []byte
	fieldKey   []byte

	macHashes     hmacPool
	subjectHashes hmacPool
	fieldHashes   hmacPool
}

// hmacPool hands out HMAC-SHA256 states for one key.
type hmacPool struct{ pool sync.Pool }

// keyedHash is a pooled HMAC state with scratch space for input and sum.
type keyedHash struct {
	h   hash.Hash
	in  []byte
	sum []byte
}

// maxPooledInput keeps pooled scratch buffers from pinning large inputs.
const maxPooledInput = 8 << 10

func newHMACPool(key []byte) hmacPool {
	return hmacPool{pool: sync.Pool{New: func() any {
		return &keyedHash{h: hmac.New(sha256.New, key), sum: make([]byte, 0, sha256.Size)}
	}}}
}

func (p *hmacPool) get() *keyedHash {
	kh := p.pool.Get().(*keyedHash)
	kh.h.Reset()
	return kh
}

func (p *hmacPool) put(kh *keyedHash) {
	if cap(kh.in) > maxPooledInput {
		kh.in = nil
	}
	p.pool.Put(kh)
}

// NewKeyRing builds a key ring. activeID must be one of keys; ids are
// 1 to 64 characters of [A-Za-z0-9._-]; every key has at least MinKeyBytes.
// The key bytes are copied.
func NewKeyRing(activeID string, keys map[string][]byte) (*KeyRing, error) {
	var errs []error
	r := &KeyRing{active: activeID, keys: make(map[string]*ringKey, len(keys)), scratchPool: &sync.Pool{}}
	for id, secret := range keys {
		if !validKeyID(id) {
			errs = append(errs, fmt.Errorf("%w: key id %q must be 1-%d characters of [A-Za-z0-9._-]", ErrInvalidKey, id, maxKeyIDLength))
			continue
		}
		if len(secret) < MinKeyBytes {
			errs = append(errs, fmt.Errorf("%w: key %q has %d bytes, need at least %d", ErrInvalidKey, id, len(secret), MinKeyBytes))
			continue
		}
		rk, err := deriveKey(id, secret)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		r.keys[id] = rk
		r.ids = append(r.ids, id)
	}
	if _, ok := keys[activeID]; !ok {
		errs = append(errs, fmt.Errorf("%w: active key %q is not among the configured keys", ErrInvalidKey, activeID))
	}
	if len(errs) > 0 {
		slices.SortFunc(errs, func(a, b error) int { return strings.Compare(a.Error(), b.Error()) })
		return nil, errors.Join(errs...)
	}
	slices.Sort(r.ids)
	return r, nil
}

func deriveKey(id string, secret []byte) (*ringKey, error) {
	subjectKey, err := hkdf.Expand(sha256.New, secret, subjectTagLabel, sha256.Size)
	if err != nil {
		return nil, fmt.Errorf("failed to derive the subject key of %q: %w", id, err)
	}
	fieldKey, err := hkdf.Expand(sha256.New, secret, fieldTagLabel, sha256.Size)
	if err != nil {
		return nil, fmt.Errorf("failed to derive the field key of %q: %w", id, err)
	}
	rk := &ringKey{id: id, mac: slices.Clone(secret), subjectKey: subjectKey, fieldKey: fieldKey}
	rk.macHashes = newHMACPool(rk.mac)
	rk.subjectHashes = newHMACPool(rk.subjectKey)
	rk.fieldHashes = newHMACPool(rk.fieldKey)
	return rk, nil
}

func validKeyID(id string) bool {
	if id == "" || len(id) > maxKeyIDLength {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || isDigit(c) || c == '.' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// DeriveKeys returns, for every key of the ring, a 32-byte key derived
// from it with HKDF-SHA256 under label: a key of its own for another use
// (docs/design.md §13: the sealed MCP requestState), so that nothing sealed
// with it could pass for a fingerprint or a tag. label must differ from
// the fingerprint's own labels.
func (r *KeyRing) DeriveKeys(label string) (map[string][]byte, error) {
	if label == "" || label == subjectTagLabel || label == fieldTagLabel {
		return nil, fmt.Errorf("%w: a derived key needs a label of its own", ErrInvalidKey)
	}
	out := make(map[string][]byte, len(r.keys))
	for id, k := range r.keys {
		d, err := hkdf.Expand(sha256.New, k.mac, label, sha256.Size)
		if err != nil {
			return nil, fmt.Errorf("failed to derive a %s key of %q: %w", label, id, err)
		}
		out[id] = d
	}
	return out, nil
}

// ActiveKeyID is the id of the key that signs.
func (r *KeyRing) ActiveKeyID() string { return r.active }

// KeyIDs returns every configured key id, sorted.
func (r *KeyRing) KeyIDs() []string { return slices.Clone(r.ids) }

// LogValue shows key ids only.
func (r *KeyRing) LogValue() slog.Value {
	return slog.GroupValue(
		slog.String("active_key", r.active),
		slog.Any("key_ids", r.KeyIDs()),
		slog.String("keys", "[REDACTED]"),
	)
}

// String shows key ids only.
func (r *KeyRing) String() string {
	return fmt.Sprintf("KeyRing{active_key: %s, key_ids: [%s], keys: [REDACTED]}", r.active, strings.Join(r.ids, " "))
}

// GoString shows key ids only, so %#v does not print secrets either.
func (r *KeyRing) GoString() string { return r.String() }

// SubjectTag returns the keyed tag of subject under key keyID, the "u" claim:
// base64url (no padding) of the first 16 bytes of HMAC-SHA256(subject key,
// subject). The subject is used byte for byte, with no normalisation.
func (r *KeyRing) SubjectTag(keyID, subject string) (string, error) {
	k, ok := r.keys[keyID]
	if !ok {
		return "", fmt.Errorf("%w: unknown key id", ErrInvalidKey)
	}
	if subject == "" {
		return "", errors.New("failed to tag subject: subject is empty")
	}
	return k.subjectTag(subject), nil
}

func (k *ringKey) subjectTag(subject string) string {
	kh := k.subjectHashes.get()
	defer k.subjectHashes.put(kh)
	kh.in = append(kh.in[:0], subject...)
	kh.h.Write(kh.in)
	kh.sum = kh.h.Sum(kh.sum[:0])
	return base64.RawURLEncoding.EncodeToString(kh.sum[:subjectTagBytes])
}

// appendSubjectTag appends subjectTag(subject) to buf.
func (k *ringKey) appendSubjectTag(buf []byte, subject string) []byte {
	kh := k.subjectHashes.get()
	defer k.subjectHashes.put(kh)
	kh.in = append(kh.in[:0], subject...)
	kh.h.Write(kh.in)
	kh.sum = kh.h.Sum(kh.sum[:0])
	return base64.RawURLEncoding.AppendEncode(buf, kh.sum[:subjectTagBytes])
}

// fieldTag is base64url (no padding) of the first 9 bytes of
// HMAC-SHA256(field key, path || 0x00 || canonical value). Paths cannot
// contain 0x00, so the input is unambiguous. kh comes from k.fieldHashes.
func (k *ringKey) fieldTag(kh *keyedHash, path string, canonical []byte) string {
	kh.h.Reset()
	kh.in = append(append(kh.in[:0], path...), 0)
	kh.h.Write(kh.in)
	kh.h.Write(canonical)
	kh.sum = kh.h.Sum(kh.sum[:0])
	return base64.RawURLEncoding.EncodeToString(kh.sum[:fieldTagBytes])
}

// appendFieldTag appends fieldTag(kh, path, canonical) to buf.
func (k *ringKey) appendFieldTag(buf []byte, kh *keyedHash, path string, canonical []byte) []byte {
	kh.h.Reset()
	kh.in = append(append(kh.in[:0], path...), 0)
	kh.h.Write(kh.in)
	kh.h.Write(canonical)
	kh.sum = kh.h.Sum(kh.sum[:0])
	return base64.RawURLEncoding.AppendEncode(buf, kh.sum[:fieldTagBytes])
}

// computeMAC is HMAC-SHA256(key, base64url payload text).
func computeMAC[T string | []byte](k *ringKey, encodedPayload T) [sha256.Size]byte {
	kh := k.macHashes.get()
	defer k.macHashes.put(kh)
	kh.in = append(kh.in[:0], encodedPayload...)
	kh.h.Write(kh.in)
	var mac [sha256.Size]byte
	copy(mac[:], kh.h.Sum(kh.sum[:0]))
	return mac
}
