// Package jsonx is idemgate's one JSON reader. It owns the single
// definition of strict JSON that the binding rule (docs/design.md §2), the
// preview injection and MCP routing all read with: exactly one RFC 8259
// value, no byte-order mark, no trailing data, valid UTF-8, no lone UTF-16
// surrogate in a \u escape, and no object holding one name twice (compared
// after unescaping). A body two parsers could read two ways is refused
// here, once, for every caller.
//
// Tokens come from github.com/go-json-experiment/json/jsontext, which
// checks all of the above and hands out raw values and offsets without
// building anything. This package adds what idemgate needs on top: a tree
// for the binding rule whose numbers keep their literal text, the path of a
// duplicated name, a nesting limit (jsontext has none below its own 10000),
// raw member and element access, and splicing members into an object while
// every other byte stays as its sender wrote it.
package jsonx

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"sync"

	"github.com/go-json-experiment/json/jsontext"
)

// ErrInvalid is returned (wrapped) for any input that is not exactly one
// strict JSON value.
var ErrInvalid = errors.New("invalid JSON")

// ErrTooDeep is returned (wrapped, together with ErrInvalid) when objects and
// arrays nest deeper than the limit.
var ErrTooDeep = errors.New("nesting too deep")

// DuplicateKeyError is the error for an object that holds one name twice.
// Path leads from the root to the duplicated name (string keys, int array
// indexes; the name is last), so that a caller can tell a duplicate on a
// bound path from one elsewhere.
type DuplicateKeyError struct {
	Offset int
	Path   []any
}

func (e *DuplicateKeyError) Error() string {
	return fmt.Sprintf("%v at offset %d: duplicate object key %q", ErrInvalid, e.Offset, e.Path[len(e.Path)-1])
}

func (e *DuplicateKeyError) Unwrap() error { return ErrInvalid }

// reader is a pooled strict decoder over an in-memory body. jsontext reads a
// *bytes.Buffer in place, so raw values are slices of the body and a
// reused decoder keeps its name sets: reading costs no allocation of its
// own.
type reader struct {
	dec jsontext.Decoder
	buf bytes.Buffer
}

var readers = sync.Pool{New: func() any { return new(reader) }}

// laxOptions let duplicate names and invalid text through; see Lax.
var laxOptions = []jsontext.Options{jsontext.AllowDuplicateNames(true), jsontext.AllowInvalidUTF8(true)}

func getReader(b []byte, lax bool) *reader {
	r := readers.Get().(*reader)
	r.buf = *bytes.NewBuffer(b)
	if lax {
		r.dec.Reset(&r.buf, laxOptions...)
	} else {
		r.dec.Reset(&r.buf)
	}
	return r
}

func putReader(r *reader) {
	// Drop the body so the pool does not keep it alive.
	r.buf = bytes.Buffer{}
	r.dec.Reset(&r.buf)
	readers.Put(r)
}

// fail converts an error from jsontext (or io.EOF for a missing value) to
// this package's errors.
func fail(err error, offset int64) error {
	if err == io.EOF || errors.Is(err, io.ErrUnexpectedEOF) {
		return fmt.Errorf("%w at offset %d: unexpected end of input", ErrInvalid, offset)
	}
	var se *jsontext.SyntacticError
	if errors.As(err, &se) {
		if errors.Is(se.Err, jsontext.ErrDuplicateName) {
			return &DuplicateKeyError{Offset: int(se.ByteOffset), Path: pointerPath(se.JSONPointer)}
		}
		return fmt.Errorf("%w at offset %d: %v", ErrInvalid, se.ByteOffset, se.Err)
	}
	return fmt.Errorf("%w at offset %d: %v", ErrInvalid, offset, err)
}

// pointerPath is a JSON pointer's unescaped reference tokens. A pointer
// does not tell an array index from a name of digits, so every step is a
// string here; Parse, which knows, reports ints for indexes.
func pointerPath(p jsontext.Pointer) []any {
	var path []any
	for tok := range p.Tokens() {
		path = append(path, tok)
	}
	if len(path) == 0 {
		path = append(path, "")
	}
	return path
}

// end checks that nothing but whitespace follows the value just read.
func (r *reader) end() error {
	off := r.dec.InputOffset()
	if _, err := r.dec.ReadToken(); err != io.EOF {
		if err != nil {
			return fail(err, off)
		}
		return fmt.Errorf("%w at offset %d: unexpected data after the JSON value", ErrInvalid, off)
	}
	return nil
}

// Check reports whether raw is exactly one strict JSON value (nil) or why
// not. It builds nothing.
func Check(raw []byte) error {
	r := getReader(raw, false)
	defer putReader(r)
	if err := r.dec.SkipValue(); err != nil {
		return fail(err, r.dec.InputOffset())
	}
	return r.end()
}

// Lax reports whether raw is one JSON value when duplicate names, invalid
// UTF-8 and lone surrogates are let through, as many parsers do. It is for
// choosing how to word a refusal of something Check refused (a well-formed
// but ambiguous message, or no JSON at all); nothing read laxly may be
// acted on.
func Lax(raw []byte) bool {
	r := getReader(raw, true)
	defer putReader(r)
	if r.dec.SkipValue() != nil {
		return false
	}
	return r.end() == nil
}
