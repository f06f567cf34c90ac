package extproc

import (
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/attest/verify"
	"github.com/idemgate/idemgate/state"
	"github.com/idemgate/idemgate/state/memory"
)

// Attestation keys for the tests (not secrets).
func init() {
	testKeys["A1"] = "YXR0ZXN0LWtleS1hMS1ub3QtYS1zZWNyZXQtMzJieXQ="
	testKeys["A2"] = "YXR0ZXN0LWtleS1hMi1ub3QtYS1zZWNyZXQtMzJieXQ="
}

const attestationYAML = `
attestation: {active_key: a2, ttl: 30s, keys: {a1: {env: A1}, a2: {env: A2}}}
`

func newAttestingEnv(t testing.TB, base string) *env {
	t.Helper()
	e := newEnv(t, nil, nil)
	e.cfg = testConfig(t, base+attestationYAML)
	e.useStore(t, memory.New(memory.Options{Now: e.clock.Now}))
	return e
}

// upstreamVerifies runs what the upstream received through attest/verify's
// middleware (keys from the JWKS idemgate serves, idemgate's clock) and
// returns the status it answers and the claims it let through.
func upstreamVerifies(t testing.TB, e *env, method, path string, res result, mcpTools ...string) (int, *verify.Claims) {
	t.Helper()
	require.True(t, res.upstreamCalled, "idemgate did not forward: %s", res.body)
	keys, err := verify.ParseJWKS(e.cfg.Attestation.Signer.JWKS())
	require.NoError(t, err)
	v, err := verify.New(verify.Options{Keys: keys, MCPTools: mcpTools, Now: e.clock.Now, Leeway: -1,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	req := httptest.NewRequest(method, path, bytes.NewReader(res.upstreamBody))
	for k, val := range res.upstreamHdrs {
		if k[0] != ':' {
			req.Header.Set(k, val)
		}
	}
	var got *verify.Claims
	rec := httptest.NewRecorder()
	v.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got, _ = verify.ClaimsFrom(r.Context())
	})).ServeHTTP(rec, req)
	return rec.Code, got
}

func TestConfirmIsAttested(t *testing.T) {
	e := newAttestingEnv(t, testConfigYAML)
	d := fakeDialer{srv: e.srv}
	fp := preview(t, d, "alice", `100.00`)
	c := e.claimsOf(t, fp, "alice", "payments.transfer")
	p := newPayments()
	res := do(t, d, post("/v1/transfers/confirm", "alice", transferBody(`100.00`, "EUR", "DE89", fp)), p.handle)
	require.Equal(t, 201, res.status)
	code, claims := upstreamVerifies(t, e, "POST", "/v1/transfers/confirm", res)
	require.Equal(t, http.StatusOK, code, "the upstream refused idemgate's own confirm")
	require.NotNil(t, claims)
	now := e.clock.Now().Unix()
	require.Equal(t, verify.Claims{
		Version: 1, Issuer: "idemgate", Key: c.Nonce, Scope: "payments.transfer", ParamHash: c.ParamHash,
		Params: []verify.Param{{Path: "amount", Type: "decimal"}, {Path: "currency"}, {Path: "payee.account_id"}},
		Method: "POST", Path: "/v1/transfers/confirm", Subject: c.SubjectTag, Owner: claims.Owner, Fence: 1,
		IssuedAt: now, Expiry: now + 30,
	}, *claims)
	require.NotEmpty(t, claims.Owner)
	require.Equal(t, c.Nonce, res.upstreamHdrs["idempotency-key"])

	// The client's own attestation header never reaches the upstream as is.
	fp = preview(t, d, "alice", `7`)
	res = do(t, d, post("/v1/transfers/confirm", "alice", transferBody(`7`, "EUR", "DE89", fp), header{"idempotency-attestation", "forged"}), p.handle)
	require.Equal(t, 201, res.status)
	require.NotEqual(t, "forged", res.upstreamHdrs["idempotency-attestation"])

	// The attested request with another amount is refused by the upstream.
	res.upstreamBody = bytes.Replace(res.upstreamBody, []byte(`"amount":7`), []byte(`"amount":70`), 1)
	code, _ = upstreamVerifies(t, e, "POST", "/v1/transfers/confirm", res)
	require.Equal(t, http.StatusForbidden, code)
}

func TestPreviewAndReplayAreNotAttested(t *testing.T) {
	e := newAttestingEnv(t, testConfigYAML)
	d := fakeDialer{srv: e.srv}
	res := do(t, d, post("/v1/transfers/preview", "alice", transferBody(`5`, "EUR", "DE89", "")), previewOK)
	require.True(t, res.upstreamCalled)
	require.NotContains(t, res.upstreamHdrs, "idempotency-attestation", "previews carry none")
	fp := res.json(t)["fingerprint"].(string)
	p := newPayments()
	body := transferBody(`5`, "EUR", "DE89", fp)
	require.Equal(t, 201, do(t, d, post("/v1/transfers/confirm", "alice", body), p.handle).status)
	res = do(t, d, post("/v1/transfers/confirm", "alice", body), neverCalled(t))
	require.Equal(t, "true", res.headers["idempotent-replayed"], "a replay is idemgate's own answer: nothing forwarded, nothing attested")
}

