package extproc

import (
	"bytes"
	"encoding/json"
	"unicode/utf8"

	"github.com/idemgate/idemgate/extproc/envelope"
)

// Raw JSON object access for JSON-RPC messages. idemgate rewrites MCP
// messages member by member and keeps every other byte as its sender wrote
// it: the JSON-RPC id must come back byte for byte, and an upstream's result
// must reach the client unchanged apart from what idemgate adds.

// rawMember is one member of a JSON object: its decoded key and the raw
// bytes of its value.
type rawMember struct {
	key   string
	value []byte
}

// objectMembers returns the members of the JSON object raw, in order, or
// ok=false when raw is not a valid JSON object. Keys are decoded, so
// "\u0069d" is the member id.
func objectMembers(raw []byte) (members []rawMember, ok bool) {
	if !json.Valid(raw) {
		return nil, false
	}
	return scanMembers(raw)
}

// scanMembers is objectMembers for raw known to be valid JSON: a value
// inside a message that was validated as a whole. Validating every nested
// value again would scan a message once per level it is read at.
func scanMembers(raw []byte) (members []rawMember, ok bool) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || raw[0] != '{' {
		return nil, false
	}
	i := skipSpace(raw, 1)
	for i < len(raw) && raw[i] != '}' {
		if raw[i] == ',' {
			i = skipSpace(raw, i+1)
			continue
		}
		keyEnd := skipString(raw, i)
		key := decodeKey(raw[i:keyEnd])
		i = skipSpace(raw, keyEnd) + 1 // ':'
		i = skipSpace(raw, i)
		end := skipValue(raw, i)
		members = append(members, rawMember{key: key, value: raw[i:end]})
		i = skipSpace(raw, end)
	}
	return members, true
}

// decodeKey decodes a raw JSON string (quotes included).
func decodeKey(raw []byte) string {
	inner := raw[1 : len(raw)-1]
	if bytes.IndexByte(inner, '\\') < 0 {
		return string(inner)
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return string(inner)
	}
	return s
}

// member returns the raw value of the member named key (nil when absent).
func member(members []rawMember, key string) []byte {
	for _, m := range members {
		if m.key == key {
			return m.value
		}
	}
	return nil
}

// memberOf is member on a raw object (nil when raw is not an object).
func memberOf(raw []byte, key string) []byte {
	ms, ok := objectMembers(raw)
	if !ok {
		return nil
	}
	return member(ms, key)
}

// validMemberOf is memberOf for raw known to be valid JSON (see
// scanMembers).
func validMemberOf(raw []byte, key string) []byte {
	ms, ok := scanMembers(raw)
	if !ok {
		return nil
	}
	return member(ms, key)
}

// rawSet is one member to set: a key and its raw JSON value.
type rawSet struct {
	key   string
	value []byte
}

// editObject returns the object raw without the members named in remove and
// with the members of set replaced in place (or appended when absent). Every
// other member keeps its bytes. raw must be a valid JSON object.
func editObject(raw []byte, remove []string, set ...rawSet) []byte {
	members, _ := scanMembers(raw)
	out := make([]byte, 0, len(raw)+64)
	out = append(out, '{')
	done := make([]bool, len(set))
	n := 0
	add := func(key string, value []byte) {
		if n > 0 {
			out = append(out, ',')
		}
		n++
		out = envelope.AppendString(out, key)
		out = append(out, ':')
		out = append(out, value...)
	}
next:
	for _, m := range members {
		for _, r := range remove {
			if m.key == r {
				continue next
			}
		}
		for j, s := range set {
			if m.key == s.key {
				if !done[j] {
					add(s.key, s.value)
					done[j] = true
				}
				continue next
			}
		}
		add(m.key, m.value)
	}
	for j, s := range set {
		if !done[j] {
			add(s.key, s.value)
		}
	}
	return append(out, '}')
}

// appendElements returns the JSON array raw (or a new array when raw is
// empty or not an array) with elems appended.
func appendElements(raw []byte, elems ...[]byte) []byte {
	raw = bytes.TrimSpace(raw)
	out := make([]byte, 0, len(raw)+64)
	if len(raw) < 2 || raw[0] != '[' {
		out = append(out, '[')
	} else {
		body := bytes.TrimSpace(raw[1 : len(raw)-1])
		out = append(out, '[')
		out = append(out, body...)
		if len(body) > 0 && len(elems) > 0 {
			out = append(out, ',')
		}
	}
	for i, e := range elems {
		if i > 0 {
			out = append(out, ',')
		}
		out = append(out, e...)
	}
	return append(out, ']')
}

// arrayElements returns the raw elements of the JSON array raw (ok=false
// when raw is not a valid array).
func arrayElements(raw []byte) (elems [][]byte, ok bool) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || raw[0] != '[' || !json.Valid(raw) {
		return nil, false
	}
	i := skipSpace(raw, 1)
	for i < len(raw) && raw[i] != ']' {
		if raw[i] == ',' {
			i = skipSpace(raw, i+1)
			continue
		}
		end := skipValue(raw, i)
		elems = append(elems, raw[i:end])
		i = skipSpace(raw, end)
	}
	return elems, true
}

// jsonString decodes raw as a JSON string (ok=false for any other value).
func jsonString(raw []byte) (string, bool) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || raw[0] != '"' {
		return "", false
	}
	if s, ok := plainString(raw); ok {
		return s, true
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return "", false
	}
	return s, true
}

// isTrue reports whether raw is the JSON literal true.
func isTrue(raw []byte) bool { return string(bytes.TrimSpace(raw)) == "true" }

// sameID reports whether two raw JSON-RPC ids name the same request: equal
// strings after unescaping, or equal numbers (an upstream may re-encode the
// id it echoes; the client still matches it by value).
func sameID(a, b []byte) bool {
	a, b = bytes.TrimSpace(a), bytes.TrimSpace(b)
	if len(a) == 0 || len(b) == 0 {
		return false
	}
	if bytes.Equal(a, b) {
		return true
	}
	if a[0] == '"' || b[0] == '"' {
		sa, okA := jsonString(a)
		sb, okB := jsonString(b)
		return okA && okB && sa == sb
	}
	var na, nb json.Number
	if json.Unmarshal(a, &na) != nil || json.Unmarshal(b, &nb) != nil {
		return false
	}
	fa, errA := na.Float64()
	fb, errB := nb.Float64()
	return errA == nil && errB == nil && fa == fb
}

// compactJSON removes insignificant whitespace (an SSE data line cannot
// hold a raw line break).
func compactJSON(raw []byte) []byte {
	if !bytes.ContainsAny(raw, "\r\n") {
		return raw
	}
	var b bytes.Buffer
	if err := json.Compact(&b, raw); err != nil {
		return raw
	}
	return b.Bytes()
}

// plainString decodes a JSON string that needs no decoding: quoted, valid
// UTF-8, without escapes, quotes or control characters inside (method and
// tool names, result types). Anything else is left to encoding/json, so the
// answer is always what json.Unmarshal would give.
func plainString(raw []byte) (string, bool) {
	if len(raw) < 2 || raw[len(raw)-1] != '"' {
		return "", false
	}
	inner := raw[1 : len(raw)-1]
	for _, c := range inner {
		if c < 0x20 || c == '"' || c == '\\' {
			return "", false
		}
	}
	if !utf8.Valid(inner) {
		return "", false
	}
	return string(inner), true
}
