package stack

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/idemgate/idemgate/envoy"
)

// idemgateConfig is what the stack changes in the shipped envoy/idemgate.yaml:
// where the stores and listeners are, and the timings a test needs. The
// operations, params and everything else stay as shipped.
type idemgateConfig struct {
	grpcAddr, adminAddr string
	redisAddr           string
	fingerprintTTL      time.Duration
	inFlightTTL         time.Duration
	ignoreKeys          bool
	upstreamTimeout     time.Duration
	extra               map[string]any
	transactionPooler   bool
	approval            map[string]any
	// mcpPreviewWithoutHeaders: mcp.preview_response_headers: false.
	mcpPreviewWithoutHeaders bool
}

// render derives the test's idemgate.yaml from the shipped one.
func (c idemgateConfig) render() ([]byte, error) {
	doc := map[string]any{}
	if err := yaml.Unmarshal(envoy.IdemgateYAML(), &doc); err != nil {
		return nil, fmt.Errorf("failed to decode the shipped idemgate.yaml: %w", err)
	}
	doc["grpc_listen"] = c.grpcAddr
	doc["admin_listen"] = c.adminAddr
	// Text logs: the tests read event=security_alert lines, and a person
	// reads the dump of a failed test.
	doc["log"] = map[string]any{"level": "info", "format": "text"}
	// A test's stack is stopped at cleanup; no load balancer waits for it.
	doc["drain"] = map[string]any{"period": "0s", "timeout": "5s"}

	store, err := child(doc, "store")
	if err != nil {
		return nil, err
	}
	redis, err := child(store, "redis")
	if err != nil {
		return nil, err
	}
	redis["addrs"] = []any{c.redisAddr}
	// Generous deadlines (see storeTimeout).
	store["timeout"] = storeTimeout.String()
	redis["timeout"] = redisTimeout.String()
	postgres, err := child(store, "postgres")
	if err != nil {
		return nil, err
	}
	if postgres["dsn_env"] != postgresDSNEnv {
		return nil, fmt.Errorf("the shipped idemgate.yaml reads the PostgreSQL DSN from %v, the stack sets %s", postgres["dsn_env"], postgresDSNEnv)
	}
	if c.transactionPooler {
		postgres["pooler"] = "transaction"
	}

	ttl, err := child(doc, "ttl")
	if err != nil {
		return nil, err
	}
	if c.fingerprintTTL > 0 {
		ttl["fingerprint"] = c.fingerprintTTL.String()
	}
	if c.inFlightTTL > 0 {
		ttl["in_flight"] = c.inFlightTTL.String()
	}

	ops, ok := doc["operations"].([]any)
	if !ok || len(ops) == 0 {
		return nil, fmt.Errorf("the shipped idemgate.yaml should have operations, has %v", doc["operations"])
	}
	for i := range ops {
		op, ok := ops[i].(map[string]any)
		if !ok {
			return nil, fmt.Errorf("operations[%d] of the shipped idemgate.yaml is not a mapping", i)
		}
		if c.ignoreKeys {
			// docs/design.md §8: an explicit empty string means the downstream
			// ignores keys (the payments service ignores them on every face).
			op["downstream_idempotency_header"] = ""
		}
		if c.approval != nil && (op["name"] == "transfer" || op["name"] == "transfer_mcp") {
			op["approval"] = c.approval
		}
		if m, isMCP := op["mcp"].(map[string]any); isMCP && c.mcpPreviewWithoutHeaders {
			m["preview_response_headers"] = false
		}
		if _, isMCP := op["mcp"]; c.upstreamTimeout > 0 && !isMCP {
			// The config says this equals the confirm route's timeout.
			op["upstream_timeout"] = c.upstreamTimeout.String()
		}
	}
	if err := applyIdemgateConfig(doc, c.extra); err != nil {
		return nil, err
	}
	return yaml.Marshal(doc)
}

func child(m map[string]any, key string) (map[string]any, error) {
	v, ok := m[key].(map[string]any)
	if !ok {
		return nil, fmt.Errorf("the shipped idemgate.yaml has no mapping %q", key)
	}
	return v, nil
}

// Deadlines widened for the machines the suite runs on. The shipped values
// (store.timeout 250ms, store.redis.timeout 50ms, ext_proc message_timeout
// 1s) are sized for a production host; on two shared cores with the race
// detector in idemgate, the front and the test, 120 simultaneous confirms
// queue for PostgreSQL connections for longer than 250 ms, and idemgate then
// answers temporarily_unavailable (correct, but not what these tests are
// about). The ratio message_timeout >= 4 x store.timeout that envoy.yaml
// keeps is kept here too.
const (
	storeTimeout          = 2 * time.Second
	redisTimeout          = 500 * time.Millisecond
	extProcMessageTimeout = 4 * storeTimeout
)

