package e2e

import (
	"bufio"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"
	"sigs.k8s.io/yaml"

	"github.com/idemgate/idemgate/attest"
	"github.com/idemgate/idemgate/attest/verify"
	"github.com/idemgate/idemgate/e2e/internal/stack"
	"github.com/idemgate/idemgate/e2e/payments"
	"github.com/idemgate/idemgate/envoy/envoytest"
)

// guardedAPI is the upstream of the attestation tests: a lenient router
// (any method, any case, a trailing slash, ;params, a .json suffix and
// percent-encoding all reach the confirm handler — Express defaults, older
// Spring, hand-written routers) in front of the demo payments API, with
// attest/verify's middleware on the confirm handler and on the MCP
// endpoint. It counts what the verifier refused.
type guardedAPI struct {
	httpV, mcpV atomic.Pointer[verify.Verifier]
	refused     atomic.Int64

	mu     sync.Mutex
	tokens []string // the attestations the confirm handler accepted
}

// looseTarget is how a lenient router reads a request target.
func looseTarget(target string) string {
	p, _, _ := strings.Cut(target, "?")
	if u, err := url.PathUnescape(p); err == nil {
		p = u
	}
	p, _, _ = strings.Cut(p, ";")
	p = strings.TrimSuffix(strings.TrimSuffix(strings.ToLower(p), "/"), ".json")
	return p
}

func (g *guardedAPI) wrap(next http.Handler) http.Handler {
	// The payments API's own router is strict: hand it the canonical route.
	canonical := func(path string) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			r2 := r.Clone(r.Context())
			r2.Method, r2.URL.Path, r2.URL.RawPath, r2.RequestURI = http.MethodPost, path, "", path
			if tok := r.Header.Get(verify.Header); tok != "" && path == "/v1/transfers/confirm" {
				g.mu.Lock()
				g.tokens = append(g.tokens, tok)
				g.mu.Unlock()
			}
			next.ServeHTTP(w, r2)
		})
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p := looseTarget(r.RequestURI)
		var v *verify.Verifier
		switch p {
		case "/v1/transfers/confirm":
			v = g.httpV.Load()
		case payments.MCPPath:
			v = g.mcpV.Load()
		default:
			if strings.HasPrefix(p, "/v1/transfers/") {
				canonical(p).ServeHTTP(w, r)
				return
			}
			next.ServeHTTP(w, r)
			return
		}
		if v == nil {
			http.Error(w, "verifier not configured yet", http.StatusServiceUnavailable)
			return
		}
		rec := &statusRecorder{ResponseWriter: w}
		v.Middleware(canonical(p)).ServeHTTP(rec, r)
		if rec.status == http.StatusForbidden {
			g.refused.Add(1)
		}
	})
}

// useJWKS points both verifiers at idemgate's admin JWKS.
func (g *guardedAPI) useJWKS(t *testing.T, s *stack.Stack) {
	t.Helper()
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	url := "http://" + s.Idemgate.AdminAddr + "/.well-known/jwks.json"
	for _, v := range []struct {
		p     *atomic.Pointer[verify.Verifier]
		tools []string
	}{{&g.httpV, nil}, {&g.mcpV, []string{payments.MCPConfirmTool}}} {
		ver, err := verify.New(verify.Options{JWKSURL: url, MCPTools: v.tools, RefreshMinInterval: 50 * time.Millisecond, Logger: logger})
		require.NoError(t, err)
		v.p.Store(ver)
	}
}

type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (r *statusRecorder) WriteHeader(code int) {
	if r.status == 0 {
		r.status = code
	}
	r.ResponseWriter.WriteHeader(code)
}

func (r *statusRecorder) Write(b []byte) (int, error) {
	if r.status == 0 {
		r.status = http.StatusOK
	}
	return r.ResponseWriter.Write(b)
}

// attestationKeys writes Ed25519 seeds for ids into files and returns the
// idemgate.yaml attestation section naming them, active first.
func attestationKeys(t *testing.T, active string, ids ...string) map[string]any {
	t.Helper()
	keys := map[string]any{}
	dir := t.TempDir()
	for _, id := range ids {
		seed, err := attest.GenerateSeed()
		require.NoError(t, err)
		path := filepath.Join(dir, id)
		require.NoError(t, os.WriteFile(path, []byte(seed+"\n"), 0o600))
		keys[id] = map[string]any{"file": path}
	}
	return map[string]any{"active_key": active, "ttl": "30s", "keys": keys}
}

