package envoytest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Options say how Start runs Envoy.
type Options struct {
	// Bin is the Envoy binary (FindEnvoy), Bootstrap the config it runs
	// (RenderBootstrap), written into Dir with the admin address file.
	Bin       string
	Bootstrap []byte
	Dir       string
	// Name prefixes the files in Dir ("" : envoy.yaml, envoy-admin-address)
	// so that several Envoys can share one directory.
	Name string
	// Concurrency is --concurrency (worker threads); 0 means 2.
	Concurrency int
	// FlushInterval is --file-flush-interval-msec (how often the access log
	// is flushed); 0 keeps Envoy's default (10 s).
	FlushInterval time.Duration
	// Listener is the listener whose bound address Start reads back; ""
	// expects exactly one.
	Listener string
	// Stdout receives the access log (the shipped stdout logger), Stderr
	// Envoy's own log (warnings and above); nil discards. When both are the
	// same writer it never sees two writes at once. An *os.File as Stdout is
	// handed to Envoy as is (then Tail holds only Stderr's lines).
	Stdout, Stderr io.Writer
	// Env is the process environment; nil inherits the caller's.
	Env []string
	// ReadyTimeout bounds the start (process up, clusters initialised,
	// listener bound); 0 means 60 s.
	ReadyTimeout time.Duration
}

// Envoy is one running Envoy process.
type Envoy struct {
	// ListenAddr is the listener's bound address and AdminAddr the admin
	// interface's (a port 0 in the bootstrap is read back).
	ListenAddr, AdminAddr string
	cmd                   *exec.Cmd
	done                  chan struct{}
	err                   error // what Wait returned, once done is closed
	tail                  *tail
}

var adminClient = &http.Client{Timeout: 10 * time.Second}

// Start runs Envoy and waits until it is ready: its admin /ready answers 200
// and the listener is bound. Hot restart is off (no shared memory or domain
// socket, keyed by --base-id, that another Envoy on the machine could hold),
// the admin address is written to --admin-address-path, and Envoy logs at
// warning. It runs in a process group of its own (a terminal's Ctrl-C reaches
// only the caller, which stops it) and dies with the caller's thread
// (Pdeathsig), so it cannot outlive a killed test or demo holding its ports.
// Cancelling ctx abandons the wait (and stops Envoy), not a started Envoy.
func Start(ctx context.Context, o Options) (*Envoy, error) {
	prefix := "envoy"
	if o.Name != "" {
		prefix = o.Name + ".envoy"
	}
	cfgPath := filepath.Join(o.Dir, prefix+".yaml")
	if err := os.WriteFile(cfgPath, o.Bootstrap, 0o600); err != nil {
		return nil, fmt.Errorf("failed to write the bootstrap: %w", err)
	}
	adminPath := filepath.Join(o.Dir, prefix+"-admin-address")
	args := []string{"-c", cfgPath,
		"--disable-hot-restart",
		"--concurrency", strconv.Itoa(cmpOr(o.Concurrency, 2)),
		"--admin-address-path", adminPath,
		"--log-level", "warning",
	}
	if o.FlushInterval > 0 {
		args = append(args, "--file-flush-interval-msec", strconv.FormatInt(o.FlushInterval.Milliseconds(), 10))
	}
	cmd := exec.Command(o.Bin, args...)
	if o.Env != nil {
		cmd.Env = o.Env
	}
	e := &Envoy{cmd: cmd, done: make(chan struct{}), tail: &tail{}}
	if f, ok := o.Stdout.(*os.File); ok {
		// A file (the load benchmark's access log) gets the descriptor
		// itself: no copying goroutine in the caller's process.
		cmd.Stdout = f
	} else {
		cmd.Stdout = io.MultiWriter(writerOr(o.Stdout), e.tail)
	}
	if o.Stdout == o.Stderr && o.Stdout != nil {
		cmd.Stderr = cmd.Stdout
	} else {
		cmd.Stderr = io.MultiWriter(writerOr(o.Stderr), e.tail)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("failed to start envoy (%s): %w", o.Bin, err)
	}
	go func() {
		e.err = cmd.Wait()
		close(e.done)
	}()

	timeout := cmpOr(o.ReadyTimeout, 60*time.Second)
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		err := e.probe(adminPath, o.Listener)
		if err == nil {
			return e, nil
		}
		if time.Now().After(deadline) {
			_ = e.Stop(5 * time.Second)
			return nil, fmt.Errorf("envoy was not ready within %s: %v; its last lines:\n%s", timeout, err, e.Tail())
		}
		select {
		case <-e.done:
			return nil, fmt.Errorf("envoy exited during start-up (%v); its last lines:\n%s", e.err, e.Tail())
		case <-ctx.Done():
			_ = e.Stop(5 * time.Second)
			return nil, ctx.Err()
		case <-tick.C:
		}
	}
}

func cmpOr[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}

func writerOr(w io.Writer) io.Writer {
	if w == nil {
		return io.Discard
	}
	return w
}

