package verify_test

import (
	"bytes"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemgate/idemgate/attest"
	"github.com/idemgate/idemgate/attest/verify"
)

const testNow = 1753499100

var transferParams = []verify.Param{{Path: "amount", Type: "decimal"}, {Path: "currency"}, {Path: "payee.account_id"}}

// The "transfer" golden vector's body and hash.
const (
	transferBody = `{"amount":"100.00","currency":"EUR","payee":{"account_id":"DE89370400440532013000","name":"Alice"},"memo":"rent for May"}`
	transferHash = "ef1d1de846e7cec13f224fef3049e9d64077d0d91d31b2f1da64da9a637ec00f"
)

func newSigner(t testing.TB, active string, ids ...string) *attest.Signer {
	t.Helper()
	keys := map[string]ed25519.PrivateKey{}
	for _, id := range ids {
		seed := bytes.Repeat([]byte(id[:1]), attest.SeedBytes)
		keys[id] = ed25519.NewKeyFromSeed(seed)
	}
	s, err := attest.NewSigner(active, keys)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func claims() *verify.Claims {
	return &verify.Claims{
		Version: verify.Version, Issuer: verify.Issuer, Key: "00112233445566778899aabbccddeeff", Scope: "payments.transfer",
		ParamHash: transferHash, Params: transferParams, Method: "POST", Path: "/v1/transfers/confirm",
		Subject: "GpuoOCE9Y_zgyjR5v1l4DQ", Owner: "r1-42", Fence: 1, IssuedAt: testNow, Expiry: testNow + 30,
	}
}

func sign(t testing.TB, s *attest.Signer, c *verify.Claims) string {
	t.Helper()
	tok, err := s.Sign(c)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// upstream is a handler behind the middleware counting executions.
type upstream struct {
	srv        *httptest.Server
	executions atomic.Int64
	lastKey    atomic.Value
}

func newUpstream(t *testing.T, opts verify.Options) *upstream {
	t.Helper()
	if opts.Now == nil {
		opts.Now = func() time.Time { return time.Unix(testNow, 0) }
	}
	opts.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	v, err := verify.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	u := &upstream{}
	u.srv = httptest.NewServer(v.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if c, ok := verify.ClaimsFrom(r.Context()); ok {
			u.lastKey.Store(c.Key)
		}
		if !json.Valid(body) {
			http.Error(w, "the handler did not get the body", http.StatusInternalServerError)
			return
		}
		u.executions.Add(1)
		w.WriteHeader(http.StatusCreated)
	})))
	t.Cleanup(u.srv.Close)
	return u
}