// bypassRoutes are a broken route table's mistakes: spellings of the
// confirm and an MCP confirm routed to the upstream with ext_proc disabled
// (idemgate never sees them), placed first in every virtual host.
var bypassRoutes = []map[string]any{
	{"match": map[string]any{"path": "/v1/transfers/confirm/"}},
	{"match": map[string]any{"path": "/V1/Transfers/Confirm"}},
	{"match": map[string]any{"path": "/v1/transfers/confirm.json"}},
	{"match": map[string]any{"prefix": "/v1/transfers/confirm;"}},
	{"match": map[string]any{"path": "/v1/transfers/confirm", "headers": []any{map[string]any{"name": ":method", "string_match": map[string]any{"exact": "PUT"}}}}},
	{"match": map[string]any{"path": "/mcp", "headers": []any{map[string]any{"name": "x-route", "string_match": map[string]any{"exact": "around"}}}}},
}

func breakRoutes(bootstrap []byte) ([]byte, error) {
	var doc map[string]any
	if err := yaml.Unmarshal(bootstrap, &doc); err != nil {
		return nil, err
	}
	edited := 0
	for _, l := range dig[[]any](doc, "static_resources", "listeners") {
		for _, fc := range dig[[]any](l, "filter_chains") {
			for _, f := range dig[[]any](fc, "filters") {
				hcm := dig[map[string]any](f, "typed_config")
				extProc := ""
				for _, hf := range dig[[]any](hcm, "http_filters") {
					// ext_proc, or ext_proc delegated to by the shipped composite.
					if strings.Contains(fmt.Sprint(hf), ".ext_proc.v3.ExternalProcessor") {
						extProc = dig[string](hf, "name")
					}
				}
				if extProc == "" {
					continue
				}
				for _, vh := range dig[[]any](hcm, "route_config", "virtual_hosts") {
					vhm := vh.(map[string]any)
					var routes []any
					for i, b := range bypassRoutes {
						routes = append(routes, map[string]any{
							"name": fmt.Sprintf("bypass_%d", i), "match": b["match"],
							"route": map[string]any{"cluster": envoytest.PaymentsCluster, "timeout": "10s"},
							"typed_per_filter_config": map[string]any{extProc: map[string]any{
								"@type":    "type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExtProcPerRoute",
								"disabled": true,
							}},
						})
					}
					vhm["routes"] = append(routes, dig[[]any](vhm, "routes")...)
					edited++
				}
			}
		}
	}
	if edited == 0 {
		return nil, fmt.Errorf("no virtual host behind an ext_proc filter in the bootstrap")
	}
	return yaml.Marshal(doc)
}

// dig walks maps by keys (snake_case as written in envoy.yaml, or the
// lowerCamelCase a proto round trip renders) and returns the value as T
// (zero when absent).
func dig[T any](v any, keys ...string) T {
	for _, k := range keys {
		m, _ := v.(map[string]any)
		next, ok := m[k]
		if !ok {
			next = m[lowerCamel(k)]
		}
		v = next
	}
	out, _ := v.(T)
	return out
}

func lowerCamel(s string) string {
	parts := strings.Split(s, "_")
	for i := 1; i < len(parts); i++ {
		if parts[i] != "" {
			parts[i] = strings.ToUpper(parts[i][:1]) + parts[i][1:]
		}
	}
	return strings.Join(parts, "")
}

// directPost posts to the upstream's own port: around Envoy and idemgate.
func directPost(t *testing.T, s *stack.Stack, path string, body []byte, header map[string]string) int {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, "http://"+s.UpstreamAddr()+path, strings.NewReader(string(body)))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode
}

