package verify

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
)

// The canonical parameters (docs/design.md §2): an object of the bound
// params keyed by their paths as configured, keys sorted by their UTF-8
// bytes, nulls and absent fields left out, numbers as canonical decimals,
// strings byte for byte after unescaping (NFC only for a param that says
// so), compact JSON escaped like Go's encoding/json without HTML escaping;
// the hash is hex SHA-256 of that text.

// Param is one bound param as the claims carry it.
type Param struct {
	// Path is a dotted body path (all-digit segments index arrays) or
	// "path.<name>", a variable of the route's path template.
	Path string `json:"path"`
	// Type "decimal" makes a JSON string holding a decimal hash like the
	// number it spells.
	Type string `json:"type,omitempty"`
	// Normalize "nfc" NFC-normalises the param's strings (not its keys).
	Normalize string `json:"normalize,omitempty"`
}

var (
	errDecimal    = errors.New("not a decimal")
	errOutOfRange = errors.New("decimal out of range")
)

// Limits of canonical decimals, as idemgate's: an exponent literal of more
// than 10 significant digits, or a scientific exponent beyond ±999999999,
// is out of range.
const (
	maxExponentDigits     = 10
	maxScientificExponent = 999999999
)

// CanonicalDecimal writes the JSON number text s in canonical form: no
// leading or trailing zeros, -0 as 0, laid out like ECMAScript's
// Number::toString applied to the exact digits (1e21 and up, and below
// 1e-6, in exponent form).
func CanonicalDecimal(s string) (string, error) {
	i := 0
	neg := false
	if i < len(s) && s[i] == '-' {
		neg = true
		i++
	}
	intStart := i
	for i < len(s) && s[i] >= '0' && s[i] <= '9' {
		i++
	}
	ipart := s[intStart:i]
	if ipart == "" || (len(ipart) > 1 && ipart[0] == '0') {
		return "", errDecimal
	}
	fpart := ""
	if i < len(s) && s[i] == '.' {
		i++
		fs := i
		for i < len(s) && s[i] >= '0' && s[i] <= '9' {
			i++
		}
		fpart = s[fs:i]
		if fpart == "" {
			return "", errDecimal
		}
	}
	exp := int64(0)
	if i < len(s) && (s[i] == 'e' || s[i] == 'E') {
		i++
		eneg := false
		if i < len(s) && (s[i] == '+' || s[i] == '-') {
			eneg = s[i] == '-'
			i++
		}
		es := i
		for i < len(s) && s[i] >= '0' && s[i] <= '9' {
			i++
		}
		edigits := s[es:i]
		if edigits == "" {
			return "", errDecimal
		}
		if len(strings.TrimLeft(edigits, "0")) > maxExponentDigits {
			return "", errOutOfRange
		}
		if t := strings.TrimLeft(edigits, "0"); t != "" {
			exp, _ = strconv.ParseInt(t, 10, 64) // at most 10 digits: fits
		}
		if eneg {
			exp = -exp
		}
	}
	if i != len(s) {
		return "", errDecimal
	}
	digits := strings.TrimLeft(ipart+fpart, "0")
	if digits == "" {
		return "0", nil
	}
	// value = digits × 10^scale
	scale := exp - int64(len(fpart))
	stripped := strings.TrimRight(digits, "0")
	scale += int64(len(digits) - len(stripped))
	digits = stripped
	k := int64(len(digits))
	n := k + scale // value = 0.d1…dk × 10^n
	if n-1 > maxScientificExponent || n-1 < -maxScientificExponent {
		return "", errOutOfRange
	}
	var out string
	switch {
	case k <= n && n <= 21:
		out = digits + strings.Repeat("0", int(n-k))
	case 0 < n && n <= 21:
		out = digits[:n] + "." + digits[n:]
	case -6 < n && n <= 0:
		out = "0." + strings.Repeat("0", int(-n)) + digits
	default:
		mant := digits
		if k > 1 {
			mant = digits[:1] + "." + digits[1:]
		}
		e := n - 1
		sign := "+"
		if e < 0 {
			sign, e = "-", -e
		}
		out = mant + "e" + sign + strconv.FormatInt(e, 10)
	}
	if neg {
		return "-" + out, nil
	}
	return out, nil
}

// appendString writes s as a JSON string: encoding/json's escaping without
// HTML escaping (", \, \b \f \n \r \t, other controls as \u00xx, U+2028
// and U+2029 escaped, everything else as is).
func appendString(b []byte, s string) []byte {
	const hexDigits = "0123456789abcdef"
	b = append(b, '"')
	for _, r := range s {
		switch {
		case r == '"':
			b = append(b, '\\', '"')
		case r == '\\':
			b = append(b, '\\', '\\')
		case r == '\b':
			b = append(b, '\\', 'b')
		case r == '\f':
			b = append(b, '\\', 'f')
		case r == '\n':
			b = append(b, '\\', 'n')
		case r == '\r':
			b = append(b, '\\', 'r')
		case r == '\t':
			b = append(b, '\\', 't')
		case r < 0x20:
			b = append(b, '\\', 'u', '0', '0', hexDigits[r>>4], hexDigits[r&0xf])
		case r == 0x2028 || r == 0x2029:
			b = append(b, '\\', 'u', '2', '0', '2', hexDigits[r&0xf])
		default:
			b = append(b, string(r)...)
		}
	}
	return append(b, '"')
}

