// Command loadgen is idemgate's load benchmark (make bench): it plays Envoy's
// ext_proc filter against a server at a given concurrency over a given number
// of HTTP/2 connections and compares, in one run, idemgate with the floors
// the protocol and the stores impose:
//
//	floor            a no-op ext_proc server (CONTINUE to everything)
//	preview          idemgate on the preview route (sign + inject, no store)
//	replay           idemgate answering confirms that are already DONE
//	io-floor         a server making exactly a confirm's store round trips
//	confirm-tiered   idemgate on first-time confirms, Redis + PostgreSQL
//	confirm-postgres idemgate on first-time confirms, PostgreSQL alone
//	memory           idemgate's resident memory with many open streams
//
// Every server is a child process (idemgate built once with go build; the
// floors are this binary re-executed with the hidden -serve flag), so server
// and load tool share the machine's cores the same way in every row. Redis
// is a redis-server of the run's own; PostgreSQL is the shared server, in a
// database the run creates and drops.
//
//	go run ./e2e/loadgen -out BENCHMARKS.md
//	go run ./e2e/loadgen -scenarios floor,preview -concurrency 16 -duration 3s
//	go run ./e2e/loadgen -scenarios preview,confirm-tiered -cpuprofile prof -memprofile prof
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Scenario names, in the order they run.
const (
	scFloor           = "floor"
	scPreview         = "preview"
	scReplay          = "replay"
	scIOFloor         = "io-floor"
	scConfirmTiered   = "confirm-tiered"
	scConfirmPostgres = "confirm-postgres"
	scMemory          = "memory"
)

var allScenarios = []string{scFloor, scPreview, scReplay, scIOFloor, scConfirmTiered, scConfirmPostgres, scMemory}

// options are the command-line settings of a benchmark run.
type options struct {
	out            string
	duration       time.Duration
	warmup         time.Duration
	concurrencies  []int
	conns          int
	scenarios      []string
	messageTimeout time.Duration
	budgetRate     int
	replayPool     int
	rounds         int

	memStreams int
	memBody    int
	memConns   int
	memRoutes  []string

	cpuProfileDir      string
	memProfileDir      string
	profileConcurrency int

	idemgateBin string
	redisServer string
	pgAdminDSN  string

	// The through-Envoy table.
	envoyTable  bool
	envoyBin    string
	envoyRounds int
	// envoyAttachRounds are the attach pair's own rounds (attachPairRounds).
	envoyAttachRounds int
	envoyDuration     time.Duration
	envoyWarmup       time.Duration
	envoyRedis        string
	envoyConfirmRate  int
	// envoyLenientStores (tests only) gives idemgate and the I/O floor
	// longer store timeouts than shipped, for a behaviour check that must
	// not fail when a busy machine delays Redis past 50 ms.
	envoyLenientStores bool

	serve serveOptions
}

func (o *options) selected(s string) bool { return slices.Contains(o.scenarios, s) }

func main() {
	os.Exit(run(os.Args, os.Stdout, os.Stderr))
}

// run is the whole program; args include the program name.
func run(args []string, stdout, stderr io.Writer) int {
	opts, err := parseFlags(args[1:], stderr)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintln(stderr, "loadgen:", err)
		return 2
	}
	if opts.serve.kind != "" {
		if err := serve(opts.serve, stderr); err != nil {
			fmt.Fprintln(stderr, "loadgen -serve:", err)
			return 1
		}
		return 0
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	b := &bench{opts: opts, log: log, command: commandLine(args)}
	md, err := b.run(ctx)
	if err != nil {
		log.Error("benchmark failed", "error", err)
		return 1
	}
	if opts.out == "" {
		_, _ = io.WriteString(stdout, md)
		return 0
	}
	md += keptSections(opts.out)
	if err := os.WriteFile(opts.out, []byte(md), 0o644); err != nil {
		log.Error("failed to write the report", "file", opts.out, "error", err)
		return 1
	}
	log.Info("report written", "file", opts.out)
	return 0
}

