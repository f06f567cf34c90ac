package postgres

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/idemgate/idemgate/state"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// migrationLockID is the pg_advisory_xact_lock key that serialises migrations
// ("idemgate" in ASCII), so replicas starting together apply each file once.
const migrationLockID int64 = 0x6964656d67617465

type migration struct {
	version int
	name    string
	sql     string
}

// migrations returns the embedded files ordered by their numeric prefix
// (0001_name.sql).
func migrations() ([]migration, error) {
	entries, err := fs.ReadDir(migrationFiles, "migrations")
	if err != nil {
		return nil, fmt.Errorf("failed to read embedded migrations: %w", err)
	}
	var out []migration
	seen := map[int]string{}
	for _, e := range entries {
		name := e.Name()
		prefix, _, ok := strings.Cut(name, "_")
		if !ok || !strings.HasSuffix(name, ".sql") {
			return nil, fmt.Errorf("migration %q is not named NNNN_name.sql", name)
		}
		v, err := strconv.Atoi(prefix)
		if err != nil || v <= 0 {
			return nil, fmt.Errorf("migration %q has no positive version prefix", name)
		}
		if other, dup := seen[v]; dup {
			return nil, fmt.Errorf("migrations %q and %q share version %d", other, name, v)
		}
		seen[v] = name
		b, err := migrationFiles.ReadFile(path.Join("migrations", name))
		if err != nil {
			return nil, fmt.Errorf("failed to read migration %q: %w", name, err)
		}
		out = append(out, migration{version: v, name: name, sql: string(b)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].version < out[j].version })
	return out, nil
}

// Migrate applies every embedded migration not yet recorded in
// schema_migrations in one transaction that first takes a
// transaction-level advisory lock, so that concurrent callers (replicas
// starting at once, `idemgate migrate` beside `serve`) apply each file
// exactly once. The lock ends with the transaction whatever happens: a
// session lock would not, behind a pooler in transaction mode, where the
// lock and its unlock can run on different server connections and leave
// the lock held on a pooled one, so that no later start could migrate.
// It uses its own connection, closed on return.
func Migrate(ctx context.Context, dsn string) error {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return fmt.Errorf("%w: failed to parse postgres dsn: %w", state.ErrInvalidArgument, err)
	}
	return migrateWith(ctx, cfg)
}

func migrateWith(ctx context.Context, cfg *pgx.ConnConfig) error {
	// The simple protocol: no statement, named or not, outlives its
	// message, whatever pooler sits between here and PostgreSQL. Migrations
	// are not a hot path.
	cfg = cfg.Copy()
	cfg.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return state.Unavailable("connect to postgres for migrations", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	return migrate(ctx, conn)
}

func migrate(ctx context.Context, conn *pgx.Conn) (err error) {
	all, err := migrations()
	if err != nil {
		return err
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		return state.Unavailable("begin migrations", err)
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, ignoreClosed(tx.Rollback(context.WithoutCancel(ctx))))
		}
	}()
	if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", migrationLockID); err != nil {
		return state.Unavailable("take the migration lock", err)
	}
	if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (
		version    int         PRIMARY KEY,
		name       text        NOT NULL,
		applied_at timestamptz NOT NULL DEFAULT now()
	)`); err != nil {
		return state.Unavailable("create schema_migrations", err)
	}
	applied := map[int]bool{}
	rows, err := tx.Query(ctx, "SELECT version FROM schema_migrations")
	if err != nil {
		return state.Unavailable("read schema_migrations", err)
	}
	for rows.Next() {
		var v int
		if err := rows.Scan(&v); err != nil {
			rows.Close()
			return state.Unavailable("read schema_migrations", err)
		}
		applied[v] = true
	}
	if err := rows.Err(); err != nil {
		return state.Unavailable("read schema_migrations", err)
	}
	for _, m := range all {
		if applied[m.version] {
			continue
		}
		if err := apply(ctx, tx, m); err != nil {
			return err
		}
	}
	if err := ensurePartitions(ctx, tx, DefaultPartitionsAhead); err != nil {
		return state.Unavailable("create postgres partitions", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return state.Unavailable("commit migrations", err)
	}
	return nil
}

// apply runs one migration inside the migrations' transaction.
func apply(ctx context.Context, tx pgx.Tx, m migration) error {
	// No arguments: pgx sends the file with the simple protocol, which
	// allows several statements.
	if _, err := tx.Exec(ctx, m.sql); err != nil {
		return fmt.Errorf("failed to apply migration %s: %w", m.name, err)
	}
	if _, err := tx.Exec(ctx, "INSERT INTO schema_migrations (version, name) VALUES ($1, $2)", m.version, m.name); err != nil {
		return fmt.Errorf("failed to record migration %s: %w", m.name, err)
	}
	return nil
}

func ignoreClosed(err error) error {
	if errors.Is(err, pgx.ErrTxClosed) {
		return nil
	}
	return err
}
