package stack

import (
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
	"syscall"
	"testing"
	"time"
)

// Envoy is the front of a stack: a real Envoy process running the shipped
// envoy.yaml with only ports, paths and the test's timeouts changed.
type Envoy struct {
	// ListenAddr is the ingress listener, AdminAddr the admin interface
	// (both loopback, ports chosen by the kernel).
	ListenAddr, AdminAddr string
	log                   *logBuffer
	cmd                   *exec.Cmd
	exited                chan struct{}
}

// ingressListener is the listener's name in the shipped envoy.yaml.
const ingressListener = "ingress"

// accessLogFlush is --file-flush-interval-msec. The stdout access log is
// where the tests read the x-request-id Envoy gave a request; Envoy's
// default flush interval (10 s) makes every such lookup wait that long, and
// tests that race a lease (6 s in the crash test) then lose the race.
const accessLogFlush = 20 * time.Millisecond

// startEnvoy runs bin on bootstrap. The bootstrap binds the listener and the
// admin interface to port 0, so two Envoys (parallel tests, parallel test
// binaries) can never collide on a port chosen before it was bound; the
// admin address is read from --admin-address-path and the listener's port
// from the admin /listeners. Hot restart is off (no shared memory, so no
// --base-id to keep apart) and two worker threads are enough for any test.
func startEnvoy(t testing.TB, bin string, bootstrap []byte) (*Envoy, error) {
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "envoy.yaml")
	if err := os.WriteFile(cfgPath, bootstrap, 0o600); err != nil {
		return nil, fmt.Errorf("failed to write the bootstrap: %w", err)
	}
	adminPath := filepath.Join(dir, "admin-address")
	f := &Envoy{log: &logBuffer{}, exited: make(chan struct{})}
	cmd := exec.Command(bin, "-c", cfgPath,
		"--disable-hot-restart",
		"--concurrency", "2",
		"--file-flush-interval-msec", strconv.Itoa(int(accessLogFlush/time.Millisecond)),
		"--admin-address-path", adminPath,
		"--log-level", "warning",
	)
	// stdout carries the access log (the shipped stdout access logger),
	// stderr Envoy's own log; both go into the dump of a failed test.
	cmd.Stdout, cmd.Stderr = f.log, f.log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("failed to start envoy: %w", err)
	}
	f.cmd = cmd
	go func() {
		err := cmd.Wait()
		fmt.Fprintf(f.log, "=== e2e: envoy exited: %v ===\n", err)
		close(f.exited)
	}()
	deadline := time.Now().Add(readyTimeout)
	for {
		select {
		case <-f.exited:
			return nil, fmt.Errorf("envoy exited during start-up:\n%s", f.log.String())
		default:
		}
		if err := f.probe(adminPath); err == nil {
			return f, nil
		} else if time.Now().After(deadline) {
			f.Close()
			return nil, fmt.Errorf("envoy was not ready within %s: %v\n%s", readyTimeout, err, f.log.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// probe learns the admin and listener addresses (once) and checks /ready.
func (f *Envoy) probe(adminPath string) error {
	if f.AdminAddr == "" {
		b, err := os.ReadFile(adminPath)
		if err != nil || len(strings.TrimSpace(string(b))) == 0 {
			return errors.New("no admin address yet")
		}
		f.AdminAddr = strings.TrimSpace(string(b))
	}
	if f.ListenAddr == "" {
		addr, err := f.listenerAddr(ingressListener)
		if err != nil {
			return err
		}
		f.ListenAddr = addr
	}
	code, body, err := f.Admin("/ready")
	if err != nil {
		return err
	}
	if code != http.StatusOK {
		return fmt.Errorf("/ready answered %d %s", code, body)
	}
	return nil
}

// listenerAddr reads the bound address of listener name from the admin
// /listeners?format=json.
func (f *Envoy) listenerAddr(name string) (string, error) {
	code, body, err := f.Admin("/listeners?format=json")
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
	for _, l := range ls.ListenerStatuses {
		if l.Name == name && l.LocalAddress.SocketAddress.PortValue != 0 {
			sa := l.LocalAddress.SocketAddress
			return net.JoinHostPort(sa.Address, strconv.Itoa(sa.PortValue)), nil
		}
	}
	return "", fmt.Errorf("listener %q is not bound yet", name)
}

// Admin GETs path from the admin interface.
func (f *Envoy) Admin(path string) (int, string, error) {
	resp, err := adminClient.Get("http://" + f.AdminAddr + path)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// Stat reads one counter or gauge from the admin /stats (0 when absent).
func (f *Envoy) Stat(name string) (int64, error) {
	code, body, err := f.Admin("/stats?filter=^" + regexp.QuoteMeta(name) + "$")
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

// Log is everything Envoy wrote so far: its own log and the access log.
func (f *Envoy) Log() string { return f.log.String() }

// Close stops Envoy (SIGTERM, then SIGKILL).
func (f *Envoy) Close() {
	_ = f.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-f.exited:
	case <-time.After(10 * time.Second):
		_ = f.cmd.Process.Signal(syscall.SIGKILL)
		<-f.exited
	}
}

// accessLogRequestID matches the end of Envoy's default access log format:
// ... "%REQ(USER-AGENT)%" "%REQ(X-REQUEST-ID)%" "%REQ(:AUTHORITY)%" "%UPSTREAM_HOST%".
func accessLogRequestID(userAgent string) *regexp.Regexp {
	return regexp.MustCompile(`"` + regexp.QuoteMeta(userAgent) + `" "([^"]*)"`)
}

// AccessLogLine waits for the access log line of the request sent with the
// unique User-Agent ua and returns it.
func (f *Envoy) AccessLogLine(ua string) (string, error) {
	re := regexp.MustCompile(`(?m)^.*"` + regexp.QuoteMeta(ua) + `".*$`)
	deadline := time.Now().Add(10 * time.Second)
	for {
		if m := re.FindString(f.log.String()); m != "" {
			return m, nil
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("no access log line for user-agent %s", ua)
		}
		time.Sleep(accessLogFlush)
	}
}

// RequestID reads the x-request-id Envoy gave the request that got resp
// from its access log line (each agent request has a unique User-Agent).
func (f *Envoy) RequestID(resp *Response) (string, error) {
	line, err := f.AccessLogLine(resp.UserAgent)
	if err != nil {
		return "", err
	}
	m := accessLogRequestID(resp.UserAgent).FindStringSubmatch(line)
	if m == nil {
		return "", fmt.Errorf("access log line has no x-request-id after the user-agent: %s", line)
	}
	return m[1], nil
}
