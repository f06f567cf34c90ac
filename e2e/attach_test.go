package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"sigs.k8s.io/yaml"

	"github.com/idemgate/idemgate/cmd/idemgate/settings"
	"github.com/idemgate/idemgate/e2e/demoauth"
	"github.com/idemgate/idemgate/e2e/internal/stack"
	"github.com/idemgate/idemgate/envoy/envoytest"
	"github.com/idemgate/idemgate/envoy/pieces"
	"github.com/idemgate/idemgate/extproc/config"
	"github.com/idemgate/idemgate/extproc/route"
	"github.com/idemgate/idemgate/internal/testutil"
)

// lenientUpstream is the kind of API a user attaches idemgate to: its
// router accepts any method, any case, a trailing slash, ;params, a .json
// suffix, percent-encoding and dot segments for the same handler (Express
// defaults, older Spring, hand-written routers). It counts every confirm it
// executes, and those that came without an Idempotency-Key: idemgate sets
// the key on every confirm it checked, so those reached it unchecked.
type lenientUpstream struct {
	mu        sync.Mutex
	executed  int
	unchecked []string
}

func (u *lenientUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	target := r.RequestURI
	// route.Loose is the most lenient reading idemgate knows of.
	p := route.Loose(target)
	w.Header().Set("content-type", "application/json")
	switch {
	case p == "/v1/transfers/preview":
		_, _ = io.WriteString(w, `{"quote":{"fee":"0.50"},"amount":"100.00","currency":"EUR"}`)
	case p == "/mcp" && bytes.Contains(body, []byte("transfer_preview")):
		// A JSON-RPC result for the call's id, as JSON or (X-Test-Sse) as an
		// event stream after a progress notification.
		var call struct {
			ID json.RawMessage `json:"id"`
		}
		_ = json.Unmarshal(body, &call)
		msg := `{"jsonrpc":"2.0","id":` + string(call.ID) + `,"result":{"content":[{"type":"text","text":"fee 0.50"}],"structuredContent":{"quote":{"fee":"0.50"}}}}`
		if r.Header.Get("X-Test-Sse") == "" {
			_, _ = io.WriteString(w, msg)
			return
		}
		w.Header().Set("content-type", "text/event-stream")
		_, _ = io.WriteString(w, "event: message\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{\"progressToken\":\"p1\",\"progress\":1}}\n\nevent: message\ndata: "+msg+"\n\n")
	case p == "/v1/transfers/confirm" || p == "/mcp" && bytes.Contains(body, []byte("transfer_confirm")):
		u.mu.Lock()
		u.executed++
		n := u.executed
		if r.Header.Get("Idempotency-Key") == "" {
			u.unchecked = append(u.unchecked, r.Method+" "+target)
		}
		u.mu.Unlock()
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"transfer_id":"tr_%d","state":"executed"}`, n)
	default:
		_, _ = io.WriteString(w, `{"ok":true}`)
	}
}

func (u *lenientUpstream) counts() (int, []string) {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.executed, append([]string(nil), u.unchecked...)
}

// userAuth is the user's authentication as Envoy's docs show it: jwt_authn
// on every path, setting the subject header idemgate reads.
func userAuth(t *testing.T) []any {
	t.Helper()
	var jwks any
	require.NoError(t, json.Unmarshal(demoauth.JWKS(), &jwks))
	jwksJSON, err := json.Marshal(jwks)
	require.NoError(t, err)
	return []any{map[string]any{
		"name": "envoy.filters.http.jwt_authn",
		"typed_config": map[string]any{
			"@type": "type.googleapis.com/envoy.extensions.filters.http.jwt_authn.v3.JwtAuthentication",
			"providers": map[string]any{"corp": map[string]any{
				"issuer": demoauth.Issuer, "audiences": []any{demoauth.Audience},
				"local_jwks":       map[string]any{"inline_string": string(jwksJSON)},
				"claim_to_headers": []any{map[string]any{"header_name": "x-idemgate-subject", "claim_name": "sub"}},
			}},
			"rules": []any{map[string]any{"match": map[string]any{"prefix": "/"}, "requires": map[string]any{"provider_name": "corp"}}},
		},
	}}
}

// attached runs idemgate (embedded store) and Envoy with the pieces of
// `idemgate envoy-config` pasted into a bootstrap of the user's (a
// catch-all route to the lenient upstream, no path normalisation,
// jwt_authn), edit changing the idemgate config first; it returns alice's
// agent through that Envoy.
func attached(t *testing.T, edit func(doc map[string]any)) (*stack.Agent, *stack.Envoy, *lenientUpstream, *stack.Idemgate) {
	t.Helper()
	requireEnv(t)
	dir := t.TempDir()

	grpcAddr, adminAddr := fmt.Sprintf("127.0.0.1:%d", testutil.FreePort(t)), fmt.Sprintf("127.0.0.1:%d", testutil.FreePort(t))
	raw, err := stack.RenderIdemgateConfig(stack.ReplicaConfig{GRPCAddr: grpcAddr, AdminAddr: adminAddr, RedisAddr: "127.0.0.1:1"})
	require.NoError(t, err)
	doc := map[string]any{}
	require.NoError(t, yaml.Unmarshal(raw, &doc))
	delete(doc, "store") // the embedded store: these tests are about routing, not storage
	if edit != nil {
		edit(doc)
	}
	raw, err = yaml.Marshal(doc)
	require.NoError(t, err)
	cfgPath := filepath.Join(dir, "idemgate.yaml")
	require.NoError(t, os.WriteFile(cfgPath, raw, 0o600))

	key, err := stack.NewSigningKey()
	require.NoError(t, err)
	g := stack.NewIdemgate(stack.IdemgateSpec{Bin: env.IdemgateBin, ConfigPath: cfgPath, SigningKey: key, GRPCAddr: grpcAddr, AdminAddr: adminAddr})
	require.NoError(t, g.Start())
	t.Cleanup(g.Stop)

	up := &lenientUpstream{}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := &http.Server{Handler: up, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })

	// The pieces, exactly as `idemgate envoy-config` prints them.
	s, _, err := settings.Load(cfgPath, config.Options{Offline: true})
	require.NoError(t, err)
	out, err := pieces.Render(s.Runtime, pieces.Options{ConfigPath: cfgPath, IdemgateAddress: grpcAddr, UpstreamCluster: "payments"})
	require.NoError(t, err)
	// Pasted into a bootstrap of the user's, NOT envoy/envoy.yaml: a catch-all
	// route to the app, no path normalisation, jwt_authn.
	bootstrap, err := envoytest.PasteIntoBootstrap(out, envoytest.PasteOptions{UpstreamAddr: ln.Addr().String(), AuthFilters: userAuth(t), RawPaths: true, LoopbackIsInternal: true})
	require.NoError(t, err)
	e, err := stack.StartEnvoy(t, env.EnvoyBin, bootstrap)
	require.NoError(t, err, "Envoy refused the pieces pasted into the user's bootstrap")
	t.Cleanup(e.Close)
	front := e.ListenAddr

	alice, err := stack.NewAgent("alice", "http://"+front)
	require.NoError(t, err)
	return alice, e, up, g
}

// TestAttachedAsTheREADMESaysNothingBypassesIdemgate pastes the pieces of
// `idemgate envoy-config` into a bootstrap of the user's (with a catch-all
// route and a lenient upstream) and sends every spelling and method of the
// guarded paths: each is refused before the upstream or checked by
// idemgate. The upstream never executes a confirm without the key idemgate
// sets after a fingerprint was checked and claimed.
func TestAttachedAsTheREADMESaysNothingBypassesIdemgate(t *testing.T) {
	alice, e, up, _ := attached(t, nil)
	transfer := []byte(`{"amount":"100.00","currency":"EUR","payee":{"account_id":"DE89"},"memo":"rent"}`)
	mcpConfirm := []byte(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"transfer_confirm","arguments":{"amount":"100.00","currency":"EUR","payee":{"account_id":"DE89"}}}}`)

	type probe struct{ method, target string }
	var probes []probe
	for _, path := range []string{"/v1/transfers/confirm", "/mcp"} {
		last := path[strings.LastIndex(path, "/")+1:]
		base := path[:strings.LastIndex(path, "/")+1]
		for _, spelled := range []string{
			path + "/", strings.ToUpper(path), base + strings.ToUpper(last[:1]) + last[1:], path + ";x=1", path + ".json",
			base + "%" + fmt.Sprintf("%02X", last[0]) + last[1:], "/" + path, base + "/" + last, base + "./" + last,
			base + "x/../" + last, path + "%2F", path + "/.",
		} {
			probes = append(probes, probe{"POST", spelled})
		}
		for _, m := range []string{"PUT", "PATCH", "GET", "DELETE", "HEAD", "OPTIONS"} {
			probes = append(probes, probe{m, path})
		}
	}
	for _, pr := range probes {
		body := transfer
		if strings.Contains(strings.ToLower(pr.target), "mcp") || strings.Contains(pr.target, "%6D") {
			body = mcpConfirm
		}
		if pr.method == "HEAD" {
			body = nil
		}
		r, err := alice.Send(pr.method, pr.target, body, stack.WithLength)
		require.NoError(t, err, "%s %s", pr.method, pr.target)
		status, hdr, rb := r.StatusCode, r.Header, r.Body
		executed, unchecked := up.counts()
		require.Empty(t, unchecked, "%s %s reached the upstream unchecked (status %d: %s)", pr.method, pr.target, status, rb)
		require.Zero(t, executed, "%s %s executed", pr.method, pr.target)
		if pr.method == "HEAD" {
			require.Equal(t, 405, status, "%s %s", pr.method, pr.target)
			continue
		}
		require.Contains(t, []int{400, 404, 405}, status, "%s %s: %s", pr.method, pr.target, rb)
		require.Equal(t, "application/json", hdr.Get("Content-Type"), "%s %s: %s", pr.method, pr.target, rb)
		var envl map[string]any
		require.NoError(t, json.Unmarshal(rb, &envl), "%s %s: %s", pr.method, pr.target, rb)
		require.Contains(t, []any{"path_not_exact", "method_not_allowed", "fingerprint_required", "invalid_json"}, envl["status"], "%s %s: %s", pr.method, pr.target, rb)
		require.Equal(t, false, envl["retryable"])
	}

	// The agent is an internal client here, so Envoy would honour a retry
	// header it sends: idemgate refuses the confirm before anything runs.
	r, err := alice.Send("POST", "/v1/transfers/confirm", transfer, stack.WithLength, "x-envoy-retry-on: 5xx", "x-envoy-max-retries: 3")
	require.NoError(t, err)
	require.Equal(t, 400, r.StatusCode, "%s", r)
	require.Equal(t, "header_not_allowed", r.Envelope.Status)

	// The exact spelling works, once: preview, confirm, replay.
	r, err = alice.Raw("/v1/transfers/preview", transfer, stack.WithLength)
	require.NoError(t, err)
	require.Equal(t, 200, r.StatusCode, "%s", r)
	var pv map[string]any
	require.NoError(t, json.Unmarshal(r.Body, &pv))
	fp, _ := pv["fingerprint"].(string)
	require.NotEmpty(t, fp, "%s", r)
	confirm := []byte(strings.Replace(string(transfer), `"memo":"rent"`, `"memo":"rent","fingerprint":"`+fp+`"`, 1))
	r, err = alice.Raw("/v1/transfers/confirm", confirm, stack.WithLength)
	require.NoError(t, err)
	require.Equal(t, 201, r.StatusCode, "%s", r)
	r, err = alice.Raw("/v1/transfers/confirm", confirm, stack.WithLength)
	require.NoError(t, err)
	require.Equal(t, 201, r.StatusCode)
	require.True(t, r.Replayed())
	executed, unchecked := up.counts()
	require.Equal(t, 1, executed)
	require.Empty(t, unchecked)

	// Other paths open no ext_proc stream at all.
	before, err := e.Stat("cluster.idemgate.upstream_rq_total")
	require.NoError(t, err)
	for _, path := range []string{"/v1/accounts", "/healthz", "/v1/transfers", "/static/app.js?q=a%20b"} {
		r, err := alice.Raw(path, []byte(`{}`), stack.WithLength)
		require.NoError(t, err)
		require.Equal(t, 200, r.StatusCode, path)
	}
	after, err := e.Stat("cluster.idemgate.upstream_rq_total")
	require.NoError(t, err)
	require.Equal(t, before, after, "a request that cannot name a guarded path opened an ext_proc stream")

	// An oversize confirm sent chunked gets Envoy's 413, as an envelope.
	r, err = alice.Raw("/v1/transfers/confirm", bytes.Repeat([]byte("x"), 2<<20), stack.Chunked)
	require.NoError(t, err)
	require.Equal(t, 413, r.StatusCode)
	require.NotNil(t, r.Envelope, "%s", r)
	require.Equal(t, "request_too_large", r.Envelope.Status)
	require.False(t, *r.Envelope.Retryable)
}

