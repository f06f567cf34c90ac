package main

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	goredis "github.com/redis/go-redis/v9"
)

// defaultAdminDSN is the shared PostgreSQL; IDEMGATE_TEST_PG overrides it
// (as for the tests).
func defaultAdminDSN() string {
	if v := os.Getenv("IDEMGATE_TEST_PG"); v != "" {
		return v
	}
	return "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"
}

// defaultSharedRedis is the machine's Redis the tests use
// (IDEMGATE_TEST_REDIS_PORT as in .ci/services.sh).
func defaultSharedRedis() string {
	port := os.Getenv("IDEMGATE_TEST_REDIS_PORT")
	if port == "" {
		port = "6379"
	}
	return "127.0.0.1:" + port
}

// benchDatabase is the database this run creates on the shared server and
// drops at the end.
type benchDatabase struct {
	adminDSN string
	name     string
	dsn      string
	version  string
}

// createBenchDatabase creates namePrefix<pid> (e.g. idemgate_bench_1234).
func createBenchDatabase(ctx context.Context, adminDSN, namePrefix string) (*benchDatabase, error) {
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, adminDSN)
	if err != nil {
		return nil, fmt.Errorf("failed to connect to PostgreSQL: %w", err)
	}
	defer conn.Close(context.Background())
	db := &benchDatabase{adminDSN: adminDSN, name: namePrefix + strconv.Itoa(os.Getpid())}
	if err := conn.QueryRow(ctx, "SHOW server_version").Scan(&db.version); err != nil {
		return nil, fmt.Errorf("failed to read the PostgreSQL version: %w", err)
	}
	// A database left by an interrupted run with the same pid is ours too.
	if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+db.name+" WITH (FORCE)"); err != nil {
		return nil, fmt.Errorf("failed to drop a stale %s: %w", db.name, err)
	}
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+db.name); err != nil {
		return nil, fmt.Errorf("failed to create %s: %w", db.name, err)
	}
	u, err := url.Parse(adminDSN)
	if err != nil {
		return nil, fmt.Errorf("failed to parse the PostgreSQL DSN: %w", err)
	}
	u.Path = "/" + db.name
	db.dsn = u.String()
	return db, nil
}

// drop removes the database, closing any connection still open to it.
func (db *benchDatabase) drop() error {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, db.adminDSN)
	if err != nil {
		return fmt.Errorf("failed to connect to drop %s: %w", db.name, err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+db.name+" WITH (FORCE)"); err != nil {
		return fmt.Errorf("failed to drop %s: %w", db.name, err)
	}
	return nil
}

// truncate empties the record tables between scenarios so each starts from
// the same table size (tables that do not exist yet are skipped).
func (db *benchDatabase) truncate(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, db.dsn)
	if err != nil {
		return fmt.Errorf("failed to connect to %s: %w", db.name, err)
	}
	defer conn.Close(context.Background())
	for _, t := range []string{"idempotency_record", "iofloor_record"} {
		var exists bool
		if err := conn.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", t).Scan(&exists); err != nil {
			return fmt.Errorf("failed to look up %s: %w", t, err)
		}
		if exists {
			if _, err := conn.Exec(ctx, "TRUNCATE "+t); err != nil {
				return fmt.Errorf("failed to truncate %s: %w", t, err)
			}
		}
	}
	// No ANALYZE here: statistics of an empty table make PostgreSQL plan
	// every key lookup as a sequential scan, and the servers' cached plans
	// would keep scanning the whole table as the scenario fills it (a
	// lookup that costs more with every request, worst for whoever runs
	// last). TRUNCATE resets the statistics, so the planner sizes the
	// tables as they are.
	return nil
}

// benchRedis is the tool's own redis-server: loopback, a free port, nothing
// on disk.
type benchRedis struct {
	*child
	addr    string
	version string
}

func startRedis(ctx context.Context, bin, dir string) (*benchRedis, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	c, err := startChild(ctx, childSpec{
		name: "redis-server",
		path: bin,
		args: []string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
			"--dir", dir, "--protected-mode", "no", "--loglevel", "warning"},
		probe:   tcpProbe(addr),
		timeout: 15 * time.Second,
	})
	if err != nil {
		return nil, err
	}
	r := &benchRedis{child: c, addr: addr}
	if out, err := exec.CommandContext(ctx, bin, "--version").Output(); err == nil {
		r.version = redisVersion(string(out))
	}
	return r, nil
}

// redisVersion picks "7.0.15" out of `redis-server --version`.
func redisVersion(s string) string {
	for _, f := range strings.Fields(s) {
		if v, ok := strings.CutPrefix(f, "v="); ok {
			return v
		}
	}
	return strings.TrimSpace(s)
}

// flush empties the tool's own Redis between scenarios (never the shared one).
func (r *benchRedis) flush(ctx context.Context) error {
	c := goredis.NewClient(&goredis.Options{Addr: r.addr})
	defer c.Close()
	if err := c.FlushAll(ctx).Err(); err != nil {
		return fmt.Errorf("failed to flush the benchmark's redis-server: %w", err)
	}
	return nil
}
