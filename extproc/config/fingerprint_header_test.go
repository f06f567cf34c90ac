package config

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func fingerprintHeaderConfig(preview, confirm string) []byte {
	return []byte(`signing: {active_key: k1, keys: {k1: {env: IDEMGATE_TEST_KEY_K1}}}
operations:
  - {name: t, scope: s, preview: {method: POST, path: /p` + preview + `}, confirm: {method: POST, path: /c` + confirm + `}, status: {method: POST, path: /s}, preview_tool: a, status_tool: b, params: [x]}
`)
}

// preview.fingerprint_header is on unless turned off, and only a preview
// has it.
func TestPreviewFingerprintHeader(t *testing.T) {
	rt, _, err := Parse("f.yaml", fingerprintHeaderConfig("", ""), "", testOptions())
	require.NoError(t, err)
	require.True(t, rt.Operations[0].PreviewFingerprintHeader, "on by default")

	rt, _, err = Parse("f.yaml", fingerprintHeaderConfig(", fingerprint_header: false", ""), "", testOptions())
	require.NoError(t, err)
	require.False(t, rt.Operations[0].PreviewFingerprintHeader)

	_, _, err = Parse("f.yaml", fingerprintHeaderConfig("", ", fingerprint_header: false"), "", testOptions())
	require.ErrorContains(t, err, "operations[0].confirm.fingerprint_header: only a preview sends a fingerprint header")
}