// TestUnattestedConfirmsAreRefusedByTheUpstream: with a lenient upstream
// and a broken route table — spellings of the confirm routed around
// idemgate, an MCP confirm routed around it, and requests straight to the
// upstream's port — the upstream itself refuses every confirm idemgate did
// not check: zero executions besides the two legitimate ones.
func TestUnattestedConfirmsAreRefusedByTheUpstream(t *testing.T) {
	api := &guardedAPI{}
	s := startStack(t, stack.Options{
		IdemgateConfig: map[string]any{"attestation": attestationKeys(t, "a1", "a1")},
		WrapUpstream:   api.wrap,
		EditBootstrap:  breakRoutes,
	})
	api.useJWKS(t, s)
	alice := s.Agent("alice")

	// The legitimate confirms, through Envoy and idemgate: executed.
	pv := preview(t, alice, transfer("25.00", "acct_bob", "rent"))
	requireExecuted(t, confirm(t, alice, pv.ConfirmBody()))
	cs := mcpSession(t, s, "alice", "")
	args, _ := mcpPreviewed(t, cs, "30.00")
	res, err := cs.CallTool(t.Context(), &mcp.CallToolParams{Name: payments.MCPConfirmTool, Arguments: args})
	require.NoError(t, err)
	require.False(t, res.IsError, "%+v", structured(t, res))
	require.Equal(t, 2, s.Payments.Executions())
	api.mu.Lock()
	require.Len(t, api.tokens, 1)
	stolen := api.tokens[0] // an attestation as if read from the upstream's logs
	api.mu.Unlock()

	// Each bypass carries a fresh, valid fingerprint: idemgate would have
	// executed it; the routes send it around idemgate instead.
	fresh := func(amount string) []byte {
		b, err := json.Marshal(preview(t, alice, transfer(amount, "acct_bob", "rent")).ConfirmBody())
		require.NoError(t, err)
		return b
	}
	attempts := 0
	refusedThroughEnvoy := func(method, target string, body []byte) {
		t.Helper()
		attempts++
		r, err := alice.Send(method, target, body, stack.WithLength)
		require.NoError(t, err)
		require.Equal(t, http.StatusForbidden, r.StatusCode, "%s %s went around idemgate and was not refused: %s", method, target, r)
		require.Contains(t, string(r.Body), "attestation_", "the upstream's verifier answered")
	}
	for _, target := range []string{"/v1/transfers/confirm/", "/V1/Transfers/Confirm", "/v1/transfers/confirm.json", "/v1/transfers/confirm;x=1"} {
		refusedThroughEnvoy(http.MethodPost, target, fresh("40.00"))
	}
	refusedThroughEnvoy(http.MethodPut, "/v1/transfers/confirm", fresh("41.00"))

	// An MCP confirm routed around idemgate.
	mcpArgs, _ := mcpPreviewed(t, cs, "42.00")
	call, err := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 9, "method": "tools/call",
		"params": map[string]any{"name": payments.MCPConfirmTool, "arguments": mcpArgs}})
	require.NoError(t, err)
	attempts++
	r, err := alice.Raw("/mcp", call, stack.WithLength, "x-route: around", "Accept: application/json, text/event-stream")
	require.NoError(t, err)
	require.Equal(t, http.StatusForbidden, r.StatusCode, "an MCP confirm around idemgate: %s", r)

	// Straight to the upstream's port: no attestation; the stolen one on
	// another amount, on another method's spelling, on the MCP tool.
	body := fresh("43.00")
	for _, h := range []map[string]string{
		nil,
		{verify.Header: stolen},
		{verify.Header: "eyJhbGciOiJub25lIn0.e30."},
	} {
		attempts++
		require.Equal(t, http.StatusForbidden, directPost(t, s, "/v1/transfers/confirm", body, h), "direct with %v", h)
	}
	attempts++
	require.Equal(t, http.StatusForbidden, directPost(t, s, "/v1/transfers/confirm/", pvBody(t, pv), map[string]string{verify.Header: stolen}))
	attempts++
	require.Equal(t, http.StatusForbidden, directPost(t, s, "/mcp", call, map[string]string{"Accept": "application/json, text/event-stream"}))

	require.Equal(t, 2, s.Payments.Executions(), "a confirm that did not pass idemgate executed")
	require.Equal(t, int64(attempts), api.refused.Load())

	// What the attestation cannot tell apart: the stolen one replayed with
	// the very request it attests, within its 30 s. It carries the same
	// idempotency key, so the payments API answers the first execution
	// again (a replay, no second transfer).
	require.Equal(t, http.StatusOK, directPost(t, s, "/v1/transfers/confirm", pvBody(t, pv), map[string]string{verify.Header: stolen, "Idempotency-Key": pv.Nonce}))
	require.Equal(t, 2, s.Payments.Executions())
}

// pvBody is the confirm body idemgate forwarded for pv (the fingerprint is
// not a bound param, so it may stay).
func pvBody(t *testing.T, pv *stack.Preview) []byte {
	t.Helper()
	b, err := json.Marshal(pv.ConfirmBody())
	require.NoError(t, err)
	return b
}

