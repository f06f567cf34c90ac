package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemgate/idemgate/e2e/loadgen/driver"
	"github.com/idemgate/idemgate/e2e/loadgen/report"
	"github.com/idemgate/idemgate/fingerprint"
	"github.com/idemgate/idemgate/internal/extprocdriver"
)

// bench is one benchmark run: its services, servers and report.
type bench struct {
	opts    *options
	log     *slog.Logger
	command string

	tmp       string
	self      string
	redis     *benchRedis
	db        *benchDatabase
	bin       string // idemgate binary; empty when unavailable
	binErr    error  // why idemgate cannot run
	storesErr error  // why Redis or PostgreSQL is unavailable
	key       string // base64 signing key given to idemgate as IDEMGATE_KEY_K1
	minter    *minter
	preview   *route
	confirm   *route
	ioRate    map[int]float64 // io-floor req/s per concurrency, sizes confirm pools
	pprofMsg  string          // set once: what profiling found

	rep *report.Report
}

// Expectations: the outcome each scenario must produce; anything else is
// counted as an error.
func expectPreview(o extprocdriver.Outcome) bool {
	// Signed and injected: the response body was replaced.
	return driver.PassThrough200(o) && o.Marks&extprocdriver.MarkResponseBody != 0
}

func expectConfirm(o extprocdriver.Outcome) bool {
	// Acquired: the upstream got the nonce as Idempotency-Key.
	return driver.PassThrough200(o) && o.Marks&extprocdriver.MarkIdempotencyKey != 0
}

func expectReplay(o extprocdriver.Outcome) bool {
	// already_completed: idemgate answers with the original 200 itself.
	return o.Local && o.Status == 200 && o.Error == extprocdriver.ErrNone
}

var scenarioDescriptions = map[string]string{
	scFloor:           "the protocol floor: a no-op ext_proc server built into the load tool on idemgate's own gRPC transport (extproc.TransportOptions: stream workers, the lean codec, keepalive, limits), answering CONTINUE to every message (4 messages per request), sent preview-shaped requests.",
	scPreview:         "idemgate on the preview route: parse the request body, select and hash the params, sign a fingerprint and inject it into the upstream's quote JSON (no store call). Expected outcome: 200 with the response body replaced.",
	scReplay:          "idemgate answering confirms already DONE (a pool of fingerprints completed beforehand, reused round-robin): verify, acquire → DONE, ImmediateResponse with the original 200 after the request body (2 messages per request). Tiered store.",
	scIOFloor:         "the I/O floor: a server built into the load tool making, per confirm, exactly the store round trips a first-time confirm needs — an acquire-like EVALSHA and a PostgreSQL INSERT at the request body, a PostgreSQL UPDATE and a complete-like EVALSHA at the response body — with pgx's and go-redis's default pools, CONTINUE to every message.",
	scConfirmTiered:   "idemgate on first-time confirms (verify, acquire, complete) on the tiered store (the run's own Redis + PostgreSQL). Each request carries a distinct fingerprint minted by the load tool with idemgate's key. Expected outcome: 200 with Idempotency-Key set upstream.",
	scConfirmPostgres: "as confirm-tiered, on PostgreSQL alone.",
}

