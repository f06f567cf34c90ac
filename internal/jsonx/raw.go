package jsonx

import (
	"bytes"
	"errors"
	"strconv"
	"unicode/utf8"

	"github.com/go-json-experiment/json/jsontext"
)

// ErrNotObject and ErrNotArray are returned by Members and Elements for
// strict JSON of another kind.
var (
	ErrNotObject = errors.New("not a JSON object")
	ErrNotArray  = errors.New("not a JSON array")
)

// Member is one member of a JSON object: its decoded name (a slice of the
// input unless it had escapes), the raw bytes of its value (a slice of the
// input, as its sender wrote it) and the offsets of the whole member (name
// to end of value) in the input. Nothing is copied for a plain name, so a
// member must not outlive the input's buffer.
type Member struct {
	Name       []byte
	Value      []byte
	start, end int
}

// ValueSpan is where the member's value lies in the text it was read from
// (Value is that text[start:end]), so a caller can rewrite one value and
// keep every other byte.
func (m Member) ValueSpan() (start, end int) { return m.end - len(m.Value), m.end }

// Key is the member's name as a string (a copy).
func (m Member) Key() string { return string(m.Name) }

// Members returns the members of the object raw, in order. raw must be
// exactly one strict JSON object (surrounding whitespace allowed); nested
// values are checked as strictly but not built.
func Members(raw []byte) ([]Member, error) { return members(raw, false, nil) }

// MembersInto is Members appending to dst (a caller's stack array).
func MembersInto(dst []Member, raw []byte) ([]Member, error) { return members(raw, false, dst) }

func members(raw []byte, lax bool, dst []Member) ([]Member, error) {
	r := getReader(raw, lax)
	defer putReader(r)
	d := &r.dec
	if d.PeekKind() != '{' {
		if err := Check(raw); err != nil && !lax {
			return nil, err
		}
		return nil, ErrNotObject
	}
	if _, err := d.ReadToken(); err != nil {
		return nil, fail(err, d.InputOffset())
	}
	for d.PeekKind() != '}' {
		key, start, err := readName(d, lax)
		if err != nil {
			return nil, err
		}
		v, err := d.ReadValue()
		if err != nil {
			return nil, fail(err, d.InputOffset())
		}
		end := int(d.InputOffset())
		dst = append(dst, Member{Name: key, Value: raw[end-len(v) : end : end], start: start, end: end})
	}
	if _, err := d.ReadToken(); err != nil {
		return nil, fail(err, d.InputOffset())
	}
	if err := r.end(); err != nil {
		return nil, err
	}
	return dst, nil
}

// readName reads the member name that comes next: its decoded bytes and
// the offset of its opening quote. A name that does not decode (invalid
// UTF-8, a lone surrogate) is an error unless lax.
func readName(d *jsontext.Decoder, lax bool) (key []byte, start int, err error) {
	name, err := d.ReadValue()
	if err != nil {
		return nil, 0, fail(err, d.InputOffset())
	}
	start = int(d.InputOffset()) - len(name)
	key, ok := decodeBytes(name)
	if !ok && !lax {
		return nil, 0, fail(errors.New("invalid string"), int64(start))
	}
	return key, start, nil
}

// Lookup returns the raw value of the member named key (nil when absent).
// Members holds no name twice, so there is one answer.
func Lookup(members []Member, key string) []byte {
	m, _ := Find(members, key)
	return m.Value
}

// Find is Lookup returning the member itself (for its ValueSpan).
func Find(members []Member, key string) (Member, bool) {
	for _, m := range members {
		if string(m.Name) == key {
			return m, true
		}
	}
	return Member{}, false
}

// MemberOf is Lookup on the object raw: nil when raw is not a strict JSON
// object or has no member key.
func MemberOf(raw []byte, key string) []byte {
	ms, err := Members(raw)
	if err != nil {
		return nil
	}
	return Lookup(ms, key)
}

// IsObject reports whether raw is one strict JSON object.
func IsObject(raw []byte) bool {
	_, err := Members(raw)
	return err == nil
}

