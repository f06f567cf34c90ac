package istio

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"sigs.k8s.io/yaml"

	"istio.io/istio/pilot/pkg/simulation"
)

// tokenFilters are the generated filters the run leaves out: Istio's RBAC
// reads the request principal that Istio's own istio_authn filter writes
// (which upstream Envoy cannot load, so every request would be denied), and
// without them jwt_authn and the subject strip only decide who the subject
// is. The run sends the subject header jwt_authn would set from a token;
// TestIstioGeneratesTheShippedSidecar checks their order on the chain.
var tokenFilters = map[string]bool{
	"idemgate.strip_subject":       true,
	"envoy.filters.http.jwt_authn": true,
	"envoy.filters.http.rbac":      true,
}

// runBodyOnlyPreview runs the generated inbound chain (but tokenFilters)
// in the pinned Envoy: the idemgate filter, cluster and routes as Istio
// generated them, idemgate behind the cluster and a stand-in payments API
// behind the routes. idemgate serves k8s/istio's idemgate.yaml with its
// previews' fingerprint_header: false, the memory store and this machine's
// addresses. Such a preview skips its response headers and is signed only
// when Envoy sends response.code: a fingerprint in the body is the proof
// that the attribute arrived. The confirm with it then executes once. And
// the same run without response_attributes in the EnvoyFilter fails
// closed: the preview passes unsigned.
func runBodyOnlyPreview(t *testing.T, envoyBin string, objs []object, sim *simulation.Simulation) {
	app := &stubPayments{}
	appAddr := serveHTTP(t, app)
	cfg := idemgateYAML(t, objs)
	subjectHeader, _ := get(cfg, "subject", "header").(string)
	if subjectHeader == "" {
		t.Fatal("the rendered idemgate.yaml names no subject header")
	}
	previews := 0
	for _, op := range list(cfg["operations"]) {
		if p, ok := get(op, "preview").(object); ok {
			p["fingerprint_header"] = false
			previews++
		}
	}
	if previews == 0 {
		t.Fatal("the rendered idemgate.yaml has no preview route")
	}
	grpcPort := freePort(t)
	ig := startIdemgate(t, t.TempDir(), cfg, grpcPort)
	at := map[string]*corev3.Address{"idemgate": loopbackPort(grpcPort), "inbound|8080||": tcpAddress(t, appAddr)}

	hdr := http.Header{http.CanonicalHeaderKey(subjectHeader): {"alice"}}
	quote := map[string]any{"amount": "12.50", "currency": "EUR", "payee": map[string]any{"account_id": "DE89370400440532013000"}}

	base := startInboundEnvoy(t, envoyBin, sim, at)
	pv := post(t, base+"/v1/transfers/preview", quote, hdr)
	fp, _ := pv.json["fingerprint"].(string)
	if pv.status != http.StatusOK || fp == "" {
		t.Fatalf("the body-only preview answered %s: no fingerprint in the body, so response.code did not reach idemgate", pv)
	}
	if h := pv.header.Get("Idempotency-Fingerprint"); h != "" {
		t.Fatalf("the preview carries the Idempotency-Fingerprint header (%s): it is not body-only", h)
	}
	t.Logf("the preview through the generated filter got its fingerprint in the body only")

	confirm := map[string]any{"fingerprint": fp}
	for k, v := range quote {
		confirm[k] = v
	}
	first := post(t, base+"/v1/transfers/confirm", confirm, hdr)
	if first.status != http.StatusOK || first.header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("the confirm with the body-only fingerprint answered %s", first)
	}
	again := post(t, base+"/v1/transfers/confirm", confirm, hdr)
	if again.status != http.StatusOK || again.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("the repeated confirm answered %s, want a replay", again)
	}
	if keys := app.confirmKeys(); len(keys) != 1 || keys[0] == "" {
		t.Fatalf("payments saw confirms with Idempotency-Key %q, want one with a key", keys)
	}

	// The run must be able to fail: the EnvoyFilter without the attribute,
	// through Istio's generator again, and the same idemgate.
	var mutated []object
	for _, o := range render(t, filepath.Join(k8sDir(t), "istio")) {
		if get(o, "kind") == "EnvoyFilter" {
			dropResponseAttributes(t, o)
		}
		mutated = append(mutated, o)
	}
	base = startInboundEnvoy(t, envoyBin, generate(t, mutated), at)
	unsigned := post(t, base+"/v1/transfers/preview", quote, hdr)
	if unsigned.status != http.StatusOK || unsigned.json["fingerprint"] != nil || unsigned.header.Get("Idempotency-Fingerprint") != "" {
		t.Fatalf("without response_attributes the body-only preview answered %s (header %q): want the quote unsigned", unsigned, unsigned.header.Get("Idempotency-Fingerprint"))
	}
	if !strings.Contains(ig.out.String(), "the response.code attribute is missing") {
		t.Fatal("idemgate did not log the missing response.code attribute")
	}
	t.Logf("without response_attributes the same preview passes unsigned, as it must: %s", unsigned)
}

