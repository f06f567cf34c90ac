package fingerprint

import (
	"encoding/json"
	"errors"
	"fmt"
	"unicode/utf16"
	"unicode/utf8"
)

// ErrInvalidJSON is returned (wrapped) by ParseJSON for any body that is not
// exactly one well-formed JSON value.
var ErrInvalidJSON = errors.New("invalid JSON")

// ErrTooDeep is returned (wrapped, together with ErrInvalidJSON when it comes
// from ParseJSON) when objects and arrays nest deeper than the limit.
var ErrTooDeep = errors.New("nesting too deep")

const (
	// DefaultMaxDepth is the nesting limit used when a limit of zero is given.
	DefaultMaxDepth = 32
	// HardMaxDepth caps any configured nesting limit: parsing and
	// canonicalisation recurse, and the recursion must stay shallow.
	HardMaxDepth = 1000
)

// ParseJSON parses body as exactly one JSON value (RFC 8259) surrounded by
// optional whitespace. It returns map[string]any, []any, string, bool, nil or
// json.Number; a json.Number holds the number's literal text, so nothing is
// lost to float64.
//
// It is stricter than encoding/json where laxness would let a client smuggle a
// value past the hash: duplicate object keys, invalid UTF-8 and lone UTF-16
// surrogates in \u escapes are errors (encoding/json silently keeps the last
// duplicate and replaces bad text with U+FFFD, an upstream parser may do
// otherwise). Trailing data and a byte-order mark are errors too.
//
// maxDepth limits how deeply objects and arrays nest (the top-level object or
// array is depth 1); zero or less means DefaultMaxDepth, and values above
// HardMaxDepth are lowered to it. Errors wrap ErrInvalidJSON (and ErrTooDeep
// for the depth limit); ParseJSON never panics.
func ParseJSON(body []byte, maxDepth int) (any, error) {
	p := jsonParser{data: body, maxDepth: clampDepth(maxDepth)}
	p.skipSpace()
	v, err := p.value(0)
	if err != nil {
		return nil, err
	}
	p.skipSpace()
	if p.pos != len(p.data) {
		return nil, p.fail("unexpected data after the JSON value")
	}
	return v, nil
}

func clampDepth(maxDepth int) int {
	switch {
	case maxDepth <= 0:
		return DefaultMaxDepth
	case maxDepth > HardMaxDepth:
		return HardMaxDepth
	default:
		return maxDepth
	}
}

type jsonParser struct {
	data     []byte
	pos      int
	maxDepth int
	// text is data as one string, made on first use: keys, plain strings
	// and number literals are slices of it, so a body costs one copy
	// instead of one allocation per member.
	text string
}

// source returns data as a string, copying it once per parse.
func (p *jsonParser) source() string {
	if p.text == "" {
		p.text = string(p.data)
	}
	return p.text
}

// DuplicateKeyError is ParseJSON's error for an object that holds one key
// twice (compared after unescaping). Path leads from the document's root to
// the duplicated key (string keys, int array indexes; the key is last), so
// that a caller can tell a duplicate on a bound path — a field the upstream
// may read as either value: the binding rule — from one elsewhere.
type DuplicateKeyError struct {
	Offset int
	Path   []any
}

func (e *DuplicateKeyError) Error() string {
	return fmt.Sprintf("%v at offset %d: duplicate object key %q", ErrInvalidJSON, e.Offset, e.Path[len(e.Path)-1])
}

func (e *DuplicateKeyError) Unwrap() error { return ErrInvalidJSON }

// within prefixes the path of a duplicate found inside a member or element.
func within(err error, step any) error {
	if de, ok := err.(*DuplicateKeyError); ok {
		de.Path = append([]any{step}, de.Path...)
	}
	return err
}

func (p *jsonParser) fail(msg string) error {
	return fmt.Errorf("%w at offset %d: %s", ErrInvalidJSON, p.pos, msg)
}

func (p *jsonParser) skipSpace() {
	for p.pos < len(p.data) {
		switch p.data[p.pos] {
		case ' ', '\t', '\n', '\r':
			p.pos++
		default:
			return
		}
	}
}

func (p *jsonParser) value(depth int) (any, error) {
	if p.pos >= len(p.data) {
		return nil, p.fail("unexpected end of input")
	}
	switch c := p.data[p.pos]; {
	case c == '{':
		return p.object(depth + 1)
	case c == '[':
		return p.array(depth + 1)
	case c == '"':
		return p.string()
	case c == 't':
		return true, p.literal("true")
	case c == 'f':
		return false, p.literal("false")
	case c == 'n':
		return nil, p.literal("null")
	case c == '-' || isDigit(c):
		return p.number()
	default:
		return nil, p.fail(fmt.Sprintf("unexpected character %q", c))
	}
}