// run executes the selected scenarios and returns the markdown report.
func (b *bench) run(ctx context.Context) (string, error) {
	o := b.opts
	b.ioRate = map[int]float64{}
	b.rep = &report.Report{Command: b.command, Concurrencies: o.concurrencies, Machine: report.DescribeMachine()}
	b.preview = newRoute(previewPath, quoteBody)
	b.confirm = newRoute(confirmPath, transferBody)

	tmp, err := os.MkdirTemp("", "idemgate-loadgen-")
	if err != nil {
		return "", fmt.Errorf("failed to create a temporary directory: %w", err)
	}
	b.tmp = tmp
	defer os.RemoveAll(tmp)
	if b.self, err = os.Executable(); err != nil {
		return "", fmt.Errorf("failed to find the load tool's own binary: %w", err)
	}
	if root, err := moduleRoot(ctx); err == nil {
		if out, err := exec.CommandContext(ctx, "git", "-C", root, "describe", "--always", "--dirty").Output(); err == nil {
			b.rep.Machine.Commit = strings.TrimSpace(string(out))
		}
	}
	defer b.cleanup()
	if err := b.setup(ctx); err != nil {
		return "", err
	}

	for _, s := range allScenarios {
		if !o.selected(s) {
			continue
		}
		if err := ctx.Err(); err != nil {
			return "", err
		}
		if d, ok := scenarioDescriptions[s]; ok {
			b.rep.Scenarios = append(b.rep.Scenarios, report.Scenario{Name: s, Description: d})
		}
		var err error
		switch s {
		case scFloor:
			if b.interleaved() {
				err = b.runRotated(ctx)
			} else {
				err = b.runFloor(ctx)
			}
		case scPreview:
			if !b.interleaved() {
				err = b.runPreview(ctx)
			}
		case scReplay:
			if !b.interleaved() {
				err = b.runReplay(ctx)
			}
		case scIOFloor:
			err = b.runIOFloor(ctx)
		case scConfirmTiered, scConfirmPostgres:
			err = b.runConfirm(ctx, s)
		case scMemory:
			err = b.runMemory(ctx)
		}
		if err != nil {
			if ctx.Err() != nil {
				return "", ctx.Err()
			}
			// One scenario failing does not lose the others' figures.
			b.log.Error("scenario failed", "scenario", s, "error", err)
			b.skipRemaining(s, err.Error())
		}
	}
	if o.envoyTable {
		if err := b.runEnvoy(ctx); err != nil {
			if ctx.Err() != nil {
				return "", ctx.Err()
			}
			b.log.Error("the through-Envoy benchmark failed", "error", err)
		}
	}
	b.finishReport()
	return b.rep.Markdown(), nil
}

func (b *bench) needsStores() bool {
	o := b.opts
	return o.selected(scReplay) || o.selected(scIOFloor) || o.selected(scConfirmTiered) ||
		o.selected(scConfirmPostgres) || (o.selected(scMemory) && slices.Contains(o.memRoutes, "confirm"))
}

func (b *bench) needsIdemgate() bool {
	o := b.opts
	return o.selected(scPreview) || o.selected(scReplay) || o.selected(scConfirmTiered) ||
		o.selected(scConfirmPostgres) || o.selected(scMemory)
}

// benchFingerprintTTL is how long the fingerprints the tool mints live, and
// the ttl.fingerprint of the idemgate config it writes. It outlasts a
// whole run: the replay pools are confirmed once, at the start of the
// through-Envoy table, and a replay of an expired fingerprint takes another
// path (extproc's expired: the record read, not acquired), so with the
// default 15 minutes the last replay cells of a 23-minute make bench
// measured that path instead.
const benchFingerprintTTL = time.Hour

// setup starts Redis, creates the database, builds idemgate and makes the
// signing key, as far as the selected scenarios need them.
func (b *bench) setup(ctx context.Context) error {
	var err error
	if b.key, err = fingerprint.GenerateKey(); err != nil {
		return fmt.Errorf("failed to generate a signing key: %w", err)
	}
	if b.minter, err = newMinter(b.key, benchFingerprintTTL); err != nil {
		return err
	}
	if b.needsStores() {
		if err := b.startStores(ctx); err != nil {
			// The scenarios that need no store still run.
			b.storesErr = err
			b.log.Warn("store scenarios skipped", "reason", err)
			b.rep.Notes = append(b.rep.Notes, "store scenarios skipped: "+err.Error())
		}
	}
	if b.needsIdemgate() {
		b.bin, b.binErr = b.idemgateBinary(ctx)
		if b.binErr != nil {
			b.log.Warn("idemgate scenarios skipped", "reason", b.binErr)
			b.rep.Notes = append(b.rep.Notes, "idemgate scenarios skipped: "+b.binErr.Error())
		}
	}
	return nil
}

// profiling reports whether profiles of idemgate were asked for.
func (b *bench) profiling() bool { return b.opts.cpuProfileDir != "" || b.opts.memProfileDir != "" }

