package main

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	goredis "github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/e2e/loadgen/report"
	"github.com/idemgate/idemgate/fingerprint"
)

// TestThroughEnvoyTiny runs the through-Envoy benchmark with a few hundred
// requests per column and checks behaviour, not speed: every column
// completed with its expected outcome only, and the upstream's counters
// agree (each executed confirm reached it once with an Idempotency-Key, no
// replay reached it).
func TestThroughEnvoyTiny(t *testing.T) {
	if testing.Short() {
		t.Skip("skipped in -short: runs Envoy, idemgate, Redis and PostgreSQL")
	}
	servicesOrSkip(t)
	sharedRedisOrSkip(t)
	root, err := moduleRoot(t.Context())
	require.NoError(t, err)
	bin := filepath.Join(t.TempDir(), "idemgate")
	require.NoError(t, buildIdemgate(t.Context(), root, bin, idemgatePackage))

	// A count bound of 400 req/s × 1 s: at most 400 requests per cell (a
	// fast column runs out early, which ends its cell), no warm-up; the
	// window is a second so that a column slowed by a busy machine (the
	// io-floor's PostgreSQL writes) still completes some. At c=4
	// (the highest, so the targets' concurrency) the attach pair gets 2
	// rounds of its own; the header-auth other-path pair does not.
	b := newTestBench(t, "-idemgate", bin, "-scenarios", "", "-concurrency", "1,4",
		"-envoy-rounds", "1", "-envoy-attach-rounds", "2", "-envoy-duration", "1s", "-envoy-warmup", "0s",
		"-budget-rate", "400", "-envoy-confirm-rate", "400", "-replay-pool", "32")
	b.bin = bin
	b.opts.envoyLenientStores = true
	setupKeys(t, b)
	err = b.runEnvoy(t.Context())
	require.NoError(t, err, "%v", b.rep.Envoy.Notes)
	t.Log(b.rep.Markdown())

	tab := b.rep.Envoy
	require.Equal(t, "1.40.0", tab.Version, "the pin in .envoy-version")
	require.Len(t, tab.Cells, len(envoyColumns)*2)
	for _, cell := range tab.Cells {
		f := cell.Figures
		require.NotNil(t, f, "%s c=%d: %s", cell.Scenario, cell.Concurrency, cell.Skipped)
		require.Positive(t, f.Requests, cell.Scenario)
		rounds := uint64(1)
		if cell.Concurrency == 4 && (cell.Scenario == evPlainOther || cell.Scenario == evAttachedOther) {
			rounds = 3
		}
		require.LessOrEqual(t, f.Requests, 400*rounds, cell.Scenario)
		require.Zero(t, f.Errors, "%s c=%d: %s", cell.Scenario, cell.Concurrency, f.Outcomes)
		require.Equal(t, expectedLabel(cell.Scenario)+" ×"+strconv.FormatUint(f.Requests, 10), f.Outcomes, cell.Scenario)
	}
	for _, n := range tab.Notes {
		require.NotContains(t, n, "upstream check failed")
		require.NotContains(t, n, "not measured")
	}
	require.Contains(t, strings.Join(tab.Notes, "\n"), "the upstream's own counters matched")
	// The same-answer floor's columns were checked per answer (signed, and
	// for MCP a signed result for the request's id) above; its answers
	// had the sizes of idemgate's.
	require.Equal(t, "200 "+markSigned, expectedLabel(evNoopEdit))
	require.Equal(t, "200 "+markSigned+" "+markRPC, expectedLabel(evNoopEditMCP))
	require.Contains(t, strings.Join(tab.Notes, "\n"), "The same-answer floor's answers had the sizes of idemgate's")
	// So did the same-answer floor of a replay, which sends idemgate's
	// replay answer: the envelope with the stored result and its headers.
	require.Regexp(t, `The same-answer replay floor \(envoy\+noop-replay\) sends idemgate's replay answer captured at setup; checked against another replay: 200, body \d{3,} bytes, content-type 16 bytes, idempotent-replayed 4 bytes, idempotency-key \d+ bytes\.`,
		strings.Join(tab.Notes, "\n"))
	// The attach ratio has a round ratio per rotated and per own round at
	// the target concurrency, one elsewhere.
	i := slices.IndexFunc(tab.RoundRatios, func(rr report.RoundRatio) bool {
		return rr.Name == "envoy+idemgate other-path / envoy other-path"
	})
	require.GreaterOrEqual(t, i, 0)
	require.Len(t, tab.RoundRatios[i].PerConcurrency[4], 3)
	require.Len(t, tab.RoundRatios[i].PerConcurrency[1], 1)
	// The attach ratio with the header-only stand-in: its rotated round only.
	i = slices.IndexFunc(tab.RoundRatios, func(rr report.RoundRatio) bool {
		return rr.Name == "envoy+idemgate other-path header-auth / envoy other-path header-auth"
	})
	require.GreaterOrEqual(t, i, 0)
	require.Len(t, tab.RoundRatios[i].PerConcurrency[4], 1)
	require.Len(t, tab.RoundRatios[i].PerConcurrency[1], 1)
	// The private ext_proc channels (mutual TLS, a unix socket) are measured
	// in the same run, beside plaintext loopback, with their ratios.
	// So are the body-only preview (its fingerprint in the body, checked
	// per answer by its label) and its 3-message no-op floor.
	require.Equal(t, "200 "+markSignedBody, expectedLabel(evPreviewBodyOnly))
	for _, name := range []string{"envoy+preview mtls / envoy+preview", "envoy+preview unix / envoy+preview", "envoy+preview mtls / envoy", "envoy+preview unix / envoy",
		"envoy+preview bodyonly / envoy", "envoy+preview bodyonly / envoy+noop bodyonly", "envoy+noop bodyonly / envoy+noop",
		"envoy+preview header-auth / envoy header-auth", "envoy+preview bodyonly header-auth / envoy header-auth",
		"envoy+preview / envoy+noop-edit", "envoy+noop-edit / envoy+noop",
		"envoy+replay / envoy+noop-replay", "envoy+noop-replay / envoy+noop-answer", "envoy+mcp-preview / envoy+noop-edit mcp", "envoy+noop-edit mcp / envoy+noop mcp",
		"envoy+mcp-preview bodyonly / envoy+noop-edit mcp bodyonly", "envoy+noop-edit mcp bodyonly / envoy+noop mcp bodyonly"} {
		j := slices.IndexFunc(tab.RoundRatios, func(rr report.RoundRatio) bool { return rr.Name == name })
		require.GreaterOrEqual(t, j, 0, name)
		require.Len(t, tab.RoundRatios[j].PerConcurrency[4], 1, name)
	}

	// Nothing is left behind on the shared services.
	rdb := goredis.NewClient(&goredis.Options{Addr: defaultSharedRedis()})
	defer rdb.Close()
	keys, _, err := rdb.Scan(t.Context(), 0, "idemgate-envoybench-"+strconv.Itoa(os.Getpid())+"-*", 10000).Result()
	require.NoError(t, err)
	require.Empty(t, keys)
}

