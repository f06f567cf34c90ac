package main

import (
	"bytes"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/cmd/idemgate/settings"
	"github.com/idemgate/idemgate/e2e/loadgen/driver"
	"github.com/idemgate/idemgate/e2e/loadgen/report"
	"github.com/idemgate/idemgate/extproc/config"
	"github.com/idemgate/idemgate/fingerprint"
)

// TestMain lets the test binary stand in for the load tool when the bench
// re-executes itself as a floor server (-serve).
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == "-serve" {
		os.Exit(run(os.Args, os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

// newTestBench is a bench set up like run() does, for a few-second smoke run.
func newTestBench(t *testing.T, args ...string) *bench {
	t.Helper()
	opts, err := parseFlags(args, os.Stderr)
	require.NoError(t, err)
	self, err := os.Executable()
	require.NoError(t, err)
	b := &bench{
		opts: opts, log: slog.New(slog.NewTextHandler(os.Stderr, nil)), command: "test",
		tmp: t.TempDir(), self: self, ioRate: map[int]float64{},
		preview: newRoute(previewPath, quoteBody), confirm: newRoute(confirmPath, transferBody),
		rep: &report.Report{Concurrencies: opts.concurrencies},
	}
	return b
}

func TestSmokeFloorVersusFloor(t *testing.T) {
	b := newTestBench(t, "-concurrency", "4", "-duration", "1s", "-warmup", "200ms")
	for _, name := range []string{"floor-a", "floor-b"} {
		srv, addr, err := b.startFloor(t.Context(), "noop")
		require.NoError(t, err)
		err = b.measure(t.Context(), cellSpec{
			scenario: name, addr: addr, server: srv, expect: driver.PassThrough200,
			source: func(c int) (driver.Source, error) {
				return newFixedBodySource(b.preview, []byte(previewBody), c, b.budget()), nil
			},
		})
		srv.stop(2 * time.Second)
		require.NoError(t, err)
		require.False(t, srv.alive())
	}
	require.Len(t, b.rep.Cells, 2)
	for _, cell := range b.rep.Cells {
		f := cell.Figures
		require.NotNil(t, f, cell.Scenario)
		require.Positive(t, f.Requests, cell.Scenario)
		require.Zero(t, f.Errors, cell.Scenario)
		require.Regexp(t, `^200 ×\d+$`, f.Outcomes, "every request passed through with 200")
		require.Positive(t, f.RPS)
		require.LessOrEqual(t, f.P50, f.P99)
		require.LessOrEqual(t, f.P99, f.Max)
	}
	ratio, ok := b.rep.RatioAt(report.Ratio{Num: "floor-a", Den: "floor-b"}, 4)
	require.True(t, ok)
	require.Positive(t, ratio)
}

// servicesOrSkip skips when redis-server or PostgreSQL is missing, unless
// IDEMGATE_REQUIRE_SERVICES=1 (make test) turns that into a failure.
func servicesOrSkip(t *testing.T) {
	t.Helper()
	var missing []string
	if _, err := exec.LookPath("redis-server"); err != nil {
		missing = append(missing, "redis-server")
	}
	db, err := createBenchDatabase(t.Context(), defaultAdminDSN(), "idemgate_bench_")
	if err != nil {
		missing = append(missing, "PostgreSQL ("+err.Error()+")")
	} else {
		require.NoError(t, db.drop())
	}
	if len(missing) == 0 {
		return
	}
	if os.Getenv("IDEMGATE_REQUIRE_SERVICES") == "1" {
		t.Fatalf("required services missing: %s", strings.Join(missing, ", "))
	}
	t.Skipf("skipped: services missing: %s", strings.Join(missing, ", "))
}

func TestSmokeIdemgate(t *testing.T) {
	if testing.Short() {
		t.Skip("skipped in -short: builds and runs idemgate")
	}
	root, err := moduleRoot(t.Context())
	require.NoError(t, err)
	bin := filepath.Join(t.TempDir(), "idemgate")
	if err := buildIdemgate(t.Context(), root, bin, idemgatePackage); err != nil {
		t.Fatalf("failed to build %s: %v", idemgatePackage, err)
	}
	servicesOrSkip(t)

	b := newTestBench(t, "-idemgate", bin, "-concurrency", "4", "-duration", "1s", "-warmup", "200ms",
		"-scenarios", "floor,preview,replay,io-floor,confirm-tiered,confirm-postgres,memory", "-rounds", "2", "-envoy-table=false",
		"-replay-pool", "64", "-memory-streams", "200", "-memory-body", "1024")
	md, err := b.run(t.Context())
	require.NoError(t, err)
	t.Log(md)
	for _, cell := range b.rep.Cells {
		require.NotNil(t, cell.Figures, "%s: %s", cell.Scenario, cell.Skipped)
		f := cell.Figures
		require.Positive(t, f.Requests, cell.Scenario)
		// The expected outcome (signed preview, acquired confirm, replay)
		// dominates; on a shared machine a store call may still exceed
		// store.timeout now and then, which idemgate rightly answers 503.
		require.LessOrEqual(t, f.Errors*100, f.Requests, "%s: %s", cell.Scenario, f.Outcomes)
		if f.Errors > 0 {
			t.Logf("%s: %d unexpected outcomes: %s", cell.Scenario, f.Errors, f.Outcomes)
		}
	}
	require.Len(t, b.rep.Cells, 6)
	require.True(t, b.interleaved(), "floor, preview and replay ran in rotated rounds")
	require.Contains(t, md, "measured in 2 rounds per concurrency")
	require.Len(t, b.rep.Memory, 2)
	for _, m := range b.rep.Memory {
		require.Empty(t, m.Skipped, m.Route)
		require.Equal(t, 200, m.Reached, m.Route)
		require.Positive(t, m.Open, m.Route)
		require.NotContains(t, m.Note, "did not end as expected", m.Route)
	}
}

func TestIdemgateConfigIsAcceptedByTheStrictLoader(t *testing.T) {
	key, err := fingerprint.GenerateKey()
	require.NoError(t, err)
	env := func(name string) (string, bool) {
		if name == "IDEMGATE_KEY_K1" {
			return key, true
		}
		return "", false
	}
	for _, tc := range []struct {
		name     string
		settings idemgateSettings
		redis    bool
		postgres bool
	}{
		{"tiered", idemgateSettings{RedisAddr: "127.0.0.1:7000", PostgresDSN: "postgres://postgres@127.0.0.1:5432/idemgate_bench_1?sslmode=disable"}, true, true},
		{"postgres", idemgateSettings{PostgresDSN: "postgres://postgres@127.0.0.1:5432/idemgate_bench_1?sslmode=disable"}, false, true},
		{"memory", idemgateSettings{}, false, false},
		{"tiered-lenient", idemgateSettings{RedisAddr: "127.0.0.1:6379", KeyPrefix: "idemgate-envoybench-1-ab:", StoreTimeout: "700ms", RedisTimeout: "300ms",
			PostgresDSN: "postgres://postgres@127.0.0.1:5432/idemgate_envoybench_1?sslmode=disable"}, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.settings.GRPCListen, tc.settings.AdminListen = "127.0.0.1:50051", "127.0.0.1:9090"
			yaml, err := renderIdemgateConfig(tc.settings)
			require.NoError(t, err)
			cfg, problems, err := settings.Parse("bench.yaml", yaml, t.TempDir(), config.Options{LookupEnv: env})
			require.NoError(t, err, string(yaml))
			rt := cfg.Runtime
			for _, p := range problems {
				t.Logf("warning: %v", p)
			}
			require.Equal(t, "127.0.0.1:50051", cfg.GRPCListen)
			require.Equal(t, tc.redis, cfg.Store.Redis != nil)
			require.Equal(t, tc.postgres, cfg.Store.Postgres != nil)
			require.Len(t, rt.Operations, 2)
			op, mcpOp := rt.Operations[0], rt.Operations[1]
			require.Equal(t, scope, op.Scope)
			require.Equal(t, operationParams, op.Params, "the tool mints with the params idemgate verifies")
			require.Equal(t, mcpScope, mcpOp.Scope)
			require.Equal(t, operationParams, mcpOp.Params)
			require.NotNil(t, rt.MCPEndpoint("POST", mcpPath))
			require.Contains(t, rt.MCPEndpoint("POST", mcpPath).Tools, mcpPreviewTool)
			require.NotContains(t, rt.MCPEndpoint("POST", mcpPath).Tools, mcpUnguardedTool)

			// A fingerprint minted by the tool verifies with idemgate's own
			// compiled ring and selector against a confirm body.
			m, err := newMinter(key, 15*time.Minute)
			require.NoError(t, err)
			items, err := m.mint(3, []byte(previewBody))
			require.NoError(t, err)
			for _, it := range items {
				doc, err := fingerprint.ParseJSON(it.body, 0)
				require.NoError(t, err)
				params, err := op.Selector.Select(doc, nil)
				require.NoError(t, err)
				token := doc.Value().(map[string]any)["fingerprint"].(string)
				_, err = rt.Keys.Verify(token, fingerprint.Expect{Subject: subjectName(it.subject), Scope: op.Scope, Params: &params}, time.Now())
				require.NoError(t, err)
			}
			// And the confirm tool's arguments, for the MCP operation.
			items, err = m.mintWith(3, mcpScope, func(_ int, token string) []byte { return confirmBody([]byte(previewBody), token) })
			require.NoError(t, err)
			for _, it := range items {
				doc, err := fingerprint.ParseJSON(it.body, 0)
				require.NoError(t, err)
				params, err := mcpOp.Selector.Select(doc, nil)
				require.NoError(t, err)
				token := doc.Value().(map[string]any)["fingerprint"].(string)
				_, err = rt.Keys.Verify(token, fingerprint.Expect{Subject: subjectName(it.subject), Scope: mcpOp.Scope, Params: &params}, time.Now())
				require.NoError(t, err)
			}
		})
	}
}

func TestMintedConfirmsAreDistinctAndWellFormed(t *testing.T) {
	key, err := fingerprint.GenerateKey()
	require.NoError(t, err)
	m, err := newMinter(key, time.Minute)
	require.NoError(t, err)
	items, err := m.mint(500, []byte(previewBody))
	require.NoError(t, err)
	seen := map[string]bool{}
	for i, it := range items {
		require.True(t, bytes.HasPrefix(it.body, []byte(previewBody[:len(previewBody)-1]+`,"fingerprint":"`)))
		require.True(t, bytes.HasSuffix(it.body, []byte(`"}`)))
		require.Equal(t, i, it.subject)
		require.False(t, seen[string(it.body)], "item %d repeats", i)
		seen[string(it.body)] = true
	}
}

func TestWorkloadShapes(t *testing.T) {
	r := newRoute(previewPath, quoteBody)
	src := newFixedBodySource(r, []byte(previewBody), 2, 3)
	var ids []string
	for i := 0; i < 3; i++ {
		req := src.Next(i % 2)
		require.NotNil(t, req)
		got := map[string]string{}
		var keys []string
		for _, h := range req.Headers {
			got[h.Key] = string(h.RawValue)
			keys = append(keys, h.Key)
			require.Empty(t, h.Value, "Envoy fills raw_value only")
		}
		require.Equal(t, []string{":authority", ":path", ":method", ":scheme", "content-type", "content-length",
			"x-forwarded-proto", "x-request-id", "x-idemgate-subject"}, keys)
		require.Equal(t, previewPath, got[":path"])
		require.Equal(t, "POST", got[":method"])
		require.Equal(t, "337", got["content-length"])
		require.Len(t, previewBody, 337)
		require.Regexp(t, regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`), got["x-request-id"])
		ids = append(ids, got["x-request-id"])
		require.Equal(t, subjectName(i+1), got["x-idemgate-subject"])
		sub := req.Metadata.GetFilterMetadata()[jwtNamespace].GetFields()["jwt_payload"].GetStructValue().GetFields()["sub"].GetStringValue()
		require.Equal(t, got["x-idemgate-subject"], sub, "jwt_authn metadata names the same subject")
		require.Equal(t, 200, req.UpstreamStatus)
		require.Equal(t, []byte(quoteBody), req.ResponseBody)
	}
	require.Nil(t, src.Next(0), "the count bound ends the source")
	require.NotEqual(t, ids[0], ids[1])

	for _, size := range []int{10, 337, 338, 4096} {
		b := paddedBody(previewBody, size)
		require.Equal(t, max(size, len(previewBody)), len(b))
		_, err := fingerprint.ParseJSON(b, 0)
		require.NoError(t, err)
	}

	pool := &poolSource{route: r, items: []confirmItem{{body: []byte("{}")}, {body: []byte("[]")}}, rng: newRNGs(1, 1)}
	require.Equal(t, []byte("{}"), pool.Next(0).Body)
	require.Equal(t, []byte("[]"), pool.Next(0).Body)
	require.Nil(t, pool.Next(0), "first-time confirms never repeat")
	cyc := &poolSource{route: r, items: pool.items, rng: newRNGs(1, 1), cycle: true, limit: 3}
	require.Equal(t, []byte("{}"), cyc.Next(0).Body)
	require.Equal(t, []byte("[]"), cyc.Next(0).Body)
	require.Equal(t, []byte("{}"), cyc.Next(0).Body)
	require.Nil(t, cyc.Next(0))
}

func TestFlags(t *testing.T) {
	o, err := parseFlags(nil, os.Stderr)
	require.NoError(t, err)
	require.Equal(t, []int{1, 16, 64}, o.concurrencies)
	require.Equal(t, allScenarios, o.scenarios)
	require.Equal(t, 64, o.profileConcurrency)
	require.Equal(t, 2, o.conns)
	// The default run fits in the five minutes make bench allows: 18 cells.
	require.LessOrEqual(t, 18*(o.duration+o.warmup), 150*time.Second)
	// The through-Envoy table: every column × 3 concurrencies × rounds, plus
	// the attach pair's own rounds at c=64, within 22 minutes (make bench as
	// a whole about 27 on 2 cores). 17, not 16, since the header-auth
	// other-path pair: its 30 rotated cells add about 81 s; it gets no rounds
	// of its own, which would add as much again. 18 since the store-read
	// replay column (15 cells, about 40 s). 19 since the same-answer floor's
	// two columns (30 cells, about 81 s). 20 since the same-answer floor of
	// a replay (15 cells). 22 since the MCP preview's 3-message pair (30
	// cells) and its same-answer floor (15 cells: 21.6 minutes).
	require.True(t, o.envoyTable)
	cells := len(envoyColumns)*3*o.envoyRounds + 2*o.envoyAttachRounds
	require.LessOrEqual(t, time.Duration(cells)*(o.envoyDuration+o.envoyWarmup+200*time.Millisecond), 22*time.Minute)
	// Instead, every default rotated round measures that pair back to back.
	require.Equal(t, o.envoyRounds, backToBack(evPlainOtherHeaderAuth, evAttachedOtherHeaderAuth, o.envoyRounds))
	// So does every pair a same-message floor target compares, the floor
	// and its guarded column.
	for _, p := range floorPairs {
		require.Equal(t, o.envoyRounds, backToBack(p[0], p[1], o.envoyRounds), "%s then %s", p[0], p[1])
	}
	require.Equal(t, o.envoyRounds, minBackToBack(floorPairs, o.envoyRounds))

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-concurrency", "1,x"}, `-concurrency: "x" is not a positive integer`},
		{[]string{"-concurrency", "0"}, `-concurrency: "0" is not a positive integer`},
		{[]string{"-scenarios", "floor,bogus"}, `unknown scenario "bogus"`},
		{[]string{"-memory-routes", "status"}, `unknown route "status"`},
		{[]string{"-duration", "0s", "-conns", "0"}, "-duration must be positive"},
		{[]string{"-memory-body", "2000000"}, "-memory-body within 0..1048576"},
		{[]string{"extra"}, "unexpected arguments"},
	} {
		_, err := parseFlags(tc.args, &bytes.Buffer{})
		require.ErrorContains(t, err, tc.want, tc.args)
	}
	_, err = parseFlags([]string{"-duration", "0s", "-conns", "0"}, &bytes.Buffer{})
	require.ErrorContains(t, err, "-conns and -memory-conns must be at least 1", "every problem is reported")
}

func TestCommandLine(t *testing.T) {
	require.Equal(t, "go run ./e2e/loadgen -out BENCHMARKS.md",
		commandLine([]string{"/tmp/go-build123/b001/exe/loadgen", "-out", "BENCHMARKS.md"}))
	require.Equal(t, `./loadgen -scenarios "floor, preview"`, commandLine([]string{"./loadgen", "-scenarios", "floor, preview"}))
	require.Equal(t, "7.0.15", redisVersion("Redis server v=7.0.15 sha=00000000:0 malloc=jemalloc-5.3.0 bits=64 build=ae4d7c971a948f0\n"))
}

func TestProfilesThroughTheAdminServer(t *testing.T) {
	if testing.Short() {
		t.Skip("skipped in -short: builds and runs idemgate")
	}
	root, err := moduleRoot(t.Context())
	require.NoError(t, err)
	bin := filepath.Join(t.TempDir(), "idemgate")
	if err := buildIdemgate(t.Context(), root, bin, idemgatePackage); err != nil {
		t.Fatalf("failed to build %s: %v", idemgatePackage, err)
	}
	dir := t.TempDir()
	b := newTestBench(t, "-concurrency", "2", "-duration", "1s", "-cpuprofile", dir, "-memprofile", dir)
	key, err := fingerprint.GenerateKey()
	require.NoError(t, err)
	// The memory store: no services needed to check the profiling path.
	p, err := startIdemgate(t.Context(), idemgateSpec{bin: bin, dir: b.tmp, name: "pprof", key: key, pprof: true})
	require.NoError(t, err)
	defer p.stop(5 * time.Second)
	require.Equal(t, p.adminAddr, p.pprofAddr)
	require.True(t, p.hasPprof(t.Context()))
	plain, err := startIdemgate(t.Context(), idemgateSpec{bin: bin, dir: b.tmp, name: "plain", key: key})
	require.NoError(t, err)
	defer plain.stop(5 * time.Second)
	require.False(t, plain.hasPprof(t.Context()), "no profiler without serve --pprof")

	prof := b.profiler(t.Context(), cellSpec{scenario: "preview", idemgate: p}, 2)
	require.True(t, prof.active)
	prof.start()
	prof.wait()
	for _, kind := range []string{"cpu", "allocs"} {
		st, err := os.Stat(filepath.Join(dir, "preview-c2."+kind+".pprof"))
		require.NoError(t, err, kind)
		require.Positive(t, st.Size(), kind)
	}
	require.False(t, b.profiler(t.Context(), cellSpec{scenario: "preview", idemgate: p}, 1).active, "only the profiled concurrency")
}

// The report keeps what follows keptMarker in the file it replaces.
func TestReportKeepsSectionsBelowTheMarker(t *testing.T) {
	path := filepath.Join(t.TempDir(), "BENCHMARKS.md")
	require.Equal(t, "", keptSections(path), "no file yet")
	require.NoError(t, os.WriteFile(path, []byte("# old report\n\n"+keptMarker+"\n\n## Tracing cost\nkept\n"), 0o644))
	require.Equal(t, "\n"+keptMarker+"\n\n## Tracing cost\nkept\n", keptSections(path))
	require.NoError(t, os.WriteFile(path, []byte("# old report without the marker\n"), 0o644))
	require.Equal(t, "", keptSections(path))
}