func (b *bench) startStores(ctx context.Context) error {
	r, err := startRedis(ctx, b.opts.redisServer, b.tmp)
	if err != nil {
		return fmt.Errorf("failed to start the run's redis-server: %w", err)
	}
	b.redis = r
	b.rep.Machine.Redis = r.version
	db, err := createBenchDatabase(ctx, b.opts.pgAdminDSN, "idemgate_bench_")
	if err != nil {
		return err
	}
	b.db = db
	b.rep.Machine.Postgres = db.version
	b.log.Info("services ready", "redis", r.addr, "postgres_database", db.name)
	return nil
}

// haveStores reports whether Redis and PostgreSQL are up for this run.
func (b *bench) haveStores() bool { return b.storesErr == nil && b.redis != nil && b.db != nil }

// idemgateBinary builds idemgate once (or takes -idemgate).
func (b *bench) idemgateBinary(ctx context.Context) (string, error) {
	if b.opts.idemgateBin != "" {
		if _, err := os.Stat(b.opts.idemgateBin); err != nil {
			return "", fmt.Errorf("-idemgate %s: %w", b.opts.idemgateBin, err)
		}
		return b.opts.idemgateBin, nil
	}
	root, err := moduleRoot(ctx)
	if err != nil {
		return "", err
	}
	out := filepath.Join(b.tmp, "idemgate")
	start := time.Now()
	if err := buildIdemgate(ctx, root, out, idemgatePackage); err != nil {
		return "", err
	}
	b.log.Info("built idemgate", "package", idemgatePackage, "took", time.Since(start).Round(time.Millisecond))
	return out, nil
}

func (b *bench) cleanup() {
	if b.redis != nil {
		b.redis.stop(2 * time.Second)
	}
	if b.db != nil {
		if err := b.db.drop(); err != nil {
			b.log.Warn("failed to drop the benchmark database", "error", err)
		}
	}
}

// resetStores gives a scenario empty tables and an empty Redis.
func (b *bench) resetStores(ctx context.Context) error {
	if b.redis != nil {
		if err := b.redis.flush(ctx); err != nil {
			return err
		}
	}
	if b.db != nil {
		if err := b.db.truncate(ctx); err != nil {
			return err
		}
	}
	return nil
}

// budget is the count bound of one cell.
func (b *bench) budget() uint64 {
	return uint64(float64(b.opts.budgetRate) * (b.opts.warmup + b.opts.duration).Seconds())
}

// skip records a scenario's cells as skipped (those not measured yet).
func (b *bench) skip(scenario, why string) {
	for _, c := range b.opts.concurrencies {
		b.addSkipped(scenario, c, why)
	}
}

func (b *bench) addSkipped(scenario string, c int, why string) {
	for _, cell := range b.rep.Cells {
		if cell.Scenario == scenario && cell.Concurrency == c {
			return
		}
	}
	b.rep.Cells = append(b.rep.Cells, report.Cell{Scenario: scenario, Concurrency: c, Skipped: why})
}

func (b *bench) skipRemaining(scenario, why string) {
	if scenario == scMemory {
		b.rep.Memory = append(b.rep.Memory, report.Memory{Route: "all", Skipped: why})
		return
	}
	b.skip(scenario, why)
}

// cellSpec describes how to measure one server at every concurrency.
type cellSpec struct {
	scenario string
	addr     string
	server   *child
	idemgate *idemgateProcess // non-nil: profile it when asked
	source   func(c int) (driver.Source, error)
	expect   func(extprocdriver.Outcome) bool
}

// measure runs the cells of one server at every concurrency.
func (b *bench) measure(ctx context.Context, spec cellSpec) error {
	for _, c := range b.opts.concurrencies {
		if err := spec.server.checkAlive(); err != nil {
			return err
		}
		src, err := spec.source(c)
		if err != nil {
			return err
		}
		fig, err := b.measureCell(ctx, spec, c, src)
		if err != nil {
			return fmt.Errorf("%s at concurrency %d: %w", spec.scenario, c, err)
		}
		b.rep.Cells = append(b.rep.Cells, report.Cell{Scenario: spec.scenario, Concurrency: c, Figures: fig})
		b.log.Info("measured", "server", spec.scenario, "c", c, "req_per_s", math.Round(fig.RPS),
			"p50", fig.P50, "p99", fig.P99, "errors", fig.Errors, "outcomes", fig.Outcomes)
		// Let the server finish what the last cell left behind.
		time.Sleep(300 * time.Millisecond)
	}
	return nil
}