// extProcMessagesSentBy is how many ext_proc messages Envoy sent while do
// ran (one request at a time).
func extProcMessagesSentBy(t *testing.T, e *stack.Envoy, do func()) int64 {
	t.Helper()
	before := extProcMessagesSent(t, e)
	do()
	return extProcMessagesSent(t, e) - before
}

// extProcMessagesSent is Envoy's count of ext_proc messages sent so far
// (the one ext_proc filter's stream_msgs_sent, whatever its stat prefix).
func extProcMessagesSent(t *testing.T, e *stack.Envoy) int64 {
	t.Helper()
	code, body, err := e.Admin("/stats?filter=ext_proc\\.stream_msgs_sent$")
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, code)
	var n int64
	lines := 0
	for _, line := range strings.Split(strings.TrimSpace(body), "\n") {
		_, v, ok := strings.Cut(line, ": ")
		require.True(t, ok, body)
		var x int64
		_, err := fmt.Sscan(v, &x)
		require.NoError(t, err, line)
		n += x
		lines++
	}
	require.Equal(t, 1, lines, "one ext_proc filter: %s", body)
	return n
}

// TestAttachedBodyOnlyPreviewCostsThreeMessages: with the transfer preview's
// fingerprint in the body only (preview.fingerprint_header: false), the
// pieces ask Envoy for response.code and idemgate skips the preview's
// response headers: 3 ext_proc messages instead of 4, the fingerprint in
// the body and no header, and it confirms. Everything else keeps its
// messages: a confirm 4, a replay 2, and bodiless or wrong-method previews
// are refused before the upstream, as before.
func TestAttachedBodyOnlyPreviewCostsThreeMessages(t *testing.T) {
	alice, e, up, g := attached(t, func(doc map[string]any) {
		for _, op := range doc["operations"].([]any) {
			m := op.(map[string]any)
			if m["name"] == "transfer" {
				m["preview"].(map[string]any)["fingerprint_header"] = false
				return
			}
		}
		t.Fatal("no transfer operation in the e2e config")
	})
	transfer := []byte(`{"amount":"100.00","currency":"EUR","payee":{"account_id":"DE89"},"memo":"rent"}`)
	sent := func(do func()) int64 { return extProcMessagesSentBy(t, e, do) }

	var fp string
	require.Equal(t, int64(3), sent(func() {
		r, err := alice.Raw("/v1/transfers/preview", transfer, stack.WithLength)
		require.NoError(t, err)
		require.Equal(t, 200, r.StatusCode, "%s", r)
		require.Empty(t, r.Header.Get("Idempotency-Fingerprint"), "the body alone carries it")
		var pv map[string]any
		require.NoError(t, json.Unmarshal(r.Body, &pv))
		fp, _ = pv["fingerprint"].(string)
		require.NotEmpty(t, fp, "%s\nidemgate's log:\n%s", r, g.Log())
		require.NotEmpty(t, pv["fingerprint_expires_at"], "%s", r)
	}), "a body-only preview: request headers, request body, response body")

	confirm := []byte(strings.Replace(string(transfer), `"memo":"rent"`, `"memo":"rent","fingerprint":"`+fp+`"`, 1))
	require.Equal(t, int64(4), sent(func() {
		r, err := alice.Raw("/v1/transfers/confirm", confirm, stack.WithLength)
		require.NoError(t, err)
		require.Equal(t, 201, r.StatusCode, "%s", r)
	}), "a first-time confirm keeps all four")
	require.Equal(t, int64(2), sent(func() {
		r, err := alice.Raw("/v1/transfers/confirm", confirm, stack.WithLength)
		require.NoError(t, err)
		require.True(t, r.Replayed(), "%s", r)
	}), "a replay ends at the request body")

	// The preview path with other methods: refused at the request headers,
	// one message, before the upstream.
	for _, m := range []string{"GET", "DELETE", "PUT"} {
		require.Equal(t, int64(1), sent(func() {
			r, err := alice.Send(m, "/v1/transfers/preview", nil, stack.WithLength)
			require.NoError(t, err)
			require.Equal(t, 405, r.StatusCode, "%s %s", m, r)
			require.NotNil(t, r.Envelope, "%s", r)
		}), m)
	}
	// A bodiless POST preview is decided at its headers (end_of_stream) and
	// signed from the response body: 2 messages, none skipped unseen.
	require.Equal(t, int64(2), sent(func() {
		r, err := alice.Send("POST", "/v1/transfers/preview", nil, stack.WithLength)
		require.NoError(t, err)
		require.Equal(t, 200, r.StatusCode, "%s", r)
		require.Contains(t, string(r.Body), `"fingerprint":"`)
	}))
	executed, unchecked := up.counts()
	require.Equal(t, 1, executed)
	require.Empty(t, unchecked)
}