func (u *upstream) do(t *testing.T, method, path, body string, header map[string]string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, u.srv.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestMiddlewareAcceptsTheAttestedRequest(t *testing.T) {
	s := newSigner(t, "a1", "a1")
	keys, err := verify.ParseJWKS(s.JWKS())
	if err != nil {
		t.Fatal(err)
	}
	u := newUpstream(t, verify.Options{Keys: keys})
	tok := sign(t, s, claims())
	// Key order, spacing, escapes, the memo and the decimal's spelling do
	// not change the canonical params.
	same := `{"memo":"other memo","payee":{"name":"Bob","account_id":"DE89370400440532013000"},"currency":"\u0045UR","amount":100}`
	for _, body := range []string{transferBody, same} {
		code, out := u.do(t, "POST", "/v1/transfers/confirm", body, map[string]string{verify.Header: tok, "Idempotency-Key": "00112233445566778899aabbccddeeff"})
		if code != http.StatusCreated {
			t.Fatalf("attested confirm answered %d %s", code, out)
		}
	}
	if got := u.lastKey.Load(); got != "00112233445566778899aabbccddeeff" {
		t.Errorf("ClaimsFrom gave key %v", got)
	}
}

func TestMiddlewareRefusals(t *testing.T) {
	s := newSigner(t, "a1", "a1")
	other := newSigner(t, "b1", "b1")
	keys, _ := verify.ParseJWKS(s.JWKS())
	u := newUpstream(t, verify.Options{Keys: keys})
	good := sign(t, s, claims())
	expired := claims()
	expired.IssuedAt, expired.Expiry = testNow-100, testNow-6 // beyond the 5s leeway
	future := claims()
	future.IssuedAt, future.Expiry = testNow+60, testNow+90
	h := func(tok string) map[string]string { return map[string]string{verify.Header: tok} }
	parts := strings.Split(good, ".")
	for _, tc := range []struct {
		name, method, path, body string
		header                   map[string]string
		reason                   string
	}{
		{"missing", "POST", "/v1/transfers/confirm", transferBody, nil, "attestation_missing"},
		{"wrong method", "PUT", "/v1/transfers/confirm", transferBody, h(good), "attestation_other_request"},
		{"trailing slash", "POST", "/v1/transfers/confirm/", transferBody, h(good), "attestation_other_request"},
		{"other case", "POST", "/v1/Transfers/confirm", transferBody, h(good), "attestation_other_request"},
		{"matrix params", "POST", "/v1/transfers/confirm;x=1", transferBody, h(good), "attestation_other_request"},
		{"query added", "POST", "/v1/transfers/confirm?x=1", transferBody, h(good), "attestation_other_request"},
		{"expired", "POST", "/v1/transfers/confirm", transferBody, h(sign(t, s, expired)), "attestation_expired"},
		{"issued in the future", "POST", "/v1/transfers/confirm", transferBody, h(sign(t, s, future)), "attestation_expired"},
		{"amount differs", "POST", "/v1/transfers/confirm", strings.Replace(transferBody, "100.00", "1000.00", 1), h(good), "attestation_params_differ"},
		{"payee differs", "POST", "/v1/transfers/confirm", strings.Replace(transferBody, "DE89", "DE88", 1), h(good), "attestation_params_differ"},
		{"param dropped", "POST", "/v1/transfers/confirm", `{"amount":"100.00","currency":"EUR"}`, h(good), "attestation_params_differ"},
		{"duplicate key", "POST", "/v1/transfers/confirm", `{"amount":"100.00","amount":"1000.00","currency":"EUR","payee":{"account_id":"DE89370400440532013000"}}`, h(good), "attestation_params_differ"},
		{"other idempotency key", "POST", "/v1/transfers/confirm", transferBody, map[string]string{verify.Header: good, "Idempotency-Key": "ffffffffffffffffffffffffffffffff"}, "attestation_other_request"},
		{"unknown key", "POST", "/v1/transfers/confirm", transferBody, h(sign(t, other, claims())), "attestation_invalid"},
		{"signature of another payload", "POST", "/v1/transfers/confirm", transferBody, h(parts[0] + "." + strings.Split(sign(t, s, expired), ".")[1] + "." + parts[2]), "attestation_invalid"},
		{"alg none", "POST", "/v1/transfers/confirm", transferBody, h("eyJhbGciOiJub25lIiwidHlwIjoiaWRlbWdhdGUtYXR0ZXN0YXRpb24rand0Iiwia2lkIjoiYTEifQ." + parts[1] + "."), "attestation_invalid"},
		{"garbage", "POST", "/v1/transfers/confirm", transferBody, h("not.a.jws"), "attestation_invalid"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, body := u.do(t, tc.method, tc.path, tc.body, tc.header)
			if code != http.StatusForbidden || !strings.Contains(body, tc.reason) {
				t.Fatalf("answered %d %s, want 403 %s", code, body, tc.reason)
			}
		})
	}
	if n := u.executions.Load(); n != 0 {
		t.Fatalf("%d refused requests executed", n)
	}
}

func TestLogOnlyLetsThroughAndLogs(t *testing.T) {
	s := newSigner(t, "a1", "a1")
	keys, _ := verify.ParseJWKS(s.JWKS())
	var logs bytes.Buffer
	v, err := verify.New(verify.Options{Keys: keys, LogOnly: true, Logger: slog.New(slog.NewTextHandler(&logs, nil)),
		Now: func() time.Time { return time.Unix(testNow, 0) }})
	if err != nil {
		t.Fatal(err)
	}
	ran := 0
	h := v.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, ok := verify.ClaimsFrom(r.Context()); ok {
			t.Error("claims for an unattested request")
		}
		ran++
	}))
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("POST", "/v1/transfers/confirm", strings.NewReader(transferBody)))
	if ran != 1 || rec.Code != http.StatusOK {
		t.Fatalf("log-only refused: ran %d, code %d", ran, rec.Code)
	}
	if !strings.Contains(logs.String(), "missing attestation") || !strings.Contains(logs.String(), "log_only=true") {
		t.Fatalf("log-only logged %q", logs.String())
	}
}