func (p *jsonParser) literal(word string) error {
	if len(p.data)-p.pos < len(word) || string(p.data[p.pos:p.pos+len(word)]) != word {
		return p.fail("invalid literal")
	}
	p.pos += len(word)
	return nil
}

func (p *jsonParser) object(depth int) (any, error) {
	if depth > p.maxDepth {
		return nil, fmt.Errorf("%w at offset %d: %w (limit %d)", ErrInvalidJSON, p.pos, ErrTooDeep, p.maxDepth)
	}
	p.pos++ // '{'
	obj := make(map[string]any)
	p.skipSpace()
	if p.pos < len(p.data) && p.data[p.pos] == '}' {
		p.pos++
		return obj, nil
	}
	for {
		if p.pos >= len(p.data) || p.data[p.pos] != '"' {
			return nil, p.fail("expected a string object key")
		}
		keyPos := p.pos
		key, err := p.string()
		if err != nil {
			return nil, err
		}
		if _, dup := obj[key]; dup {
			p.pos = keyPos
			return nil, &DuplicateKeyError{Offset: keyPos, Path: []any{key}}
		}
		p.skipSpace()
		if p.pos >= len(p.data) || p.data[p.pos] != ':' {
			return nil, p.fail("expected ':' after object key")
		}
		p.pos++
		p.skipSpace()
		v, err := p.value(depth)
		if err != nil {
			return nil, within(err, key)
		}
		obj[key] = v
		p.skipSpace()
		if p.pos >= len(p.data) {
			return nil, p.fail("unexpected end of input in object")
		}
		switch p.data[p.pos] {
		case ',':
			p.pos++
			p.skipSpace()
		case '}':
			p.pos++
			return obj, nil
		default:
			return nil, p.fail("expected ',' or '}' in object")
		}
	}
}

func (p *jsonParser) array(depth int) (any, error) {
	if depth > p.maxDepth {
		return nil, fmt.Errorf("%w at offset %d: %w (limit %d)", ErrInvalidJSON, p.pos, ErrTooDeep, p.maxDepth)
	}
	p.pos++ // '['
	arr := make([]any, 0)
	p.skipSpace()
	if p.pos < len(p.data) && p.data[p.pos] == ']' {
		p.pos++
		return arr, nil
	}
	for {
		v, err := p.value(depth)
		if err != nil {
			return nil, within(err, len(arr))
		}
		arr = append(arr, v)
		p.skipSpace()
		if p.pos >= len(p.data) {
			return nil, p.fail("unexpected end of input in array")
		}
		switch p.data[p.pos] {
		case ',':
			p.pos++
			p.skipSpace()
		case ']':
			p.pos++
			return arr, nil
		default:
			return nil, p.fail("expected ',' or ']' in array")
		}
	}
}

// number scans a JSON number and returns its literal text. The value is
// checked for grammar only; range limits apply when it is canonicalised, so a
// body may carry an absurd number in a field nobody hashes.
func (p *jsonParser) number() (any, error) {
	start := p.pos
	if err := p.scanNumber(); err != nil {
		return nil, err
	}
	return json.Number(p.source()[start:p.pos]), nil
}

// scanNumber moves past a JSON number, checking its grammar, without
// building a value.
func (p *jsonParser) scanNumber() error {
	d := p.data
	i := p.pos
	if d[i] == '-' {
		i++
	}
	switch {
	case i >= len(d):
		p.pos = i
		return p.fail("missing digits in number")
	case d[i] == '0':
		i++
	case isDigit(d[i]):
		for i < len(d) && isDigit(d[i]) {
			i++
		}
	default:
		p.pos = i
		return p.fail("missing digits in number")
	}
	if i < len(d) && d[i] == '.' {
		i++
		fracStart := i
		for i < len(d) && isDigit(d[i]) {
			i++
		}
		if i == fracStart {
			p.pos = i
			return p.fail("missing digits after '.' in number")
		}
	}
	if i < len(d) && (d[i] == 'e' || d[i] == 'E') {
		i++
		if i < len(d) && (d[i] == '+' || d[i] == '-') {
			i++
		}
		expStart := i
		for i < len(d) && isDigit(d[i]) {
			i++
		}
		if i == expStart {
			p.pos = i
			return p.fail("missing exponent digits in number")
		}
	}
	p.pos = i
	return nil
}