// startInboundEnvoy runs the inbound chain of sim (but tokenFilters) in
// the pinned Envoy on a free loopback port, with the clusters moved as at
// says, and returns its base URL once it is ready.
func startInboundEnvoy(t *testing.T, envoyBin string, sim *simulation.Simulation, at map[string]*corev3.Address) string {
	t.Helper()
	chain, kept, dropped := upstreamChain(t, sim, func(name string) bool { return tokenFilters[name] })
	listenPort, adminPort := freePort(t), freePort(t)
	bs := inboundBootstrap(t, sim, chain, loopbackPort(listenPort), loopbackPort(adminPort), at)
	t.Logf("running the inbound chain %v (left out: %v)", kept, dropped)
	envoy := startProc(t, "envoy", exec.Command(envoyBin, "-c", writeBootstrap(t, bs), "--disable-hot-restart", "--concurrency", "1", "-l", "warning"))
	waitUntil(t, time.Minute, envoy, func() error { return httpOK(fmt.Sprintf("http://127.0.0.1:%d/ready", adminPort)) })
	return fmt.Sprintf("http://127.0.0.1:%d", listenPort)
}

// idemgateYAML is the idemgate.yaml of the rendered idemgate-config
// ConfigMap, decoded.
func idemgateYAML(t *testing.T, objs []object) object {
	t.Helper()
	for _, o := range objs {
		if get(o, "kind") != "ConfigMap" || !strings.HasPrefix(fmt.Sprint(get(o, "metadata", "name")), "idemgate-config") {
			continue
		}
		var cfg object
		if err := yaml.Unmarshal([]byte(fmt.Sprint(get(o, "data", "idemgate.yaml"))), &cfg); err != nil {
			t.Fatalf("the rendered idemgate.yaml: %v", err)
		}
		return cfg
	}
	t.Fatal("no idemgate-config ConfigMap in the rendered k8s/istio")
	return nil
}