// Environment variables the shipped idemgate.yaml reads its secrets from,
// and the id of the one signing key.
const (
	signingKeyID   = "k1"
	signingKeyEnv  = "IDEMGATE_KEY_K1"
	postgresDSNEnv = "IDEMGATE_POSTGRES_DSN"
)

// newSigningKey returns what `idemgate keygen` prints: base64 of 32 random
// bytes.
func newSigningKey() (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("failed to generate a signing key: %w", err)
	}
	return base64.StdEncoding.EncodeToString(b), nil
}

// Idemgate is the idemgate server running as a child process, so that a
// test can kill -9 it and start it again on the same ports.
type Idemgate struct {
	bin        string
	configPath string
	env        []string
	// GRPCAddr and AdminAddr are fixed for the stack's lifetime.
	GRPCAddr, AdminAddr string

	log *LogBuffer

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{}
	starts int
}

// readyTimeout bounds one start: the `ready` line and /readyz answering 200
// (migrations applied, stores answering). Generous: a race build on two busy
// cores starts slowly.
const readyTimeout = 60 * time.Second

// Start runs the server and waits until it printed `ready` and /readyz says
// the stores answer.
func (g *Idemgate) Start() error {
	if err := g.startProcess(); err != nil {
		return err
	}
	return g.WaitReady(readyTimeout)
}

// startProcess runs the server and waits for its `ready` line only.
func (g *Idemgate) startProcess() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.cmd != nil {
		return errors.New("idemgate is already running")
	}
	g.starts++
	fmt.Fprintf(g.log, "=== e2e: idemgate start #%d at %s ===\n", g.starts, time.Now().Format(time.RFC3339Nano))

	cmd := exec.Command(g.bin, "serve", "--config", g.configPath)
	cmd.Env = g.env
	cmd.Stdout = g.log
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return fmt.Errorf("failed to pipe idemgate's stderr: %w", err)
	}
	// Its own process group: a kill reaches this process and nothing else.
	// Pdeathsig: a test binary that dies (panic, -timeout) takes it along.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("failed to start idemgate: %w", err)
	}
	ready := make(chan struct{})
	copied := make(chan struct{})
	go func() {
		defer close(copied)
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		signalled := false
		for sc.Scan() {
			line := sc.Text()
			fmt.Fprintln(g.log, line)
			if !signalled && line == "ready" {
				signalled = true
				close(ready)
			}
		}
		_, _ = io.Copy(g.log, stderr)
	}()
	exited := make(chan struct{})
	go func() {
		<-copied // Wait must not run before the pipe is drained
		err := cmd.Wait()
		fmt.Fprintf(g.log, "=== e2e: idemgate exited: %v ===\n", err)
		close(exited)
	}()
	g.cmd, g.exited = cmd, exited

	select {
	case <-ready:
		return nil
	case <-exited:
		g.cmd = nil
		return errors.New("idemgate exited before printing ready")
	case <-time.After(readyTimeout):
		_ = cmd.Process.Kill()
		<-exited
		g.cmd = nil
		return fmt.Errorf("idemgate did not print ready within %s", readyTimeout)
	}
}

// WaitReady polls /readyz until it answers 200.
func (g *Idemgate) WaitReady(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		code, body, err := g.Readyz()
		if err == nil && code == http.StatusOK {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("idemgate /readyz did not answer 200 within %s (last: %d %s %v)", timeout, code, body, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Kill sends SIGKILL (a crash: nothing is flushed, no stream is settled) and
// waits for the process to be gone.
func (g *Idemgate) Kill() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.cmd == nil {
		return
	}
	fmt.Fprintf(g.log, "=== e2e: kill -9 at %s ===\n", time.Now().Format(time.RFC3339Nano))
	_ = g.cmd.Process.Signal(syscall.SIGKILL)
	<-g.exited
	g.cmd = nil
}

// Pause stops the process (SIGSTOP): its sockets stay open and nothing
// answers, as a hung or overloaded server looks to Envoy. Resume continues it.
//
// It returns once every thread of the process is stopped: kill(2) only
// queues the signal, and on a loaded machine a thread already running may
// still read a stream and answer it, so a test that sends a request right
// after Pause would race the stop.
func (g *Idemgate) Pause() error {
	if err := g.signal(syscall.SIGSTOP, "SIGSTOP"); err != nil {
		return err
	}
	g.mu.Lock()
	pid := g.cmd.Process.Pid
	g.mu.Unlock()
	deadline := time.Now().Add(5 * time.Second)
	for !allThreadsStopped(pid) {
		if time.Now().After(deadline) {
			return fmt.Errorf("idemgate (pid %d) did not stop within 5s of SIGSTOP", pid)
		}
		time.Sleep(time.Millisecond)
	}
	return nil
}

// allThreadsStopped reports whether every thread of pid is in state T
// (stopped by a signal), read from /proc.
func allThreadsStopped(pid int) bool {
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil || len(tasks) == 0 {
		return false
	}
	for _, task := range tasks {
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/stat", pid, task.Name()))
		if err != nil {
			return false
		}
		// The state follows the command name, which is in parentheses
		// and may itself contain spaces or parentheses.
		i := bytes.LastIndexByte(stat, ')')
		if i < 0 || i+2 >= len(stat) || stat[i+2] != 'T' {
			return false
		}
	}
	return true
}

// PID is the running process's id, 0 while it is not running (a soak
// reads its /proc entries).
func (g *Idemgate) PID() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.cmd == nil {
		return 0
	}
	return g.cmd.Process.Pid
}

// Resume continues a paused process (SIGCONT).
func (g *Idemgate) Resume() error { return g.signal(syscall.SIGCONT, "SIGCONT") }

func (g *Idemgate) signal(sig syscall.Signal, name string) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.cmd == nil {
		return errors.New("idemgate is not running")
	}
	fmt.Fprintf(g.log, "=== e2e: %s at %s ===\n", name, time.Now().Format(time.RFC3339Nano))
	return g.cmd.Process.Signal(sig)
}

