package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"text/template"
	"time"
)

// moduleRoot is the directory of the module's go.mod (the tool is run from
// anywhere inside the checkout).
func moduleRoot(ctx context.Context) (string, error) {
	out, err := exec.CommandContext(ctx, "go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("failed to run go env GOMOD: %w", err)
	}
	mod := strings.TrimSpace(string(out))
	if mod == "" || mod == os.DevNull {
		return "", fmt.Errorf("not inside the idemgate module (go env GOMOD is empty)")
	}
	return filepath.Dir(mod), nil
}

// idemgatePackage is the package the tool builds idemgate from.
const idemgatePackage = "./cmd/idemgate"

// buildIdemgate runs `go build -o out <pkg>` in the module root. The error
// carries the compiler's first lines: the binary may not build yet while
// cmd/idemgate is being written.
func buildIdemgate(ctx context.Context, root, out, pkg string) error {
	cmd := exec.CommandContext(ctx, "go", "build", "-o", out, pkg)
	cmd.Dir = root
	var buf bytes.Buffer
	cmd.Stdout = &buf
	cmd.Stderr = &buf
	if err := cmd.Run(); err != nil {
		lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
		if len(lines) > 4 {
			lines = append(lines[:4], "…")
		}
		return fmt.Errorf("go build %s failed (%v): %s", pkg, err, strings.Join(lines, "; "))
	}
	return nil
}

// idemgateSettings fill the benchmark's idemgate.yaml.
type idemgateSettings struct {
	GRPCListen  string
	AdminListen string
	// GRPCTLS serves grpc_listen with mutual TLS (grpc_tls) when set.
	GRPCTLS    *benchTLS
	ClientSANs []string
	RedisAddr  string // empty: no Redis
	KeyPrefix  string // of the Redis keys; empty: idem:
	// StoreTimeout and RedisTimeout replace envoy/idemgate.yaml's 250ms and
	// 50ms when set (the behaviour test on a busy machine).
	StoreTimeout string
	RedisTimeout string
	PostgresDSN  string // empty: no PostgreSQL (both empty: memory store)
	// PreviewBodyOnly sets preview.fingerprint_header: false on the
	// transfer operation and mcp.preview_response_headers: false on
	// transfer_mcp (3 ext_proc messages per preview).
	PreviewBodyOnly bool
	// NoTerminalCache sets limits.terminal_cache_bytes: 0, so every replay
	// reads the store.
	NoTerminalCache bool
}

// FingerprintTTL is ttl.fingerprint: the lifetime of the fingerprints the
// tool mints itself (benchFingerprintTTL), so both agree.
func (idemgateSettings) FingerprintTTL() string { return benchFingerprintTTL.String() }

// The operations (HTTP and MCP) and limits mirror envoy/idemgate.yaml; the store is the
// scenario's; logging is at warn so logs cost nothing per request; the
// drain period is zero because nothing drains between runs.
var idemgateTemplate = template.Must(template.New("idemgate.yaml").Parse(`# Written by e2e/loadgen for one benchmark run.
grpc_listen: "{{.GRPCListen}}"
{{- with .GRPCTLS}}
grpc_tls:
  cert_file: "{{.ServerCert}}"
  key_file: "{{.ServerKey}}"
  client_ca_file: "{{.CAFile}}"
  client_sans: [{{range $i, $s := $.ClientSANs}}{{if $i}}, {{end}}"{{$s}}"{{end}}]
{{- end}}
admin_listen: "{{.AdminListen}}"
log: {level: warn, format: json}
signing:
  active_key: k1
  keys:
    k1: {env: IDEMGATE_KEY_K1}
subject:
  header: x-idemgate-subject
store:
  timeout: {{if .StoreTimeout}}{{.StoreTimeout}}{{else}}250ms{{end}}
{{- if .RedisAddr}}
  redis:
    addrs: ["{{.RedisAddr}}"]
    mode: single
    key_prefix: "{{if .KeyPrefix}}{{.KeyPrefix}}{{else}}idem:{{end}}"
    timeout: {{if .RedisTimeout}}{{.RedisTimeout}}{{else}}50ms{{end}}
{{- end}}
{{- if .PostgresDSN}}
  postgres:
    dsn: "{{.PostgresDSN}}"
{{- end}}
ttl: {fingerprint: {{.FingerprintTTL}}, in_flight: 2m, terminal: 72h}
limits: {max_body_bytes: 1048576, max_json_depth: 32{{if .NoTerminalCache}}, terminal_cache_bytes: 0{{end}}}
messages: {language: en}
drain: {period: 0s, timeout: 2s}
operations:
  - name: transfer
    scope: payments.transfer
    preview: {method: POST, path: /v1/transfers/preview{{if .PreviewBodyOnly}}, fingerprint_header: false{{end}}}
    confirm: {method: POST, path: /v1/transfers/confirm}
    status:  {method: POST, path: /v1/transfers/status}
    preview_tool: transfer_preview
    status_tool: transfer_status
    params: [{path: amount, type: decimal}, currency, payee.account_id]
    fingerprint_field: fingerprint
    result_ref: transfer_id
    downstream_idempotency_header: Idempotency-Key
    replay: envelope
    upstream_timeout: 10s
    upstream_retries: 1
    poll_after: 2s
  - name: transfer_mcp
    scope: payments.transfer.mcp
    mcp:
      endpoint: /mcp
      preview_tool: transfer_preview
      confirm_tool: transfer_confirm
      status_tool: transfer_status
{{- if .PreviewBodyOnly}}
      preview_response_headers: false
{{- end}}
    params: [{path: amount, type: decimal}, currency, payee.account_id]
    result_ref: transfer_id
    downstream_idempotency_header: Idempotency-Key
    upstream_timeout: 30s
    upstream_retries: 0
    poll_after: 2s
`))