// probe learns the admin and listener addresses (once each) and checks
// /ready.
func (e *Envoy) probe(adminPath, listener string) error {
	if e.AdminAddr == "" {
		b, err := os.ReadFile(adminPath)
		if err != nil || len(strings.TrimSpace(string(b))) == 0 {
			return errors.New("no admin address yet")
		}
		e.AdminAddr = strings.TrimSpace(string(b))
	}
	code, body, err := e.Admin("/ready")
	if err != nil {
		return err
	}
	if code != http.StatusOK {
		return fmt.Errorf("/ready answered %d %s", code, body)
	}
	if e.ListenAddr == "" {
		addr, err := e.listenerAddr(listener)
		if err != nil {
			return err
		}
		e.ListenAddr = addr
	}
	return nil
}

// listenerAddr reads the bound address of listener name ("": the only one)
// from the admin /listeners?format=json.
func (e *Envoy) listenerAddr(name string) (string, error) {
	code, body, err := e.Admin("/listeners?format=json")
	if err != nil {
		return "", err
	}
	if code != http.StatusOK {
		return "", fmt.Errorf("/listeners answered %d", code)
	}
	var ls struct {
		ListenerStatuses []struct {
			Name         string `json:"name"`
			LocalAddress struct {
				SocketAddress struct {
					Address   string `json:"address"`
					PortValue int    `json:"port_value"`
				} `json:"socket_address"`
			} `json:"local_address"`
		} `json:"listener_statuses"`
	}
	if err := json.Unmarshal([]byte(body), &ls); err != nil {
		return "", fmt.Errorf("bad /listeners answer: %w", err)
	}
	if name == "" && len(ls.ListenerStatuses) != 1 {
		return "", fmt.Errorf("envoy reports %d listeners, want 1", len(ls.ListenerStatuses))
	}
	for _, l := range ls.ListenerStatuses {
		if (name == "" || l.Name == name) && l.LocalAddress.SocketAddress.PortValue != 0 {
			sa := l.LocalAddress.SocketAddress
			return net.JoinHostPort(sa.Address, strconv.Itoa(sa.PortValue)), nil
		}
	}
	return "", fmt.Errorf("listener %q is not bound yet", name)
}

// Admin GETs path from the admin interface.
func (e *Envoy) Admin(path string) (int, string, error) {
	resp, err := adminClient.Get("http://" + e.AdminAddr + path)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// Stat reads one counter or gauge from the admin /stats (0 when absent).
func (e *Envoy) Stat(name string) (int64, error) {
	code, body, err := e.Admin("/stats?filter=^" + regexp.QuoteMeta(name) + "$")
	if err != nil {
		return 0, err
	}
	if code != http.StatusOK {
		return 0, fmt.Errorf("/stats answered %d", code)
	}
	for _, line := range strings.Split(body, "\n") {
		k, v, ok := strings.Cut(line, ": ")
		if ok && k == name {
			return strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		}
	}
	return 0, nil
}

// Pid is the process id.
func (e *Envoy) Pid() int { return e.cmd.Process.Pid }

// Done is closed once the process has exited (and its output was copied).
func (e *Envoy) Done() <-chan struct{} { return e.done }

// Err is what waiting for the process returned (nil before Done, and for
// an exit with status 0).
func (e *Envoy) Err() error {
	select {
	case <-e.done:
		return e.err
	default:
		return nil
	}
}

// Tail is the last lines Envoy wrote (both streams), for error messages.
func (e *Envoy) Tail() string { return e.tail.String() }

// Stop sends SIGTERM, waits up to grace, then SIGKILLs; it signals Envoy's
// own pid only. It returns Err.
func (e *Envoy) Stop(grace time.Duration) error {
	select {
	case <-e.done:
		return e.err
	default:
	}
	_ = e.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-e.done:
	case <-time.After(grace):
		_ = e.cmd.Process.Kill()
		<-e.done
	}
	return e.err
}

// Kill ends Envoy with SIGKILL (a crash: open connections are reset, nothing
// is drained) and waits for the process to be gone.
func (e *Envoy) Kill() {
	_ = e.cmd.Process.Kill()
	<-e.done
}

// tail keeps the last tailLines lines written to it.
type tail struct {
	mu    sync.Mutex
	lines []string
	part  []byte
}

const tailLines = 40

func (t *tail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.part = append(t.part, p...)
	for {
		i := bytes.IndexByte(t.part, '\n')
		if i < 0 {
			break
		}
		t.lines = append(t.lines, string(t.part[:i]))
		t.part = t.part[i+1:]
		if len(t.lines) > tailLines {
			t.lines = t.lines[len(t.lines)-tailLines:]
		}
	}
	return len(p), nil
}

func (t *tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	lines := t.lines
	if len(t.part) > 0 {
		lines = append(lines[:len(lines):len(lines)], string(t.part))
	}
	if len(lines) == 0 {
		return "(no output)"
	}
	return strings.Join(lines, "\n")
}