func (b *bench) measureCell(ctx context.Context, spec cellSpec, c int, src driver.Source) (*report.Figures, error) {
	res, profiled, err := b.runCell(ctx, spec, c, src, b.opts.duration)
	if err != nil {
		return nil, err
	}
	return cellFigures(res, profiled), nil
}

// cellFigures are a cell's figures with its notes.
func cellFigures(res *driver.Result, profiled bool) *report.Figures {
	fig := figuresOf(res)
	if res.Exhausted {
		fig.Note = fmt.Sprintf("source ran out after %s", res.Elapsed.Round(time.Millisecond))
	}
	if profiled {
		fig.Note = strings.TrimPrefix(fig.Note+"; profiled", "; ")
	}
	return fig
}

// runCell measures one server at concurrency c for duration (after the
// warm-up) on fresh connections.
func (b *bench) runCell(ctx context.Context, spec cellSpec, c int, src driver.Source, duration time.Duration) (*driver.Result, bool, error) {
	conns, err := extprocdriver.Dial(ctx, spec.addr, b.opts.conns)
	if err != nil {
		return nil, false, err
	}
	defer conns.Close()
	filter := extprocdriver.EnvoyFilter()
	filter.MessageTimeout = b.opts.messageTimeout

	prof := b.profiler(ctx, spec, c)
	res, err := driver.Run{
		Conns: conns, Filter: filter, Source: src, Concurrency: c,
		Warmup: b.opts.warmup, Duration: duration, Expect: spec.expect,
		WindowStarted: prof.start,
	}.Execute(ctx)
	prof.wait()
	if err != nil {
		return nil, false, err
	}
	if err := spec.server.checkAlive(); err != nil {
		return nil, false, err
	}
	return res, prof.active, nil
}

func figuresOf(res *driver.Result) *report.Figures {
	type oc struct {
		o extprocdriver.Outcome
		n uint64
	}
	var list []oc
	for o, n := range res.Outcomes {
		list = append(list, oc{o, n})
	}
	sort.Slice(list, func(i, j int) bool {
		if list[i].n != list[j].n {
			return list[i].n > list[j].n
		}
		return list[i].o.String() < list[j].o.String()
	})
	var parts []string
	for _, e := range list {
		parts = append(parts, fmt.Sprintf("%s ×%d", e.o, e.n))
	}
	ok := float64(res.Requests - res.Unexpected)
	return &report.Figures{
		RPS: ok / res.Elapsed.Seconds(), P50: res.Latency.Quantile(0.50), P90: res.Latency.Quantile(0.90),
		P99: res.Latency.Quantile(0.99), Max: res.Latency.Max(),
		Requests: res.Requests, Errors: res.Unexpected, Outcomes: strings.Join(parts, ", "),
	}
}