// TestAttestationKeyRotation: the attestation keys rotate in the four
// steps README gives (add the next key verify-only, make it active, keep
// the old one verify-only while its attestations live, drop it), idemgate
// restarted at each step, and the upstream's verifier — which fetched the
// JWKS once at the start — refuses no legitimate confirm.
func TestAttestationKeyRotation(t *testing.T) {
	api := &guardedAPI{}
	section := attestationKeys(t, "a1", "a1", "a2")
	keys := section["keys"].(map[string]any)
	a1, a2 := keys["a1"], keys["a2"]
	section["keys"] = map[string]any{"a1": a1}
	s := startStack(t, stack.Options{IdemgateConfig: map[string]any{"attestation": section}, WrapUpstream: api.wrap})
	api.useJWKS(t, s)
	alice := s.Agent("alice")

	steps := []struct {
		active string
		keys   map[string]any
	}{
		{"a1", map[string]any{"a1": a1}},
		{"a1", map[string]any{"a1": a1, "a2": a2}},
		{"a2", map[string]any{"a1": a1, "a2": a2}},
		{"a2", map[string]any{"a2": a2}},
	}
	for i, step := range steps {
		if i > 0 {
			rewriteAttestation(t, s, step.active, step.keys)
		}
		pv := preview(t, alice, transfer(fmt.Sprintf("%d.00", 10+i), "acct_bob", "rent"))
		requireExecuted(t, confirm(t, alice, pv.ConfirmBody()))
		api.mu.Lock()
		kid := kidOf(t, api.tokens[len(api.tokens)-1])
		api.mu.Unlock()
		require.Equal(t, step.active, kid, "step %d", i)
	}
	require.Equal(t, len(steps), s.Payments.Executions())
	require.Zero(t, api.refused.Load(), "a legitimate confirm was refused during the rotation")
}

// rewriteAttestation restarts idemgate with another attestation section.
func rewriteAttestation(t *testing.T, s *stack.Stack, active string, keys map[string]any) {
	t.Helper()
	s.Idemgate.Stop()
	raw, err := os.ReadFile(s.Idemgate.ConfigPath())
	require.NoError(t, err)
	var doc map[string]any
	require.NoError(t, yaml.Unmarshal(raw, &doc))
	doc["attestation"] = map[string]any{"active_key": active, "ttl": "30s", "keys": keys}
	out, err := yaml.Marshal(doc)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(s.Idemgate.ConfigPath(), out, 0o600))
	require.NoError(t, s.Idemgate.Start(), s.Idemgate.Log())
}

func kidOf(t *testing.T, token string) string {
	t.Helper()
	h, _, _ := strings.Cut(token, ".")
	raw, err := base64.RawURLEncoding.DecodeString(h)
	require.NoError(t, err)
	var hdr struct{ Kid string }
	require.NoError(t, json.Unmarshal(raw, &hdr))
	return hdr.Kid
}

