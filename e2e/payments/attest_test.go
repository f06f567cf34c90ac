package payments

import (
	"bytes"
	"crypto/ed25519"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/idemgate/idemgate/attest"
	"github.com/idemgate/idemgate/attest/verify"
)

func TestAttestedRefusesUnattestedConfirms(t *testing.T) {
	signer, err := attest.NewSigner("a1", map[string]ed25519.PrivateKey{"a1": ed25519.NewKeyFromSeed(bytes.Repeat([]byte{7}, 32))})
	if err != nil {
		t.Fatal(err)
	}
	keys, err := verify.ParseJWKS(signer.JWKS())
	if err != nil {
		t.Fatal(err)
	}
	s := New(Options{})
	h, err := Attested(s, keys, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	defer srv.Close()
	body := `{"amount":"250.00","currency":"EUR","payee":{"account_id":"acct_bob"}}`
	post := func(path, body string, header map[string]string) int {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+path, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		for k, v := range header {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := post("/v1/transfers/preview", body, nil); code != http.StatusOK {
		t.Fatalf("preview answered %d", code)
	}
	if code := post("/v1/transfers/confirm", body, map[string]string{"Idempotency-Key": "k-chosen-by-the-client"}); code != http.StatusForbidden {
		t.Fatalf("an unattested confirm answered %d", code)
	}
	doc, _ := verify.ParseBody([]byte(body))
	params := []verify.Param{{Path: "amount", Type: "decimal"}, {Path: "currency"}, {Path: "payee.account_id"}}
	ph, _ := verify.ParamHash(params, doc, nil, nil)
	now := time.Now().Unix()
	tok, err := signer.Sign(&verify.Claims{Version: 1, Issuer: "idemgate", Key: "00112233445566778899aabbccddeeff", Scope: "payments.transfer",
		ParamHash: ph, Params: params, Method: "POST", Path: "/v1/transfers/confirm", IssuedAt: now, Expiry: now + 30})
	if err != nil {
		t.Fatal(err)
	}
	if code := post("/v1/transfers/confirm", body, map[string]string{"Idempotency-Key": "00112233445566778899aabbccddeeff", verify.Header: tok}); code != http.StatusOK {
		t.Fatalf("an attested confirm answered %d", code)
	}
	if s.Executions() != 1 {
		t.Fatalf("%d executions", s.Executions())
	}
}
