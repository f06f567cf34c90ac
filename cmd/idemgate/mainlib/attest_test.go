package mainlib

import (
	"bytes"
	"crypto/ed25519"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/attest"
	"github.com/idemgate/idemgate/attest/verify"
)

// Attestation keys of these tests (not secrets).
const (
	testAttestA1 = "YXR0ZXN0LWtleS1hMS1ub3QtYS1zZWNyZXQtMzJieXQ="
	testAttestA2 = "YXR0ZXN0LWtleS1hMi1ub3QtYS1zZWNyZXQtMzJieXQ="
)

func writeAttestingConfig(t *testing.T) string {
	t.Helper()
	t.Setenv("IDEMGATE_ATTEST_KEY_A1", testAttestA1)
	t.Setenv("IDEMGATE_ATTEST_KEY_A2", testAttestA2)
	return writeConfig(t, `attestation: {active_key: a2, keys: {a1: {env: IDEMGATE_ATTEST_KEY_A1}, a2: {env: IDEMGATE_ATTEST_KEY_A2}}}`)
}

func TestKeygenAttestation(t *testing.T) {
	var out, errOut bytes.Buffer
	require.NoError(t, Main(t.Context(), []string{"keygen", "--attestation", "a7"}, &out, &errOut))
	key, err := attest.ParseSeed(out.String())
	require.NoError(t, err)
	jwk := strings.TrimSpace(strings.SplitN(errOut.String(), ": ", 2)[1])
	keys, err := verify.ParseJWKS([]byte(`{"keys":[` + jwk + `]}`))
	require.NoError(t, err)
	require.Equal(t, verify.KeySet{"a7": key.Public().(ed25519.PublicKey)}, keys)
}

func TestJWKSCommandAndCheckConfig(t *testing.T) {
	path := writeAttestingConfig(t)
	var out, errOut bytes.Buffer
	require.NoError(t, Main(t.Context(), []string{"jwks", "--config", path}, &out, &errOut))
	keys, err := verify.ParseJWKS(out.Bytes())
	require.NoError(t, err)
	require.Len(t, keys, 2, "the verify-only key is published too")
	require.NotContains(t, out.String(), testAttestA1)

	out.Reset()
	require.NoError(t, Main(t.Context(), []string{"check-config", "--config", path}, &out, &errOut))
	require.Contains(t, out.String(), "attest:     header idempotency-attestation, ttl 1m0s, keys a1 (env IDEMGATE_ATTEST_KEY_A1) verify-only, a2 (env IDEMGATE_ATTEST_KEY_A2) active")

	// Without the section, jwks says so.
	require.ErrorContains(t, Main(t.Context(), []string{"jwks", "--config", writeConfig(t, "")}, &out, &errOut), "no attestation section")
	// The fingerprint's key is refused as an attestation key.
	t.Setenv("IDEMGATE_KEY_K1", testKey)
	same := writeConfig(t, `attestation: {active_key: a1, keys: {a1: {env: IDEMGATE_KEY_K1}}}`)
	err = Main(t.Context(), []string{"check-config", "--config", same}, &out, &errOut)
	require.ErrorContains(t, err, "1 problem")
	require.Contains(t, errOut.String(), "is also a fingerprint signing key")
}

// serve publishes the JWKS on the admin listener, and the confirm it lets
// through carries an attestation those keys verify.
func TestServePublishesTheJWKSAndAttests(t *testing.T) {
	s := startServe(t, writeAttestingConfig(t))
	code, body := s.get(t, JWKSPath)
	require.Equal(t, 200, code)
	keys, err := verify.ParseJWKS([]byte(body))
	require.NoError(t, err)

	conn := s.conn(t)
	fp := previewFingerprint(t, conn)
	reply := confirm(t, conn, fp)
	require.Nil(t, reply.GetImmediateResponse())
	set := map[string]string{}
	for _, h := range reply.GetRequestBody().GetResponse().GetHeaderMutation().GetSetHeaders() {
		set[h.GetHeader().GetKey()] = string(h.GetHeader().GetRawValue())
	}
	require.Contains(t, set, "idempotency-attestation")
	v, err := verify.New(verify.Options{Keys: keys})
	require.NoError(t, err)
	doc, err := verify.ParseBody([]byte(fmt.Sprintf(`{"amount":1,"fingerprint":%q}`, fp)))
	require.NoError(t, err)
	c, err := v.Verify(t.Context(), verify.Request{Method: "POST", Path: "/v1/transfers/confirm", Token: set["idempotency-attestation"], IdempotencyKey: set["idempotency-key"], Doc: doc})
	require.NoError(t, err)
	require.Equal(t, set["idempotency-key"], c.Key)

	// Without the section the path is a plain 404.
	plain := startServe(t, writeConfig(t, ""))
	code, _ = plain.get(t, JWKSPath)
	require.Equal(t, 404, code)
}
