package fingerprint

import (
	"github.com/idemgate/idemgate/internal/jsonx"
)

// ErrInvalidJSON is returned (wrapped) by ParseJSON for any body that is not
// exactly one well-formed JSON value.
var ErrInvalidJSON = jsonx.ErrInvalid

// ErrTooDeep is returned (wrapped, together with ErrInvalidJSON when it comes
// from ParseJSON) when objects and arrays nest deeper than the limit.
var ErrTooDeep = jsonx.ErrTooDeep

const (
	// DefaultMaxDepth is the nesting limit used when a limit of zero is given.
	DefaultMaxDepth = 32
	// HardMaxDepth caps any configured nesting limit: parsing and
	// canonicalisation recurse, and the recursion must stay shallow.
	HardMaxDepth = 1000
)

// Number is a JSON number's literal text as ParseJSON keeps it.
type Number = jsonx.Number

// Document is a JSON body as ParseJSON read it. Select and CheckKey take a
// Document, not a tree: the binding rule holds only for what the strict
// parser built, so a caller cannot hash a tree another parser (one that
// keeps the last duplicate, say) made of the same bytes. The zero Document
// stands for no body.
type Document struct{ root any }

// Value is the document's tree: map[string]any, []any, string, bool, nil or
// Number. Callers read it; Select never sees a changed copy, because it
// takes the Document.
func (d Document) Value() any { return d.root }

// ParseJSON parses body as exactly one JSON value (RFC 8259) surrounded by
// optional whitespace. Its tree holds map[string]any, []any, string, bool,
// nil or Number; a Number holds the number's literal text, so nothing is
// lost to float64.
//
// It is stricter than encoding/json where laxness would let a client smuggle a
// value past the hash: duplicate object keys, invalid UTF-8 and lone UTF-16
// surrogates in \u escapes are errors (encoding/json silently keeps the last
// duplicate and replaces bad text with U+FFFD, an upstream parser may do
// otherwise). Trailing data and a byte-order mark are errors too. The
// definition is internal/jsonx's, the one MCP routing and the preview
// injection read with as well.
//
// maxDepth limits how deeply objects and arrays nest (the top-level object or
// array is depth 1); zero or less means DefaultMaxDepth, and values above
// HardMaxDepth are lowered to it. Errors wrap ErrInvalidJSON (and ErrTooDeep
// for the depth limit); ParseJSON never panics.
func ParseJSON(body []byte, maxDepth int) (Document, error) {
	v, err := jsonx.Parse(body, clampDepth(maxDepth))
	if err != nil {
		return Document{}, err
	}
	return Document{root: v}, nil
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

// DuplicateKeyError is ParseJSON's error for an object that holds one key
// twice (compared after unescaping). Path leads from the document's root to
// the duplicated key (string keys, int array indexes; the key is last), so
// that a caller can tell a duplicate on a bound path — a field the upstream
// may read as either value: the binding rule — from one elsewhere.
type DuplicateKeyError = jsonx.DuplicateKeyError