func TestMCPGuardsOnlyTheConfirmTool(t *testing.T) {
	s := newSigner(t, "a1", "a1")
	keys, _ := verify.ParseJWKS(s.JWKS())
	u := newUpstream(t, verify.Options{Keys: keys, MCPTools: []string{"transfer_confirm"}})
	c := claims()
	c.Path, c.MCPTool = "/mcp", "transfer_confirm"
	tok := sign(t, s, c)
	args := `{"amount":"100.00","currency":"EUR","payee":{"account_id":"DE89370400440532013000"}}`
	call := func(tool, args, meta string) string {
		m := ""
		if meta != "" {
			m = `,"_meta":{"` + verify.MCPMetaKey + `":"` + meta + `"}`
		}
		return `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"` + tool + `","arguments":` + args + m + `}}`
	}
	for _, tc := range []struct {
		name, body string
		header     map[string]string
		want       int
	}{
		{"tools/list passes", `{"jsonrpc":"2.0","id":1,"method":"tools/list"}`, nil, 201},
		{"preview tool passes", call("transfer_preview", args, ""), nil, 201},
		{"confirm in _meta", call("transfer_confirm", args, tok), nil, 201},
		{"confirm in header", call("transfer_confirm", args, ""), map[string]string{verify.Header: tok}, 201},
		{"confirm without", call("transfer_confirm", args, ""), nil, 403},
		{"confirm, other args", call("transfer_confirm", strings.Replace(args, "100.00", "999", 1), tok), nil, 403},
		{"other tool with this attestation", call("transfer_preview2", args, tok), nil, 201},
		{"header and _meta differ", call("transfer_confirm", args, tok), map[string]string{verify.Header: sign(t, s, claims())}, 403},
		{"batch with a confirm", "[" + call("transfer_confirm", args, tok) + "]", nil, 403},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if code, body := u.do(t, "POST", "/mcp", tc.body, tc.header); code != tc.want {
				t.Fatalf("answered %d %s, want %d", code, body, tc.want)
			}
		})
	}
	// The HTTP attestation does not confirm the MCP tool (tool and path differ).
	if code, _ := u.do(t, "POST", "/mcp", call("transfer_confirm", args, sign(t, s, claims())), nil); code != 403 {
		t.Fatalf("an HTTP confirm's attestation confirmed an MCP call: %d", code)
	}
}

// TestJWKSRotation: a verifier that fetched the JWKS before a new key
// existed accepts the first attestation signed by it (an unknown kid
// refetches), and the old key keeps verifying while it is published.
func TestJWKSRotation(t *testing.T) {
	var current atomic.Pointer[attest.Signer]
	current.Store(newSigner(t, "a1", "a1"))
	var fetches atomic.Int64
	jwks := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fetches.Add(1)
		_, _ = w.Write(current.Load().JWKS())
	}))
	defer jwks.Close()
	now := time.Unix(testNow, 0)
	clock := func() time.Time { return now }
	u := newUpstream(t, verify.Options{JWKSURL: jwks.URL, Now: clock})
	send := func(s *attest.Signer) int {
		code, _ := u.do(t, "POST", "/v1/transfers/confirm", transferBody, map[string]string{verify.Header: sign(t, s, claims())})
		return code
	}
	old := current.Load()
	if send(old) != 201 {
		t.Fatal("a1 refused")
	}
	// Rotate: a2 signs, a1 stays published for the attestations in flight.
	next := newSigner(t, "a2", "a1", "a2")
	current.Store(next)
	now = now.Add(10 * time.Second) // past RefreshMinInterval
	if code := send(next); code != 201 {
		t.Fatalf("the first a2 attestation answered %d", code)
	}
	if code := send(old); code != 201 {
		t.Fatalf("an a1 attestation in flight answered %d after the rotation", code)
	}
	if fetches.Load() != 2 {
		t.Fatalf("%d JWKS fetches, want 2", fetches.Load())
	}
	// An unknown kid does not make every request fetch.
	stranger := newSigner(t, "zz", "zz")
	for range 3 {
		if send(stranger) != 403 {
			t.Fatal("an unknown key verified")
		}
	}
	if fetches.Load() != 2 {
		t.Fatalf("unknown kids fetched the JWKS %d times", fetches.Load()-2)
	}
}

