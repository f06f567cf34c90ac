package fingerprint

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"

	"github.com/idemgate/idemgate/internal/jsonx"
)

// ErrTooLarge is returned when the canonical form would exceed the configured
// MaxCanonicalBytes.
var ErrTooLarge = errors.New("canonical parameters too large")

// ErrUnsupportedValue is returned for a Go value that is not one of the types
// ParseJSON produces (plus float64 and the integer types, for convenience) and
// for strings that are not valid UTF-8.
var ErrUnsupportedValue = errors.New("unsupported value")

// Canonicalize returns the canonical JSON of v, a value as returned by
// ParseJSON: objects with keys sorted by bytes and null members removed,
// arrays in order (nulls kept, positions matter), strings byte for byte (as
// unescaped) and escaped as described in the package doc, numbers in
// canonical decimal form, no insignificant whitespace. A top-level nil is
// "null". Neither keys nor strings are normalised: two byte-different
// strings are two values, as they are to the upstream.
//
// float64, float32 and the integer types are accepted as numbers too (a float
// through its shortest round-trip text); prefer Number, which is exact.
// Nesting deeper than HardMaxDepth is an error, so cyclic values fail instead
// of recursing forever.
//
// A Document from ParseJSON is canonicalised as its tree.
func Canonicalize(v any) ([]byte, error) {
	if d, ok := v.(Document); ok {
		v = d.root
	}
	c := canonicalizer{maxDepth: HardMaxDepth}
	if err := c.value(v, 0); err != nil {
		return nil, err
	}
	return c.buf, nil
}

// canonicalizer appends canonical JSON to buf, failing once buf would exceed
// limit (0: unlimited) or values nest deeper than maxDepth.
type canonicalizer struct {
	buf      []byte
	limit    int
	maxDepth int
	members  []member // scratch, reused across objects at the same call
	// bound: the value is a bound param's, so values that parsers read
	// differently are refused (checkBoundNumber, checkBoundString).
	bound bool
	// nfc: NFC-normalise strings first (`normalize: nfc`).
	nfc bool
}

type member struct {
	key   string
	value any
}

func (c *canonicalizer) checkSize() error {
	if c.limit > 0 && len(c.buf) > c.limit {
		return fmt.Errorf("%w (limit %d bytes)", ErrTooLarge, c.limit)
	}
	return nil
}

func (c *canonicalizer) value(v any, depth int) error {
	switch v := v.(type) {
	case nil:
		c.buf = append(c.buf, "null"...)
	case bool:
		if v {
			c.buf = append(c.buf, "true"...)
		} else {
			c.buf = append(c.buf, "false"...)
		}
	case string:
		return c.string(v)
	case Number:
		return c.number(string(v))
	case map[string]any:
		return c.object(v, depth+1)
	case []any:
		return c.array(v, depth+1)
	case float64:
		return c.float(v, 64)
	case float32:
		return c.float(float64(v), 32)
	case int:
		c.buf = strconv.AppendInt(c.buf, int64(v), 10)
	case int8:
		c.buf = strconv.AppendInt(c.buf, int64(v), 10)
	case int16:
		c.buf = strconv.AppendInt(c.buf, int64(v), 10)
	case int32:
		c.buf = strconv.AppendInt(c.buf, int64(v), 10)
	case int64:
		c.buf = strconv.AppendInt(c.buf, v, 10)
	case uint:
		c.buf = strconv.AppendUint(c.buf, uint64(v), 10)
	case uint8:
		c.buf = strconv.AppendUint(c.buf, uint64(v), 10)
	case uint16:
		c.buf = strconv.AppendUint(c.buf, uint64(v), 10)
	case uint32:
		c.buf = strconv.AppendUint(c.buf, uint64(v), 10)
	case uint64:
		c.buf = strconv.AppendUint(c.buf, v, 10)
	default:
		return fmt.Errorf("%w: Go type %T", ErrUnsupportedValue, v)
	}
	return c.checkSize()
}

func (c *canonicalizer) number(text string) error {
	d, err := parseDecimal(text)
	if err != nil {
		return err
	}
	if c.bound {
		if err := checkBoundNumber(text, d); err != nil {
			return err
		}
	}
	c.buf = appendDecimal(c.buf, d)
	return c.checkSize()
}