func parseFlags(args []string, stderr io.Writer) (*options, error) {
	fs := flag.NewFlagSet("loadgen", flag.ContinueOnError)
	fs.SetOutput(stderr)
	o := &options{}
	var conc, scen, memRoutes string
	fs.StringVar(&o.out, "out", "", "write the markdown report to this file (default: stdout)")
	fs.DurationVar(&o.duration, "duration", 5*time.Second, "measured time per cell (server × concurrency)")
	fs.DurationVar(&o.warmup, "warmup", time.Second, "unmeasured warm-up before each cell")
	fs.StringVar(&conc, "concurrency", "1,16,64", "comma-separated concurrencies (simultaneous HTTP requests)")
	fs.IntVar(&o.conns, "conns", 2, "HTTP/2 connections to each server (Envoy: one per worker thread; 2 on a 2-core machine)")
	fs.StringVar(&scen, "scenarios", strings.Join(allScenarios, ","), "comma-separated scenarios: "+strings.Join(allScenarios, ","))
	fs.DurationVar(&o.messageTimeout, "message-timeout", time.Second, "ext_proc message_timeout (envoy/envoy.yaml: 1s)")
	fs.IntVar(&o.budgetRate, "budget-rate", 20000, "count bound: at most this many requests per second of warm-up+duration per cell")
	fs.IntVar(&o.rounds, "rounds", 3, "floor, preview and replay (when all three run): this many rounds per concurrency, each -duration/rounds long, the order rotated each round")
	fs.IntVar(&o.replayPool, "replay-pool", 1024, "fingerprints completed before the replay cells and reused round-robin")
	fs.IntVar(&o.memStreams, "memory-streams", 5000, "concurrent open streams in the memory scenario")
	fs.IntVar(&o.memBody, "memory-body", 2048, "request body bytes per stream in the memory scenario")
	fs.IntVar(&o.memConns, "memory-conns", 8, "HTTP/2 connections in the memory scenario")
	fs.StringVar(&memRoutes, "memory-routes", "preview,confirm", "routes the memory scenario holds streams on: preview,confirm")
	fs.StringVar(&o.cpuProfileDir, "cpuprofile", "", "directory for CPU profiles of idemgate (started with serve --pprof, fetched from its admin server) during each idemgate cell at -profile-concurrency")
	fs.StringVar(&o.memProfileDir, "memprofile", "", "directory for allocation profiles of idemgate, as -cpuprofile")
	fs.IntVar(&o.profileConcurrency, "profile-concurrency", 0, "concurrency whose cells are profiled (default: the highest)")
	fs.StringVar(&o.idemgateBin, "idemgate", "", "use this idemgate binary instead of building ./cmd/idemgate")
	fs.StringVar(&o.redisServer, "redis-server", "redis-server", "redis-server binary for the run's own Redis")
	fs.StringVar(&o.pgAdminDSN, "pg", defaultAdminDSN(), "PostgreSQL DSN used to create and drop the run's database")
	fs.BoolVar(&o.envoyTable, "envoy-table", true, "also measure through a real Envoy (the pinned one: ENVOY_BIN, or .ci/envoy.sh installs it)")
	fs.StringVar(&o.envoyBin, "envoy", "", "Envoy binary for the through-Envoy table (default: $ENVOY_BIN, else .ci/envoy.sh)")
	fs.IntVar(&o.envoyRounds, "envoy-rounds", 5, "through-Envoy rounds per concurrency (every column once per round, the order rotated)")
	fs.IntVar(&o.envoyAttachRounds, "envoy-attach-rounds", 15, "at the target concurrency, extra rounds of just the two other-path columns (Envoy alone, Envoy carrying idemgate), back to back, the order alternating")
	fs.DurationVar(&o.envoyDuration, "envoy-duration", 2*time.Second, "measured time per through-Envoy cell and round")
	fs.DurationVar(&o.envoyWarmup, "envoy-warmup", 500*time.Millisecond, "unmeasured warm-up before each through-Envoy cell")
	fs.StringVar(&o.envoyRedis, "envoy-redis", defaultSharedRedis(), "the shared Redis idemgate and the I/O floor use through Envoy (own key prefix, keys deleted at the end)")
	fs.IntVar(&o.envoyConfirmRate, "envoy-confirm-rate", 3000, "fingerprints minted per second of warm-up+duration for each through-Envoy first-time confirm cell")
	// Child mode: this binary as a floor server.
	fs.StringVar(&o.serve.kind, "serve", "", "internal: run a floor server or the upstream (noop|noop-bodyonly|answer|noop-edit|iofloor|upstream)")
	fs.StringVar(&o.serve.listen, "listen", "127.0.0.1:0", "internal: -serve listen address")
	fs.StringVar(&o.serve.redisAddr, "redis-addr", "", "internal: -serve iofloor Redis address")
	fs.StringVar(&o.serve.redisPrefix, "redis-prefix", "iofloor:", "internal: -serve iofloor prefix of its Redis keys")
	fs.StringVar(&o.serve.pgDSN, "pg-dsn", "", "internal: -serve iofloor PostgreSQL DSN")
	fs.DurationVar(&o.serve.storeTimeout, "store-timeout", 0, "internal: -serve iofloor bound of each store call (default 250ms)")
	fs.StringVar(&o.serve.editToken, "edit-token", "", "internal: -serve noop-edit fingerprint of its HTTP answers")
	fs.StringVar(&o.serve.editMCPToken, "edit-mcp-token", "", "internal: -serve noop-edit fingerprint of its MCP answers (default: -edit-token)")
	fs.StringVar(&o.serve.editExpires, "edit-expires", "", "internal: -serve noop-edit expiry member's value (RFC 3339)")
	fs.StringVar(&o.serve.answerReply, "answer-reply", "", "internal: -serve answer ImmediateResponse (protojson) it sends to every request body (default: a fixed one of its own)")
	fs.StringVar(&o.serve.editMCPBlock, "edit-mcp-block", "", "internal: -serve noop-edit text block (JSON) appended to an MCP result's content")
	fs.BoolVar(&o.serve.editBodyOnly, "edit-bodyonly", false, "internal: -serve noop-edit in 3 messages (the response headers switched off, no header set on the body)")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	if o.serve.kind != "" {
		return o, nil
	}

	var problems []error
	var err error
	if o.concurrencies, err = parseInts(conc); err != nil {
		problems = append(problems, fmt.Errorf("-concurrency: %w", err))
	}
	o.scenarios = splitList(scen)
	for _, s := range o.scenarios {
		if !slices.Contains(allScenarios, s) {
			problems = append(problems, fmt.Errorf("-scenarios: unknown scenario %q", s))
		}
	}
	o.memRoutes = splitList(memRoutes)
	for _, r := range o.memRoutes {
		if r != "preview" && r != "confirm" {
			problems = append(problems, fmt.Errorf("-memory-routes: unknown route %q (preview|confirm)", r))
		}
	}
	if o.duration <= 0 || o.warmup < 0 {
		problems = append(problems, errors.New("-duration must be positive and -warmup not negative"))
	}
	if o.conns < 1 || o.memConns < 1 {
		problems = append(problems, errors.New("-conns and -memory-conns must be at least 1"))
	}
	if o.memStreams < 1 || o.memBody < 0 || o.memBody > 1<<20 {
		problems = append(problems, errors.New("-memory-streams must be at least 1 and -memory-body within 0..1048576 (limits.max_body_bytes)"))
	}
	if o.envoyTable && (o.envoyRounds < 1 || o.envoyAttachRounds < 0 || o.envoyDuration <= 0 || o.envoyWarmup < 0 || o.envoyConfirmRate < 1) {
		problems = append(problems, errors.New("-envoy-rounds and -envoy-confirm-rate must be at least 1, -envoy-attach-rounds not negative, -envoy-duration positive and -envoy-warmup not negative"))
	}
	if o.rounds < 1 {
		problems = append(problems, errors.New("-rounds must be at least 1"))
	}
	if o.budgetRate < 1 || o.replayPool < 1 {
		problems = append(problems, errors.New("-budget-rate and -replay-pool must be at least 1"))
	}
	if o.profileConcurrency == 0 && len(o.concurrencies) > 0 {
		o.profileConcurrency = slices.Max(o.concurrencies)
	}
	return o, errors.Join(problems...)
}

