package fingerprint_test

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/fingerprint"
)

func mustSelector(t testing.TB, params []fingerprint.Param, lim fingerprint.Limits) *fingerprint.Selector {
	t.Helper()
	s, err := fingerprint.NewSelector(params, lim)
	require.NoError(t, err)
	return s
}

func selectBody(t testing.TB, s *fingerprint.Selector, body string, vars map[string]string) (fingerprint.Params, error) {
	t.Helper()
	doc, err := fingerprint.ParseJSON([]byte(body), 0)
	require.NoError(t, err)
	return s.Select(doc, vars)
}

var transferParams = []fingerprint.Param{
	{Path: "amount", Decimal: true},
	{Path: "currency"},
	{Path: "payee.account_id"},
}

func TestSelect(t *testing.T) {
	for _, tc := range []struct {
		name       string
		params     []fingerprint.Param
		body       string
		vars       map[string]string
		canonical  string
		fieldPaths []string
	}{
		{
			name:       "transfer",
			params:     transferParams,
			body:       `{"amount":"100.00","currency":"EUR","payee":{"account_id":"DE89","name":"Alice"},"memo":"rent","client_ts":"2026-01-01T00:00:00Z"}`,
			canonical:  `{"amount":100,"currency":"EUR","payee.account_id":"DE89"}`,
			fieldPaths: []string{"amount", "currency", "payee.account_id"},
		},
		{
			name:       "decimal field as number",
			params:     transferParams,
			body:       `{"amount":100,"currency":"EUR","payee":{"account_id":"DE89"}}`,
			canonical:  `{"amount":100,"currency":"EUR","payee.account_id":"DE89"}`,
			fieldPaths: []string{"amount", "currency", "payee.account_id"},
		},
		{
			name:       "absent and null fields removed",
			params:     transferParams,
			body:       `{"amount":null,"payee":{}}`,
			canonical:  `{}`,
			fieldPaths: []string{},
		},
		{
			name:       "walking through a scalar is absent",
			params:     transferParams,
			body:       `{"amount":"5","payee":"DE89"}`,
			canonical:  `{"amount":5}`,
			fieldPaths: []string{"amount"},
		},
		{
			name:       "no body",
			params:     transferParams,
			canonical:  `{}`,
			fieldPaths: []string{},
		},
		{
			name:       "keys sorted by path, fields in configured order",
			params:     []fingerprint.Param{{Path: "z"}, {Path: "a.b"}, {Path: "a"}},
			body:       `{"z":1,"a":{"b":2}}`,
			canonical:  `{"a":{"b":2},"a.b":2,"z":1}`,
			fieldPaths: []string{"z", "a.b", "a"},
		},
		{
			name:       "nested object value canonicalised",
			params:     []fingerprint.Param{{Path: "payee"}},
			body:       `{"payee":{"name":"Zoe\u0308","iban":"DE89","bic":null,"tags":["b",null,"a"]}}`,
			canonical:  "{\"payee\":{\"iban\":\"DE89\",\"name\":\"Zoe\u0308\",\"tags\":[\"b\",null,\"a\"]}}",
			fieldPaths: []string{"payee"},
		},
		{
			name:       "normalize: nfc recomposes the param's strings, not its keys",
			params:     []fingerprint.Param{{Path: "payee", NFC: true}, {Path: "memo"}},
			body:       `{"payee":{"name":"Zoe\u0308","e\u0301":"x"},"memo":"Zoe\u0308"}`,
			canonical:  "{\"memo\":\"Zoe\u0308\",\"payee\":{\"e\u0301\":\"x\",\"name\":\"Zo\u00eb\"}}",
			fieldPaths: []string{"payee", "memo"},
		},
		{
			name:       "array index segments",
			params:     []fingerprint.Param{{Path: "items.1.sku"}, {Path: "items.0.qty"}, {Path: "items.5.sku"}, {Path: "items.01.sku"}},
			body:       `{"items":[{"sku":"A","qty":2.0},{"sku":"B","qty":1}]}`,
			canonical:  `{"items.0.qty":2,"items.1.sku":"B"}`,
			fieldPaths: []string{"items.1.sku", "items.0.qty"},
		},
		{
			name:       "digit segment on an object is a key",
			params:     []fingerprint.Param{{Path: "m.0"}},
			body:       `{"m":{"0":"zero"}}`,
			canonical:  `{"m.0":"zero"}`,
			fieldPaths: []string{"m.0"},
		},
		{
			name:       "path variables",
			params:     []fingerprint.Param{{Path: "path.id"}, {Path: "path.amount", Decimal: true}, {Path: "path.missing"}, {Path: "amount"}},
			body:       `{"amount":3}`,
			vars:       map[string]string{"id": "acc-1", "amount": "7.50"},
			canonical:  `{"amount":3,"path.amount":7.5,"path.id":"acc-1"}`,
			fieldPaths: []string{"path.id", "path.amount", "amount"},
		},
		{
			name:       "a body field named path",
			params:     []fingerprint.Param{{Path: "path"}},
			body:       `{"path":"/x"}`,
			canonical:  `{"path":"/x"}`,
			fieldPaths: []string{"path"},
		},
		{
			name:       "no params",
			params:     nil,
			body:       `{"amount":1}`,
			canonical:  `{}`,
			fieldPaths: []string{},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := mustSelector(t, tc.params, fingerprint.Limits{})
			var doc fingerprint.Document
			if tc.body != "" {
				var err error
				doc, err = fingerprint.ParseJSON([]byte(tc.body), 0)
				require.NoError(t, err)
			}
			got, err := s.Select(doc, tc.vars)
			require.NoError(t, err)
			require.Equal(t, tc.canonical, string(got.Canonical))
			sum := sha256.Sum256([]byte(tc.canonical))
			require.Equal(t, hex.EncodeToString(sum[:]), got.Hash)
			paths := make([]string, 0, len(got.Fields))
			for _, f := range got.Fields {
				paths = append(paths, f.Path)
				// Each field's canonical value is a valid canonical document.
				v, err := fingerprint.ParseJSON(f.Canonical, 0)
				require.NoError(t, err)
				again, err := fingerprint.Canonicalize(v)
				require.NoError(t, err)
				require.Equal(t, string(f.Canonical), string(again))
			}
			require.Equal(t, tc.fieldPaths, paths)
		})
	}
}

