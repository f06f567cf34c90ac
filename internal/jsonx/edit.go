package jsonx

import (
	"bytes"
	"slices"
	"unicode/utf8"
)

// Set is one member to set by Edit or Splice: Raw is written as it is (a
// JSON value); without Raw, Text is written as a JSON string.
type Set struct {
	Key  string
	Raw  []byte
	Text string
	// name, when set, is the key as decoded bytes (a kept member's name,
	// written without converting it to a string first).
	name []byte
}

// appendName writes a decoded name as a JSON string, as AppendString would.
func appendName(out, name []byte) []byte {
	for _, c := range name {
		if c < 0x20 || c == '"' || c == '\\' || c >= utf8.RuneSelf {
			return AppendString(out, string(name))
		}
	}
	out = append(out, '"')
	out = append(out, name...)
	return append(out, '"')
}

func appendMember(out []byte, s Set) []byte {
	if s.name != nil {
		out = appendName(out, s.name)
	} else {
		out = AppendString(out, s.Key)
	}
	out = append(out, ':')
	if s.Raw != nil {
		return append(out, s.Raw...)
	}
	return AppendString(out, s.Text)
}

// Edit returns the object raw without the members named in remove and with
// the members of set replaced in place (or appended when absent). Every
// other member keeps its value's bytes. raw that is not a strict JSON object
// is taken as {}.
func Edit(raw []byte, remove []string, set ...Set) []byte {
	ms, _ := Members(raw)
	return EditMembers(ms, remove, set...)
}

// EditMembers is Edit on members already read (from Members or ReadNested),
// so that an object read for routing is not read again to be rewritten.
func EditMembers(ms []Member, remove []string, set ...Set) []byte {
	size := 2
	for _, m := range ms {
		size += m.end - m.start + 1
	}
	return AppendEdited(make([]byte, 0, size+setsSize(set)), ms, remove, set...)
}

// setsSize is about what set adds to an object, for sizing a buffer.
func setsSize(set []Set) int {
	size := 0
	for _, s := range set {
		size += len(s.Key) + len(s.Raw) + len(s.Text) + 8
	}
	return size
}

// AppendEdited is EditMembers appending the object to dst (a pooled
// buffer, or one the caller writes a larger document into).
func AppendEdited(dst []byte, ms []Member, remove []string, set ...Set) []byte {
	out := append(dst, '{')
	var doneSpace [8]bool
	done := doneSpace[:0]
	if len(set) > len(doneSpace) {
		done = make([]bool, 0, len(set))
	}
	done = done[:len(set)]
	n := 0
	add := func(s Set) {
		if n > 0 {
			out = append(out, ',')
		}
		n++
		out = appendMember(out, s)
	}
next:
	for _, m := range ms {
		for _, r := range remove {
			if string(m.Name) == r {
				continue next
			}
		}
		for j, s := range set {
			if string(m.Name) == s.Key {
				if !done[j] {
					add(s)
					done[j] = true
				}
				continue next
			}
		}
		add(Set{name: m.Name, Raw: m.Value})
	}
	for j, s := range set {
		if !done[j] {
			add(s)
		}
	}
	return append(out, '}')
}

// Splice sets the members of set at the top level of the strict JSON
// object body, replacing members of the same names wherever they are, and
// keeps every other byte of the object as its sender wrote it: with nothing
// to replace, the new members go in before the closing brace. The result
// is written into dst's memory when it is large enough (a pooled buffer).
func Splice(dst, body []byte, set ...Set) ([]byte, error) {
	return AppendSpliced(dst[:0], body, set...)
}

// AppendSpliced is Splice appending the object to dst. When body is not a
// strict JSON object it returns the error and dst as it was.
func AppendSpliced(dst, body []byte, set ...Set) ([]byte, error) {
	var space [32]Member // on the stack for objects of up to 32 members
	ms, err := members(body, false, space[:0])
	if err != nil {
		return dst, err
	}
	out := slices.Grow(dst, len(body)+16+setsSize(set))
	replaced := false
	for _, m := range ms {
		if setsKey(set, m.Name) {
			replaced = true
			break
		}
	}
	closeAt := lastByte(body, '}')
	if !replaced {
		// Common case: splice the new members in before the closing brace.
		out = append(out, body[:closeAt]...)
		if len(ms) > 0 {
			out = trimRightSpace(out)
			out = append(out, ',')
		}
	} else {
		out = append(out, body[:firstByte(body, '{')+1]...)
		k := 0
		for _, m := range ms {
			if setsKey(set, m.Name) {
				continue
			}
			if k > 0 {
				out = append(out, ',')
			}
			k++
			out = append(out, body[m.start:m.end]...)
		}
		if k > 0 {
			out = append(out, ',')
		}
	}
	for k, s := range set {
		if k > 0 {
			out = append(out, ',')
		}
		out = appendMember(out, s)
	}
	return append(out, body[closeAt:]...), nil
}

