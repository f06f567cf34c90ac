package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/idemgate/idemgate/state"
	"github.com/idemgate/idemgate/state/redis"
)

// redisBytesPerRecord stores records as a confirm leaves them in a
// redis-server of its own and divides the memory it grew by their number.
func redisBytesPerRecord(ctx context.Context) (float64, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	dir, err := os.MkdirTemp("", "retentionbench-redis-")
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(dir)
	cmd := exec.Command("redis-server", "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", dir)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return 0, fmt.Errorf("start redis-server: %w", err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	s, err := redis.New(redis.Options{Addrs: []string{fmt.Sprintf("127.0.0.1:%d", port)}})
	if err != nil {
		return 0, err
	}
	defer s.Close()
	for deadline := time.Now().Add(10 * time.Second); s.Ping(ctx) != nil; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("redis-server did not start")
		}
	}
	used := func() (int64, error) {
		info, err := s.Client().Info(ctx, "memory").Result()
		if err != nil {
			return 0, err
		}
		for _, line := range strings.Split(info, "\n") {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), "used_memory:"); ok {
				return strconv.ParseInt(v, 10, 64)
			}
		}
		return 0, fmt.Errorf("no used_memory in INFO")
	}
	before, err := used()
	if err != nil {
		return 0, err
	}
	const n = 20000
	body := []byte(`{"transfer_id":"tr_` + strings.Repeat("0", 16) + `","status":"executed","amount":"100.00","currency":"EUR","payee":{"account_id":"DE89370400440532013000"},"fee":"1.00","executed_at":"2026-12-01T22:00:00Z","memo":"` + strings.Repeat("x", 40) + `"}`)
	for i := 0; i < n; i++ {
		var raw [16]byte
		_, _ = rand.Read(raw[:])
		key := hex.EncodeToString(raw[:])
		a, err := s.Acquire(ctx, state.AcquireRequest{Key: key, Scope: "payments.transfer", SubjectTag: "t0123456789abcdef0123456789abcdef",
			ParamHash: strings.Repeat("a", 64), Owner: "gw-1-0123456789abcdef", Lease: 2 * time.Minute, Retention: time.Hour})
		if err != nil {
			return 0, err
		}
		if _, err := s.Complete(ctx, state.Claim{Key: key, Owner: a.Record.Owner, Fence: a.Record.Fence}, state.Completion{
			State: state.Done, Retention: time.Hour,
			Result: state.Result{Status: 200, Headers: []state.Header{{Name: "content-type", Value: "application/json"}}, Body: body, Ref: "tr_0000000000000000"}}); err != nil {
			return 0, err
		}
	}
	after, err := used()
	if err != nil {
		return 0, err
	}
	return float64(after-before) / n, nil
}

func report(records int, baseline latencies, parts, sweep removal, pgBytes, redisBytes float64) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s\n\n", sectionTitle)
	fmt.Fprintf(&b, "Removing one day of expired records (%d of %d, a third) from PostgreSQL while four agents confirm at about 200/s "+
		"(Acquire, then Complete DONE, through `state/postgres`). Measured %s on %s/%s, %d CPUs, on the PostgreSQL shared with the other "+
		"work on this machine (WAL bytes include whatever else wrote meanwhile).\n\n",
		sweep.removed, records, time.Now().UTC().Format("2006-01-02 15:04 UTC"), runtime.GOOS, runtime.GOARCH, runtime.NumCPU())
	b.WriteString("| removal | time | WAL written | records removed | confirms meanwhile | confirm p50 | p99 | max |\n")
	b.WriteString("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
	row := func(name string, took time.Duration, wal int64, removed int64, l latencies) {
		fmt.Fprintf(&b, "| %s | %s | %s | %d | %d | %s | %s | %s |\n", name, took.Round(time.Millisecond), mib(wal), removed, len(l),
			l.pct(0.5).Round(10*time.Microsecond), l.pct(0.99).Round(10*time.Microsecond), l.pct(1).Round(10*time.Microsecond))
	}
	row("none (baseline, 5 s)", 5*time.Second, 0, 0, baseline)
	row("row-by-row sweeper (batches of 1000, as `serve` runs it)", sweep.took, sweep.walBytes, sweep.removed, sweep.during)
	row("drop the day's partition (detach concurrently, drop)", parts.took, parts.walBytes, parts.removed, parts.during)
	fmt.Fprintf(&b, "\nRatios: the sweeper took %.0f× the partition drop's time and wrote %.0f× its WAL; confirm p99 during the "+
		"sweeper was %.2f× the baseline's, during the drop %.2f×.\n\n",
		ratio(float64(sweep.took), float64(parts.took)), ratio(float64(sweep.walBytes), float64(parts.walBytes)),
		ratio(float64(sweep.during.pct(0.99)), float64(baseline.pct(0.99))), ratio(float64(parts.during.pct(0.99)), float64(baseline.pct(0.99))))
	fmt.Fprintf(&b, "The sweeper's deletes also leave %d dead tuples for autovacuum to clean afterwards (more I/O and WAL, not counted above); a dropped partition leaves none.\n\n", sweep.removed)
	b.WriteString("Bytes per record (a transfer's 256-byte JSON answer, one stored header, its result reference), the basis of docs/scaling.md's sizing table:\n\n")
	fmt.Fprintf(&b, "- PostgreSQL: %.0f bytes per record, table and indexes (pg_total_relation_size of a daily partition / its rows)\n", pgBytes)
	fmt.Fprintf(&b, "- Redis: %.0f bytes per record (used_memory grown by 20000 completed records / 20000)\n\n", redisBytes)
	fmt.Fprintf(&b, "Command: `make bench-retention` (`go run ./e2e/retentionbench -records %d -out BENCHMARKS.md`).\n", records)
	return b.String()
}

func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

func mib(n int64) string {
	switch {
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}
