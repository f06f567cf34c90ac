package stack

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/idemgate/idemgate/e2e/envoysim"
	"github.com/idemgate/idemgate/internal/testutil"
)

// front is what agents talk to: the envoysim harness or a real Envoy, both
// running the (edited) shipped envoy.yaml.
type front interface {
	// Addr is the listener's host:port.
	Addr() string
	// RequestID returns the x-request-id the front gave the request that
	// got resp, which idemgate must echo as trace_id. Only local replies
	// (every envelope is one) can be looked up.
	RequestID(resp *Response) (string, error)
	// Mode names the front for logs and the package doc.
	Mode() string
	Log() string
	Close()
}

// harnessFront is envoysim serving the bootstrap in-process.
type harnessFront struct {
	proxy *envoysim.Proxy
	log   *logBuffer

	mu      sync.Mutex
	replies []envoysim.LocalReply
}

func startHarness(bootstrap []byte) (*harnessFront, error) {
	cfg, err := envoysim.FromBootstrap(bootstrap, nil, "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("the harness refuses the bootstrap: %w", err)
	}
	f := &harnessFront{log: &logBuffer{}}
	p, err := envoysim.New(cfg,
		envoysim.WithLogger(slog.New(slog.NewTextHandler(f.log, &slog.HandlerOptions{Level: slog.LevelInfo}))),
		envoysim.WithHooks(envoysim.Hooks{
			OnLocalReply: func(lr envoysim.LocalReply) {
				f.mu.Lock()
				f.replies = append(f.replies, lr)
				f.mu.Unlock()
				fmt.Fprintf(f.log, "local reply: request_id=%s status=%d source=%s details=%s\n", lr.RequestID, lr.Status, lr.Source, lr.Details)
			},
			OnRequestDone: func(a envoysim.AccessLog) {
				fmt.Fprintf(f.log, "access: request_id=%s %s %s -> %d %s ext_proc=%t upstream_attempts=%d reset=%t %s\n",
					a.RequestID, a.Method, a.Path, a.ResponseCode, a.ResponseCodeDetails, a.ExtProcStreamOpened, a.UpstreamAttempts, a.DownstreamReset, a.Duration)
			},
		}))
	if err != nil {
		return nil, fmt.Errorf("the harness refuses the config: %w", err)
	}
	if err := p.Start(""); err != nil {
		return nil, fmt.Errorf("failed to start the harness: %w", err)
	}
	f.proxy = p
	return f, nil
}

func (f *harnessFront) Addr() string { return f.proxy.Addr() }
func (f *harnessFront) Mode() string { return "envoysim harness" }
func (f *harnessFront) Log() string  { return f.log.String() }
func (f *harnessFront) Close()       { _ = f.proxy.Close() }

// RequestID finds the local reply whose status and body are resp's: the body
// of an envelope holds its trace_id, so at most one reply matches.
func (f *harnessFront) RequestID(resp *Response) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, lr := range f.replies {
		if lr.Status == resp.StatusCode && lr.Body == string(resp.Body) {
			return lr.RequestID, nil
		}
	}
	return "", errors.New("the harness generated no local reply with this status and body")
}

// envoyFront is a real Envoy process.
type envoyFront struct {
	listenAddr, adminAddr string
	log                   *logBuffer
	cmd                   *exec.Cmd
	exited                chan struct{}
}

// envoyBaseIDs keeps the shared-memory base ids of the Envoys one test
// binary starts apart; the pid keeps them apart from other binaries'.
var envoyBaseIDs atomic.Uint32

func startEnvoy(t testing.TB, bin string, bootstrap []byte, listenAddr, adminAddr string) (*envoyFront, error) {
	path := filepath.Join(t.TempDir(), "envoy.yaml")
	if err := os.WriteFile(path, bootstrap, 0o600); err != nil {
		return nil, fmt.Errorf("failed to write the bootstrap: %w", err)
	}
	baseID := uint32(os.Getpid()%100000)*100 + envoyBaseIDs.Add(1)%100
	f := &envoyFront{listenAddr: listenAddr, adminAddr: adminAddr, log: &logBuffer{}, exited: make(chan struct{})}
	cmd := exec.Command(bin, "-c", path, "--base-id", strconv.FormatUint(uint64(baseID), 10), "--log-level", "warning")
	// stdout carries the access log (the shipped stdout access logger).
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
			return nil, errors.New("envoy exited during start-up")
		default:
		}
		resp, err := adminClient.Get("http://" + adminAddr + "/ready")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK && testutil.WaitForTCP(listenAddr, time.Second) == nil {
				return f, nil
			}
		}
		if time.Now().After(deadline) {
			f.Close()
			return nil, fmt.Errorf("envoy was not ready within %s", readyTimeout)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (f *envoyFront) Addr() string { return f.listenAddr }
func (f *envoyFront) Mode() string { return "real Envoy" }
func (f *envoyFront) Log() string  { return f.log.String() }

func (f *envoyFront) Close() {
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

// RequestID reads the access log line of the request sent with resp's
// unique User-Agent. Envoy flushes access logs about once a second.
func (f *envoyFront) RequestID(resp *Response) (string, error) {
	re := accessLogRequestID(resp.UserAgent)
	deadline := time.Now().Add(10 * time.Second)
	for {
		if m := re.FindStringSubmatch(f.log.String()); m != nil {
			return m[1], nil
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("no access log line for user-agent %s", resp.UserAgent)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