func setsKey(set []Set, name []byte) bool {
	for _, s := range set {
		if s.Key == string(name) {
			return true
		}
	}
	return false
}

func firstByte(b []byte, c byte) int {
	for i := range b {
		if b[i] == c {
			return i
		}
	}
	return -1
}

func lastByte(b []byte, c byte) int {
	for i := len(b) - 1; i >= 0; i-- {
		if b[i] == c {
			return i
		}
	}
	return -1
}

func trimRightSpace(b []byte) []byte {
	for len(b) > 0 {
		switch b[len(b)-1] {
		case ' ', '\t', '\n', '\r':
			b = b[:len(b)-1]
		default:
			return b
		}
	}
	return b
}

// AppendElements returns the JSON array raw (or a new array when raw is
// not a strict JSON array) with elems appended; raw's elements keep their
// bytes, the space between them included.
func AppendElements(raw []byte, elems ...[]byte) []byte {
	return AppendElementsTo(nil, raw, elems...)
}

// AppendElementsTo is AppendElements appending the array to dst.
func AppendElementsTo(dst, raw []byte, elems ...[]byte) []byte {
	var body []byte
	if _, err := Elements(raw); err == nil {
		raw = bytes.TrimSpace(raw)
		body = bytes.TrimSpace(raw[1 : len(raw)-1])
	}
	size := len(body) + 2
	for _, e := range elems {
		size += len(e) + 1
	}
	out := slices.Grow(dst, size)
	out = append(out, '[')
	out = append(out, body...)
	if len(body) > 0 && len(elems) > 0 {
		out = append(out, ',')
	}
	for i, e := range elems {
		if i > 0 {
			out = append(out, ',')
		}
		out = append(out, e...)
	}
	return append(out, ']')
}

const hexDigits = "0123456789abcdef"

// WrittenAsIs reports whether AppendString writes s between its quotes
// byte for byte: s is printable ASCII without '"' or '\\'. (Some non-ASCII
// is written as is too, but not all: this answers no for any of it.) A
// caller filling a pre-rendered JSON template with s may then copy bytes.
func WrittenAsIs(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c == '"' || c == '\\' || c >= utf8.RuneSelf {
			return false
		}
	}
	return true
}

// AppendString appends s as a JSON string with the escaping of Go's
// encoding/json when HTML escaping is off: '"' and '\\' escaped with a
// backslash; \b \f \n \r \t in short form; every other byte below 0x20 as
// \u00xx with lower-case hex; U+2028 and U+2029 as \u2028 and \u2029
// (valid JSON, but they break JavaScript readers); invalid UTF-8 as \ufffd;
// everything else (DEL, '<', '>', '&', all other non-ASCII) written as is.
// It is the project's one JSON string writer: the canonical form
// (fingerprint.AppendJSONString, whose documentation makes this escaping
// part of the fingerprint's specification) and every fragment the server
// builds use it.
func AppendString(buf []byte, s string) []byte {
	buf = append(buf, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' {
				i++
				continue
			}
			buf = append(buf, s[start:i]...)
			switch c {
			case '"', '\\':
				buf = append(buf, '\\', c)
			case '\b':
				buf = append(buf, '\\', 'b')
			case '\f':
				buf = append(buf, '\\', 'f')
			case '\n':
				buf = append(buf, '\\', 'n')
			case '\r':
				buf = append(buf, '\\', 'r')
			case '\t':
				buf = append(buf, '\\', 't')
			default:
				buf = append(buf, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xF])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			buf = append(buf, s[start:i]...)
			buf = append(buf, `\ufffd`...)
			i++
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			buf = append(buf, s[start:i]...)
			buf = append(buf, '\\', 'u', '2', '0', '2', hexDigits[r&0xF])
			i += size
			start = i
			continue
		}
		i += size
	}
	buf = append(buf, s[start:]...)
	return append(buf, '"')
}