// TestAttachedMCPPreviewCostsThreeMessages: with the MCP operation's
// mcp.preview_response_headers: false the pieces ask Envoy for
// response.code, and a 2026-07-28 call of the preview tool (Mcp-Name names
// it) skips its response headers: 3 ext_proc messages, the fingerprint in
// the result, JSON and event stream alike (Envoy sends the rewritten body
// chunked). A call without the mirrored headers keeps all four.
func TestAttachedMCPPreviewCostsThreeMessages(t *testing.T) {
	alice, e, _, g := attached(t, func(doc map[string]any) {
		for _, op := range doc["operations"].([]any) {
			if m, ok := op.(map[string]any)["mcp"].(map[string]any); ok {
				m["preview_response_headers"] = false
				return
			}
		}
		t.Fatal("no MCP operation in the e2e config")
	})
	call := []byte(`{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"transfer_preview","arguments":{"amount":"100.00","currency":"EUR","payee":{"account_id":"DE89"}}}}`)
	modern := []string{"Accept: application/json, text/event-stream", "MCP-Protocol-Version: 2026-07-28", "Mcp-Method: tools/call", "Mcp-Name: transfer_preview"}
	preview := func(want int64, headers ...string) {
		t.Helper()
		var r *stack.Response
		require.Equal(t, want, extProcMessagesSentBy(t, e, func() {
			var err error
			r, err = alice.Raw("/mcp", call, stack.WithLength, headers...)
			require.NoError(t, err)
		}), "%v", headers)
		require.Equal(t, 200, r.StatusCode, "%s", r)
		raw := r.Body
		if strings.HasPrefix(r.Header.Get("Content-Type"), "text/event-stream") {
			_, raw, _ = bytes.Cut(r.Body, []byte("data: {\"jsonrpc\":\"2.0\",\"id\":7,"))
			raw = append([]byte(`{"jsonrpc":"2.0","id":7,`), bytes.TrimSpace(raw)...)
		}
		var msg struct {
			Result struct {
				StructuredContent map[string]any `json:"structuredContent"`
				Content           []any          `json:"content"`
			} `json:"result"`
		}
		require.NoError(t, json.Unmarshal(raw, &msg), "%s", r)
		require.NotEmpty(t, msg.Result.StructuredContent["fingerprint"], "%s\nidemgate's log:\n%s", r, g.Log())
		require.Len(t, msg.Result.Content, 2, "%s", r)
	}
	preview(3, modern...)
	preview(3, append(modern, "X-Test-Sse: 1")...)
	preview(4, "Accept: application/json, text/event-stream")
}