// startFloor runs this binary as a floor server child.
func (b *bench) startFloor(ctx context.Context, kind string, extra ...string) (*child, string, error) {
	port, err := freePort()
	if err != nil {
		return nil, "", err
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	args := append([]string{"-serve", kind, "-listen", addr}, extra...)
	c, err := startChild(ctx, childSpec{name: kind + " server", path: b.self, args: args, readyLine: "ready"})
	if err != nil {
		return nil, "", err
	}
	return c, addr, nil
}

func (b *bench) runFloor(ctx context.Context) error {
	srv, addr, err := b.startFloor(ctx, "noop")
	if err != nil {
		return err
	}
	defer srv.stop(2 * time.Second)
	return b.measure(ctx, cellSpec{
		scenario: scFloor, addr: addr, server: srv, expect: driver.PassThrough200,
		source: func(c int) (driver.Source, error) {
			return newFixedBodySource(b.preview, []byte(previewBody), c, b.budget()), nil
		},
	})
}

func (b *bench) runIOFloor(ctx context.Context) error {
	if !b.haveStores() {
		b.skip(scIOFloor, "Redis or PostgreSQL unavailable")
		return nil
	}
	if err := b.resetStores(ctx); err != nil {
		return err
	}
	srv, addr, err := b.startFloor(ctx, "iofloor", "-redis-addr", b.redis.addr, "-pg-dsn", b.db.dsn)
	if err != nil {
		return err
	}
	defer srv.stop(2 * time.Second)
	// The floor ignores what the body says; it gets confirm-shaped bodies.
	sample, err := b.minter.mint(1, []byte(previewBody))
	if err != nil {
		return err
	}
	err = b.measure(ctx, cellSpec{
		scenario: scIOFloor, addr: addr, server: srv, expect: driver.PassThrough200,
		source: func(c int) (driver.Source, error) {
			return newFixedBodySource(b.confirm, sample[0].body, c, b.budget()), nil
		},
	})
	for _, cell := range b.rep.Cells {
		if cell.Scenario == scIOFloor && cell.Figures != nil {
			b.ioRate[cell.Concurrency] = cell.Figures.RPS
		}
	}
	return err
}

// startIdemgateFor starts idemgate on the given store ("tiered",
// "postgres" or "memory").
func (b *bench) startIdemgateFor(ctx context.Context, name, store string) (*idemgateProcess, error) {
	s := idemgateSettings{}
	switch store {
	case "tiered":
		s.RedisAddr, s.PostgresDSN = b.redis.addr, b.db.dsn
	case "postgres":
		s.PostgresDSN = b.db.dsn
	}
	p, err := startIdemgate(ctx, idemgateSpec{bin: b.bin, dir: b.tmp, name: name, key: b.key, settings: s, pprof: b.profiling()})
	if err != nil {
		return nil, err
	}
	if b.profiling() && b.pprofMsg == "" {
		if p.hasPprof(ctx) {
			b.pprofMsg = "Profiles were taken from idemgate's admin server (serve --pprof, /debug/pprof/); cells marked profiled had a CPU/allocation profile taken during their window."
		} else {
			b.pprofMsg = "idemgate does not serve /debug/pprof at " + p.pprofAddr + " (serve --pprof): no profiles were taken."
		}
	}
	return p, nil
}

func (b *bench) runPreview(ctx context.Context) error {
	if b.bin == "" {
		b.skip(scPreview, "idemgate unavailable")
		return nil
	}
	store := "memory"
	if b.haveStores() {
		// As deployed: the stores are configured, preview just never calls them.
		store = "tiered"
		if err := b.resetStores(ctx); err != nil {
			return err
		}
	}
	p, err := b.startIdemgateFor(ctx, scPreview, store)
	if err != nil {
		return err
	}
	defer p.stop(5 * time.Second)
	return b.measure(ctx, cellSpec{
		scenario: scPreview, addr: p.grpcAddr, server: p.child, idemgate: p, expect: expectPreview,
		source: func(c int) (driver.Source, error) {
			return newFixedBodySource(b.preview, []byte(previewBody), c, b.budget()), nil
		},
	})
}

// confirmPoolSize is how many fingerprints a first-time confirm cell gets:
// three times what the I/O floor did at this concurrency (when measured),
// never more than the cell's budget. A cell that uses them up ends early and
// says so; its rate is still measured over the time it ran.
func (b *bench) confirmPoolSize(c int) int {
	budget := b.budget()
	if r, ok := b.ioRate[c]; ok && r > 0 {
		n := uint64(3 * r * (b.opts.warmup + b.opts.duration).Seconds())
		return int(min(max(n, 2000), budget))
	}
	return int(budget)
}

func (b *bench) runConfirm(ctx context.Context, scenario string) error {
	if b.bin == "" {
		b.skip(scenario, "idemgate unavailable")
		return nil
	}
	if !b.haveStores() {
		b.skip(scenario, "Redis or PostgreSQL unavailable")
		return nil
	}
	if err := b.resetStores(ctx); err != nil {
		return err
	}
	store := "tiered"
	if scenario == scConfirmPostgres {
		store = "postgres"
	}
	p, err := b.startIdemgateFor(ctx, scenario, store)
	if err != nil {
		return err
	}
	defer p.stop(5 * time.Second)
	return b.measure(ctx, cellSpec{
		scenario: scenario, addr: p.grpcAddr, server: p.child, idemgate: p, expect: expectConfirm,
		source: func(c int) (driver.Source, error) {
			n := b.confirmPoolSize(c)
			start := time.Now()
			items, err := b.minter.mint(n, []byte(previewBody))
			if err != nil {
				return nil, err
			}
			b.log.Info("minted fingerprints", "server", scenario, "c", c, "count", n, "took", time.Since(start).Round(time.Millisecond))
			return &poolSource{route: b.confirm, items: items, rng: newRNGs(c, 2)}, nil
		},
	})
}

func (b *bench) runReplay(ctx context.Context) error {
	if b.bin == "" {
		b.skip(scReplay, "idemgate unavailable")
		return nil
	}
	if !b.haveStores() {
		b.skip(scReplay, "Redis or PostgreSQL unavailable")
		return nil
	}
	if err := b.resetStores(ctx); err != nil {
		return err
	}
	p, err := b.startIdemgateFor(ctx, scReplay, "tiered")
	if err != nil {
		return err
	}
	defer p.stop(5 * time.Second)
	items, err := b.minter.mint(b.opts.replayPool, []byte(previewBody))
	if err != nil {
		return err
	}
	done, failures, err := b.completeAll(ctx, p.grpcAddr, items)
	if err != nil {
		return err
	}
	if len(failures) > 0 {
		note := fmt.Sprintf("replay pool: %d of %d first confirms did not complete and were left out (%s); idemgate's last output: %s",
			len(items)-len(done), len(items), failures, p.lastLines())
		b.log.Warn(note)
		if len(done) < len(items)*9/10 {
			return errors.New(note)
		}
		b.rep.Notes = append(b.rep.Notes, fmt.Sprintf("replay pool: %d of %d first confirms did not complete and were left out (%s).",
			len(items)-len(done), len(items), failures))
	}
	items = done
	return b.measure(ctx, cellSpec{
		scenario: scReplay, addr: p.grpcAddr, server: p.child, idemgate: p, expect: expectReplay,
		source: func(c int) (driver.Source, error) {
			return &poolSource{route: b.confirm, items: items, rng: newRNGs(c, 3), cycle: true, limit: b.budget()}, nil
		},
	})
}

// completeAll confirms every item once (4 at a time, gently, on a server
// that just started) and returns those acquired and completed, so the replay
// cells see DONE records only; failures counts the others by outcome. A
// temporarily_unavailable answer (503, nothing executed, retryable) is
// retried after a pause, as an agent would.
func (b *bench) completeAll(ctx context.Context, addr string, items []confirmItem) (done []confirmItem, failures string, err error) {
	conns, err := extprocdriver.Dial(ctx, addr, b.opts.conns)
	if err != nil {
		return nil, "", err
	}
	defer conns.Close()
	filter := extprocdriver.EnvoyFilter()
	filter.MessageTimeout = b.opts.messageTimeout
	const workers = 4
	var (
		wg   sync.WaitGroup
		next atomic.Int64
		ok   = make([]bool, len(items))
		mu   sync.Mutex
		bad  = map[extprocdriver.Outcome]int{}
	)
	rng := newRNGs(workers, 4)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := int(next.Add(1) - 1); i < len(items) && ctx.Err() == nil; i = int(next.Add(1) - 1) {
				req := b.confirm.request(rng[w], items[i].body, items[i].subject)
				out := filter.Do(ctx, conns.Next(), req, nil)
				for try := 0; try < 5 && out.Local && out.Status == 503 && out.Error == extprocdriver.ErrNone; try++ {
					time.Sleep(100 * time.Millisecond)
					out = filter.Do(ctx, conns.Next(), req, nil)
				}
				if expectConfirm(out) {
					ok[i] = true
					continue
				}
				mu.Lock()
				bad[out]++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return nil, "", err
	}
	for i, it := range items {
		if ok[i] {
			done = append(done, it)
		}
	}
	var parts []string
	for o, n := range bad {
		parts = append(parts, fmt.Sprintf("%s ×%d", o, n))
	}
	sort.Strings(parts)
	return done, strings.Join(parts, ", "), nil
}

// finishReport adds the ratios, notes and settings.
func (b *bench) finishReport() {
	o := b.opts
	top := slices.Max(o.concurrencies)
	at := 64
	if !slices.Contains(o.concurrencies, at) {
		at = top
	}
	b.rep.Ratios = []report.Ratio{
		{Name: "preview / floor", Num: scPreview, Den: scFloor, Target: 0.90, TargetConcurrency: at},
		{Name: "replay / floor", Num: scReplay, Den: scFloor, Target: 0.85, TargetConcurrency: at,
			Note: "a replay is answered after the request body (2 ext_proc messages), the floor exchanges all 4."},
		{Name: "confirm-tiered / io-floor", Num: scConfirmTiered, Den: scIOFloor, Target: 0.90, Stretch: 2.0, TargetConcurrency: at,
			Note: "the stretch target is ≥ 2 × the naive I/O floor once confirms share PostgreSQL round trips."},
		{Name: "confirm-postgres / io-floor", Num: scConfirmPostgres, Den: scIOFloor,
			Note: "the PostgreSQL-only path makes no Redis round trips but its acquire is an INSERT … ON CONFLICT plus read; no target set."},
	}
	if b.pprofMsg != "" {
		b.rep.Notes = append(b.rep.Notes, b.pprofMsg)
	}
	if l := b.rep.Machine.LoadAverage; l != "" {
		b.rep.Notes = append(b.rep.Notes, "Load average when the run started: "+l+" (other work on the machine competes for the same cores and widens every figure).")
	}
	b.rep.Settings = []string{
		fmt.Sprintf("%s measured per cell after %s warm-up; closed loop: each of c workers sends its next request when the previous one ends.", o.duration, o.warmup),
	}
	if b.interleaved() {
		b.rep.Settings = append(b.rep.Settings, fmt.Sprintf("floor, preview and replay run side by side (the floor and one idemgate on the tiered store) and are measured in %d rounds per concurrency of %s each (each after its own %s warm-up on new connections), the order rotated every round, so drift on a shared machine hits all three alike; their figures are over all rounds together.",
			o.rounds, time.Duration(math.Ceil(float64(o.duration)/float64(o.rounds))).Round(time.Millisecond), o.warmup))
	}
	b.rep.Settings = append(b.rep.Settings, []string{
		fmt.Sprintf("%d HTTP/2 connections per server (separate grpc.ClientConns), streams spread round-robin; Envoy's 256 MiB flow-control windows.", o.conns),
		fmt.Sprintf("ext_proc filter as envoy/envoy.yaml: request/response headers SEND, bodies BUFFERED, trailers SKIP, allow_mode_override, message_timeout %s.", o.messageTimeout),
		"Latency is per HTTP request end to end (stream open to the last reply), over every request completed inside the window, in a log-linear histogram (≤ 0.8 % error); ok req/s counts only those with the scenario's expected outcome, and the ratios use it.",
		fmt.Sprintf("Count bound: at most %d req/s × (warm-up + duration) requests per cell; first-time confirm cells get 3 × the I/O floor's rate worth of minted fingerprints.", o.budgetRate),
		"Errors: requests whose outcome is not the scenario's expected one (see Servers); outcomes list every result (local = a reply idemgate or Envoy wrote, not the upstream's).",
		"Each server is a separate process (floors: this tool re-executed with -serve, on idemgate's gRPC server options; idemgate: built once with go build ./cmd/idemgate), started with empty Redis and truncated tables.",
		"idemgate config: log level warn, store.timeout 250ms, the transfer operation of envoy/idemgate.yaml; the tool's own redis-server (no persistence); PostgreSQL database idemgate_bench_<pid>, dropped at the end.",
	}...)
	b.rep.Generated = time.Now()
}