func TestSelectHashEquality(t *testing.T) {
	s := mustSelector(t, transferParams, fingerprint.Limits{})
	hash := func(body string) string {
		p, err := selectBody(t, s, body, nil)
		require.NoError(t, err)
		return p.Hash
	}
	base := hash(`{"amount":"100.00","currency":"EUR","payee":{"account_id":"DE89"}}`)
	for _, same := range []string{
		`{"amount":100,"currency":"EUR","payee":{"account_id":"DE89"}}`,
		`{"amount":"1e2","currency":"EUR","payee":{"account_id":"DE89"}}`,
		`{"amount":1.00e2,"currency":"EUR","payee":{"account_id":"DE89"}}`,
		`{"payee":{"account_id":"DE89","name":"other"},"currency":"EUR","amount":"100"}`,
		`{"amount":"100.0","currency":"EUR","payee":{"account_id":"DE89"},"memo":"changed memo","ts":1}`,
	} {
		require.Equal(t, base, hash(same), same)
	}
	for _, different := range []string{
		`{"amount":"100.01","currency":"EUR","payee":{"account_id":"DE89"}}`,
		`{"amount":"1000","currency":"EUR","payee":{"account_id":"DE89"}}`,
		`{"amount":"100.00","currency":"USD","payee":{"account_id":"DE89"}}`,
		`{"amount":"100.00","currency":"EUR","payee":{"account_id":"DE90"}}`,
		`{"amount":"100.00","currency":"EUR"}`,
		`{"amount":"100.00","currency":"EUR","payee":{"account_id":"DE89 "}}`,
	} {
		require.NotEqual(t, base, hash(different), different)
	}
}

func TestSelectDecimalErrors(t *testing.T) {
	s := mustSelector(t, []fingerprint.Param{{Path: "fee"}, {Path: "amount", Decimal: true}}, fingerprint.Limits{})
	for _, body := range []string{
		`{"amount":"abc"}`,
		`{"amount":"100,00"}`,
		`{"amount":" 100"}`,
		`{"amount":"+100"}`,
		`{"amount":"0100"}`,
		`{"amount":""}`,
		`{"amount":"NaN"}`,
		`{"amount":true}`,
		`{"amount":{"value":1}}`,
		`{"amount":[1]}`,
	} {
		t.Run(body, func(t *testing.T) {
			_, err := selectBody(t, s, body, nil)
			require.ErrorIs(t, err, fingerprint.ErrInvalidDecimal)
			require.Contains(t, err.Error(), `"amount"`)
		})
	}
	t.Run("out of range", func(t *testing.T) {
		_, err := selectBody(t, s, `{"amount":"1e1000000000"}`, nil)
		require.ErrorIs(t, err, fingerprint.ErrNumberOutOfRange)
		require.Contains(t, err.Error(), `"amount"`)
		_, err = selectBody(t, s, `{"fee":1e1000000000}`, nil)
		require.ErrorIs(t, err, fingerprint.ErrNumberOutOfRange)
		require.Contains(t, err.Error(), `"fee"`)
	})
	t.Run("unselected hostile number is ignored", func(t *testing.T) {
		p, err := selectBody(t, s, `{"amount":"1","memo":1e1000000000}`, nil)
		require.NoError(t, err)
		require.Equal(t, `{"amount":1}`, string(p.Canonical))
	})
	t.Run("decimal path variable", func(t *testing.T) {
		sv := mustSelector(t, []fingerprint.Param{{Path: "path.amount", Decimal: true}}, fingerprint.Limits{})
		_, err := sv.Select(fingerprint.Document{}, map[string]string{"amount": "12abc"})
		require.ErrorIs(t, err, fingerprint.ErrInvalidDecimal)
		require.Contains(t, err.Error(), `"path.amount"`)
	})
}