func parseInts(s string) ([]int, error) {
	var out []int
	for _, f := range splitList(s) {
		n, err := strconv.Atoi(f)
		if err != nil || n < 1 {
			return nil, fmt.Errorf("%q is not a positive integer", f)
		}
		if !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	if len(out) == 0 {
		return nil, errors.New("no value given")
	}
	return out, nil
}

func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// commandLine renders how the tool was invoked; under `go run` the binary is
// a temporary file, so the command is given as go run ./e2e/loadgen.
func commandLine(args []string) string {
	prog := args[0]
	if strings.Contains(prog, string(filepath.Separator)+"go-build") {
		prog = "go run ./e2e/loadgen"
	}
	parts := []string{prog}
	for _, a := range args[1:] {
		if a == "" || strings.ContainsAny(a, " \t'\"$") {
			a = strconv.Quote(a)
		}
		parts = append(parts, a)
	}
	return strings.Join(parts, " ")
}

// keptMarker starts the part of the report file that the benchmark does not
// write: sections measured by other commands (the tracing cost of the Go
// benchmarks in extproc), kept across runs.
const keptMarker = "<!-- sections below are not written by the load benchmark; it keeps them -->"

// keptSections returns the marker and everything after it in the existing
// report, or "" when there is none.
func keptSections(path string) string {
	old, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	i := strings.Index(string(old), keptMarker)
	if i < 0 {
		return ""
	}
	return "\n" + string(old[i:])
}
