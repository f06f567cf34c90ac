package fingerprint

import (
	"errors"
	"fmt"
	"strings"
)

// ErrInvalidDecimal is returned for a number, or a decimal-typed string, that is
// not a decimal in JSON number grammar.
var ErrInvalidDecimal = errors.New("invalid decimal")

// ErrNumberOutOfRange is returned for a number whose decimal exponent is absurd
// (see maxExponentDigits and maxScientificExponent). Such numbers are rejected
// rather than expanded, so a hostile "1e999999999" costs nothing.
var ErrNumberOutOfRange = errors.New("number exponent out of range")

const (
	// maxExponentDigits bounds the exponent literal ("1e<digits>") after its
	// leading zeros are dropped.
	maxExponentDigits = 10
	// maxScientificExponent bounds the exponent of the normalised value in
	// scientific notation (d.ddd × 10^x, |x| <= maxScientificExponent).
	maxScientificExponent = 999_999_999
	// plainMaxPosition and plainMinPosition choose between plain and
	// scientific output; they are the ECMAScript Number::toString limits.
	plainMaxPosition = 21
	plainMinPosition = -6
)

// decimal is an exact decimal value: (-1)^neg × digits × 10^exp.
// digits has neither leading nor trailing zeros; zero is digits == "" (never negative).
type decimal struct {
	neg    bool
	digits string
	exp    int64
}

// parseDecimal parses s, which must follow the JSON number grammar exactly:
// optional '-', integer part without leading zeros, optional fraction with at
// least one digit, optional exponent. No '+' sign in front, no spaces, no
// ".5", "5.", "0x..", "NaN" or "Infinity". The value is kept exact: no float64.
func parseDecimal(s string) (decimal, error) {
	i := 0
	neg := false
	if i < len(s) && s[i] == '-' {
		neg = true
		i++
	}
	intStart := i
	switch {
	case i >= len(s):
		return decimal{}, fmt.Errorf("%w: missing digits", ErrInvalidDecimal)
	case s[i] == '0':
		i++
	case isDigit(s[i]):
		for i < len(s) && isDigit(s[i]) {
			i++
		}
	default:
		return decimal{}, fmt.Errorf("%w: unexpected character at offset %d", ErrInvalidDecimal, i)
	}
	intPart := s[intStart:i]

	fracPart := ""
	if i < len(s) && s[i] == '.' {
		i++
		fracStart := i
		for i < len(s) && isDigit(s[i]) {
			i++
		}
		if i == fracStart {
			return decimal{}, fmt.Errorf("%w: missing digits after '.'", ErrInvalidDecimal)
		}
		fracPart = s[fracStart:i]
	}

	var expVal int64
	if i < len(s) && (s[i] == 'e' || s[i] == 'E') {
		i++
		expNeg := false
		if i < len(s) && (s[i] == '+' || s[i] == '-') {
			expNeg = s[i] == '-'
			i++
		}
		expStart := i
		for i < len(s) && isDigit(s[i]) {
			i++
		}
		if i == expStart {
			return decimal{}, fmt.Errorf("%w: missing exponent digits", ErrInvalidDecimal)
		}
		expDigits := strings.TrimLeft(s[expStart:i], "0")
		if len(expDigits) > maxExponentDigits {
			return decimal{}, ErrNumberOutOfRange
		}
		for j := 0; j < len(expDigits); j++ {
			expVal = expVal*10 + int64(expDigits[j]-'0')
		}
		if expNeg {
			expVal = -expVal
		}
	}
	if i != len(s) {
		return decimal{}, fmt.Errorf("%w: unexpected character at offset %d", ErrInvalidDecimal, i)
	}

	mantissa := intPart
	if fracPart != "" {
		mantissa = intPart + fracPart
	}
	mantissa = strings.TrimLeft(mantissa, "0")
	trimmed := strings.TrimRight(mantissa, "0")
	if trimmed == "" {
		return decimal{}, nil // every spelling of zero, "-0" included
	}
	exp := expVal - int64(len(fracPart)) + int64(len(mantissa)-len(trimmed))
	scientific := exp + int64(len(trimmed)) - 1
	if scientific > maxScientificExponent || scientific < -maxScientificExponent {
		return decimal{}, ErrNumberOutOfRange
	}
	return decimal{neg: neg, digits: trimmed, exp: exp}, nil
}

// appendDecimal writes d in its canonical form. The layout is the one of
// ECMAScript Number::toString (also used by RFC 8785), applied to the exact
// digits instead of a binary double. With k significant digits and the decimal
// point n places after the first digit (value = 0.digits × 10^n):
//
//	k <= n <= 21   digits then n-k zeros            1e2      -> 100
//	0 < n <= 21    digits with a point inside       1234e-2  -> 12.34
//	-6 < n <= 0    "0." then -n zeros then digits   5e-3     -> 0.005
//	otherwise      d[.ddd]e±x, x = n-1              1e21     -> 1e+21, 1e-7 -> 1e-7
//
// Zero is "0". The output is at most k+22 bytes, whatever the exponent.
func appendDecimal(buf []byte, d decimal) []byte {
	if d.digits == "" {
		return append(buf, '0')
	}
	if d.neg {
		buf = append(buf, '-')
	}
	k := int64(len(d.digits))
	n := d.exp + k
	switch {
	case k <= n && n <= plainMaxPosition:
		buf = append(buf, d.digits...)
		for j := k; j < n; j++ {
			buf = append(buf, '0')
		}
	case 0 < n && n <= plainMaxPosition:
		buf = append(buf, d.digits[:n]...)
		buf = append(buf, '.')
		buf = append(buf, d.digits[n:]...)
	case plainMinPosition < n && n <= 0:
		buf = append(buf, '0', '.')
		for j := n; j < 0; j++ {
			buf = append(buf, '0')
		}
		buf = append(buf, d.digits...)
	default:
		buf = append(buf, d.digits[0])
		if k > 1 {
			buf = append(buf, '.')
			buf = append(buf, d.digits[1:]...)
		}
		buf = append(buf, 'e')
		x := n - 1
		if x < 0 {
			buf = append(buf, '-')
			x = -x
		} else {
			buf = append(buf, '+')
		}
		buf = appendUint(buf, uint64(x))
	}
	return buf
}

// CanonicalDecimal returns the canonical form of a decimal written in JSON
// number grammar ("1.00" -> "1", "1e21" -> "1e+21"). It is what a number, or
// a string in a `type: decimal` param, contributes to the canonical JSON.
func CanonicalDecimal(s string) (string, error) {
	d, err := parseDecimal(s)
	if err != nil {
		return "", err
	}
	return string(appendDecimal(nil, d)), nil
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

func appendUint(buf []byte, x uint64) []byte {
	var tmp [20]byte
	i := len(tmp)
	for {
		i--
		tmp[i] = byte('0' + x%10)
		x /= 10
		if x == 0 {
			break
		}
	}
	return append(buf, tmp[i:]...)
}
