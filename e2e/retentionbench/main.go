// Command retentionbench measures what removing a day of idempotency
// records costs at scale, today's row-by-row sweeper against dropping a
// daily partition: the time, the WAL written, and the latency of the
// confirms that run meanwhile. It also measures bytes per record in
// PostgreSQL and Redis, for docs/scaling.md's sizing table. It writes its section of
// BENCHMARKS.md (make bench-retention; not part of make test: loading ten
// million records takes minutes and gigabytes).
//
//	go run ./e2e/retentionbench -records 10000000 -out BENCHMARKS.md
//
// It works in a database of its own on the shared PostgreSQL (created and
// dropped) and a redis-server of its own on a free loopback port.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

func main() {
	records := flag.Int("records", 10_000_000, "records in the table when a day of them is removed (a third of them are that day)")
	out := flag.String("out", "", "report file whose retention section is (re)written; empty: stdout only")
	flag.Parse()
	if err := run(*records, *out); err != nil {
		log.Fatal(err)
	}
}

func adminDSN() string {
	if v := os.Getenv("IDEMGATE_TEST_PG"); v != "" {
		return v
	}
	return "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"
}

func run(records int, out string) error {
	ctx := context.Background()
	dsn, drop, err := createDatabase(ctx)
	if err != nil {
		return err
	}
	defer drop()
	b, err := newBench(ctx, dsn)
	if err != nil {
		return err
	}
	defer b.close()

	log.Printf("baseline: confirms with nothing being removed")
	baseline, err := b.confirmsDuring(ctx, func() error { time.Sleep(5 * time.Second); return nil })
	if err != nil {
		return err
	}

	log.Printf("partitions: loading %d records over three daily partitions", records)
	if err := b.loadPartitions(ctx, records); err != nil {
		return err
	}
	pgBytes, err := b.bytesPerRecord(ctx, partitionTable(b.today.AddDate(0, 0, -2)))
	if err != nil {
		return err
	}
	dayRecords, err := b.dayRecords(ctx)
	if err != nil {
		return err
	}
	parts, err := b.measure(ctx, "drop the day's partition", func(ctx context.Context) (int64, error) { return b.dropDay(ctx, dayRecords) })
	if err != nil {
		return err
	}
	if err := b.cleanPartitions(ctx); err != nil {
		return err
	}

	log.Printf("sweeper: loading %d records into one table", records)
	if err := b.loadTable(ctx, records); err != nil {
		return err
	}
	sweep, err := b.measure(ctx, "sweep the day row by row", b.sweepDay)
	if err != nil {
		return err
	}

	redisBytes, err := redisBytesPerRecord(ctx)
	if err != nil {
		return err
	}
	md := report(records, baseline, parts, sweep, pgBytes, redisBytes)
	fmt.Print(md)
	if out == "" {
		return nil
	}
	return writeSection(out, md)
}

// createDatabase makes a database of the benchmark's own.
func createDatabase(ctx context.Context) (string, func(), error) {
	admin, err := pgx.Connect(ctx, adminDSN())
	if err != nil {
		return "", nil, fmt.Errorf("connect to PostgreSQL (make services): %w", err)
	}
	defer admin.Close(ctx)
	name := fmt.Sprintf("idemgate_retention_bench_%d", os.Getpid())
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		return "", nil, err
	}
	cfg := admin.Config()
	dsn := fmt.Sprintf("postgres://%s@%s:%d/%s?sslmode=disable", cfg.User, cfg.Host, cfg.Port, name)
	return dsn, func() {
		c, err := pgx.Connect(context.Background(), adminDSN())
		if err != nil {
			log.Printf("failed to drop %s: %v", name, err)
			return
		}
		defer c.Close(context.Background())
		if _, err := c.Exec(context.Background(), "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
			log.Printf("failed to drop %s: %v", name, err)
		}
	}, nil
}

const sectionTitle = "## Retention: a day of records out of ten million (`make bench-retention`)"

// writeSection replaces the retention section of the report (from its
// title to the next "## " title), or appends it.
func writeSection(path, md string) error {
	old, err := os.ReadFile(path)
	if err != nil && !os.IsNotExist(err) {
		return err
	}
	text := string(old)
	if i := strings.Index(text, sectionTitle); i >= 0 {
		rest := text[i+len(sectionTitle):]
		end := len(text)
		if j := strings.Index(rest, "\n## "); j >= 0 {
			end = i + len(sectionTitle) + j + 1
		}
		text = text[:i] + md + text[end:]
	} else {
		if text != "" && !strings.HasSuffix(text, "\n\n") {
			text = strings.TrimRight(text, "\n") + "\n\n"
		}
		text += md
	}
	return os.WriteFile(path, []byte(text), 0o644)
}
