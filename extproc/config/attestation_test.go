package config

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

const attestationOps = `
operations:
  - name: transfer
    scope: payments.transfer
    preview: {method: POST, path: /v1/transfers/preview}
    confirm: {method: POST, path: /v1/transfers/confirm}
    status: {method: POST, path: /v1/transfers/status}
    preview_tool: transfer_preview
    status_tool: transfer_status
    params: [amount, currency]
`

func attestationEnv() Options {
	env := map[string]string{
		"IDEMGATE_TEST_KEY_K1": testEnv["IDEMGATE_TEST_KEY_K1"],
		"ATTEST_A1":            "YXR0ZXN0LWtleS1hMS1ub3QtYS1zZWNyZXQtMzJieXQ=",
		"ATTEST_A2":            "YXR0ZXN0LWtleS1hMi1ub3QtYS1zZWNyZXQtMzJieXQ=",
		"ATTEST_SHORT":         "c2hvcnQ=",
	}
	return Options{LookupEnv: func(k string) (string, bool) { v, ok := env[k]; return v, ok }}
}

func TestAttestationKeys(t *testing.T) {
	src := `signing: {active_key: k1, keys: {k1: {env: IDEMGATE_TEST_KEY_K1}}}
attestation:
  active_key: a2
  ttl: 30s
  keys: {a1: {env: ATTEST_A1}, a2: {env: ATTEST_A2}}
` + attestationOps
	rt, warns, err := Parse("f.yaml", []byte(src), "", attestationEnv())
	require.NoError(t, err)
	require.Empty(t, warns)
	a := rt.Attestation
	require.NotNil(t, a)
	require.Equal(t, "a2", a.Signer.ActiveKeyID())
	require.Equal(t, []string{"a1", "a2"}, a.Signer.KeyIDs())
	require.Equal(t, 30*time.Second, a.TTL)
	require.Equal(t, "idempotency-attestation", a.Header)
	var b strings.Builder
	require.NoError(t, rt.WriteSummary(&b, ProcessSummary{}))
	require.Contains(t, b.String(), "attest:     header idempotency-attestation, ttl 30s, keys a1 (env ATTEST_A1) verify-only, a2 (env ATTEST_A2) active\n")
	require.NotContains(t, b.String(), "YXR0ZXN0")
}

func TestAttestationOffByDefault(t *testing.T) {
	rt, warns, err := Parse("f.yaml", []byte(`signing: {active_key: k1, keys: {k1: {env: IDEMGATE_TEST_KEY_K1}}}`+attestationOps), "", attestationEnv())
	require.NoError(t, err)
	require.Empty(t, warns)
	require.Nil(t, rt.Attestation)
	var b strings.Builder
	require.NoError(t, rt.WriteSummary(&b, ProcessSummary{}))
	require.Contains(t, b.String(), "attest:     off")
}

func TestBadAttestation(t *testing.T) {
	for _, tc := range []struct{ name, section, want string }{
		{"the fingerprint key", `{active_key: a1, keys: {a1: {env: IDEMGATE_TEST_KEY_K1}}}`,
			"f.yaml:2:43: attestation.keys.a1: key from env IDEMGATE_TEST_KEY_K1 is also a fingerprint signing key: attestation keys must be their own"},
		{"short key", `{active_key: a1, keys: {a1: {env: ATTEST_SHORT}}}`,
			"f.yaml:2:43: attestation.keys.a1: key from env ATTEST_SHORT: invalid attestation key: 5 bytes, need exactly 32 (an Ed25519 seed) (generate one with `idemgate keygen --attestation ID`)"},
		{"active key not configured", `{active_key: a9, keys: {a1: {env: ATTEST_A1}}}`,
			"f.yaml:2:27: attestation.active_key: names key \"a9\", which is not under attestation.keys"},
		{"no keys", `{active_key: a1}`,
			"f.yaml:2:15: attestation.keys: required: at least one key"},
		{"unset env", `{active_key: a1, keys: {a1: {env: NOPE}}}`,
			"environment variable NOPE (the attestation key) is not set"},
		{"bad header", `{active_key: a1, header: "Bad Header", keys: {a1: {env: ATTEST_A1}}}`,
			"attestation.header: \"Bad Header\" is not an HTTP header name"},
		{"bad ttl", `{active_key: a1, ttl: soon, keys: {a1: {env: ATTEST_A1}}}`,
			"attestation.ttl: invalid duration \"soon\""},
		{"unknown key", `{active_key: a1, kyes: {}, keys: {a1: {env: ATTEST_A1}}}`,
			"attestation.kyes: unknown key \"kyes\""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src := "signing: {active_key: k1, keys: {k1: {env: IDEMGATE_TEST_KEY_K1}}}\nattestation: " + tc.section + attestationOps
			rt, _, err := Parse("f.yaml", []byte(src), "", attestationEnv())
			require.Nil(t, rt)
			require.ErrorContains(t, err, tc.want)
		})
	}
}

// An offline check follows no secret: the stand-in is a valid attestation
// key and differs from the fingerprint's stand-in.
func TestAttestationOffline(t *testing.T) {
	src := `signing: {active_key: k1, keys: {k1: {file: /nonexistent/k1}}}
attestation: {active_key: a1, keys: {a1: {file: /nonexistent/a1}, a2: {env: NOT_SET_ANYWHERE}}}
` + attestationOps
	rt, _, err := Parse("f.yaml", []byte(src), "", Options{Offline: true, LookupEnv: func(string) (string, bool) { return "", false }})
	require.NoError(t, err)
	require.Equal(t, "file /nonexistent/a1 (not read: offline check)", rt.Attestation.KeySources["a1"])
}
