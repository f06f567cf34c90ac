package jsonx

import (
	"encoding/json"
	"fmt"

	"github.com/go-json-experiment/json/jsontext"
)

// Number is a JSON number's literal text, exactly as written: the tree keeps
// what the sender wrote, and the binding rule decides what it means. It is
// encoding/json's Number (only the type is used, nothing is decoded with
// that package), so a tree compares equal to what encoding/json builds with
// UseNumber.
type Number = json.Number

// Parse reads body as exactly one strict JSON value (see the package
// comment) and builds it as map[string]any, []any, string, bool, nil or
// Number. maxDepth limits how deeply objects and arrays nest (the top-level
// container is depth 1) and must be positive. Errors wrap ErrInvalid; a
// duplicate name is a *DuplicateKeyError with its typed path; the nesting
// limit wraps ErrTooDeep too.
func Parse(body []byte, maxDepth int) (any, error) {
	r := getReader(body, false)
	defer putReader(r)
	p := treeParser{dec: &r.dec, body: body, maxDepth: maxDepth}
	v, err := p.value()
	if err != nil {
		return nil, err
	}
	if err := r.end(); err != nil {
		return nil, err
	}
	return v, nil
}

type treeParser struct {
	dec      *jsontext.Decoder
	body     []byte
	maxDepth int
	// text is body as one string, made on first use: names, plain strings
	// and number literals are slices of it, so a body costs one copy
	// instead of one allocation per member.
	text string
}

func (p *treeParser) source() string {
	if p.text == "" {
		p.text = string(p.body)
	}
	return p.text
}

// read reads the next value raw and returns it with its offset in body.
func (p *treeParser) read() (jsontext.Value, int, error) {
	raw, err := p.dec.ReadValue()
	if err != nil {
		return nil, 0, p.fail(err)
	}
	return raw, int(p.dec.InputOffset()) - len(raw), nil
}

func (p *treeParser) fail(err error) error {
	err = fail(err, p.dec.InputOffset())
	if de, ok := err.(*DuplicateKeyError); ok {
		// jsontext's pointer cannot tell an index from a name of digits;
		// the parser's own steps can (within, on the way out).
		de.Path = de.Path[len(de.Path)-1:]
	}
	return err
}

// within prefixes the path of a duplicate found inside a member or element.
// The path is built on the way out of an error only: keeping it on the way
// in would box every name.
func within(err error, step any) error {
	if de, ok := err.(*DuplicateKeyError); ok {
		de.Path = append([]any{step}, de.Path...)
	}
	return err
}

func (p *treeParser) tooDeep() error {
	return fmt.Errorf("%w at offset %d: %w (limit %d)", ErrInvalid, p.dec.InputOffset(), ErrTooDeep, p.maxDepth)
}

func (p *treeParser) value() (any, error) {
	switch p.dec.PeekKind() {
	case '{':
		return p.object()
	case '[':
		return p.array()
	case '"':
		raw, at, err := p.read()
		if err != nil {
			return nil, err
		}
		return p.str(raw, at)
	case '0':
		raw, at, err := p.read()
		if err != nil {
			return nil, err
		}
		return Number(p.source()[at : at+len(raw)]), nil
	case 't', 'f', 'n':
		raw, _, err := p.read()
		if err != nil {
			return nil, err
		}
		switch raw[0] {
		case 't':
			return true, nil
		case 'f':
			return false, nil
		}
		return nil, nil
	}
	// Nothing valid comes next: ReadToken says why.
	_, err := p.dec.ReadToken()
	if err == nil {
		err = fmt.Errorf("%w at offset %d: unexpected token", ErrInvalid, p.dec.InputOffset())
	}
	return nil, p.fail(err)
}

// str decodes the raw JSON string at offset at. Text without escapes is a
// slice of the body (jsontext has checked its UTF-8 already).
func (p *treeParser) str(raw jsontext.Value, at int) (string, error) {
	if !hasEscape(raw) {
		return p.source()[at+1 : at+len(raw)-1], nil
	}
	var scratch [64]byte
	b, err := jsontext.AppendUnquote(scratch[:0], raw)
	if err != nil {
		return "", p.fail(err)
	}
	return string(b), nil
}

func (p *treeParser) object() (any, error) {
	if p.dec.StackDepth()+1 > p.maxDepth {
		return nil, p.tooDeep()
	}
	if _, err := p.dec.ReadToken(); err != nil {
		return nil, p.fail(err)
	}
	obj := make(map[string]any)
	for p.dec.PeekKind() != '}' {
		raw, at, err := p.read()
		if err != nil {
			return nil, err
		}
		key, err := p.str(raw, at)
		if err != nil {
			return nil, err
		}
		v, err := p.value()
		if err != nil {
			return nil, within(err, key)
		}
		obj[key] = v
	}
	if _, err := p.dec.ReadToken(); err != nil {
		return nil, p.fail(err)
	}
	return obj, nil
}

func (p *treeParser) array() (any, error) {
	if p.dec.StackDepth()+1 > p.maxDepth {
		return nil, p.tooDeep()
	}
	if _, err := p.dec.ReadToken(); err != nil {
		return nil, p.fail(err)
	}
	arr := make([]any, 0)
	for p.dec.PeekKind() != ']' {
		v, err := p.value()
		if err != nil {
			return nil, within(err, len(arr))
		}
		arr = append(arr, v)
	}
	if _, err := p.dec.ReadToken(); err != nil {
		return nil, p.fail(err)
	}
	return arr, nil
}
