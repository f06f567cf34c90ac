package testutil

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// PgBouncer is a pgbouncer process owned by one test, in front of the shared
// PostgreSQL, on a free loopback port.
type PgBouncer struct {
	Addr string
	out  *SyncBuffer
}

// PgBouncerOptions configure StartPgBouncer.
type PgBouncerOptions struct {
	// PoolMode is session, transaction (default) or statement.
	PoolMode string
	// PoolSize is default_pool_size: server connections per database and
	// user (default 4). Small, so that a client's transactions move
	// between server connections, as they do at scale.
	PoolSize int
}

// StartPgBouncer starts pgbouncer (Debian package pgbouncer) for this test
// and stops it at cleanup. Every database of the shared PostgreSQL is
// reachable through it under its own name.
func StartPgBouncer(t testing.TB, opts PgBouncerOptions) *PgBouncer {
	t.Helper()
	bin, err := exec.LookPath("pgbouncer")
	if err != nil {
		if _, serr := os.Stat("/usr/sbin/pgbouncer"); serr != nil {
			unavailable(t, "pgbouncer (Debian package pgbouncer)", err)
		}
		bin = "/usr/sbin/pgbouncer"
	}
	if opts.PoolMode == "" {
		opts.PoolMode = "transaction"
	}
	if opts.PoolSize == 0 {
		opts.PoolSize = 4
	}
	admin, err := pgx.ParseConfig(PostgresAdminDSN())
	if err != nil {
		t.Fatalf("failed to parse %q: %v", PostgresAdminDSN(), err)
	}
	port := FreePort(t)
	dir := t.TempDir()
	conf := fmt.Sprintf(`[databases]
* = host=%s port=%d
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = trust
auth_file = %s
pool_mode = %s
default_pool_size = %d
max_client_conn = 500
ignore_startup_parameters = extra_float_digits
server_reset_query =
`, admin.Host, admin.Port, port, filepath.Join(dir, "users.txt"), opts.PoolMode, opts.PoolSize)
	if os.Geteuid() == 0 {
		// pgbouncer refuses to run as root; it drops to this user itself.
		conf += "user = nobody\n"
		if err := os.Chmod(dir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "users.txt"), fmt.Appendf(nil, "%q \"\"\n", admin.User), 0o644); err != nil {
		t.Fatal(err)
	}
	ini := filepath.Join(dir, "pgbouncer.ini")
	if err := os.WriteFile(ini, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	b := &PgBouncer{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), out: &SyncBuffer{}}
	cmd := exec.Command(bin, ini)
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = b.out, b.out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatalf("failed to start pgbouncer: %v", err)
	}
	waitErr := make(chan error, 1)
	go func() { waitErr <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGINT)
		select {
		case <-waitErr:
		case <-time.After(5 * time.Second):
			_ = cmd.Process.Kill()
			<-waitErr
		}
	})
	if err := WaitForTCP(b.Addr, 10*time.Second); err != nil {
		t.Fatalf("pgbouncer did not start: %v\n%s", err, b.out.String())
	}
	return b
}

// DSN rewrites a DSN of the shared PostgreSQL (CreateDatabase's) to go
// through the pooler.
func (b *PgBouncer) DSN(t testing.TB, direct string) string {
	t.Helper()
	cfg, err := pgx.ParseConfig(direct)
	if err != nil {
		t.Fatalf("failed to parse %q: %v", direct, err)
	}
	from := net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port)))
	if !strings.Contains(direct, from) {
		t.Fatalf("DSN %q does not name %s", direct, from)
	}
	return strings.Replace(direct, from, b.Addr, 1)
}

// Log is what pgbouncer printed so far.
func (b *PgBouncer) Log() string { return b.out.String() }
