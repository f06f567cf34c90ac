package fingerprint_test

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/fingerprint"
)

// A duplicate key carries its JSON path out of ParseJSON, and the selector
// says whether that path is one the binding rule covers.
func TestDuplicateKeyOnBoundPath(t *testing.T) {
	sel, err := fingerprint.NewSelector([]fingerprint.Param{
		{Path: "amount", Decimal: true}, {Path: "payee.account_id"}, {Path: "items.0.sku"}, {Path: "meta"},
	}, fingerprint.Limits{})
	require.NoError(t, err)
	for _, tc := range []struct {
		body  string
		path  []any
		bound string // "" when off the bound paths
	}{
		{`{"amount":1,"amount":2}`, []any{"amount"}, `$["amount"]`},
		{`{"a\u006dount":1,"amount":2}`, []any{"amount"}, `$["amount"]`},
		{`{"AMOUNT":1,"AMOUNT":2}`, []any{"AMOUNT"}, `$["AMOUNT"]`},
		{`{"payee":{"account_id":"a","account_id":"b"}}`, []any{"payee", "account_id"}, `$["payee"]["account_id"]`},
		{`{"payee":{},"payee":{}}`, []any{"payee"}, `$["payee"]`},
		{`{"PAYEE":{"x":1,"x":2}}`, []any{"PAYEE", "x"}, `$["PAYEE"]`}, // the case twin of payee is what is ambiguous
		{`{"items":[{"sku":"a","sku":"b"}]}`, []any{"items", 0, "sku"}, `$["items"][0]["sku"]`},
		{`{"meta":{"deep":[{"k":1,"k":2}]}}`, []any{"meta", "deep", 0, "k"}, `$["meta"]["deep"][0]["k"]`},
		{`{"memo":"a","memo":"b"}`, []any{"memo"}, ""},
		{`{"payee":{"name":"a","name":"b"}}`, []any{"payee", "name"}, ""},
		{`{"items":[{},{"sku":"a","sku":"b"}]}`, []any{"items", 1, "sku"}, ""},
	} {
		_, err := fingerprint.ParseJSON([]byte(tc.body), 0)
		var de *fingerprint.DuplicateKeyError
		require.True(t, errors.As(err, &de), "%s: %v", tc.body, err)
		require.ErrorIs(t, err, fingerprint.ErrInvalidJSON)
		require.Equal(t, tc.path, de.Path, tc.body)
		path, bound := sel.DuplicateOnBoundPath(de)
		require.Equal(t, tc.bound != "", bound, tc.body)
		if bound {
			require.Equal(t, tc.bound, path, tc.body)
		}
	}
}