// TestPythonAndNodeVerifiersThroughEnvoy runs the Python (WSGI) and the
// Node (Express-style) verifiers as the upstream itself, behind real
// Envoy and idemgate: the checked confirm executes; the same confirm sent
// along a broken route or straight to the upstream's port is refused by
// the upstream, and executes nothing.
func TestPythonAndNodeVerifiersThroughEnvoy(t *testing.T) {
	requireEnv(t)
	repo, err := filepath.Abs("..")
	require.NoError(t, err)
	for _, u := range []struct {
		name  string
		argv  func(jwks string) []string
		env   []string
		probe []string
	}{
		{"python", func(jwks string) []string { return []string{"python3", "testdata/attest_upstream.py", jwks} },
			[]string{"PYTHONPATH=" + filepath.Join(repo, "attest", "python"), "PYTHONDONTWRITEBYTECODE=1"}, []string{"python3", "-c", "import cryptography"}},
		{"node", func(jwks string) []string { return []string{"node", "testdata/attest_upstream.js", jwks} }, nil, []string{"node", "--version"}},
	} {
		t.Run(u.name, func(t *testing.T) {
			if err := exec.Command(u.probe[0], u.probe[1:]...).Run(); err != nil {
				if os.Getenv("IDEMGATE_REQUIRE_SERVICES") != "" {
					t.Fatalf("%v is required: %v", u.probe, err)
				}
				t.Skipf("%v not usable: %v", u.probe, err)
			}
			section := attestationKeys(t, "a1", "a1")
			jwks := filepath.Join(t.TempDir(), "jwks.json")
			require.NoError(t, os.WriteFile(jwks, jwksOf(t, section), 0o600))
			addr := startUpstreamProcess(t, u.argv(jwks), u.env)

			s := startStack(t, stack.Options{
				IdemgateConfig: map[string]any{"attestation": section},
				EditBootstrap: func(b []byte) ([]byte, error) {
					b, err := breakRoutes(b)
					if err != nil {
						return nil, err
					}
					return pointCluster(b, envoytest.PaymentsCluster, addr)
				},
			})
			alice := s.Agent("alice")
			pv := preview(t, alice, transfer("12.00", "acct_bob", "rent"))
			requireExecuted(t, confirm(t, alice, pv.ConfirmBody()))

			body := pvBody(t, preview(t, alice, transfer("13.00", "acct_bob", "rent")))
			r, err := alice.Send(http.MethodPost, "/v1/transfers/confirm/", body, stack.WithLength)
			require.NoError(t, err)
			require.Equal(t, http.StatusForbidden, r.StatusCode, "around idemgate through Envoy: %s", r)
			require.Contains(t, string(r.Body), "attestation_missing")
			req, err := http.NewRequest(http.MethodPost, "http://"+addr+"/v1/transfers/confirm", strings.NewReader(string(body)))
			require.NoError(t, err)
			req.Header.Set("Content-Type", "application/json")
			resp, err := http.DefaultClient.Do(req)
			require.NoError(t, err)
			resp.Body.Close()
			require.Equal(t, http.StatusForbidden, resp.StatusCode, "straight to the upstream's port")

			resp, err = http.Get("http://" + addr + "/_stats")
			require.NoError(t, err)
			var stats struct {
				Executions int
				Keys       []string
			}
			require.NoError(t, json.NewDecoder(resp.Body).Decode(&stats))
			resp.Body.Close()
			require.Equal(t, 1, stats.Executions)
			require.Equal(t, []string{pv.Nonce}, stats.Keys, "executed once, under the attested key")
		})
	}
}

// jwksOf is the public JWKS of an attestation section's key files.
func jwksOf(t *testing.T, section map[string]any) []byte {
	t.Helper()
	keys := map[string]ed25519.PrivateKey{}
	for id, src := range section["keys"].(map[string]any) {
		text, err := os.ReadFile(src.(map[string]any)["file"].(string))
		require.NoError(t, err)
		keys[id], err = attest.ParseSeed(string(text))
		require.NoError(t, err)
	}
	s, err := attest.NewSigner(section["active_key"].(string), keys)
	require.NoError(t, err)
	return s.JWKS()
}

// startUpstreamProcess runs argv (in e2e/) until the test ends and returns
// the address it printed ("listening PORT").
func startUpstreamProcess(t *testing.T, argv, env []string) string {
	t.Helper()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), env...)
	var stderr stack.LogBuffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("%s stderr:\n%s", argv[1], stderr.String())
		}
	})
	lines := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		if sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
		_, _ = io.Copy(io.Discard, out)
	}()
	select {
	case line := <-lines:
		port, ok := strings.CutPrefix(line, "listening ")
		require.True(t, ok, "%s printed %q; stderr: %s", argv[1], line, stderr.String())
		return "127.0.0.1:" + port
	case <-time.After(30 * time.Second):
		t.Fatalf("%s printed nothing within 30s; stderr: %s", argv[1], stderr.String())
	}
	return ""
}

// pointCluster sends an Envoy cluster's one endpoint to addr.
func pointCluster(bootstrap []byte, cluster, addr string) ([]byte, error) {
	var doc map[string]any
	if err := yaml.Unmarshal(bootstrap, &doc); err != nil {
		return nil, err
	}
	host, portText, _ := strings.Cut(addr, ":")
	port, err := strconv.Atoi(portText)
	if err != nil {
		return nil, fmt.Errorf("address %q: %w", addr, err)
	}
	for _, c := range dig[[]any](doc, "static_resources", "clusters") {
		if dig[string](c, "name") != cluster {
			continue
		}
		for _, ep := range dig[[]any](c, "load_assignment", "endpoints") {
			for _, lb := range dig[[]any](ep, "lb_endpoints") {
				sa := dig[map[string]any](lb, "endpoint", "address", "socket_address")
				if sa == nil {
					return nil, fmt.Errorf("cluster %s: no socket address", cluster)
				}
				for k := range sa {
					delete(sa, k)
				}
				sa["address"], sa["port_value"] = host, port
				return yaml.Marshal(doc)
			}
		}
	}
	return nil, fmt.Errorf("no cluster %s with an endpoint", cluster)
}