// TestEnvoyTableNamesEveryColumn: the table the run writes describes every
// column (an entry missing from envoyColumnDescriptions left a column's
// line empty in BENCHMARKS.md), lists each once, and every ratio is named
// after, and divides, two of its columns. No services: nothing is measured.
func TestEnvoyTableNamesEveryColumn(t *testing.T) {
	b := newTestBench(t)
	e := &envoyBench{b: b, results: map[string]map[int]*httpResult{}, cpu: map[string]map[int]*cpuUse{},
		roundRates: map[string]map[int][]float64{}, table: &report.EnvoyTable{Concurrencies: b.opts.concurrencies}}
	e.finish()
	tab := e.table

	var names []string
	for _, col := range tab.Columns {
		require.NotEmpty(t, strings.TrimSpace(col.Description), "column %s has no description", col.Name)
		require.NotContains(t, names, col.Name, "column listed twice")
		names = append(names, col.Name)
	}
	require.Equal(t, envoyColumns, names)
	for col := range envoyColumnDescriptions {
		require.Contains(t, envoyColumns, col, "a description of no column")
	}
	for _, col := range idemgateColumns {
		require.Contains(t, envoyColumns, col)
	}
	var ratios []string
	for _, ra := range tab.Ratios {
		require.Contains(t, envoyColumns, ra.Num, ra.Name)
		require.Contains(t, envoyColumns, ra.Den, ra.Name)
		require.Equal(t, ra.Num+" / "+ra.Den, ra.Name)
		require.NotContains(t, ratios, ra.Name, "ratio listed twice")
		ratios = append(ratios, ra.Name)
	}
}

