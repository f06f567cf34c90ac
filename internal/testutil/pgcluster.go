package testutil

import (
	"context"
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
)

// PGServer is a PostgreSQL server (its own initdb cluster) owned by one test,
// on a free loopback port, trust authentication, user postgres. It may be
// killed (SIGKILL: a crash) and, when a standby, promoted.
type PGServer struct {
	t       testing.TB
	Port    int
	dataDir string
	bin     string
	cred    *syscall.Credential
	mu      sync.Mutex
	cmd     *exec.Cmd
	waitErr chan error
	out     *SyncBuffer
}

// DSN reaches the server's postgres database.
func (s *PGServer) DSN() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", s.Port)
}

// Log is what the server printed.
func (s *PGServer) Log() string { return s.out.String() }

// postgresBin finds a directory with PostgreSQL's server binaries (Debian
// puts them under /usr/lib/postgresql/<major>/bin, off PATH; the newest
// major first), then the one initdb on PATH is in.
func postgresBin(t testing.TB) string {
	t.Helper()
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool {
		a, _ := strconv.Atoi(filepath.Base(filepath.Dir(dirs[i])))
		b, _ := strconv.Atoi(filepath.Base(filepath.Dir(dirs[j])))
		return a > b
	})
	if p, err := exec.LookPath("initdb"); err == nil {
		dirs = append(dirs, filepath.Dir(p))
	}
	for _, d := range dirs {
		complete := true
		for _, tool := range []string{"initdb", "postgres", "pg_basebackup"} {
			if _, err := os.Stat(filepath.Join(d, tool)); err != nil {
				complete = false
			}
		}
		if complete {
			return d
		}
	}
	unavailable(t, "PostgreSQL server binaries (initdb; Debian package postgresql)", os.ErrNotExist)
	return ""
}

// pgCredential is who runs PostgreSQL's tools: they refuse root, so a test
// running as root runs them as the postgres user.
func pgCredential(t testing.TB) *syscall.Credential {
	t.Helper()
	if os.Geteuid() != 0 {
		return nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		unavailable(t, "the postgres OS user (PostgreSQL refuses to run as root)", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
}

// pgDir makes a directory the postgres user owns, removed at cleanup.
func pgDir(t testing.TB, cred *syscall.Credential) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "idemgate-pg-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	if cred != nil {
		if err := os.Chown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func runPG(t testing.TB, cred *syscall.Credential, name string, args ...string) {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Credential: cred}
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s %v failed: %v\n%s", filepath.Base(name), args, err, out)
	}
}

// PGPrimaryOptions configure StartPGPrimary.
type PGPrimaryOptions struct {
	// SynchronousStandby names the standby (its application_name) every
	// commit waits for (synchronous_standby_names); empty: asynchronous
	// replication only.
	SynchronousStandby string
}

// StartPGPrimary initialises and starts a primary ready for streaming
// replication.
func StartPGPrimary(t testing.TB, opts PGPrimaryOptions) *PGServer {
	t.Helper()
	bin := postgresBin(t)
	cred := pgCredential(t)
	dir := pgDir(t, cred)
	data := filepath.Join(dir, "data")
	runPG(t, cred, filepath.Join(bin, "initdb"), "-D", data, "-U", "postgres", "--auth=trust", "--no-sync", "-E", "UTF8")
	conf := fmt.Sprintf(`
listen_addresses = '127.0.0.1'
unix_socket_directories = '%s'
wal_level = replica
max_wal_senders = 4
synchronous_commit = on
synchronous_standby_names = '%s'
fsync = off
shared_buffers = 32MB
max_connections = 60
`, dir, opts.SynchronousStandby)
	appendFile(t, filepath.Join(data, "postgresql.conf"), conf)
	s := &PGServer{t: t, Port: FreePort(t), dataDir: data, bin: bin, cred: cred, out: &SyncBuffer{}}
	s.start(t)
	return s
}

// StartPGStandby clones primary with pg_basebackup and starts it as a
// streaming standby named name (its application_name).
func StartPGStandby(t testing.TB, primary *PGServer, name string) *PGServer {
	t.Helper()
	dir := pgDir(t, primary.cred)
	data := filepath.Join(dir, "data")
	runPG(t, primary.cred, filepath.Join(primary.bin, "pg_basebackup"), "-h", "127.0.0.1", "-p", strconv.Itoa(primary.Port),
		"-U", "postgres", "-D", data, "-X", "stream", "-R", "--no-sync")
	// postgresql.auto.conf, after what pg_basebackup -R wrote there: the
	// last setting of a name wins.
	appendFile(t, filepath.Join(data, "postgresql.auto.conf"), fmt.Sprintf(`
unix_socket_directories = '%s'
primary_conninfo = 'host=127.0.0.1 port=%d user=postgres application_name=%s'
hot_standby = on
# Promoted, it has no standby of its own: commits must not wait for one.
synchronous_standby_names = ''
`, dir, primary.Port, name))
	s := &PGServer{t: t, Port: FreePort(t), dataDir: data, bin: primary.bin, cred: primary.cred, out: &SyncBuffer{}}
	s.start(t)
	return s
}

func appendFile(t testing.TB, path, text string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(text); err != nil {
		t.Fatal(err)
	}
}

func (s *PGServer) start(t testing.TB) {
	t.Helper()
	cmd := exec.Command(filepath.Join(s.bin, "postgres"), "-D", s.dataDir, "-p", strconv.Itoa(s.Port))
	cmd.Stdout, cmd.Stderr = s.out, s.out
	// Own process group, so Kill reaches the postmaster's children too and
	// nothing else.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Credential: s.cred}
	if err := cmd.Start(); err != nil {
		t.Fatalf("failed to start postgres: %v", err)
	}
	s.mu.Lock()
	s.cmd = cmd
	s.waitErr = make(chan error, 1)
	s.mu.Unlock()
	go func() { s.waitErr <- cmd.Wait() }()
	t.Cleanup(s.Kill)
	deadline := time.Now().Add(60 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		c, err := pgx.Connect(ctx, s.DSN())
		if err == nil {
			_ = c.Close(ctx)
			cancel()
			return
		}
		cancel()
		if time.Now().After(deadline) {
			t.Fatalf("postgres on port %d did not accept connections: %v\n%s", s.Port, err, s.out.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Kill crashes the server: SIGKILL to the postmaster and every backend.
func (s *PGServer) Kill() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return
	}
	_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
	<-s.waitErr
	s.cmd = nil
}

// Promote makes a standby the primary and waits until it accepts writes.
func (s *PGServer) Promote(ctx context.Context) error {
	c, err := pgx.Connect(ctx, s.DSN())
	if err != nil {
		return err
	}
	defer c.Close(context.WithoutCancel(ctx))
	var ok bool
	if err := c.QueryRow(ctx, "SELECT pg_promote(true, 60)").Scan(&ok); err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("pg_promote did not finish")
	}
	return nil
}

// WaitForStandby waits until the primary streams to the standby named
// name in the given sync_state ("sync" or "async").
func (s *PGServer) WaitForStandby(ctx context.Context, name, syncState string) error {
	c, err := pgx.Connect(ctx, s.DSN())
	if err != nil {
		return err
	}
	defer c.Close(context.WithoutCancel(ctx))
	for {
		var st string
		err := c.QueryRow(ctx, "SELECT sync_state FROM pg_stat_replication WHERE application_name = $1 AND state = 'streaming'", name).Scan(&st)
		if err == nil && st == syncState {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("standby %s not %s: last %q, %v: %w", name, syncState, st, err, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}
