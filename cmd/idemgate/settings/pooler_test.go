package settings

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// store.postgres.pooler: transaction tells the PostgreSQL store it talks
// to a pooler in transaction mode (no named prepared statements); the
// summary says so.
func TestPostgresPoolerTransaction(t *testing.T) {
	src := `signing:
  active_key: k1
  keys: {k1: {env: IDEMGATE_TEST_KEY_K1}}
store:
  postgres: {dsn: "postgres://u@127.0.0.1:6432/idemgate", pooler: transaction}
operations:
  - name: transfer
    scope: payments.transfer
    preview: {method: POST, path: /p}
    confirm: {method: POST, path: /c}
    status: {method: POST, path: /s}
    preview_tool: tp
    status_tool: ts
    params: [amount]
`
	cfg, _, err := Parse("inline.yaml", []byte(src), "", testOptions())
	require.NoError(t, err)
	require.True(t, cfg.Store.Postgres.TransactionPooler)
	var b strings.Builder
	require.NoError(t, cfg.WriteSummary(&b))
	require.Contains(t, b.String(), "through a transaction pooler")

	cfg, _, err = Parse("inline.yaml", []byte(strings.Replace(src, ", pooler: transaction", "", 1)), "", testOptions())
	require.NoError(t, err)
	require.False(t, cfg.Store.Postgres.TransactionPooler, "no pooler unless said")
}