// sharedRedisOrSkip needs the machine's Redis (make services), as servicesOrSkip.
func sharedRedisOrSkip(t *testing.T) {
	t.Helper()
	c := goredis.NewClient(&goredis.Options{Addr: defaultSharedRedis()})
	defer c.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		if os.Getenv("IDEMGATE_REQUIRE_SERVICES") == "1" {
			t.Fatalf("required service missing: Redis at %s: %v", defaultSharedRedis(), err)
		}
		t.Skipf("skipped: no Redis at %s: %v", defaultSharedRedis(), err)
	}
}

// setupKeys gives a test bench the signing key and minter run() makes.
func setupKeys(t *testing.T, b *bench) {
	t.Helper()
	var err error
	b.key, err = fingerprint.GenerateKey()
	require.NoError(t, err)
	b.minter, err = newMinter(b.key, 15*time.Minute)
	require.NoError(t, err)
}

// TestCPUSecondsGrows: the CPU time read from /proc grows while this process
// spins. /proc counts in clock ticks (10 ms) and a loaded machine may not
// schedule the spin at once, so it spins until the reading moves (bounded),
// rather than for a fixed time.
func TestCPUSecondsGrows(t *testing.T) {
	before, err := cpuSeconds(0)
	require.NoError(t, err)
	after := before
	for deadline := time.Now().Add(10 * time.Second); after <= before && time.Now().Before(deadline); {
		for spin := time.Now().Add(10 * time.Millisecond); time.Now().Before(spin); {
		}
		after, err = cpuSeconds(os.Getpid())
		require.NoError(t, err)
	}
	require.Greater(t, after, before, "the CPU time of a spinning process did not grow in 10s")
}

// TestReadStatParsesAnyCommandName: a command name may hold spaces and
// parentheses; the fields after the last ')' are fixed.
func TestReadStatParsesAnyCommandName(t *testing.T) {
	path := filepath.Join(t.TempDir(), "stat")
	line := "4242 (post gres) (x)) S 17 4242 4242 0 -1 4194304 100 0 0 0 250 75 30 12 20 0 1 0 100 0 0\n"
	require.NoError(t, os.WriteFile(path, []byte(line), 0o600))
	st, err := readStat(path)
	require.NoError(t, err)
	require.Equal(t, procStat{comm: "post gres) (x)", ppid: 17, utime: 250, stime: 75, cutime: 30, cstime: 12}, st)
	require.NoError(t, os.WriteFile(path, []byte("4242 (short) S 1 2\n"), 0o600))
	_, err = readStat(path)
	require.Error(t, err)
}

// TestPostgresCPUSecondsGrows: the whole PostgreSQL server's CPU time, read
// from /proc, grows while a backend works (the machine's PostgreSQL of make
// services).
func TestPostgresCPUSecondsGrows(t *testing.T) {
	servicesOrSkip(t)
	before, err := postgresCPUSeconds()
	require.NoError(t, err)
	require.Positive(t, before)
	pool, err := pgxpool.New(t.Context(), defaultAdminDSN())
	require.NoError(t, err)
	defer pool.Close()
	after := before
	for deadline := time.Now().Add(20 * time.Second); after <= before && time.Now().Before(deadline); {
		_, err := pool.Exec(t.Context(), "SELECT count(*) FROM generate_series(1, 300000)")
		require.NoError(t, err)
		after, err = postgresCPUSeconds()
		require.NoError(t, err)
	}
	require.Greater(t, after, before, "PostgreSQL's CPU time did not grow while a backend counted 300000 rows")
}