func TestSelectLimits(t *testing.T) {
	t.Run("canonical size", func(t *testing.T) {
		s := mustSelector(t, []fingerprint.Param{{Path: "memo"}}, fingerprint.Limits{MaxCanonicalBytes: 100})
		_, err := selectBody(t, s, `{"memo":"`+strings.Repeat("x", 200)+`"}`, nil)
		require.ErrorIs(t, err, fingerprint.ErrTooLarge)
		_, err = selectBody(t, s, `{"memo":[`+strings.Repeat(`1,`, 100)+`1]}`, nil)
		require.ErrorIs(t, err, fingerprint.ErrTooLarge)
		// The limit covers the whole object, keys included: 11 + 89 = 100 fits.
		p, err := selectBody(t, s, `{"memo":"`+strings.Repeat("x", 89)+`"}`, nil)
		require.NoError(t, err)
		require.Len(t, p.Canonical, 100)
		_, err = selectBody(t, s, `{"memo":"`+strings.Repeat("x", 90)+`"}`, nil)
		require.ErrorIs(t, err, fingerprint.ErrTooLarge)
	})
	t.Run("default size", func(t *testing.T) {
		s := mustSelector(t, []fingerprint.Param{{Path: "memo"}}, fingerprint.Limits{})
		_, err := selectBody(t, s, `{"memo":"`+strings.Repeat("x", fingerprint.DefaultMaxCanonicalBytes)+`"}`, nil)
		require.ErrorIs(t, err, fingerprint.ErrTooLarge)
	})
	t.Run("depth", func(t *testing.T) {
		s := mustSelector(t, []fingerprint.Param{{Path: "a"}}, fingerprint.Limits{MaxDepth: 3})
		_, err := selectBody(t, s, `{"a":[[[1]]]}`, nil)
		require.NoError(t, err)
		_, err = selectBody(t, s, `{"a":[[[[1]]]]}`, nil)
		require.ErrorIs(t, err, fingerprint.ErrTooDeep)
		require.Contains(t, err.Error(), `"a"`)
	})
}

func TestNewSelectorRejects(t *testing.T) {
	for _, tc := range []struct {
		name   string
		params []fingerprint.Param
		lim    fingerprint.Limits
	}{
		{"empty path", []fingerprint.Param{{Path: ""}}, fingerprint.Limits{}},
		{"leading dot", []fingerprint.Param{{Path: ".a"}}, fingerprint.Limits{}},
		{"trailing dot", []fingerprint.Param{{Path: "a."}}, fingerprint.Limits{}},
		{"double dot", []fingerprint.Param{{Path: "a..b"}}, fingerprint.Limits{}},
		{"empty path var", []fingerprint.Param{{Path: "path."}}, fingerprint.Limits{}},
		{"dotted path var", []fingerprint.Param{{Path: "path.a.b"}}, fingerprint.Limits{}},
		{"duplicate", []fingerprint.Param{{Path: "amount"}, {Path: "amount", Decimal: true}}, fingerprint.Limits{}},
		{"control character", []fingerprint.Param{{Path: "a\x00b"}}, fingerprint.Limits{}},
		{"invalid UTF-8", []fingerprint.Param{{Path: "\xff"}}, fingerprint.Limits{}},
		{"not NFC", []fingerprint.Param{{Path: "e\u0301"}}, fingerprint.Limits{}},
		{"negative depth", nil, fingerprint.Limits{MaxDepth: -1}},
		{"negative size", nil, fingerprint.Limits{MaxCanonicalBytes: -1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := fingerprint.NewSelector(tc.params, tc.lim)
			require.ErrorIs(t, err, fingerprint.ErrInvalidParam)
		})
	}
	t.Run("every problem reported", func(t *testing.T) {
		_, err := fingerprint.NewSelector([]fingerprint.Param{{Path: "a."}, {Path: "ok"}, {Path: ""}}, fingerprint.Limits{})
		require.ErrorContains(t, err, `"a."`)
		require.ErrorContains(t, err, `"": empty path`)
	})
}

func TestSelectorAccessors(t *testing.T) {
	s := mustSelector(t, transferParams, fingerprint.Limits{})
	require.Equal(t, []string{"amount", "currency", "payee.account_id"}, s.Paths())
	require.Equal(t, transferParams, s.Params())
	// Callers cannot change the selector through the returned slice.
	s.Paths()[0] = "x"
	require.Equal(t, "amount", s.Paths()[0])
}
