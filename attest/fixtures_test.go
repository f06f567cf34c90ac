package attest

import (
	"bytes"
	"crypto/ed25519"
	"encoding/json"
	"flag"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/idemgate/idemgate/attest/verify"
)

var update = flag.Bool("update", false, "rewrite testdata/attestations.json")

// fixtureFile holds attestations signed here, the JWKS that verifies them
// and what each verifier (Go, Python, Node) must answer to each request:
// "ok" (the handler ran) or the refusal's error name.
const fixtureFile = "testdata/attestations.json"

type fixture struct {
	Comment []string        `json:"comment"`
	JWKS    json.RawMessage `json:"jwks"`
	Now     int64           `json:"now"`
	Cases   []fixtureCase   `json:"cases"`
}

type fixtureCase struct {
	Name     string            `json:"name"`
	Method   string            `json:"method"`
	Path     string            `json:"path"`
	Headers  map[string]string `json:"headers,omitempty"`
	Body     string            `json:"body"`
	MCPTools []string          `json:"mcp_tools,omitempty"`
	Want     string            `json:"want"`
}

const fixtureNow = 1753499100

func fixtureSigner(t *testing.T, active string, ids ...string) *Signer {
	t.Helper()
	keys := map[string]ed25519.PrivateKey{}
	for _, id := range ids {
		keys[id] = ed25519.NewKeyFromSeed(bytes.Repeat([]byte(id[len(id)-1:]), SeedBytes))
	}
	s, err := NewSigner(active, keys)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func buildFixture(t *testing.T) fixture {
	s := fixtureSigner(t, "a2", "a1", "a2")
	old := fixtureSigner(t, "a1", "a1", "a2")
	stranger := fixtureSigner(t, "z9", "z9")
	sign := func(s *Signer, edit func(c *verify.Claims)) string {
		c := &verify.Claims{
			Version: verify.Version, Issuer: verify.Issuer, Key: "00112233445566778899aabbccddeeff", Scope: "payments.transfer",
			ParamHash: "ef1d1de846e7cec13f224fef3049e9d64077d0d91d31b2f1da64da9a637ec00f",
			Params:    []verify.Param{{Path: "amount", Type: "decimal"}, {Path: "currency"}, {Path: "payee.account_id"}},
			Method:    "POST", Path: "/v1/transfers/confirm", Subject: "GpuoOCE9Y_zgyjR5v1l4DQ", Owner: "r1-7", Fence: 1,
			IssuedAt: fixtureNow, Expiry: fixtureNow + 60,
		}
		if edit != nil {
			edit(c)
		}
		tok, err := s.Sign(c)
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	const body = `{"amount":"100.00","currency":"EUR","payee":{"account_id":"DE89370400440532013000","name":"Alice"},"memo":"rent for May"}`
	const confirm = "/v1/transfers/confirm"
	good := sign(s, nil)
	h := func(tok string) map[string]string {
		return map[string]string{verify.Header: tok, "Idempotency-Key": "00112233445566778899aabbccddeeff"}
	}
	parts := strings.Split(good, ".")
	mcp := sign(s, func(c *verify.Claims) { c.Path, c.MCPTool = "/mcp", "transfer_confirm" })
	call := func(tool, args, meta string) string {
		m := ""
		if meta != "" {
			m = `,"_meta":{"progressToken":"p1","io.idemgate/idempotency-key":"00112233445566778899aabbccddeeff","` + verify.MCPMetaKey + `":"` + meta + `"}`
		}
		return `{"jsonrpc":"2.0","id":"c-1","method":"tools/call","params":{"name":"` + tool + `","arguments":` + args + m + `}}`
	}
	const args = `{"amount":100,"currency":"EUR","payee":{"account_id":"DE89370400440532013000"}}`
	cases := []fixtureCase{
		{Name: "the attested confirm", Method: "POST", Path: confirm, Headers: h(good), Body: body, Want: "ok"},
		{Name: "same params, other spelling", Method: "POST", Path: confirm, Headers: h(good),
			Body: `{ "payee" : {"account_id":"DE89370400440532013000"}, "currency":"\u0045UR", "amount":1e2, "memo":null }`, Want: "ok"},
		{Name: "signed by the verify-only key during a rotation", Method: "POST", Path: confirm, Headers: h(sign(old, nil)), Body: body, Want: "ok"},
		{Name: "no attestation", Method: "POST", Path: confirm, Body: body, Want: "attestation_missing"},
		{Name: "another method", Method: "PUT", Path: confirm, Headers: h(good), Body: body, Want: "attestation_other_request"},
		{Name: "a trailing slash", Method: "POST", Path: confirm + "/", Headers: h(good), Body: body, Want: "attestation_other_request"},
		{Name: "another case", Method: "POST", Path: "/v1/transfers/Confirm", Headers: h(good), Body: body, Want: "attestation_other_request"},
		{Name: "a query added", Method: "POST", Path: confirm + "?via=bypass", Headers: h(good), Body: body, Want: "attestation_other_request"},
		{Name: "expired", Method: "POST", Path: confirm, Headers: h(sign(s, func(c *verify.Claims) { c.IssuedAt, c.Expiry = fixtureNow-120, fixtureNow-60 })), Body: body, Want: "attestation_expired"},
		{Name: "another amount", Method: "POST", Path: confirm, Headers: h(good), Body: strings.Replace(body, `"100.00"`, `"1000.00"`, 1), Want: "attestation_params_differ"},
		{Name: "another payee", Method: "POST", Path: confirm, Headers: h(good), Body: strings.Replace(body, "DE89", "DE88", 1), Want: "attestation_params_differ"},
		{Name: "a duplicate amount", Method: "POST", Path: confirm, Headers: h(good), Body: `{"amount":"100.00","currency":"EUR","payee":{"account_id":"DE89370400440532013000"},"amount":"1000.00"}`, Want: "attestation_params_differ"},
		{Name: "another idempotency key", Method: "POST", Path: confirm, Headers: map[string]string{verify.Header: good, "Idempotency-Key": "ffeeddccbbaa99887766554433221100"}, Body: body, Want: "attestation_other_request"},
		{Name: "an unknown key", Method: "POST", Path: confirm, Headers: h(sign(stranger, nil)), Body: body, Want: "attestation_invalid"},
		{Name: "a forged signature", Method: "POST", Path: confirm, Headers: h(parts[0] + "." + parts[1] + "." + strings.Split(sign(s, func(c *verify.Claims) { c.Fence = 2 }), ".")[2]), Body: body, Want: "attestation_invalid"},
		{Name: "alg none", Method: "POST", Path: confirm, Headers: h("eyJhbGciOiJub25lIiwidHlwIjoiaWRlbWdhdGUtYXR0ZXN0YXRpb24rand0Iiwia2lkIjoiYTIifQ." + parts[1] + "."), Body: body, Want: "attestation_invalid"},
		{Name: "MCP: the attested confirm tool, in params._meta", Method: "POST", Path: "/mcp", Body: call("transfer_confirm", args, mcp), MCPTools: []string{"transfer_confirm"}, Want: "ok"},
		{Name: "MCP: the confirm tool without attestation", Method: "POST", Path: "/mcp", Body: call("transfer_confirm", args, ""), MCPTools: []string{"transfer_confirm"}, Want: "attestation_missing"},
		{Name: "MCP: the confirm tool with other arguments", Method: "POST", Path: "/mcp", Body: call("transfer_confirm", strings.Replace(args, "100", "900", 1), mcp), MCPTools: []string{"transfer_confirm"}, Want: "attestation_params_differ"},
		{Name: "MCP: an HTTP confirm's attestation", Method: "POST", Path: "/mcp", Headers: h(good), Body: call("transfer_confirm", args, ""), MCPTools: []string{"transfer_confirm"}, Want: "attestation_other_request"},
		{Name: "MCP: tools/list needs none", Method: "POST", Path: "/mcp", Body: `{"jsonrpc":"2.0","id":1,"method":"tools/list"}`, MCPTools: []string{"transfer_confirm"}, Want: "ok"},
		{Name: "MCP: the preview tool needs none", Method: "POST", Path: "/mcp", Body: call("transfer_preview", args, ""), MCPTools: []string{"transfer_confirm"}, Want: "ok"},
		{Name: "MCP: a GET (the SSE stream) needs none", Method: "GET", Path: "/mcp", Body: "", MCPTools: []string{"transfer_confirm"}, Want: "ok"},
		{Name: "MCP: a body with a duplicate key (a lenient reader may see the confirm tool)", Method: "POST", Path: "/mcp",
			Body:     `{"jsonrpc":"2.0","id":1,"method":"tools/list","method":"tools/call","params":{"name":"transfer_confirm","arguments":` + args + `}}`,
			MCPTools: []string{"transfer_confirm"}, Want: "attestation_invalid"},
		{Name: "MCP: a batch holding the confirm tool", Method: "POST", Path: "/mcp", Body: "[" + call("transfer_confirm", args, mcp) + "]", MCPTools: []string{"transfer_confirm"}, Want: "attestation_other_request"},
	}
	// A path-variable param: its hash comes from the Go implementation.
	pdoc, _ := verify.ParseBody([]byte(`{"amount":3}`))
	ph, err := verify.ParamHash([]verify.Param{{Path: "path.account"}, {Path: "amount"}}, pdoc, map[string]string{"account": "acc-9"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	payout := sign(s, func(c *verify.Claims) {
		c.Scope, c.Params, c.PathVars, c.ParamHash = "payments.payout", []verify.Param{{Path: "path.account"}, {Path: "amount"}}, map[string]string{"account": "acc-9"}, ph
		c.Path = "/v1/accounts/acc-9/payouts/confirm"
	})
	cases = append(cases,
		fixtureCase{Name: "path variables bound by the path", Method: "POST", Path: "/v1/accounts/acc-9/payouts/confirm", Headers: map[string]string{verify.Header: payout}, Body: `{"amount":3.0}`, Want: "ok"},
		fixtureCase{Name: "path variables: another account", Method: "POST", Path: "/v1/accounts/acc-8/payouts/confirm", Headers: map[string]string{verify.Header: payout}, Body: `{"amount":3.0}`, Want: "attestation_other_request"},
	)
	return fixture{
		Comment: []string{
			"Attestations signed by package attest (Ed25519 seeds of repeated bytes '1', '2', '9': test keys), the JWKS that verifies",
			"them, and what every verifier (Go attest/verify, Python attest/python, Node attest/node) answers each request at `now`",
			"with its default 5 s leeway: ok (the handler ran) or the refusal's error. Rewritten only by",
			"`go test ./attest -run TestFixtures -update`.",
		},
		JWKS: json.RawMessage(s.JWKS()), Now: fixtureNow, Cases: cases,
	}
}

// TestFixtures: the committed cases are what this code signs, and the Go
// verifier answers each as written (the Python and Node verifiers run the
// same file in TestPythonVerifier and TestNodeVerifier).
func TestFixtures(t *testing.T) {
	f := buildFixture(t)
	data, err := json.MarshalIndent(f, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	data = append(data, '\n')
	if *update {
		if err := os.WriteFile(fixtureFile, data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	committed, err := os.ReadFile(fixtureFile)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(committed, data) {
		t.Fatalf("%s is not what this code signs: run go test ./attest -run TestFixtures -update", fixtureFile)
	}
	keys, err := verify.ParseJWKS(f.JWKS)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range f.Cases {
		t.Run(c.Name, func(t *testing.T) {
			v, err := verify.New(verify.Options{Keys: keys, MCPTools: c.MCPTools, Now: func() time.Time { return time.Unix(f.Now, 0) },
				Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
			if err != nil {
				t.Fatal(err)
			}
			req := httptest.NewRequest(c.Method, c.Path, strings.NewReader(c.Body))
			for k, val := range c.Headers {
				req.Header.Set(k, val)
			}
			rec := httptest.NewRecorder()
			v.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "ok") })).ServeHTTP(rec, req)
			got := "ok"
			if rec.Code != http.StatusOK {
				var e struct {
					Error string `json:"error"`
				}
				_ = json.Unmarshal(rec.Body.Bytes(), &e)
				got = e.Error
			}
			if got != c.Want {
				t.Fatalf("answered %d %s, want %s", rec.Code, rec.Body, c.Want)
			}
		})
	}
}