// string parses a JSON string starting at the opening quote.
func (p *jsonParser) string() (string, error) {
	// Printable ASCII without escapes (nearly every key and most values)
	// is a slice of the body's text.
	start := p.pos + 1
	for i := start; i < len(p.data); i++ {
		c := p.data[i]
		if c == '"' {
			p.pos = i + 1
			return p.source()[start:i], nil
		}
		if c == '\\' || c < 0x20 || c >= utf8.RuneSelf {
			break
		}
	}
	// Escaped or non-ASCII text is decoded into scratch, which stays on
	// the stack: the string conversion is the only allocation.
	var scratch [64]byte
	b, err := p.stringInto(scratch[:0])
	if err != nil {
		return "", err
	}
	return string(b), nil
}

// stringBytes parses a JSON string starting at the opening quote and returns
// its decoded bytes. Without escapes or non-ASCII bytes (the common case)
// that is a slice of the input, so nothing is copied; callers that keep it
// convert it to a string.
func (p *jsonParser) stringBytes() ([]byte, error) { return p.stringInto(nil) }

// stringInto is stringBytes decoding escaped or non-ASCII text into buf.
func (p *jsonParser) stringInto(buf []byte) ([]byte, error) {
	p.pos++ // opening quote
	start := p.pos
	// Fast path: printable ASCII without escapes needs no copy-and-decode.
	for i := start; i < len(p.data); i++ {
		c := p.data[i]
		if c == '"' {
			p.pos = i + 1
			return p.data[start:i:i], nil
		}
		if c == '\\' || c < 0x20 || c >= utf8.RuneSelf {
			break
		}
	}
	for {
		if p.pos >= len(p.data) {
			return nil, p.fail("unterminated string")
		}
		c := p.data[p.pos]
		switch {
		case c == '"':
			p.pos++
			return buf, nil
		case c == '\\':
			var err error
			buf, err = p.escape(buf)
			if err != nil {
				return nil, err
			}
		case c < 0x20:
			return nil, p.fail("control character in string")
		case c < utf8.RuneSelf:
			buf = append(buf, c)
			p.pos++
		default:
			r, size := utf8.DecodeRune(p.data[p.pos:])
			if r == utf8.RuneError && size <= 1 {
				return nil, p.fail("invalid UTF-8 in string")
			}
			buf = append(buf, p.data[p.pos:p.pos+size]...)
			p.pos += size
		}
	}
}

func (p *jsonParser) escape(buf []byte) ([]byte, error) {
	if p.pos+1 >= len(p.data) {
		return nil, p.fail("unterminated escape")
	}
	c := p.data[p.pos+1]
	p.pos += 2
	switch c {
	case '"', '\\', '/':
		return append(buf, c), nil
	case 'b':
		return append(buf, '\b'), nil
	case 'f':
		return append(buf, '\f'), nil
	case 'n':
		return append(buf, '\n'), nil
	case 'r':
		return append(buf, '\r'), nil
	case 't':
		return append(buf, '\t'), nil
	case 'u':
		r, ok := p.hex4()
		if !ok {
			return nil, p.fail("invalid \\u escape")
		}
		if utf16.IsSurrogate(r) {
			// Only a high surrogate followed by a \u low surrogate is a character.
			if r >= 0xDC00 || p.pos+1 >= len(p.data) || p.data[p.pos] != '\\' || p.data[p.pos+1] != 'u' {
				return nil, p.fail("lone UTF-16 surrogate in \\u escape")
			}
			p.pos += 2
			low, ok := p.hex4()
			if !ok {
				return nil, p.fail("invalid \\u escape")
			}
			r = utf16.DecodeRune(r, low)
			if r == utf8.RuneError {
				return nil, p.fail("lone UTF-16 surrogate in \\u escape")
			}
		}
		return utf8.AppendRune(buf, r), nil
	default:
		p.pos -= 2
		return nil, p.fail("invalid escape")
	}
}

func (p *jsonParser) hex4() (rune, bool) {
	if len(p.data)-p.pos < 4 {
		return 0, false
	}
	var r rune
	for _, c := range p.data[p.pos : p.pos+4] {
		r <<= 4
		switch {
		case '0' <= c && c <= '9':
			r |= rune(c - '0')
		case 'a' <= c && c <= 'f':
			r |= rune(c - 'a' + 10)
		case 'A' <= c && c <= 'F':
			r |= rune(c - 'A' + 10)
		default:
			return 0, false
		}
	}
	p.pos += 4
	return r, true
}