// Elements returns the raw elements of the array raw, which must be exactly
// one strict JSON array.
func Elements(raw []byte) ([][]byte, error) {
	r := getReader(raw, false)
	defer putReader(r)
	d := &r.dec
	if d.PeekKind() != '[' {
		if err := Check(raw); err != nil {
			return nil, err
		}
		return nil, ErrNotArray
	}
	if _, err := d.ReadToken(); err != nil {
		return nil, fail(err, d.InputOffset())
	}
	var elems [][]byte
	for d.PeekKind() != ']' {
		v, err := d.ReadValue()
		if err != nil {
			return nil, fail(err, d.InputOffset())
		}
		end := int(d.InputOffset())
		elems = append(elems, raw[end-len(v):end:end])
	}
	if _, err := d.ReadToken(); err != nil {
		return nil, fail(err, d.InputOffset())
	}
	if err := r.end(); err != nil {
		return nil, err
	}
	return elems, nil
}

// String decodes raw as a strict JSON string (ok=false for anything else,
// invalid UTF-8 and lone surrogates included).
func String(raw []byte) (string, bool) {
	raw = bytes.TrimSpace(raw)
	if len(raw) < 2 || raw[0] != '"' {
		return "", false
	}
	return decodeString(raw)
}

// StringBytes is String without the copy: the decoded bytes alias raw
// unless it had escapes.
func StringBytes(raw []byte) ([]byte, bool) {
	raw = bytes.TrimSpace(raw)
	if len(raw) < 2 || raw[0] != '"' {
		return nil, false
	}
	return decodeBytes(raw)
}

// decodeString decodes the raw JSON string raw (quotes included).
func decodeString(raw []byte) (string, bool) {
	inner := raw[1 : len(raw)-1]
	if raw[len(raw)-1] == '"' && plain(inner) {
		return string(inner), true
	}
	var scratch [64]byte
	b, err := jsontext.AppendUnquote(scratch[:0], raw)
	if err != nil {
		return "", false
	}
	return string(b), true
}

// decodeBytes is decodeString aliasing raw when it can.
func decodeBytes(raw []byte) ([]byte, bool) {
	inner := raw[1 : len(raw)-1 : len(raw)-1]
	if raw[len(raw)-1] == '"' && plain(inner) {
		return inner, true
	}
	b, err := jsontext.AppendUnquote(nil, raw)
	if err != nil {
		return nil, false
	}
	return b, true
}

// plain reports whether inner is string content that decodes to itself:
// valid UTF-8 without escapes, quotes or control characters.
func plain(inner []byte) bool {
	for _, c := range inner {
		if c < 0x20 || c == '"' || c == '\\' {
			return false
		}
	}
	return utf8.Valid(inner)
}

func hasEscape(raw []byte) bool { return bytes.IndexByte(raw, '\\') >= 0 }

// IsTrue reports whether raw is the JSON literal true.
func IsTrue(raw []byte) bool { return string(bytes.TrimSpace(raw)) == "true" }

// IsNull reports whether raw is absent or the JSON literal null.
func IsNull(raw []byte) bool {
	raw = bytes.TrimSpace(raw)
	return len(raw) == 0 || string(raw) == "null"
}

// SameNumber reports whether two raw JSON numbers have the same value as
// doubles (how JSON-RPC peers compare ids they re-encode).
func SameNumber(a, b []byte) bool {
	fa, errA := strconv.ParseFloat(string(bytes.TrimSpace(a)), 64)
	fb, errB := strconv.ParseFloat(string(bytes.TrimSpace(b)), 64)
	return errA == nil && errB == nil && fa == fb
}

// Compact removes insignificant whitespace from the strict JSON value raw
// (an SSE data line cannot hold a raw line break); raw is returned as it is
// when it holds no line break or is not strict JSON.
func Compact(raw []byte) []byte {
	if !bytes.ContainsAny(raw, "\r\n") {
		return raw
	}
	v := jsontext.Value(bytes.Clone(raw))
	if err := v.Compact(jsontext.AllowDuplicateNames(false), jsontext.AllowInvalidUTF8(false)); err != nil {
		return raw
	}
	return v
}
