package chaos

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemgate/idemgate/internal/testutil"
)

// PGInstance is a throwaway PostgreSQL server of the run's own (initdb into
// a temporary directory, a free loopback port), so the run can crash and
// restart it without touching the shared server. It runs as the system's
// postgres user when the run is root (postgres refuses to run as root).
type PGInstance struct {
	bin, data, sock string
	port            int
	cred            *syscall.Credential
	log             testutil.SyncBuffer

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{}
}

// pgBinDir finds the newest /usr/lib/postgresql/<v>/bin holding initdb.
func pgBinDir() (string, error) {
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool {
		vi, _ := strconv.Atoi(filepath.Base(filepath.Dir(dirs[i])))
		vj, _ := strconv.Atoi(filepath.Base(filepath.Dir(dirs[j])))
		return vi > vj
	})
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "initdb")); err == nil {
			return d, nil
		}
	}
	return "", errors.New("no /usr/lib/postgresql/*/bin/initdb")
}

// StartPGInstance initialises and starts a server; it is stopped at cleanup.
func StartPGInstance(t testing.TB) (*PGInstance, error) {
	bin, err := pgBinDir()
	if err != nil {
		return nil, err
	}
	// Not t.TempDir: its parent is private to root, and the server runs as
	// postgres.
	dir, err := os.MkdirTemp("", "idemgate-chaos-pg-")
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	p := &PGInstance{bin: bin, data: filepath.Join(dir, "data"), sock: dir, port: testutil.FreePort(t)}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			return nil, fmt.Errorf("running as root and there is no postgres user: %w", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		p.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		if err := os.Chown(dir, uid, gid); err != nil {
			return nil, err
		}
	}
	initdb := exec.Command(filepath.Join(bin, "initdb"), "-D", p.data, "-U", "postgres", "--auth=trust", "--no-sync", "-E", "UTF8", "--no-instructions")
	initdb.SysProcAttr = &syscall.SysProcAttr{Credential: p.cred}
	if out, err := initdb.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("initdb: %w\n%s", err, out)
	}
	if err := p.start(); err != nil {
		return nil, err
	}
	t.Cleanup(p.kill)
	return p, nil
}

// DSN reaches the instance's postgres database.
func (p *PGInstance) DSN() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", p.port)
}

// Addr is the instance's host:port.
func (p *PGInstance) Addr() string { return fmt.Sprintf("127.0.0.1:%d", p.port) }

func (p *PGInstance) start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	cmd := exec.Command(filepath.Join(p.bin, "postgres"), "-D", p.data, "-p", strconv.Itoa(p.port), "-k", p.sock,
		"-c", "listen_addresses=127.0.0.1",
		// fsync off: a process crash keeps what reached the kernel. Never
		// synchronous_commit=off: a commit acknowledged from the WAL buffer
		// is lost by a crash, and with it a DONE record (the chaos run
		// found it: the retry executed again).
		"-c", "fsync=off",
		"-c", "max_connections=200", "-c", "log_min_messages=warning")
	cmd.Stdout, cmd.Stderr = &p.log, &p.log
	// Its own process group, so a crash takes the backends along; and it
	// dies with the test binary.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL, Credential: p.cred}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("postgres: %w", err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	p.cmd, p.exited = cmd, exited
	deadline := time.Now().Add(60 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		c, err := pgx.Connect(ctx, p.DSN())
		cancel()
		if err == nil {
			_ = c.Close(context.Background())
			return nil
		}
		select {
		case <-exited:
			return fmt.Errorf("postgres exited during start-up: %s", p.log.String())
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("postgres did not accept connections within 60s: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// kill ends the server and every backend at once (SIGKILL to the group): a
// crash, recovered from the WAL at the next start.
func (p *PGInstance) kill() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	<-p.exited
	p.cmd = nil
}

// Restart crashes the server and starts it again after down.
func (p *PGInstance) Restart(down time.Duration) error {
	p.kill()
	time.Sleep(down)
	return p.start()
}
