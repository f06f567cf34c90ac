package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"
)

// child is a process the tool started: a server under test or Redis. It
// runs in its own process group and dies with the tool (Pdeathsig), so an
// interrupted run leaves nothing behind on a shared machine.
type child struct {
	name string
	cmd  *exec.Cmd
	done chan struct{}
	err  error // set before done is closed

	mu   sync.Mutex
	tail []string // last lines of stderr+stdout, for error messages
}

const tailLines = 40

type childSpec struct {
	name string
	path string
	args []string
	env  []string // added to the tool's environment
	// readyLine, if set, is the stderr line that says the child is serving.
	readyLine string
	// probe, if set, is polled until it succeeds (e.g. a TCP dial).
	probe   func() error
	timeout time.Duration
}

// freePort returns a loopback port that was free a moment ago.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("failed to find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func startChild(ctx context.Context, spec childSpec) (*child, error) {
	cmd := exec.Command(spec.path, spec.args...)
	cmd.Env = append(os.Environ(), spec.env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, fmt.Errorf("failed to pipe the stderr of %s: %w", spec.name, err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, fmt.Errorf("failed to pipe the stdout of %s: %w", spec.name, err)
	}
	c := &child{name: spec.name, cmd: cmd, done: make(chan struct{})}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("failed to start %s: %w", spec.name, err)
	}
	ready := make(chan struct{})
	var readyOnce sync.Once
	var pipes sync.WaitGroup
	pipes.Add(2)
	go func() {
		defer pipes.Done()
		c.scan(stderr, func(line string) {
			if spec.readyLine != "" && strings.TrimSpace(line) == spec.readyLine {
				readyOnce.Do(func() { close(ready) })
			}
		})
	}()
	go func() {
		defer pipes.Done()
		c.scan(stdout, nil)
	}()
	go func() {
		pipes.Wait()
		c.err = cmd.Wait()
		close(c.done)
	}()
	if spec.probe != nil {
		go func() {
			for {
				if spec.probe() == nil {
					readyOnce.Do(func() { close(ready) })
					return
				}
				select {
				case <-c.done:
					return
				case <-time.After(20 * time.Millisecond):
				}
			}
		}()
	}
	timeout := spec.timeout
	if timeout <= 0 {
		timeout = 30 * time.Second
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-ready:
		return c, nil
	case <-c.done:
		return nil, fmt.Errorf("%s exited before it was ready (%v): %s", spec.name, c.err, c.lastLines())
	case <-t.C:
		c.stop(0)
		return nil, fmt.Errorf("%s was not ready within %s: %s", spec.name, timeout, c.lastLines())
	case <-ctx.Done():
		c.stop(0)
		return nil, ctx.Err()
	}
}

func (c *child) scan(r io.Reader, onLine func(string)) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		c.mu.Lock()
		c.tail = append(c.tail, line)
		if len(c.tail) > tailLines {
			c.tail = c.tail[len(c.tail)-tailLines:]
		}
		c.mu.Unlock()
		if onLine != nil {
			onLine(line)
		}
	}
	// Keep draining so the child never blocks on a full pipe.
	_, _ = io.Copy(io.Discard, r)
}

func (c *child) lastLines() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.tail) == 0 {
		return "(no output)"
	}
	return strings.Join(c.tail, "\n")
}

// pid is the child's process id.
func (c *child) pid() int { return c.cmd.Process.Pid }

// alive reports whether the child is still running.
func (c *child) alive() bool {
	select {
	case <-c.done:
		return false
	default:
		return true
	}
}

// stop sends SIGTERM, waits up to grace, then SIGKILLs; it signals the
// child's own pid only (never a group or a name).
func (c *child) stop(grace time.Duration) {
	if !c.alive() {
		return
	}
	if grace > 0 {
		_ = c.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-c.done:
			return
		case <-time.After(grace):
		}
	}
	_ = c.cmd.Process.Kill()
	<-c.done
}

// tcpProbe succeeds once addr accepts a connection.
func tcpProbe(addr string) func() error {
	return func() error {
		conn, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err != nil {
			return err
		}
		return conn.Close()
	}
}

var errNotRunning = errors.New("not running")

// checkAlive returns an error with the child's last output if it died.
func (c *child) checkAlive() error {
	if c.alive() {
		return nil
	}
	return fmt.Errorf("%s %w (%v): %s", c.name, errNotRunning, c.err, c.lastLines())
}