// appendCanonical writes the canonical JSON of a parsed value; nfc, when
// not nil, normalises strings (not keys) first.
func appendCanonical(b []byte, v any, nfc func(string) string) ([]byte, error) {
	switch v := v.(type) {
	case nil:
		return append(b, "null"...), nil
	case bool:
		return strconv.AppendBool(b, v), nil
	case Number:
		d, err := CanonicalDecimal(string(v))
		if err != nil {
			return nil, err
		}
		return append(b, d...), nil
	case string:
		if nfc != nil {
			v = nfc(v)
		}
		return appendString(b, v), nil
	case []any:
		b = append(b, '[')
		for i, x := range v {
			if i > 0 {
				b = append(b, ',')
			}
			var err error
			if b, err = appendCanonical(b, x, nfc); err != nil {
				return nil, err
			}
		}
		return append(b, ']'), nil
	case object:
		keys := make([]string, 0, len(v))
		for k, x := range v {
			if x != nil {
				keys = append(keys, k)
			}
		}
		sort.Strings(keys) // byte order of the UTF-8 text
		b = append(b, '{')
		for i, k := range keys {
			if i > 0 {
				b = append(b, ',')
			}
			b = append(appendString(b, k), ':')
			var err error
			if b, err = appendCanonical(b, v[k], nfc); err != nil {
				return nil, err
			}
		}
		return append(b, '}'), nil
	}
	return nil, fmt.Errorf("unsupported value %T", v)
}

// lookup finds a param's value: absent is reported as ok=false.
func lookup(doc any, path string, pathVars map[string]string) (any, bool) {
	if name, isVar := strings.CutPrefix(path, "path."); isVar {
		v, ok := pathVars[name]
		return v, ok
	}
	cur := doc
	for _, seg := range strings.Split(path, ".") {
		switch c := cur.(type) {
		case object:
			v, ok := c[seg]
			if !ok {
				return nil, false
			}
			cur = v
		case []any:
			i, err := strconv.Atoi(seg)
			if err != nil || i < 0 || i >= len(c) || strings.TrimLeft(seg, "0123456789") != "" {
				return nil, false
			}
			cur = c[i]
		default:
			return nil, false
		}
	}
	return cur, true
}

// CanonicalParams writes the canonical parameters of doc (a parsed body)
// for params. nfc normalises a `normalize: nfc` param's strings; nil
// refuses such a param (the standard library has no NFC).
func CanonicalParams(params []Param, doc any, pathVars map[string]string, nfc func(string) string) ([]byte, error) {
	type field struct {
		path  string
		canon []byte
	}
	fields := make([]field, 0, len(params))
	for _, p := range params {
		v, ok := lookup(doc, p.Path, pathVars)
		if !ok || v == nil {
			continue
		}
		var canon []byte
		var err error
		switch p.Type {
		case "decimal":
			var text string
			switch v := v.(type) {
			case Number:
				text = string(v)
			case string:
				text = v
			default:
				return nil, fmt.Errorf("param %s: not a decimal", p.Path)
			}
			d, derr := CanonicalDecimal(text)
			if derr != nil {
				return nil, fmt.Errorf("param %s: %w", p.Path, derr)
			}
			canon = []byte(d)
		case "":
			var norm func(string) string
			switch p.Normalize {
			case "":
			case "nfc":
				if nfc == nil {
					return nil, fmt.Errorf("param %s says normalize: nfc; set Options.NFC (for example to golang.org/x/text/unicode/norm.NFC.String)", p.Path)
				}
				norm = nfc
			default:
				return nil, fmt.Errorf("param %s: unknown normalize %q", p.Path, p.Normalize)
			}
			if canon, err = appendCanonical(nil, v, norm); err != nil {
				return nil, fmt.Errorf("param %s: %w", p.Path, err)
			}
		default:
			return nil, fmt.Errorf("param %s: unknown type %q", p.Path, p.Type)
		}
		fields = append(fields, field{p.Path, canon})
	}
	sort.Slice(fields, func(i, j int) bool { return fields[i].path < fields[j].path })
	b := []byte{'{'}
	for i, f := range fields {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(appendString(b, f.path), ':')
		b = append(b, f.canon...)
	}
	return append(b, '}'), nil
}

// ParamHash is hex SHA-256 of CanonicalParams.
func ParamHash(params []Param, doc any, pathVars map[string]string, nfc func(string) string) (string, error) {
	canon, err := CanonicalParams(params, doc, pathVars, nfc)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(canon)
	return hex.EncodeToString(sum[:]), nil
}
