//go:build mesh

// Package envoygateway_test is the Envoy Gateway judge of `make test-mesh`:
// Envoy Gateway standalone reconciles the shipped k8s/envoy-gateway files
// (plus the overlay in overlay_test.go), starts the pinned Envoy with what it
// generated, and real requests go through it to idemgate (tiered store) and
// the demo payments API.
package envoygateway_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/idemgate/idemgate/e2e/demoauth"
	"github.com/idemgate/idemgate/e2e/payments"
	"github.com/idemgate/idemgate/envoy/envoytest"
	"github.com/idemgate/idemgate/internal/testutil"
	"github.com/idemgate/idemgate/k8s/mesh/meshtest"
)

// The fixed ports of Envoy Gateway standalone (xDS 18000, wasm 18002, admin
// 19000, metrics 19001): one judge at a time per machine.
var egFixedPorts = []int{18000, 18002, 19000, 19001}

func TestEnvoyGatewayRunsTheShippedFiles(t *testing.T) {
	egBin := meshtest.Binary(t, "ENVOY_GATEWAY_BIN", "envoy-gateway")
	envoyBin := envoytest.RequireEnvoy(t)
	version, err := envoytest.EnvoyVersion(envoyBin)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range egFixedPorts {
		if err := testutil.WaitForTCP(fmt.Sprintf("127.0.0.1:%d", p), 100*time.Millisecond); err == nil {
			t.Fatalf("port %d is taken: Envoy Gateway standalone needs it (is another judge running?)", p)
		}
	}
	k8s := meshtest.K8sDir(t)
	_, objs := meshtest.Render(t, filepath.Join(k8s, "envoy-gateway"))
	jwksDoc, err := os.ReadFile(filepath.Join(k8s, "envoy-gateway", "securitypolicy-local-jwks.example.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var localJWKS meshtest.Object
	if err := yaml.Unmarshal(jwksDoc, &localJWKS); err != nil {
		t.Fatal(err)
	}

	pay := payments.New(payments.Options{})
	paymentsAddr := serve(t, pay)
	cfg := idemgateConfigOf(t, objs)
	listen, _ := cfg["grpc_listen"].(string)
	shippedSocket, ok := strings.CutPrefix(listen, "unix://")
	if !ok {
		t.Fatalf("the shipped idemgate.yaml listens on %q, want a unix socket (the proxy pods' sidecar)", listen)
	}
	ig := startIdemgate(t, cfg, "")

	gatewayPort := testutil.FreePort(t)
	home := t.TempDir()
	adminFile := filepath.Join(home, "envoy-admin-address")
	resources := standalone(t, objs, localJWKS, version, overlayAddrs{
		gatewayPort: gatewayPort, idemgateSocket: ig.socket, shippedSocket: shippedSocket, payments: paymentsAddr,
		envoyAdminFile: adminFile,
	})
	resourcesDir := filepath.Join(home, "resources")
	if err := os.MkdirAll(resourcesDir, 0o755); err != nil {
		t.Fatal(err)
	}
	resourcesFile := filepath.Join(resourcesDir, "k8s-envoy-gateway.yaml")
	meshtest.WriteYAML(t, resourcesFile, resources)
	linkEnvoy(t, home, envoyBin, version)
	eg := startEnvoyGateway(t, egBin, home, egConfig(resourcesDir, home))

	c := &client{base: fmt.Sprintf("http://127.0.0.1:%d", gatewayPort), http: &http.Client{Timeout: 30 * time.Second}}
	alice, bob := c.as(t, "alice"), c.as(t, "bob")
	// The Gateway is up once the guarded route asks for a token.
	waitFor(t, 4*time.Minute, eg, func() error {
		r, err := c.post("/v1/transfers/preview", "", transfer("1.00"), nil)
		if err != nil {
			return err
		}
		if r.status != http.StatusUnauthorized {
			return fmt.Errorf("preview without a token answered %d, want 401", r.status)
		}
		return nil
	})

	// Envoy Gateway wrote the ext_proc cluster on a pipe address, idemgate's
	// socket: the only way idemgate can be reached here (it has no TCP
	// listener for gRPC), so the streams below went through it.
	t.Run("the ext_proc cluster is idemgate's unix socket", func(t *testing.T) {
		if err := extProcClusterOnPipe(adminFile, ig.socket); err != nil {
			t.Fatal(err)
		}
	})

	// What `idemgate envoy-config` writes for a preview with
	// fingerprint_header: false, translated by Envoy Gateway from the
	// policy's processingMode.response.attributes.
	t.Run("the ext_proc filter asks for response.code", func(t *testing.T) {
		if err := extProcResponseAttributes(adminFile, []string{"response.code"}); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("preview, confirm, replay and status", func(t *testing.T) {
		before := pay.Executions()
		fp := alice.preview(t, transfer("12.50"))
		confirm := with(transfer("12.50"), "fingerprint", fp)
		r := alice.must(t, "/v1/transfers/confirm", confirm, http.StatusOK)
		if r.header.Get("Idempotent-Replayed") != "" {
			t.Fatalf("the first confirm is marked replayed: %s", r)
		}
		again := alice.must(t, "/v1/transfers/confirm", confirm, http.StatusOK)
		if again.header.Get("Idempotent-Replayed") != "true" {
			t.Fatalf("the second confirm is not a replay: %s", again)
		}
		if got := pay.Executions() - before; got != 1 {
			t.Fatalf("payments executed %d transfers, want 1", got)
		}
		st := alice.must(t, "/v1/transfers/status", map[string]any{"fingerprint": fp}, http.StatusOK)
		if st.field("status") != "completed" {
			t.Fatalf("status answered %s, want completed", st)
		}
	})

	t.Run("a confirm without a fingerprint is refused", func(t *testing.T) {
		if err := confirmNeedsFingerprint(alice, pay); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("MCP tools/call is guarded", func(t *testing.T) {
		before := pay.Executions()
		preview := alice.mcp(t, 1, "transfer_preview", transfer("7.00"))
		fp, _ := meshtest.Path(preview, "result", "structuredContent", "fingerprint").(string)
		if fp == "" {
			t.Fatalf("the MCP preview carries no fingerprint: %v", preview)
		}
		bare := alice.mcp(t, 2, "transfer_confirm", transfer("7.00"))
		if st := meshtest.Path(bare, "result", "structuredContent", "status"); st != "fingerprint_required" {
			t.Fatalf("an MCP confirm without a fingerprint answered %v, want fingerprint_required", bare)
		}
		if pay.Executions() != before {
			t.Fatal("an MCP confirm without a fingerprint reached payments")
		}
		args := with(transfer("7.00"), "fingerprint", fp)
		first := alice.mcp(t, 3, "transfer_confirm", args)
		if meshtest.Path(first, "result", "isError") == true {
			t.Fatalf("the MCP confirm failed: %v", first)
		}
		replay := alice.mcp(t, 4, "transfer_confirm", args)
		if meshtest.Path(replay, "result", "_meta", "io.idemgate/replayed") != true {
			t.Fatalf("the second MCP confirm is not a replay: %v", replay)
		}
		if got := pay.Executions() - before; got != 1 {
			t.Fatalf("payments executed %d MCP transfers, want 1", got)
		}
	})

	t.Run("a spoofed subject header is removed before the JWT sets it", func(t *testing.T) {
		fp := alice.preview(t, transfer("3.00"))
		spoof := http.Header{"X-Idemgate-Subject": {"alice"}}
		r := bob.do(t, "/v1/transfers/confirm", with(transfer("3.00"), "fingerprint", fp), spoof)
		if r.status != http.StatusForbidden || r.field("status") != "fingerprint_subject_mismatch" {
			t.Fatalf("bob's confirm of alice's fingerprint, claiming to be alice, answered %s; want 403 fingerprint_subject_mismatch", r)
		}
	})

	t.Run("no token or a bad token gets 401", func(t *testing.T) {
		for name, token := range map[string]string{"none": "", "bad": alice.token[:len(alice.token)-4] + "AAAA", "expired": mint(t, "alice", -10*time.Minute)} {
			for _, path := range []string{"/v1/transfers/preview", "/v1/transfers/confirm", "/v1/transfers/status", "/mcp"} {
				r, err := c.post(path, token, transfer("1.00"), nil)
				if err != nil {
					t.Fatal(err)
				}
				if r.status != http.StatusUnauthorized {
					t.Fatalf("%s token on %s answered %s, want 401", name, path, r)
				}
			}
		}
	})

	t.Run("near-miss spellings and other methods get 404 and reach nothing", func(t *testing.T) {
		before := pay.Stats()
		for _, req := range []struct{ method, path string }{
			{"POST", "/v1/transfers/confirm/"}, {"POST", "/v1/Transfers/Confirm"}, {"POST", "/v1/transfers/confirm;x"},
			{"POST", "/v1/transfers/confirm.json"}, {"PUT", "/v1/transfers/confirm"}, {"PATCH", "/v1/transfers/preview"},
			{"POST", "/MCP"}, {"POST", "/mcp/"},
		} {
			r := alice.request(t, req.method, req.path, with(transfer("1.00"), "fingerprint", "x"), nil)
			if r.status != http.StatusNotFound || !strings.Contains(string(r.body), "not found") {
				t.Fatalf("%s %s answered %s, want the near-miss 404", req.method, req.path, r)
			}
		}
		if after := pay.Stats(); after.Executions != before.Executions {
			t.Fatalf("a near-miss spelling executed a transfer")
		}
	})

	// The judge must be able to fail: without the EnvoyExtensionPolicy (no
	// ext_proc filter) its core check lets a confirm without a fingerprint
	// through to payments. Envoy Gateway watches the resources file, so the
	// policy is taken out and put back while everything runs.
	t.Run("without the ext_proc filter the judge fails", func(t *testing.T) {
		meshtest.WriteYAML(t, resourcesFile, without(resources, extensionPolicyKind))
		waitFor(t, 2*time.Minute, eg, func() error {
			err := confirmNeedsFingerprint(alice, pay)
			if err == nil || !strings.Contains(err.Error(), "executed") {
				return fmt.Errorf("a confirm without a fingerprint is still refused (%v)", err)
			}
			t.Logf("the core check fails as it must: %v", err)
			return nil
		})
		meshtest.WriteYAML(t, resourcesFile, resources)
		waitFor(t, 2*time.Minute, eg, func() error { return confirmNeedsFingerprint(alice, pay) })
	})

	t.Run("idemgate down: guarded routes fail closed, others still work", func(t *testing.T) {
		fp := alice.preview(t, transfer("4.00"))
		before := pay.Executions()
		ig.kill()
		r := alice.do(t, "/v1/transfers/confirm", with(transfer("4.00"), "fingerprint", fp), nil)
		if r.status < 500 {
			t.Fatalf("a confirm with idemgate down answered %s, want a 5xx", r)
		}
		if pay.Executions() != before {
			t.Fatal("a confirm reached payments with idemgate down")
		}
		// jwt_authn's local 401 still opens a (response-only) ext_proc
		// stream, so with idemgate down a token-less call fails closed too.
		{
			noToken, err := c.post("/v1/transfers/confirm", "", transfer("4.00"), nil)
			if err != nil {
				t.Fatal(err)
			}
			if noToken.status < 400 {
				t.Fatalf("a token-less confirm with idemgate down answered %s", noToken)
			}
			t.Logf("a token-less confirm with idemgate down answers %d", noToken.status)
		}
		// The unguarded HTTPRoute opens no ext_proc stream, so it does not care.
		other := alice.request(t, "GET", "/v1/transfers/by-key/none", nil, nil)
		if other.status != http.StatusNotFound || strings.Contains(string(other.body), "use the exact operation path") {
			t.Fatalf("an unguarded path answered %s with idemgate down, want payments' own 404", other)
		}
	})

	// preview.fingerprint_header: false, switched on in idemgate.yaml alone
	// (the shipped file keeps the default): an idemgate with that config
	// takes the socket of the one stopped above. Its preview skips the
	// response headers and reads the upstream's status from the response.code
	// attribute the policy asks for, so a fingerprint in the body and a
	// confirm with it show that the attribute arrives through Envoy Gateway.
	t.Run("a body-only preview is signed from response.code and confirms", func(t *testing.T) {
		ig.kill() // stopped above; never two on one socket
		bodyOnly := idemgateConfigOf(t, objs)
		bodyOnlyPreviews(t, bodyOnly)
		bodyOnlyIG := startIdemgate(t, bodyOnly, ig.socket)
		var fp string
		// Until Envoy's health check finds idemgate back.
		waitFor(t, time.Minute, eg, func() error {
			var err error
			fp, err = alice.bodyOnlyPreview(transfer("6.00"))
			return err
		})
		before := pay.Executions()
		confirm := with(transfer("6.00"), "fingerprint", fp)
		if r := alice.must(t, "/v1/transfers/confirm", confirm, http.StatusOK); r.header.Get("Idempotent-Replayed") != "" {
			t.Fatalf("the first confirm is marked replayed: %s", r)
		}
		if r := alice.must(t, "/v1/transfers/confirm", confirm, http.StatusOK); r.header.Get("Idempotent-Replayed") != "true" {
			t.Fatalf("the second confirm is not a replay: %s", r)
		}
		if got := pay.Executions() - before; got != 1 {
			t.Fatalf("payments executed %d transfers, want 1", got)
		}

		// Without the attribute in the policy the same preview fails closed:
		// it passes unsigned, so no confirm can follow. Put back, it is
		// signed again. The attribute is in the listener's ext_proc filter:
		// Envoy replaces the listener and lets connections to the old one
		// drain, so each try opens a new connection.
		meshtest.WriteYAML(t, resourcesFile, withoutResponseAttributes(t, resources))
		waitFor(t, 2*time.Minute, eg, func() error {
			if err := extProcResponseAttributes(adminFile, nil); err != nil {
				return err
			}
			c.http.CloseIdleConnections()
			r, err := c.post("/v1/transfers/preview", alice.token, transfer("6.00"), nil)
			if err != nil {
				return err
			}
			if r.status != http.StatusOK || r.field("fingerprint") != "" || r.header.Get("Idempotency-Fingerprint") != "" {
				return fmt.Errorf("without response.code the body-only preview answered %s, want the quote unsigned", r)
			}
			t.Logf("without the attribute the body-only preview passes unsigned, as it must: %s", r)
			return nil
		})
		waitFor(t, 10*time.Second, bodyOnlyIG.logged, func() error {
			if !strings.Contains(bodyOnlyIG.out.String(), "the response.code attribute is missing") {
				return errors.New("idemgate did not log the missing response.code attribute")
			}
			return nil
		})
		meshtest.WriteYAML(t, resourcesFile, resources)
		waitFor(t, 2*time.Minute, eg, func() error {
			if err := extProcResponseAttributes(adminFile, []string{"response.code"}); err != nil {
				return err
			}
			c.http.CloseIdleConnections()
			_, err := alice.bodyOnlyPreview(transfer("6.00"))
			return err
		})
	})
}

// bodyOnlyPreviews sets fingerprint_header: false on every preview route
// of the idemgate config cfg.
func bodyOnlyPreviews(t *testing.T, cfg map[string]any) {
	t.Helper()
	n := 0
	for _, op := range asList(cfg["operations"]) {
		if p, ok := meshtest.Path(op, "preview").(map[string]any); ok {
			p["fingerprint_header"] = false
			n++
		}
	}
	if n == 0 {
		t.Fatal("the shipped idemgate.yaml has no preview route")
	}
}

// withoutResponseAttributes is a copy of the standalone resources whose
// EnvoyExtensionPolicy asks for no response attribute.
func withoutResponseAttributes(t *testing.T, resources []meshtest.Object) []meshtest.Object {
	t.Helper()
	var out []meshtest.Object
	dropped := 0
	for _, o := range resources {
		b, err := yaml.Marshal(o)
		if err != nil {
			t.Fatal(err)
		}
		var c meshtest.Object
		if err := yaml.Unmarshal(b, &c); err != nil {
			t.Fatal(err)
		}
		if meshtest.Kind(c) == extensionPolicyKind {
			for _, ext := range asList(meshtest.Path(c, "spec", "extProc")) {
				if r, ok := meshtest.Path(ext, "processingMode", "response").(map[string]any); ok && r["attributes"] != nil {
					delete(r, "attributes")
					dropped++
				}
			}
		}
		out = append(out, c)
	}
	if dropped == 0 {
		t.Fatal("the shipped EnvoyExtensionPolicy asks for no response attribute to drop")
	}
	return out
}

// confirmNeedsFingerprint is the judge's core check: a confirm that carries
// no fingerprint, only an Idempotency-Key of the agent's choosing, is
// refused by idemgate and never reaches payments.
func confirmNeedsFingerprint(a *agent, pay *payments.Server) error {
	before := pay.Executions()
	key := http.Header{"Idempotency-Key": {fmt.Sprintf("agent-chosen-%d", time.Now().UnixNano())}}
	r, err := a.c.post("/v1/transfers/confirm", a.token, transfer("9.99"), key)
	if err != nil {
		return err
	}
	if n := pay.Executions() - before; n != 0 {
		return fmt.Errorf("a confirm without a fingerprint executed %d transfer(s) (answer %s)", n, r)
	}
	if r.status != http.StatusBadRequest || r.field("status") != "fingerprint_required" {
		return fmt.Errorf("a confirm without a fingerprint answered %s, want 400 fingerprint_required", r)
	}
	return nil
}

func transfer(amount string) map[string]any {
	return map[string]any{"amount": amount, "currency": "EUR", "payee": map[string]any{"account_id": "DE89370400440532013000"}}
}

func with(m map[string]any, k string, v any) map[string]any {
	out := map[string]any{k: v}
	for key, val := range m {
		out[key] = val
	}
	return out
}

func mint(t *testing.T, user string, ttl time.Duration) string {
	t.Helper()
	tok, err := demoauth.Mint(user, ttl, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// --- HTTP ---------------------------------------------------------------

type client struct {
	base string
	http *http.Client
}

type response struct {
	status int
	header http.Header
	body   []byte
}

func (r *response) String() string {
	return fmt.Sprintf("%d %s", r.status, bytes.TrimSpace(r.body))
}

// field reads a top-level string of a JSON body ("" if none).
func (r *response) field(name string) string {
	var m map[string]any
	_ = json.Unmarshal(r.body, &m)
	s, _ := m[name].(string)
	return s
}

func (c *client) request(method, path, token string, body any, extra http.Header) (*response, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, c.base+path, rd)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	for k, vs := range extra {
		req.Header[k] = vs
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	return &response{status: resp.StatusCode, header: resp.Header, body: b}, nil
}

func (c *client) post(path, token string, body any, extra http.Header) (*response, error) {
	return c.request(http.MethodPost, path, token, body, extra)
}

type agent struct {
	c     *client
	token string
}

func (c *client) as(t *testing.T, user string) *agent {
	return &agent{c: c, token: mint(t, user, time.Hour)}
}

func (a *agent) request(t *testing.T, method, path string, body any, extra http.Header) *response {
	t.Helper()
	r, err := a.c.request(method, path, a.token, body, extra)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	return r
}

func (a *agent) do(t *testing.T, path string, body any, extra http.Header) *response {
	t.Helper()
	return a.request(t, http.MethodPost, path, body, extra)
}

func (a *agent) must(t *testing.T, path string, body any, status int) *response {
	t.Helper()
	r := a.do(t, path, body, nil)
	if r.status != status {
		t.Fatalf("POST %s answered %s, want %d", path, r, status)
	}
	return r
}

func (a *agent) preview(t *testing.T, body map[string]any) string {
	t.Helper()
	r := a.must(t, "/v1/transfers/preview", body, http.StatusOK)
	fp := r.field("fingerprint")
	if fp == "" || r.header.Get("Idempotency-Fingerprint") != fp {
		t.Fatalf("the preview carries no fingerprint: %s", r)
	}
	return fp
}

// bodyOnlyPreview is a preview whose fingerprint must be in the body only
// (preview.fingerprint_header: false); it returns the fingerprint.
func (a *agent) bodyOnlyPreview(body map[string]any) (string, error) {
	r, err := a.c.post("/v1/transfers/preview", a.token, body, nil)
	if err != nil {
		return "", err
	}
	fp := r.field("fingerprint")
	switch {
	case r.status != http.StatusOK || fp == "":
		return "", fmt.Errorf("the body-only preview answered %s: no fingerprint in the body", r)
	case r.header.Get("Idempotency-Fingerprint") != "":
		return "", fmt.Errorf("the preview carries the Idempotency-Fingerprint header: it is not body-only (%s)", r)
	}
	return fp, nil
}

// mcp sends one tools/call (protocol 2025-11-25: no Mcp-Method headers, so
// idemgate reads the method and tool from the body) and decodes the answer.
func (a *agent) mcp(t *testing.T, id int, tool string, args map[string]any) map[string]any {
	t.Helper()
	body := map[string]any{"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": map[string]any{"name": tool, "arguments": args}}
	h := http.Header{"Accept": {"application/json, text/event-stream"}, "Mcp-Protocol-Version": {"2025-11-25"}}
	r := a.do(t, "/mcp", body, h)
	if r.status != http.StatusOK {
		t.Fatalf("tools/call %s answered %s", tool, r)
	}
	var out map[string]any
	if err := json.Unmarshal(r.body, &out); err != nil {
		t.Fatalf("tools/call %s: the answer is not JSON: %s", tool, r)
	}
	return out
}

// --- processes ----------------------------------------------------------

// serve runs h on a loopback port until the test ends.
func serve(t *testing.T, h http.Handler) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return ln.Addr().String()
}

// logged is a child process whose output is kept and printed only when
// the test fails.
type logged struct {
	name string
	cmd  *exec.Cmd
	out  testutil.SyncBuffer
	once sync.Once
	done chan struct{}
}

func start(t *testing.T, name string, cmd *exec.Cmd) *logged {
	t.Helper()
	p := &logged{name: name, cmd: cmd, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = &p.out, &p.out
	// Its own process group, so a stop reaches Envoy Gateway's Envoy too;
	// Pdeathsig: a test binary that dies takes it along.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	go func() { _ = cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		p.stop()
		if t.Failed() {
			t.Logf("--- %s output ---\n%s", name, p.out.String())
		}
	})
	return p
}

// stop ends the process group: SIGTERM, then SIGKILL after 10s.
func (p *logged) stop() {
	p.once.Do(func() {
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(10 * time.Second):
			_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
			<-p.done
		}
	})
}

func (p *logged) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

func startEnvoyGateway(t *testing.T, bin, home string, config []byte) *logged {
	t.Helper()
	path := filepath.Join(home, "envoy-gateway.yaml")
	if err := os.WriteFile(path, config, 0o600); err != nil {
		t.Fatal(err)
	}
	// The xDS server's and Envoy's certificates, under configHome (the
	// standalone quickstart's `certgen --local`).
	if msg, err := exec.Command(bin, "certgen", "--local", "--config-home", filepath.Join(home, "config")).CombinedOutput(); err != nil {
		t.Fatalf("envoy-gateway certgen --local: %v\n%s", err, msg)
	}
	return start(t, "envoy-gateway", exec.Command(bin, "server", "--config-path", path))
}

// waitFor polls check until it returns nil, failing the test at timeout or
// when p exits.
func waitFor(t *testing.T, timeout time.Duration, p *logged, check func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := check()
		if err == nil {
			return
		}
		if p.exited() {
			t.Fatalf("%s exited: %v", p.name, err)
		}
		if strings.Contains(p.out.String(), "failed to run envoy") {
			t.Fatalf("%s could not start Envoy: %v", p.name, err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %s: %v", timeout, err)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

type idemgate struct {
	*logged
	socket string // gRPC's unix socket
}

func (g *idemgate) kill() { g.stop() }

// idemgateConfigOf takes the idemgate.yaml shipped in the rendered
// ConfigMap and changes only where things are on this machine: listeners on
// free loopback ports, the signing key in a file, the test's own Redis and
// database (tiered store), text logs.
func idemgateConfigOf(t *testing.T, objs []meshtest.Object) map[string]any {
	t.Helper()
	for _, o := range objs {
		if meshtest.Kind(o) != "ConfigMap" || !strings.HasPrefix(meshtest.Name(o), "idemgate-config") {
			continue
		}
		raw, _ := meshtest.Path(o, "data", "idemgate.yaml").(string)
		var cfg map[string]any
		if err := yaml.Unmarshal([]byte(raw), &cfg); err != nil {
			t.Fatalf("the rendered idemgate.yaml: %v", err)
		}
		return cfg
	}
	t.Fatal("no idemgate-config ConfigMap in the rendered k8s/envoy-gateway")
	return nil
}

// startIdemgate serves cfg, changed by idemgateConfigOf's rule, with gRPC
// on the unix socket at socket ("": a new one in a test directory).
func startIdemgate(t *testing.T, cfg map[string]any, socket string) *idemgate {
	t.Helper()
	dir := t.TempDir()
	redis := testutil.StartRedis(t)
	dsn := testutil.CreateDatabase(t)
	// As in the proxy pod: gRPC on a unix socket only (here in a test
	// directory: the pod's emptyDir path does not exist on this machine).
	if socket == "" {
		socket = filepath.Join(dir, "extproc.sock")
	}
	admin := fmt.Sprintf("127.0.0.1:%d", testutil.FreePort(t))
	key := make([]byte, 32)
	for i := range key {
		key[i] = byte(i*7 + 1)
	}
	keyFile := filepath.Join(dir, "k1")
	if err := os.WriteFile(keyFile, []byte(base64.StdEncoding.EncodeToString(key)), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg["grpc_listen"], cfg["admin_listen"] = "unix://"+socket, admin
	// The shipped :9091 would bind every interface and may be taken here.
	cfg["approval_listen"] = fmt.Sprintf("127.0.0.1:%d", testutil.FreePort(t))
	// The Secret's files are not on this machine; on loopback it needs no TLS.
	delete(cfg, "approval_tls")
	cfg["log"] = map[string]any{"level": "info", "format": "text"}
	cfg["drain"] = map[string]any{"period": "0s", "timeout": "5s"}
	meshtest.SetPath(cfg, map[string]any{"k1": map[string]any{"file": keyFile}}, "signing", "keys")
	r, _ := meshtest.Path(cfg, "store", "redis").(map[string]any)
	if r == nil || meshtest.Path(cfg, "store", "postgres") == nil {
		t.Fatal("the shipped idemgate.yaml should configure Redis and PostgreSQL (the tiered store)")
	}
	r["addrs"] = []any{redis.Addr}
	delete(r, "password_env") // the test's Redis has no password
	// Generous for a loaded 2-core machine; the shipped 50ms/250ms are for production.
	r["timeout"] = "500ms"
	meshtest.SetPath(cfg, "2s", "store", "timeout")
	out, err := yaml.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "idemgate.yaml")
	if err := os.WriteFile(path, out, 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(idemgateBinary(t), "serve", "--config", path)
	postgresEnv, _ := meshtest.Path(cfg, "store", "postgres", "dsn_env").(string)
	cmd.Env = append(os.Environ(), postgresEnv+"="+dsn)
	g := &idemgate{logged: start(t, "idemgate", cmd), socket: socket}
	waitFor(t, time.Minute, g.logged, func() error {
		resp, err := http.Get("http://" + admin + "/readyz")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("/readyz answered %d", resp.StatusCode)
		}
		return nil
	})
	return g
}

// idemgateBuild is cmd/idemgate, built once per test binary.
var idemgateBuild struct {
	once sync.Once
	path string
	err  error
}

func idemgateBinary(t *testing.T) string {
	t.Helper()
	idemgateBuild.once.Do(func() {
		dir, err := os.MkdirTemp("", "idemgate-judge-")
		if err != nil {
			idemgateBuild.err = err
			return
		}
		// The first caller is the judge itself, which outlives its subtests.
		t.Cleanup(func() { _ = os.RemoveAll(dir) })
		bin := filepath.Join(dir, "idemgate")
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		if msg, err := exec.CommandContext(ctx, "go", "build", "-o", bin, "github.com/idemgate/idemgate/cmd/idemgate").CombinedOutput(); err != nil {
			idemgateBuild.err = fmt.Errorf("go build cmd/idemgate: %w\n%s", err, msg)
			return
		}
		idemgateBuild.path = bin
	})
	if idemgateBuild.err != nil {
		t.Fatal(idemgateBuild.err)
	}
	return idemgateBuild.path
}

// extProcResponseAttributes reads the active listeners of the Envoy that
// Envoy Gateway runs (its admin address is in adminFile; a listener Envoy
// replaced drains beside them for a while) and checks that they hold
// exactly one ext_proc filter and that the filter's response_attributes
// are want.
func extProcResponseAttributes(adminFile string, want []string) error {
	body, err := configDump(adminFile, "resource=dynamic_listeners")
	if err != nil {
		return err
	}
	var dump struct {
		Configs []struct {
			ActiveState any `json:"active_state"`
		} `json:"configs"`
	}
	if err := json.Unmarshal(body, &dump); err != nil {
		return fmt.Errorf("config_dump: %w", err)
	}
	const extProcType = "type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor"
	var found [][]string
	var walk func(v any)
	walk = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			if v["@type"] == extProcType {
				var attrs []string
				for _, a := range asList(v["response_attributes"]) {
					attrs = append(attrs, fmt.Sprint(a))
				}
				found = append(found, attrs)
			}
			for _, e := range v {
				walk(e)
			}
		case []any:
			for _, e := range v {
				walk(e)
			}
		}
	}
	for _, l := range dump.Configs {
		walk(l.ActiveState)
	}
	if len(found) != 1 {
		return fmt.Errorf("want one ext_proc filter in Envoy's active listeners, found %d", len(found))
	}
	if !slices.Equal(found[0], want) {
		return fmt.Errorf("the ext_proc filter Envoy runs has response_attributes %v, want %v", found[0], want)
	}
	return nil
}

// extProcClusterOnPipe reads the endpoints of the Envoy that Envoy Gateway
// runs (its admin address is in adminFile; Envoy Gateway sends endpoints
// over EDS) and checks that the one ext_proc cluster's only endpoint is a
// pipe address at socket.
func extProcClusterOnPipe(adminFile, socket string) error {
	body, err := configDump(adminFile, "resource=dynamic_endpoint_configs&include_eds")
	if err != nil {
		return err
	}
	var dump struct {
		Configs []struct {
			EndpointConfig struct {
				ClusterName string `json:"cluster_name"`
				Endpoints   []struct {
					LBEndpoints []struct {
						Endpoint struct {
							Address struct {
								Pipe *struct {
									Path string `json:"path"`
								} `json:"pipe"`
								SocketAddress *struct {
									Address   string `json:"address"`
									PortValue int    `json:"port_value"`
								} `json:"socket_address"`
							} `json:"address"`
						} `json:"endpoint"`
					} `json:"lb_endpoints"`
				} `json:"endpoints"`
			} `json:"endpoint_config"`
		} `json:"configs"`
	}
	if err := json.Unmarshal(body, &dump); err != nil {
		return fmt.Errorf("config_dump: %w", err)
	}
	var extProc []string
	for _, c := range dump.Configs {
		name := c.EndpointConfig.ClusterName
		if !strings.Contains(name, "extproc") {
			continue
		}
		extProc = append(extProc, name)
		var eps []string
		for _, e := range c.EndpointConfig.Endpoints {
			for _, lb := range e.LBEndpoints {
				switch a := lb.Endpoint.Address; {
				case a.Pipe != nil:
					eps = append(eps, "pipe:"+a.Pipe.Path)
				case a.SocketAddress != nil:
					eps = append(eps, fmt.Sprintf("tcp:%s:%d", a.SocketAddress.Address, a.SocketAddress.PortValue))
				}
			}
		}
		if len(eps) != 1 || eps[0] != "pipe:"+socket {
			return fmt.Errorf("ext_proc cluster %s has endpoints %v, want only pipe:%s", name, eps, socket)
		}
	}
	if len(extProc) != 1 {
		return fmt.Errorf("want one ext_proc cluster, Envoy has %v", extProc)
	}
	return nil
}

// configDump reads Envoy's /config_dump?query from the admin address Envoy
// wrote to adminFile.
func configDump(adminFile, query string) ([]byte, error) {
	admin, err := os.ReadFile(adminFile)
	if err != nil {
		return nil, fmt.Errorf("Envoy's admin address: %w", err)
	}
	resp, err := http.Get("http://" + strings.TrimSpace(string(admin)) + "/config_dump?" + query)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("config_dump answered %d: %s", resp.StatusCode, body)
	}
	return body, nil
}