func (c *canonicalizer) float(f float64, bits int) error {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return fmt.Errorf("%w: %v is not a JSON number", ErrUnsupportedValue, f)
	}
	return c.number(strconv.FormatFloat(f, 'g', -1, bits))
}

func (c *canonicalizer) string(s string) error {
	if !utf8.ValidString(s) {
		return fmt.Errorf("%w: string is not valid UTF-8", ErrUnsupportedValue)
	}
	// Check before appending so a huge string is refused without a copy.
	if c.limit > 0 && len(c.buf)+len(s)+2 > c.limit {
		return fmt.Errorf("%w (limit %d bytes)", ErrTooLarge, c.limit)
	}
	if c.bound {
		if err := checkBoundString(s); err != nil {
			return err
		}
	}
	if c.nfc {
		s = norm.NFC.String(s)
	}
	c.buf = AppendJSONString(c.buf, s)
	return c.checkSize()
}

func (c *canonicalizer) object(obj map[string]any, depth int) error {
	if depth > c.maxDepth {
		return fmt.Errorf("%w (limit %d)", ErrTooDeep, c.maxDepth)
	}
	base := len(c.members)
	for k, v := range obj {
		if v == nil {
			continue // null members are dropped, at every level
		}
		if !utf8.ValidString(k) {
			return fmt.Errorf("%w: object key is not valid UTF-8", ErrUnsupportedValue)
		}
		c.members = append(c.members, member{key: k, value: v})
	}
	// Members of this object live in c.members[base:]; nested objects push
	// above them and truncate back, so the scratch slice is shared.
	defer func() {
		clear(c.members[base:])
		c.members = c.members[:base]
	}()
	own := c.members[base:]
	slices.SortFunc(own, func(a, b member) int { return strings.Compare(a.key, b.key) })
	c.buf = append(c.buf, '{')
	for i := range len(own) {
		m := c.members[base+i] // re-read: nested calls may have grown the slice
		if i > 0 {
			c.buf = append(c.buf, ',')
		}
		c.buf = AppendJSONString(c.buf, m.key)
		c.buf = append(c.buf, ':')
		if err := c.value(m.value, depth); err != nil {
			return err
		}
	}
	c.buf = append(c.buf, '}')
	return c.checkSize()
}

func (c *canonicalizer) array(arr []any, depth int) error {
	if depth > c.maxDepth {
		return fmt.Errorf("%w (limit %d)", ErrTooDeep, c.maxDepth)
	}
	c.buf = append(c.buf, '[')
	for i, v := range arr {
		if i > 0 {
			c.buf = append(c.buf, ',')
		}
		if err := c.value(v, depth); err != nil {
			return err
		}
	}
	c.buf = append(c.buf, ']')
	return c.checkSize()
}

// decimalValue canonicalises the value of a `type: decimal` param: a number,
// or a string holding a decimal in JSON number grammar.
func (c *canonicalizer) decimalValue(v any) error {
	switch v := v.(type) {
	case string:
		return c.number(v)
	case Number:
		return c.number(string(v))
	case float64, float32, int, int8, int16, int32, int64, uint, uint8, uint16, uint32, uint64:
		return c.value(v, 0)
	default:
		return fmt.Errorf("%w: type decimal needs a number or a decimal string, got %s", ErrInvalidDecimal, jsonKind(v))
	}
}

func jsonKind(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case bool:
		return "a boolean"
	case string:
		return "a string"
	case map[string]any:
		return "an object"
	case []any:
		return "an array"
	default:
		return fmt.Sprintf("Go type %T", v)
	}
}

const hexDigits = "0123456789abcdef"

// AppendJSONString appends s as a JSON string with the escaping of Go's
// encoding/json when HTML escaping is off: '"' and '\\' escaped with a
// backslash; \b \f \n \r \t in short form; every other byte below 0x20 as
// \u00xx with lower-case hex; U+2028 and U+2029 as \u2028 and \u2029
// (valid JSON, but they break JavaScript readers); invalid UTF-8 as \ufffd;
// everything else (DEL, '<', '>', '&', all other non-ASCII) written as is.
// The canonical form only ever passes valid UTF-8 (ParseJSON refuses the
// rest); the server writes the JSON it builds itself with it too.
func AppendJSONString(buf []byte, s string) []byte { return jsonx.AppendString(buf, s) }
