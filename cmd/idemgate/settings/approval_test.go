package settings

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

const approvalOperation = `operations:
  - name: transfer
    scope: payments.transfer
    preview: {method: POST, path: /v1/transfers/preview}
    confirm: {method: POST, path: /v1/transfers/confirm}
    status: {method: POST, path: /v1/transfers/status}
    preview_tool: transfer_preview
    status_tool: transfer_status
    params: [{path: amount, type: decimal}]
    approval:
      rules: [{param: amount, at_least: "1000"}]
      approvers: {jwt: {issuer: https://idp.example, audience: approvals, jwks_file: approvers.jwks}}
`

func writeApprovalConfig(t *testing.T, top string) string {
	t.Helper()
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "approvers.jwks"),
		[]byte(`{"keys":[{"kty":"OKP","crv":"Ed25519","x":"11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo"}]}`), 0o600))
	path := filepath.Join(dir, "idemgate.yaml")
	require.NoError(t, os.WriteFile(path, []byte("signing: {active_key: k1, keys: {k1: {env: IDEMGATE_TEST_KEY_K1}}}\n"+top+approvalOperation), 0o600))
	return path
}

func TestApprovalListen(t *testing.T) {
	cfg, warns, err := Load(writeApprovalConfig(t, "approval_listen: \"127.0.0.1:9091\"\n"), testOptions())
	require.NoError(t, err)
	require.Empty(t, warns)
	require.Equal(t, "127.0.0.1:9091", cfg.ApprovalListen)
	var b strings.Builder
	require.NoError(t, cfg.WriteSummary(&b))
	require.Contains(t, b.String(), "listen:     grpc 127.0.0.1:50051, admin :9090, approvals 127.0.0.1:9091\n")
	require.Contains(t, b.String(), "    approval when amount >= 1000; 1 approver(s), not the requester; ttl 24h0m0s; tokens iss https://idp.example aud approvals from approvers.jwks (leeway 1m0s)\n")

	_, warns, err = Load(writeApprovalConfig(t, ""), testOptions())
	require.NoError(t, err)
	require.Len(t, warns, 1)
	require.Contains(t, warns[0].Error(), "approval_listen: operation transfer needs approvals but approval_listen is not set: approvals can be decided only with idemgate ops approvals")

	_, warns, err = Load(writeApprovalConfig(t, "approval_listen: \"127.0.0.1:9091\"\nstore: {redis: {addrs: [\"127.0.0.1:6379\"]}}\n"), testOptions())
	require.NoError(t, err)
	var texts []string
	for _, w := range warns {
		texts = append(texts, w.Error())
	}
	require.Contains(t, strings.Join(texts, "\n"), "operation transfer needs approvals, which live in PostgreSQL (or the memory store): without PostgreSQL every gated confirm answers temporarily_unavailable")
}