// startIdemgate builds cmd/idemgate and serves cfg with gRPC on
// 127.0.0.1:grpcPort, the memory store, a signing key in a file and
// loopback admin and approval listeners.
func startIdemgate(t *testing.T, dir string, cfg object, grpcPort int) *proc {
	t.Helper()
	key := make([]byte, 32)
	for i := range key {
		key[i] = byte(i*5 + 3)
	}
	keyFile := filepath.Join(dir, "k1")
	if err := os.WriteFile(keyFile, []byte(base64.StdEncoding.EncodeToString(key)), 0o600); err != nil {
		t.Fatal(err)
	}
	admin := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	cfg["grpc_listen"] = fmt.Sprintf("127.0.0.1:%d", grpcPort)
	cfg["admin_listen"] = admin
	cfg["approval_listen"] = fmt.Sprintf("127.0.0.1:%d", freePort(t))
	delete(cfg, "approval_tls") // the Secret's files are not here; loopback needs no TLS
	cfg["log"] = object{"level": "info", "format": "text"}
	cfg["drain"] = object{"period": "0s", "timeout": "5s"}
	cfg["signing"] = object{"active_key": "k1", "keys": object{"k1": object{"file": keyFile}}}
	cfg["store"] = object{"timeout": "2s"} // no redis, no postgres: the memory store
	out, err := yaml.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "idemgate.yaml")
	if err := os.WriteFile(path, out, 0o600); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "idemgate")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	build := exec.CommandContext(ctx, "go", "build", "-o", bin, "./cmd/idemgate")
	build.Dir = filepath.Join(k8sDir(t), "..")
	if msg, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/idemgate: %v\n%s", err, msg)
	}
	p := startProc(t, "idemgate", exec.Command(bin, "serve", "--config", path))
	waitUntil(t, time.Minute, p, func() error { return httpOK("http://" + admin + "/readyz") })
	return p
}

// stubPayments stands in for the payments API: a preview gets a quote, a
// confirm executes and records its Idempotency-Key.
type stubPayments struct {
	mu   sync.Mutex
	keys []string
}

func (p *stubPayments) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	w.Header().Set("Content-Type", "application/json")
	switch r.URL.Path {
	case "/v1/transfers/preview":
		_, _ = io.WriteString(w, `{"quote":{"fee":"0.50"}}`)
	case "/v1/transfers/confirm":
		p.mu.Lock()
		p.keys = append(p.keys, r.Header.Get("Idempotency-Key"))
		n := len(p.keys)
		p.mu.Unlock()
		_, _ = fmt.Fprintf(w, `{"transfer_id":"tr_%d","status":"executed"}`, n)
	default:
		http.NotFound(w, r)
	}
}

func (p *stubPayments) confirmKeys() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.keys...)
}

func serveHTTP(t *testing.T, h http.Handler) string {
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

type answer struct {
	status int
	header http.Header
	body   []byte
	json   map[string]any
}

func (a *answer) String() string { return fmt.Sprintf("%d %s", a.status, bytes.TrimSpace(a.body)) }

func post(t *testing.T, url string, body any, extra http.Header) *answer {
	t.Helper()
	b, err := json.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for k, vs := range extra {
		req.Header[k] = vs
	}
	resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	a := &answer{status: resp.StatusCode, header: resp.Header, body: out}
	_ = json.Unmarshal(out, &a.json)
	return a
}

func httpOK(url string) error {
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Get(url)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s answered %d", url, resp.StatusCode)
	}
	return nil
}

func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

func loopbackPort(port int) *corev3.Address { return loopback(uint32(port)) }

func tcpAddress(t *testing.T, hostPort string) *corev3.Address {
	t.Helper()
	a, err := net.ResolveTCPAddr("tcp", hostPort)
	if err != nil {
		t.Fatal(err)
	}
	return &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
		Address: a.IP.String(), PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: uint32(a.Port)},
	}}}
}

// proc is a child process whose output is printed when the test fails.
type proc struct {
	name string
	cmd  *exec.Cmd
	out  syncBuffer
	done chan struct{}
}

func startProc(t *testing.T, name string, cmd *exec.Cmd) *proc {
	t.Helper()
	p := &proc{name: name, cmd: cmd, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = &p.out, &p.out
	// Its own process group; a test binary that dies takes it along.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	go func() { _ = cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(10 * time.Second):
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-p.done
		}
		if t.Failed() {
			t.Logf("--- %s output ---\n%s", name, p.out.String())
		}
	})
	return p
}

// waitUntil polls check until it returns nil, failing the test at timeout
// or when p exits.
func waitUntil(t *testing.T, timeout time.Duration, p *proc, check func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := check()
		if err == nil {
			return
		}
		select {
		case <-p.done:
			t.Fatalf("%s exited: %v\n%s", p.name, err, p.out.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %s: %v", timeout, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