// TestStaleKeySetFailsClosed: while the JWKS cannot be re-fetched, the last
// key set keeps verifying for MaxStale past MaxAge, then every attestation
// is refused as attestation_keys_stale (a withdrawn key must not stay valid
// because the JWKS is unreachable) until a fetch succeeds again; with a
// negative MaxStale the set is dropped right at MaxAge.
func TestStaleKeySetFailsClosed(t *testing.T) {
	s := newSigner(t, "a1", "a1")
	var down atomic.Bool
	jwks := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if down.Load() {
			http.Error(w, "unavailable", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write(s.JWKS())
	}))
	defer jwks.Close()
	for _, tc := range []struct {
		name     string
		maxStale time.Duration
		grace    time.Duration // how long past MaxAge the set still verifies
	}{
		{"default max_stale", 0, time.Minute},
		{"max_stale 20s", 20 * time.Second, 20 * time.Second},
		{"no max_stale", -1, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			down.Store(false)
			now := time.Unix(testNow, 0)
			clock := func() time.Time { return now }
			u := newUpstream(t, verify.Options{JWKSURL: jwks.URL, Now: clock, MaxAge: 5 * time.Minute, MaxStale: tc.maxStale})
			send := func() (int, string) {
				c := claims()
				c.IssuedAt, c.Expiry = now.Unix(), now.Unix()+30
				return u.do(t, "POST", "/v1/transfers/confirm", transferBody, map[string]string{verify.Header: sign(t, s, c)})
			}
			if code, body := send(); code != 201 {
				t.Fatalf("with a fresh key set: %d %s", code, body)
			}
			fetched := now
			down.Store(true)
			if tc.grace > 0 {
				now = fetched.Add(5*time.Minute + tc.grace - time.Second)
				if code, body := send(); code != 201 {
					t.Fatalf("within max_stale: %d %s", code, body)
				}
			}
			now = fetched.Add(5*time.Minute + tc.grace + time.Second)
			code, body := send()
			if code != 403 || !strings.Contains(body, "attestation_keys_stale") {
				t.Fatalf("past max_age + max_stale with the JWKS down: %d %s, want 403 attestation_keys_stale", code, body)
			}
			now = now.Add(time.Minute)
			if code, _ := send(); code != 403 {
				t.Fatalf("a later request with the JWKS still down answered %d", code)
			}
			down.Store(false)
			now = now.Add(10 * time.Second) // past RefreshMinInterval
			if code, body := send(); code != 201 {
				t.Fatalf("after the JWKS is back: %d %s", code, body)
			}
		})
	}
}

// TestStaleKeySetError: Verify names the reason (ErrKeysStale) and how old
// the set is.
func TestStaleKeySetError(t *testing.T) {
	s := newSigner(t, "a1", "a1")
	var down atomic.Bool
	jwks := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if down.Load() {
			http.Error(w, "unavailable", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write(s.JWKS())
	}))
	defer jwks.Close()
	now := time.Unix(testNow, 0)
	v, err := verify.New(verify.Options{JWKSURL: jwks.URL, Now: func() time.Time { return now }, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	// The first verification fetches the set; its claims need not match.
	_, _ = v.Verify(t.Context(), verify.Request{Method: "POST", Path: "/x", Token: sign(t, s, claims())})
	down.Store(true)
	now = now.Add(7 * time.Minute)
	c := claims()
	c.IssuedAt, c.Expiry = now.Unix(), now.Unix()+30
	_, err = v.Verify(t.Context(), verify.Request{Method: "POST", Path: "/v1/transfers/confirm", Token: sign(t, s, c)})
	if !errors.Is(err, verify.ErrKeysStale) || !strings.Contains(err.Error(), "last fetched 7m0s ago") {
		t.Fatalf("got %v, want ErrKeysStale with the set's age", err)
	}
}
