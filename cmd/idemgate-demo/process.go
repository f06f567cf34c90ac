package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"
)

// child is a process the demo started (Envoy or idemgate).
type child struct {
	name string
	cmd  *exec.Cmd
	done chan struct{} // closed once the process exited and its output was copied
	err  error         // what Wait returned; read after done

	mu   sync.Mutex
	tail []string // its last lines, for the error when it dies
}

// tailLines is how many of a child's last output lines an error quotes.
const tailLines = 20

// workspace is what the demo's children share: dir, a temporary directory
// for the files they read, and log, where their output lines go.
type workspace struct {
	dir string
	log *lockedWriter
}

// childSpec is a child process to start.
type childSpec struct {
	name string // prefixes its lines in the log and names it in errors
	bin  string
	args []string
	env  []string // its whole environment
	// onLine, if set, is called with every line it writes, from the copying
	// goroutines.
	onLine func(string)
}

// startChild runs spec.bin with spec.args. Every line it writes (stdout and
// stderr) goes to the log prefixed with its name, and to spec.onLine.
func (w workspace) startChild(spec childSpec) (*child, error) {
	c := &child{name: spec.name, done: make(chan struct{})}
	cmd := exec.Command(spec.bin, spec.args...)
	cmd.Env = spec.env
	out := &lineWriter{emit: func(line string) {
		c.mu.Lock()
		c.tail = append(c.tail, line)
		if len(c.tail) > tailLines {
			c.tail = c.tail[1:]
		}
		c.mu.Unlock()
		w.log.writeLine(spec.name + ": " + line)
		if spec.onLine != nil {
			spec.onLine(line)
		}
	}}
	cmd.Stdout, cmd.Stderr = out, out
	// Setpgid: its own process group, so the terminal's Ctrl-C reaches only
	// the demo, which stops the children in order (front first). Pdeathsig:
	// if the demo dies without stopping them (kill -9), they die too rather
	// than hold the ports.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("failed to start %s (%s): %w", spec.name, spec.bin, err)
	}
	c.cmd = cmd
	go func() {
		c.err = cmd.Wait()
		out.flush()
		close(c.done)
	}()
	return c, nil
}

// pid is the child's process id.
func (c *child) pid() int { return c.cmd.Process.Pid }

// exited reports, once the child has exited, why, with its last lines.
func (c *child) exited() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return fmt.Errorf("%s exited (%v); its last lines:\n  %s", c.name, c.err, strings.Join(c.tail, "\n  "))
}

// stop sends SIGTERM and waits up to grace for the child to exit, then
// kills it. It returns an error when the child did not exit cleanly.
func (c *child) stop(grace time.Duration) error {
	select {
	case <-c.done:
		return c.exitError()
	default:
	}
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.done:
		return c.exitError()
	case <-time.After(grace):
		_ = c.cmd.Process.Kill()
		<-c.done
		return fmt.Errorf("%s did not exit within %s of SIGTERM and was killed", c.name, grace)
	}
}

func (c *child) exitError() error {
	if c.err == nil {
		return nil
	}
	var ee *exec.ExitError
	if errors.As(c.err, &ee) {
		return c.exited()
	}
	return fmt.Errorf("%s: %w", c.name, c.err)
}

// lockedWriter serialises whole lines from several goroutines onto one
// writer (the demo's stderr), so that lines never interleave.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) writeLine(line string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	_, _ = io.WriteString(l.w, line+"\n")
}

// lineWriter splits what a process writes into lines. os/exec calls Write
// from one goroutine per stream; stdout and stderr share this writer when
// they are the same value, in which case exec copies through one pipe.
type lineWriter struct {
	mu   sync.Mutex
	buf  bytes.Buffer
	emit func(string)
}

func (w *lineWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	for {
		i := bytes.IndexByte(w.buf.Bytes(), '\n')
		if i < 0 {
			return len(p), nil
		}
		line := string(w.buf.Next(i + 1))
		w.emit(strings.TrimRight(line, "\r\n"))
	}
}

// flush emits a last line that had no newline.
func (w *lineWriter) flush() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.buf.Len() > 0 {
		w.emit(w.buf.String())
		w.buf.Reset()
	}
}
