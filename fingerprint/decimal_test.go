package fingerprint_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/fingerprint"
)

func TestCanonicalDecimalForms(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"0", "0"},
		{"-0", "0"},
		{"0.000", "0"},
		{"-0.0e-5", "0"},
		{"0e999", "0"},
		{"1", "1"},
		{"1.0", "1"},
		{"1.00", "1"},
		{"1e0", "1"},
		{"1E+0", "1"},
		{"10e-1", "1"},
		{"0.1e1", "1"},
		{"100", "100"},
		{"100.00", "100"},
		{"1e2", "100"},
		{"-5", "-5"},
		{"-5.000", "-5"},
		{"0.1", "0.1"},
		{"0.10", "0.1"},
		{"1e-1", "0.1"},
		{"12.34", "12.34"},
		{"1234e-2", "12.34"},
		{"12345678901234567.89", "12345678901234567.89"},
		{"12345678901234567.8", "12345678901234567.8"},
		{"9007199254740993", "9007199254740993"}, // not representable as float64
		{"0.000001", "0.000001"},
		{"0.0000001", "1e-7"},
		{"1e-7", "1e-7"},
		{"15e-8", "1.5e-7"},
		{"1e20", "100000000000000000000"},
		{"1e21", "1e+21"},
		{"123456789012345678901", "123456789012345678901"},
		{"1234567890123456789012", "1.234567890123456789012e+21"},
		{"-1.5E+30", "-1.5e+30"},
		{"1e999999999", "1e+999999999"},
		{"1e-999999999", "1e-999999999"},
		{"0.001e-999999996", "1e-999999999"},
		{"1e0000000000000000000000001", "10"}, // leading zeros of the exponent do not count
	} {
		t.Run(tc.in, func(t *testing.T) {
			got, err := fingerprint.CanonicalDecimal(tc.in)
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
			// Canonical output is a fixed point.
			again, err := fingerprint.CanonicalDecimal(got)
			require.NoError(t, err)
			require.Equal(t, got, again)
			// And it is what a JSON number contributes to canonical JSON.
			c, err := fingerprint.Canonicalize(json.Number(tc.in))
			require.NoError(t, err)
			require.Equal(t, tc.want, string(c))
		})
	}
}

func TestCanonicalDecimalEqualAndDifferent(t *testing.T) {
	equal := [][]string{
		{"1", "1.0", "1.00", "1e0", "10e-1", "0.1e1", "100e-2", "0.01E2"},
		{"0.1", "0.10", "1e-1", "0.01e1", "10E-2"},
		{"0", "-0", "0.0", "0e10", "-0.000e-3"},
		{"-2.5", "-2.50", "-25e-1", "-0.25e1"},
		{"12345678901234567.89", "1234567890123456789e-2", "12345678901234567.890"},
	}
	for _, group := range equal {
		want, err := fingerprint.CanonicalDecimal(group[0])
		require.NoError(t, err)
		for _, s := range group[1:] {
			got, err := fingerprint.CanonicalDecimal(s)
			require.NoError(t, err, s)
			require.Equal(t, want, got, "%s should equal %s", s, group[0])
		}
	}
	different := [][2]string{
		{"12345678901234567.89", "12345678901234567.8"},
		{"12345678901234567.89", "12345678901234567.9"},
		{"0.1", "0.01"},
		{"1", "-1"},
		{"100", "1000"},
		{"9007199254740993", "9007199254740992"},
		{"1e-7", "1e-8"},
	}
	for _, pair := range different {
		a, err := fingerprint.CanonicalDecimal(pair[0])
		require.NoError(t, err)
		b, err := fingerprint.CanonicalDecimal(pair[1])
		require.NoError(t, err)
		require.NotEqual(t, a, b, "%s vs %s", pair[0], pair[1])
	}
}

func TestCanonicalDecimalRejects(t *testing.T) {
	for _, tc := range []struct {
		in         string
		outOfRange bool
	}{
		{in: ""},
		{in: "-"},
		{in: "+1"},
		{in: " 1"},
		{in: "1 "},
		{in: "01"},
		{in: "007.50"},
		{in: ".5"},
		{in: "5."},
		{in: "1e"},
		{in: "1e+"},
		{in: "1.5.5"},
		{in: "0x10"},
		{in: "NaN"},
		{in: "Infinity"},
		{in: "-Infinity"},
		{in: "1,000"},
		{in: "1_000"},
		{in: "١"}, // Arabic-Indic digit one
		{in: "1e1000000000", outOfRange: true},
		{in: "1e-1000000000", outOfRange: true},
		{in: "1e99999999999999999999", outOfRange: true},
		{in: "10e999999999", outOfRange: true},
		{in: "0e12345678901", outOfRange: true}, // the exponent literal itself is too long
	} {
		t.Run(tc.in, func(t *testing.T) {
			_, err := fingerprint.CanonicalDecimal(tc.in)
			if tc.outOfRange {
				require.ErrorIs(t, err, fingerprint.ErrNumberOutOfRange)
			} else {
				require.ErrorIs(t, err, fingerprint.ErrInvalidDecimal)
			}
		})
	}
}

func TestCanonicalDecimalOutputIsBounded(t *testing.T) {
	// A hostile exponent must not be expanded into zeros.
	got, err := fingerprint.CanonicalDecimal("9.99e999999990")
	require.NoError(t, err)
	require.Equal(t, "9.99e+999999990", got)

	// Many fraction digits stay exactly as many digits, no more.
	in := "0." + strings.Repeat("0", 5000) + "1"
	got, err = fingerprint.CanonicalDecimal(in)
	require.NoError(t, err)
	require.Equal(t, "1e-5001", got)
}
