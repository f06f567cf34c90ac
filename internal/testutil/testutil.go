// Package testutil starts the throwaway services that integration tests need:
// a redis-server of the test's own (so it may be flushed, killed and
// restarted), a Redis Cluster, and a PostgreSQL database created on the shared
// server and dropped afterwards. Tests never flush or stop the shared Redis or
// PostgreSQL.
package testutil

import (
	"context"
	"fmt"
	"net"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// PostgresAdminDSN is the DSN of the shared PostgreSQL used to create and drop
// test databases. IDEMGATE_TEST_PG overrides it.
func PostgresAdminDSN() string {
	if v := os.Getenv("IDEMGATE_TEST_PG"); v != "" {
		return v
	}
	return "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"
}

// FreePort returns a loopback TCP port that was free a moment ago.
func FreePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("failed to find a free port: %v", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// WaitForTCP waits until addr accepts connections or the timeout passes.
func WaitForTCP(addr string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err == nil {
			c.Close()
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s did not accept connections within %s: %w", addr, timeout, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// CreateDatabase creates a fresh database on the shared PostgreSQL, drops it
// when the test ends, and returns its DSN. The test is skipped with one clear
// line when PostgreSQL is not reachable and IDEMGATE_REQUIRE_SERVICES is not
// set; with it set (as make test and CI do) the test fails instead.
func CreateDatabase(t testing.TB) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	admin, err := pgx.Connect(ctx, PostgresAdminDSN())
	if err != nil {
		unavailable(t, "PostgreSQL", err)
	}
	defer admin.Close(context.Background())
	name := fmt.Sprintf("idemgate_test_%d_%d", os.Getpid(), time.Now().UnixNano())
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatalf("failed to create test database: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		c, err := pgx.Connect(ctx, PostgresAdminDSN())
		if err != nil {
			t.Logf("failed to connect to drop %s: %v", name, err)
			return
		}
		defer c.Close(context.Background())
		if _, err := c.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
			t.Logf("failed to drop %s: %v", name, err)
		}
	})
	cfg, err := pgx.ParseConfig(PostgresAdminDSN())
	if err != nil {
		t.Fatalf("failed to parse %q: %v", PostgresAdminDSN(), err)
	}
	return fmt.Sprintf("postgres://%s@%s:%d/%s?sslmode=disable", cfg.User, cfg.Host, cfg.Port, name)
}

func unavailable(t testing.TB, what string, err error) {
	t.Helper()
	if os.Getenv("IDEMGATE_REQUIRE_SERVICES") != "" {
		t.Fatalf("%s is required but not reachable: %v", what, err)
	}
	t.Skipf("%s not reachable (%v); run `make test` to start it", what, err)
}
