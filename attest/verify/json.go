package verify

import (
	"errors"
	"strconv"
	"unicode/utf16"
	"unicode/utf8"
)

// Number is a JSON number kept as the text it was written with: hashing
// never goes through float64 (12345678901234567.89 survives).
type Number string

// object is a parsed JSON object; duplicate member names are refused by the
// parser, so a map loses nothing.
type object = map[string]any

// errJSON is every parse failure: the verifier only needs to know the body
// is not one idemgate could have let through.
var errJSON = errors.New("body is not strict JSON")

// maxDepth bounds nesting like idemgate's default limits.max_json_depth.
const maxDepth = 64

// parseJSON reads one strict JSON value (RFC 8259): no BOM, no trailing
// data, no duplicate keys, no invalid UTF-8, no lone surrogates. Strings
// are unescaped; numbers stay Number. idemgate refuses all of these before
// forwarding, so the verifier may too.
func parseJSON(data []byte) (any, error) {
	if !utf8.Valid(data) {
		return nil, errJSON
	}
	p := &parser{data: data}
	v, err := p.value(0)
	if err != nil {
		return nil, err
	}
	p.ws()
	if p.pos != len(p.data) {
		return nil, errJSON
	}
	return v, nil
}

type parser struct {
	data []byte
	pos  int
}

func (p *parser) ws() {
	for p.pos < len(p.data) {
		switch p.data[p.pos] {
		case ' ', '\t', '\n', '\r':
			p.pos++
		default:
			return
		}
	}
}

func (p *parser) literal(word string, v any) (any, error) {
	if len(p.data)-p.pos < len(word) || string(p.data[p.pos:p.pos+len(word)]) != word {
		return nil, errJSON
	}
	p.pos += len(word)
	return v, nil
}

func (p *parser) value(depth int) (any, error) {
	if depth > maxDepth {
		return nil, errJSON
	}
	p.ws()
	if p.pos >= len(p.data) {
		return nil, errJSON
	}
	switch c := p.data[p.pos]; {
	case c == '{':
		return p.object(depth)
	case c == '[':
		return p.array(depth)
	case c == '"':
		return p.string()
	case c == 't':
		return p.literal("true", true)
	case c == 'f':
		return p.literal("false", false)
	case c == 'n':
		return p.literal("null", nil)
	case c == '-' || (c >= '0' && c <= '9'):
		return p.number()
	}
	return nil, errJSON
}

func (p *parser) object(depth int) (any, error) {
	p.pos++ // {
	obj := object{}
	p.ws()
	if p.pos < len(p.data) && p.data[p.pos] == '}' {
		p.pos++
		return obj, nil
	}
	for {
		p.ws()
		if p.pos >= len(p.data) || p.data[p.pos] != '"' {
			return nil, errJSON
		}
		key, err := p.string()
		if err != nil {
			return nil, err
		}
		if _, dup := obj[key]; dup {
			return nil, errJSON
		}
		p.ws()
		if p.pos >= len(p.data) || p.data[p.pos] != ':' {
			return nil, errJSON
		}
		p.pos++
		v, err := p.value(depth + 1)
		if err != nil {
			return nil, err
		}
		obj[key] = v
		p.ws()
		if p.pos >= len(p.data) {
			return nil, errJSON
		}
		switch p.data[p.pos] {
		case ',':
			p.pos++
		case '}':
			p.pos++
			return obj, nil
		default:
			return nil, errJSON
		}
	}
}

func (p *parser) array(depth int) (any, error) {
	p.pos++ // [
	arr := []any{}
	p.ws()
	if p.pos < len(p.data) && p.data[p.pos] == ']' {
		p.pos++
		return arr, nil
	}
	for {
		v, err := p.value(depth + 1)
		if err != nil {
			return nil, err
		}
		arr = append(arr, v)
		p.ws()
		if p.pos >= len(p.data) {
			return nil, errJSON
		}
		switch p.data[p.pos] {
		case ',':
			p.pos++
		case ']':
			p.pos++
			return arr, nil
		default:
			return nil, errJSON
		}
	}
}

func (p *parser) number() (any, error) {
	start := p.pos
	digits := func() int {
		n := 0
		for p.pos < len(p.data) && p.data[p.pos] >= '0' && p.data[p.pos] <= '9' {
			p.pos++
			n++
		}
		return n
	}
	if p.data[p.pos] == '-' {
		p.pos++
	}
	intStart := p.pos
	if n := digits(); n == 0 || (n > 1 && p.data[intStart] == '0') {
		return nil, errJSON
	}
	if p.pos < len(p.data) && p.data[p.pos] == '.' {
		p.pos++
		if digits() == 0 {
			return nil, errJSON
		}
	}
	if p.pos < len(p.data) && (p.data[p.pos] == 'e' || p.data[p.pos] == 'E') {
		p.pos++
		if p.pos < len(p.data) && (p.data[p.pos] == '+' || p.data[p.pos] == '-') {
			p.pos++
		}
		if digits() == 0 {
			return nil, errJSON
		}
	}
	return Number(p.data[start:p.pos]), nil
}

func (p *parser) hex4() (rune, error) {
	if len(p.data)-p.pos < 4 {
		return 0, errJSON
	}
	v, err := strconv.ParseUint(string(p.data[p.pos:p.pos+4]), 16, 32)
	if err != nil {
		return 0, errJSON
	}
	p.pos += 4
	return rune(v), nil
}

func (p *parser) string() (string, error) {
	p.pos++ // opening quote
	var out []byte
	for p.pos < len(p.data) {
		c := p.data[p.pos]
		switch {
		case c == '"':
			p.pos++
			return string(out), nil
		case c < 0x20:
			return "", errJSON
		case c != '\\':
			out = append(out, c)
			p.pos++
			continue
		}
		p.pos++ // backslash
		if p.pos >= len(p.data) {
			return "", errJSON
		}
		e := p.data[p.pos]
		p.pos++
		switch e {
		case '"', '\\', '/':
			out = append(out, e)
		case 'b':
			out = append(out, '\b')
		case 'f':
			out = append(out, '\f')
		case 'n':
			out = append(out, '\n')
		case 'r':
			out = append(out, '\r')
		case 't':
			out = append(out, '\t')
		case 'u':
			r, err := p.hex4()
			if err != nil {
				return "", err
			}
			if utf16.IsSurrogate(r) {
				// Only a high surrogate followed by an escaped low one.
				if r >= 0xdc00 || len(p.data)-p.pos < 6 || p.data[p.pos] != '\\' || p.data[p.pos+1] != 'u' {
					return "", errJSON
				}
				p.pos += 2
				lo, err := p.hex4()
				if err != nil {
					return "", err
				}
				r = utf16.DecodeRune(r, lo)
				if r == utf8.RuneError {
					return "", errJSON
				}
			}
			out = utf8.AppendRune(out, r)
		default:
			return "", errJSON
		}
	}
	return "", errJSON
}

// ParseBody reads a request body the way Verify needs its Doc: strict JSON
// with numbers kept as their text (Number).
func ParseBody(body []byte) (any, error) { return parseJSON(body) }