// A takeover's re-send carries a new attestation: same key, the new owner,
// fence 2.
func TestTakeoverIsAttestedWithTheNewFence(t *testing.T) {
	e := newAttestingEnv(t, testConfigYAML)
	d := fakeDialer{srv: e.srv}
	fp := preview(t, d, "alice", `3`)
	c := e.claimsOf(t, fp, "alice", "payments.transfer")
	e.holdRecord(t, c, "payments.transfer", 2*time.Minute)
	e.clock.Advance(2*time.Minute + time.Second)
	res := do(t, d, post("/v1/transfers/confirm", "alice", transferBody(`3`, "EUR", "DE89", fp)), newPayments().handle)
	require.Equal(t, 201, res.status)
	code, claims := upstreamVerifies(t, e, "POST", "/v1/transfers/confirm", res)
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, int64(2), claims.Fence)
	require.Equal(t, c.Nonce, claims.Key)
	require.NotEqual(t, "other-gateway", claims.Owner)
	rec, _ := e.record(t, c.Nonce)
	require.Equal(t, state.Done, rec.State)
}

// Path variables are bound through the attested path; a downstream that
// ignores keys gets the attestation without an Idempotency-Key.
func TestPathParamsAreAttested(t *testing.T) {
	e := newAttestingEnv(t, testConfigYAML)
	d := fakeDialer{srv: e.srv}
	res := do(t, d, post("/v1/accounts/acc-9/payouts/preview", "alice", []byte(`{"amount":3}`)), previewOK)
	fp := res.json(t)["fingerprint"].(string)
	res = do(t, d, post("/v1/accounts/acc-9/payouts/confirm", "alice", []byte(fmt.Sprintf(`{"amount":3.0,"fingerprint":%q}`, fp))), newPayments().handle)
	require.Equal(t, 201, res.status)
	require.NotContains(t, res.upstreamHdrs, "idempotency-key")
	code, claims := upstreamVerifies(t, e, "POST", "/v1/accounts/acc-9/payouts/confirm", res)
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, map[string]string{"account": "acc-9"}, claims.PathVars)
	// The same attestation on another account's path is refused.
	code, _ = upstreamVerifies(t, e, "POST", "/v1/accounts/acc-8/payouts/confirm", res)
	require.Equal(t, http.StatusForbidden, code)
}

func TestMCPConfirmIsAttestedInMeta(t *testing.T) {
	e := newAttestingEnv(t, mcpConfigYAML)
	d := fakeDialer{srv: e.srv}
	up := newMCPServer(false)
	fp := mcpPreview(t, d, up, "alice", `100.00`)
	res := do(t, d, mcpPost("alice", rpc(`2`, "tools/call", callParams("transfer_confirm", transferArgs(`100.00`, fp)))), up.handle)
	require.Nil(t, res.immediate, string(res.body))
	meta := up.lastMeta
	require.Equal(t, res.upstreamHdrs["idempotency-attestation"], meta[verify.MCPMetaKey], "the same attestation in the header and in params._meta")
	require.Equal(t, "p1", meta["progressToken"], "the client's _meta is kept")
	code, claims := upstreamVerifies(t, e, "POST", "/mcp", res, "transfer_confirm")
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, "transfer_confirm", claims.MCPTool)

	// Without the header (a proxy that drops it), _meta alone verifies.
	delete(res.upstreamHdrs, "idempotency-attestation")
	code, _ = upstreamVerifies(t, e, "POST", "/mcp", res, "transfer_confirm")
	require.Equal(t, http.StatusOK, code)
}

// BenchmarkAttestedConfirm is a preview and its executed confirm (memory
// store, in-process ext_proc), without and with attestations: the ratio is
// what signing adds to a confirm's ext_proc work.
func BenchmarkAttestedConfirm(b *testing.B) {
	for _, tc := range []struct{ name, yaml string }{{"off", ""}, {"on", attestationYAML}} {
		b.Run(tc.name, func(b *testing.B) {
			e := newEnv(b, nil, nil)
			e.cfg = testConfig(b, testConfigYAML+tc.yaml)
			e.useStore(b, memory.New(memory.Options{Now: e.clock.Now}))
			d := fakeDialer{srv: e.srv, shareReplies: true}
			p := newPayments()
			b.ReportAllocs()
			for b.Loop() {
				fp := preview(b, d, "alice", `1`)
				if res := do(b, d, post("/v1/transfers/confirm", "alice", transferBody(`1`, "EUR", "DE89", fp)), p.handle); res.status != 201 {
					b.Fatalf("confirm answered %d", res.status)
				}
			}
		})
	}
}