// Stop sends SIGTERM and waits for the drain; SIGKILL if it takes too long.
func (g *Idemgate) Stop() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.cmd == nil {
		return
	}
	_ = g.cmd.Process.Signal(syscall.SIGTERM)
	_ = g.cmd.Process.Signal(syscall.SIGCONT) // a paused process must run to drain
	select {
	case <-g.exited:
	case <-time.After(20 * time.Second):
		fmt.Fprintln(g.log, "=== e2e: no exit 20s after SIGTERM; kill -9 ===")
		_ = g.cmd.Process.Signal(syscall.SIGKILL)
		<-g.exited
	}
	g.cmd = nil
}

// Log returns everything the process wrote so far, over all its starts.
func (g *Idemgate) Log() string { return g.log.String() }

// LogLines returns the log lines that contain every one of parts.
func (g *Idemgate) LogLines(parts ...string) []string { return g.log.Lines(parts...) }

var adminClient = &http.Client{Timeout: 10 * time.Second}

// Readyz fetches /readyz: its status code and body.
func (g *Idemgate) Readyz() (int, string, error) {
	resp, err := adminClient.Get("http://" + g.AdminAddr + "/readyz")
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, strings.TrimSpace(string(b)), err
}

// Metric reads one sample from /metrics, named as the exposition format
// writes it, labels sorted by name: `idemgate_not_owner_total{operation="transfer"}`.
// A sample that is absent reads as 0 (a counter never incremented is not
// exported for a label set).
func (g *Idemgate) Metric(sample string) (float64, error) {
	resp, err := adminClient.Get("http://" + g.AdminAddr + "/metrics")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, err
	}
	for _, line := range bytes.Split(body, []byte("\n")) {
		name, value, ok := bytes.Cut(line, []byte(" "))
		if !ok || string(name) != sample {
			continue
		}
		return strconv.ParseFloat(string(bytes.TrimSpace(value)), 64)
	}
	return 0, nil
}

// MetricSum adds up every sample of the metric family name (all label sets).
func (g *Idemgate) MetricSum(name string) (float64, error) {
	resp, err := adminClient.Get("http://" + g.AdminAddr + "/metrics")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, err
	}
	var sum float64
	for _, line := range bytes.Split(body, []byte("\n")) {
		sample, value, ok := bytes.Cut(line, []byte(" "))
		if !ok || (string(sample) != name && !bytes.HasPrefix(sample, []byte(name+"{"))) {
			continue
		}
		v, err := strconv.ParseFloat(string(bytes.TrimSpace(value)), 64)
		if err != nil {
			return 0, err
		}
		sum += v
	}
	return sum, nil
}

// Run runs a one-shot idemgate command (ops, migrate, ...) with the
// server's environment and returns its stdout and stderr.
func (g *Idemgate) Run(ctx context.Context, args ...string) (stdout, stderr string, err error) {
	var out, errOut bytes.Buffer
	cmd := exec.CommandContext(ctx, g.bin, args...)
	cmd.Env = g.env
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err = cmd.Run()
	return out.String(), errOut.String(), err
}

// childEnv is the environment of the idemgate processes: the caller's, plus
// the secrets the config names.
func childEnv(signingKey, dsn string) []string {
	env := make([]string, 0, len(os.Environ())+2)
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, signingKeyEnv+"=") || strings.HasPrefix(kv, postgresDSNEnv+"=") {
			continue
		}
		env = append(env, kv)
	}
	return append(env, signingKeyEnv+"="+signingKey, postgresDSNEnv+"="+dsn)
}
