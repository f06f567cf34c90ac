package settings

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/internal/testutil"
)

// redisTLSConfig is a minimal config whose Redis block carries tls.
func redisTLSConfig(tlsBlock string) []byte {
	return []byte(`signing: {active_key: k1, keys: {k1: {env: IDEMGATE_TEST_KEY_K1}}}
store:
  redis:
    addrs: ["redis.internal:6380"]
    tls: ` + tlsBlock + `
  postgres: {dsn: "postgres://127.0.0.1/idemgate"}
operations:
  - name: transfer
    scope: payments.transfer
    preview: {method: POST, path: /v1/transfers/preview}
    confirm: {method: POST, path: /v1/transfers/confirm}
    status: {method: POST, path: /v1/transfers/status}
    preview_tool: transfer_preview
    status_tool: transfer_status
    params: [amount]
`)
}

func TestRedisTLS(t *testing.T) {
	files := testutil.WriteTLSFiles(t)
	dir := filepath.Dir(files.CAFile)
	rel := func(p string) string { return filepath.Base(p) } // resolved against the config's directory

	t.Run("CA and client certificate", func(t *testing.T) {
		block := fmt.Sprintf("{ca_file: %s, cert_file: %s, key_file: %s, server_name: redis.internal}",
			rel(files.CAFile), rel(files.ClientCertFile), rel(files.ClientKeyFile))
		cfg, _, err := Parse("idemgate.yaml", redisTLSConfig(block), dir, testOptions())
		require.NoError(t, err)
		tlsSettings := cfg.Store.Redis.TLS
		require.NotNil(t, tlsSettings)
		tc := tlsSettings.Config
		require.NotNil(t, tc.RootCAs)
		require.Len(t, tc.Certificates, 1)
		require.Equal(t, "redis.internal", tc.ServerName)
		require.False(t, tc.InsecureSkipVerify)
		require.Equal(t, "tls, ca ca.pem, client cert client.pem, server name redis.internal", tlsSettings.Summary)

		// The key never reaches a log line, JSON or the summary.
		key, err := os.ReadFile(files.ClientKeyFile)
		require.NoError(t, err)
		var logs bytes.Buffer
		slog.New(slog.NewTextHandler(&logs, nil)).Info("config", "redis", cfg.Store.Redis, "tls", tlsSettings)
		jsonBytes, err := json.Marshal(cfg.Store)
		require.NoError(t, err)
		var summary bytes.Buffer
		require.NoError(t, cfg.WriteSummary(&summary))
		require.Contains(t, summary.String(), tlsSettings.Summary)
		for _, out := range []string{logs.String(), string(jsonBytes), summary.String(), fmt.Sprintf("%v", tlsSettings)} {
			require.NotContains(t, out, "PRIVATE KEY")
			require.NotContains(t, out, string(key[40:80]))
		}
	})

	t.Run("empty block uses the system roots", func(t *testing.T) {
		cfg, _, err := Parse("idemgate.yaml", redisTLSConfig("{}"), dir, testOptions())
		require.NoError(t, err)
		require.Nil(t, cfg.Store.Redis.TLS.Config.RootCAs)
		require.Equal(t, "tls, system roots", cfg.Store.Redis.TLS.Summary)
	})

	t.Run("files that are not what they claim", func(t *testing.T) {
		block := fmt.Sprintf("{ca_file: %s, cert_file: %s, key_file: %s}",
			rel(files.ClientKeyFile), rel(files.ServerCertFile), rel(files.ClientKeyFile))
		_, _, err := Parse("idemgate.yaml", redisTLSConfig(block), dir, testOptions())
		require.ErrorContains(t, err, "idemgate.yaml:5:20: store.redis.tls.ca_file: client-key.pem holds no PEM certificate")
		require.ErrorContains(t, err, "store.redis.tls.cert_file: cert_file and key_file are not a certificate and its key")
	})

	t.Run("offline names the files without reading them", func(t *testing.T) {
		offline := testOptions()
		offline.Offline = true
		offline.ReadFile = func(name string) ([]byte, error) { return nil, fmt.Errorf("read %s: not here", name) }
		cfg, _, err := Parse("idemgate.yaml", redisTLSConfig("{ca_file: /etc/idemgate/redis/ca.pem, cert_file: c.pem, key_file: k.pem}"), "", offline)
		require.NoError(t, err)
		require.Equal(t, "tls, ca /etc/idemgate/redis/ca.pem, client cert c.pem", cfg.Store.Redis.TLS.Summary)
	})
}