func renderIdemgateConfig(s idemgateSettings) ([]byte, error) {
	var b bytes.Buffer
	if err := idemgateTemplate.Execute(&b, s); err != nil {
		return nil, fmt.Errorf("failed to render idemgate.yaml: %w", err)
	}
	return b.Bytes(), nil
}

// idemgateProcess is a running idemgate child and where it listens.
type idemgateProcess struct {
	*child
	grpcAddr  string
	adminAddr string
	// pprofAddr serves /debug/pprof (the admin server, with serve --pprof).
	pprofAddr string
}

// idemgateSpec is an `idemgate serve` to start.
type idemgateSpec struct {
	bin  string
	dir  string // where its config is written
	name string // names its config file and its lines
	key  string // the signing key, in IDEMGATE_KEY_K1
	// settings render its config; startIdemgate chooses the listeners.
	settings idemgateSettings
	// pprof serves /debug/pprof/ on its admin listener (serve --pprof).
	pprof bool
	// unixSocket serves gRPC on a unix socket in dir instead of a loopback
	// port; grpcAddr is then unix:///path.
	unixSocket bool
}

// startIdemgate writes the config of spec to spec.dir and starts `idemgate
// serve`, waiting for its ready line and for /readyz.
func startIdemgate(ctx context.Context, spec idemgateSpec) (*idemgateProcess, error) {
	gp, err := freePort()
	if err != nil {
		return nil, err
	}
	ap, err := freePort()
	if err != nil {
		return nil, err
	}
	s := spec.settings
	s.GRPCListen = fmt.Sprintf("127.0.0.1:%d", gp)
	if spec.unixSocket {
		s.GRPCListen = "unix://" + filepath.Join(spec.dir, spec.name+".sock")
	}
	s.AdminListen = fmt.Sprintf("127.0.0.1:%d", ap)
	cfg, err := renderIdemgateConfig(s)
	if err != nil {
		return nil, err
	}
	path := filepath.Join(spec.dir, spec.name+".idemgate.yaml")
	if err := os.WriteFile(path, cfg, 0o600); err != nil {
		return nil, fmt.Errorf("failed to write %s: %w", path, err)
	}
	env := []string{"IDEMGATE_KEY_K1=" + spec.key}
	args := []string{"serve", "--config", path}
	if spec.pprof {
		args = append(args, "--pprof")
	}
	c, err := startChild(ctx, childSpec{
		name:      "idemgate (" + spec.name + ")",
		path:      spec.bin,
		args:      args,
		env:       env,
		readyLine: "ready",
		timeout:   60 * time.Second, // migrations on a busy machine
	})
	if err != nil {
		return nil, err
	}
	p := &idemgateProcess{child: c, grpcAddr: s.GRPCListen, adminAddr: s.AdminListen, pprofAddr: s.AdminListen}
	// "ready" means listening; /readyz says the stores answer (migrations
	// applied). Measuring before that would count start-up 503s.
	if err := p.waitReadyz(ctx, 60*time.Second); err != nil {
		c.stop(0)
		return nil, err
	}
	return p, nil
}

// waitReadyz polls /readyz until it answers 200.
func (p *idemgateProcess) waitReadyz(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	last := "no answer"
	for {
		if err := p.checkAlive(); err != nil {
			return err
		}
		var body bytes.Buffer
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		err := p.get(rctx, p.adminAddr, "/readyz", &body)
		cancel()
		if err == nil {
			return nil
		}
		last = strings.TrimSpace(err.Error() + " " + body.String())
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: /readyz did not answer 200 within %s (last: %s): %s", p.name, timeout, last, p.lastLines())
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// hasPprof reports whether /debug/pprof/ answers at pprofAddr.
func (p *idemgateProcess) hasPprof(ctx context.Context) bool {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	return p.get(ctx, p.pprofAddr, "/debug/pprof/", io.Discard) == nil
}

// get fetches http://addr+path into w; anything but 200 is an error.
func (p *idemgateProcess) get(ctx context.Context, addr, path string, w io.Writer) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+path, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("failed to get %s: %w", path, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s answered %s", path, resp.Status)
	}
	if _, err := io.Copy(w, resp.Body); err != nil {
		return fmt.Errorf("failed to read %s: %w", path, err)
	}
	return nil
}
