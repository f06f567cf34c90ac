package extproc

import (
	"bytes"
	"encoding/json"

	"github.com/idemgate/idemgate/extproc/envelope"
)

// field is one top-level JSON member to set.
type field struct {
	name  string
	value string
	// raw: value is JSON written as is (approval_required: true), not a
	// string.
	raw bool
}

// injectFieldsInto sets fields (as JSON strings) at the top level of the JSON
// object in body, replacing members of the same names wherever they are,
// and keeps every other byte of the object as the upstream wrote it. The
// body is validated once (json.Valid, no values built) and scanned once at
// the top level; nested values are skipped, never decoded. ok is false when
// body is not a single valid JSON object. The result is written into dst's
// memory when it is large enough (a pooled buffer).
func injectFieldsInto(dst, body []byte, fields ...field) (out []byte, ok bool) {
	if !json.Valid(body) {
		return nil, false
	}
	i := skipSpace(body, 0)
	if i >= len(body) || body[i] != '{' {
		return nil, false
	}
	return spliceFields(dst, body, fields...), true
}

// spliceFields is injectFieldsInto for body known to be a valid JSON
// object (a value inside a message validated as a whole).
func spliceFields(dst, body []byte, fields ...field) []byte {
	i := skipSpace(body, 0)
	open := i
	i++
	// Spans [start, end) of the members to keep, in order.
	type span struct{ start, end int }
	var keepSpace [32]span // on the stack for bodies of up to 32 members
	keep := keepSpace[:0]
	replaced := false
	closeAt := -1
	for closeAt < 0 {
		i = skipSpace(body, i)
		switch body[i] {
		case '}':
			closeAt = i
			continue
		case ',':
			i++
			continue
		}
		start := i
		keyEnd := skipString(body, i)
		key := body[i:keyEnd]
		i = skipSpace(body, keyEnd)
		i++ // ':'
		i = skipSpace(body, i)
		i = skipValue(body, i)
		if matchesAny(key, fields) {
			replaced = true
			continue
		}
		keep = append(keep, span{start, i})
	}

	size := len(body) + 16
	for _, f := range fields {
		size += len(f.name) + len(f.value) + 8
	}
	out := dst[:0]
	if cap(out) < size {
		out = make([]byte, 0, size)
	}
	if !replaced {
		// Common case: splice the new members in before the closing brace.
		out = append(out, body[:closeAt]...)
		if len(keep) > 0 {
			out = trimRightSpace(out)
			out = append(out, ',')
		}
	} else {
		out = append(out, body[:open+1]...)
		for k, s := range keep {
			if k > 0 {
				out = append(out, ',')
			}
			out = append(out, body[s.start:s.end]...)
		}
		if len(keep) > 0 {
			out = append(out, ',')
		}
	}
	for k, f := range fields {
		if k > 0 {
			out = append(out, ',')
		}
		out = envelope.AppendString(out, f.name)
		out = append(out, ':')
		if f.raw {
			out = append(out, f.value...)
		} else {
			out = envelope.AppendString(out, f.value)
		}
	}
	out = append(out, body[closeAt:]...)
	return out
}

// matchesAny reports whether the raw JSON string key equals one of the
// field names. Keys without escapes are compared as bytes; escaped keys are
// decoded first, so "\u0066ingerprint" is caught too.
func matchesAny(rawKey []byte, fields []field) bool {
	inner := rawKey[1 : len(rawKey)-1]
	if bytes.IndexByte(inner, '\\') < 0 {
		for _, f := range fields {
			if string(inner) == f.name {
				return true
			}
		}
		return false
	}
	var s string
	if err := json.Unmarshal(rawKey, &s); err != nil {
		return false
	}
	for _, f := range fields {
		if s == f.name {
			return true
		}
	}
	return false
}

func skipSpace(b []byte, i int) int {
	for i < len(b) {
		switch b[i] {
		case ' ', '\t', '\n', '\r':
			i++
		default:
			return i
		}
	}
	return i
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

// skipString returns the index after the JSON string starting at b[i] ('"').
// b is known to be valid JSON.
func skipString(b []byte, i int) int {
	i++
	for i < len(b) {
		switch b[i] {
		case '\\':
			i += 2
		case '"':
			return i + 1
		default:
			i++
		}
	}
	return i
}

// skipValue returns the index after the JSON value starting at b[i]. b is
// known to be valid JSON, so only strings and nesting need tracking.
func skipValue(b []byte, i int) int {
	switch b[i] {
	case '"':
		return skipString(b, i)
	case '{', '[':
		depth := 0
		for i < len(b) {
			switch b[i] {
			case '"':
				i = skipString(b, i)
				continue
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return i + 1
				}
			}
			i++
		}
		return i
	default: // number, true, false, null
		for i < len(b) {
			switch b[i] {
			case ',', '}', ']', ' ', '\t', '\n', '\r':
				return i
			}
			i++
		}
		return i
	}
}
