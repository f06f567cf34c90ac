package report

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func figures(rps float64, p50 time.Duration) *Figures {
	return &Figures{RPS: rps, P50: p50, P90: 2 * p50, P99: 4 * p50, Max: 40 * p50, Requests: uint64(rps * 5), Outcomes: "200 ×" + "n"}
}

func sampleReport() *Report {
	return &Report{
		Command:       "go run ./e2e/loadgen -out BENCHMARKS.md",
		Generated:     time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC),
		Concurrencies: []int{1, 64},
		Scenarios: []Scenario{
			{Name: "floor", Description: "no-op server"},
			{Name: "preview", Description: "idemgate preview"},
			{Name: "io-floor", Description: "store round trips only"},
			{Name: "confirm-tiered", Description: "idemgate confirm, Redis + PostgreSQL"},
		},
		Cells: []Cell{
			{Scenario: "floor", Concurrency: 1, Figures: figures(2000, 450*time.Microsecond)},
			{Scenario: "floor", Concurrency: 64, Figures: figures(8000, 7*time.Millisecond)},
			{Scenario: "preview", Concurrency: 1, Figures: figures(1500, 600*time.Microsecond)},
			{Scenario: "preview", Concurrency: 64, Figures: &Figures{RPS: 7400, P50: 8 * time.Millisecond, P90: 12500 * time.Microsecond,
				P99: 31 * time.Millisecond, Max: 150 * time.Millisecond, Requests: 37000, Errors: 2, Outcomes: "200 ×36998, 504 message timeout ×2", Note: "profiled"}},
			{Scenario: "io-floor", Concurrency: 1, Figures: figures(500, 2*time.Millisecond)},
			{Scenario: "io-floor", Concurrency: 64, Figures: figures(2000, 30*time.Millisecond)},
			{Scenario: "confirm-tiered", Concurrency: 1, Skipped: "idemgate does not build | yet"},
			{Scenario: "confirm-tiered", Concurrency: 64, Skipped: "idemgate does not build | yet"},
		},
		Ratios: []Ratio{
			{Name: "preview / floor", Num: "preview", Den: "floor", Target: 0.90, TargetConcurrency: 64},
			{Name: "confirm-tiered / io-floor", Num: "confirm-tiered", Den: "io-floor", Target: 0.90, Stretch: 2, TargetConcurrency: 64,
				Note: "both make the same store round trips"},
		},
		Memory: []Memory{
			{Route: "preview", Streams: 5000, Reached: 5000, BodyBytes: 2048, Before: 20 << 20, Open: 70 << 20, After: 40 << 20},
			{Route: "confirm", Skipped: "idemgate does not build yet"},
		},
		Notes:    []string{"machine was shared"},
		Settings: []string{"duration 8s per cell"},
		Machine: Machine{CPU: "AMD EPYC", Cores: 2, GoMaxProc: 2, Memory: "23.5 GiB", Kernel: "Linux 6.1", Go: "go1.26.8",
			Redis: "7.0.15", Postgres: "15.20", LoadAverage: "0.50 0.40 0.30", Commit: "abc1234"},
	}
}

func TestRatiosTable(t *testing.T) {
	r := sampleReport()
	v, ok := r.RatioAt(r.Ratios[0], 64)
	require.True(t, ok)
	require.InDelta(t, 0.925, v, 1e-9)
	_, ok = r.RatioAt(r.Ratios[1], 64)
	require.False(t, ok, "a skipped numerator has no ratio")

	md := r.Markdown()
	want := `| ratio | c=1 | c=64 | target | met |
|---|---:|---:|---|---|
| preview / floor | 0.75 | 0.93 | ≥ 0.90 at c=64 | yes |
| confirm-tiered / io-floor | n/a | n/a | ≥ 0.90 at c=64, then ≥ 2.00 | n/a |

- *confirm-tiered / io-floor*: both make the same store round trips
`
	require.Contains(t, md, want)
}

func TestRatioMissesItsTarget(t *testing.T) {
	r := sampleReport()
	r.Cells[3].Figures.RPS = 4000
	require.Contains(t, r.Markdown(), "| preview / floor | 0.75 | 0.50 | ≥ 0.90 at c=64 | no |")
	r.Ratios[0].Stretch = 0.4
	require.Contains(t, r.Markdown(), "| preview / floor | 0.75 | 0.50 | ≥ 0.90 at c=64, then ≥ 0.40 | no, stretch yes |")
}

func TestFiguresTable(t *testing.T) {
	md := sampleReport().Markdown()
	want := `| server | c | ok req/s | p50 ms | p90 ms | p99 ms | max ms | requests | errors | outcomes |
|---|---:|---:|---:|---:|---:|---:|---:|---:|---|
| floor | 1 | 2000 | 0.45 | 0.90 | 1.80 | 18.0 | 10000 | 0 | 200 ×n |
| floor | 64 | 8000 | 7.00 | 14.0 | 28.0 | 280 | 40000 | 0 | 200 ×n |
| preview | 1 | 1500 | 0.60 | 1.20 | 2.40 | 24.0 | 7500 | 0 | 200 ×n |
| preview | 64 | 7400 | 8.00 | 12.5 | 31.0 | 150 | 37000 | 2 | 200 ×36998, 504 message timeout ×2 (profiled) |
| io-floor | 1 | 500 | 2.00 | 4.00 | 8.00 | 80.0 | 2500 | 0 | 200 ×n |
| io-floor | 64 | 2000 | 30.0 | 60.0 | 120 | 1200 | 10000 | 0 | 200 ×n |
| confirm-tiered | 1 | — | — | — | — | — | — | — | skipped: idemgate does not build \| yet |
| confirm-tiered | 64 | — | — | — | — | — | — | — | skipped: idemgate does not build \| yet |
`
	require.Contains(t, md, want)
}

func TestMemoryTable(t *testing.T) {
	md := sampleReport().Markdown()
	want := `| route | open streams | request body | RSS before | RSS while open | RSS after | per open stream |
|---|---:|---:|---:|---:|---:|---:|
| preview | 5000 | 2048 B | 20.0 MiB | 70.0 MiB | 40.0 MiB | 10.2 KiB |
| confirm | — | — | — | — | — | skipped: idemgate does not build yet |
`
	require.Contains(t, md, want)
	m := Memory{Streams: 5000, Reached: 4000, Before: 1 << 20, Open: 1<<20 + 4000*2048}
	require.InDelta(t, 2048, m.PerStream(), 1e-9)
}

func TestDocumentLayout(t *testing.T) {
	md := sampleReport().Markdown()
	// Sections in reading order: ratios first, the command last.
	var at []int
	for _, h := range []string{"## Ratios", "## Raw figures", "## Memory per open stream", "## Servers", "## Notes", "## Machine", "## Settings", "## Command"} {
		i := strings.Index(md, h)
		require.GreaterOrEqual(t, i, 0, h)
		at = append(at, i)
	}
	require.IsIncreasing(t, at)
	require.Contains(t, md, "```\ngo run ./e2e/loadgen -out BENCHMARKS.md\n```\n")
	require.Contains(t, md, "| CPU | AMD EPYC |\n| cores | 2 (GOMAXPROCS 2 in the load tool and in every server) |\n")
	require.Contains(t, md, "- **io-floor**: store round trips only\n")
	require.Contains(t, md, "Run finished 2026-05-01T12:00:00Z.")
}

func TestParseCPUInfo(t *testing.T) {
	data := []byte("processor\t: 0\nmodel name\t: AMD EPYC 7B13\nflags\t: fpu\n\nprocessor\t: 1\nmodel name\t: AMD EPYC 7B13\n")
	model, cores := parseCPUInfo(data, 9)
	require.Equal(t, "AMD EPYC 7B13", model)
	require.Equal(t, 2, cores)
	model, cores = parseCPUInfo(nil, 9)
	require.Empty(t, model)
	require.Equal(t, 9, cores)
}

func TestResidentBytesOfThisProcess(t *testing.T) {
	rss, err := ResidentBytes(os.Getpid())
	require.NoError(t, err)
	require.Greater(t, rss, uint64(1<<20))
	_, err = ResidentBytes(-1)
	require.Error(t, err)
	kb, ok := meminfoKB([]byte("Name:\tx\nVmRSS:\t  12345 kB\n"), "VmRSS")
	require.True(t, ok)
	require.Equal(t, uint64(12345), kb)
}

func TestDurationFormatting(t *testing.T) {
	for _, tc := range []struct {
		d    time.Duration
		want string
	}{
		{412 * time.Microsecond, "0.41"},
		{4126 * time.Microsecond, "4.13"},
		{41260 * time.Microsecond, "41.3"},
		{412500 * time.Microsecond, "413"},
		{2 * time.Second, "2000"},
	} {
		require.Equal(t, tc.want, ms(tc.d))
	}
}

func TestEnvoySectionComesFirst(t *testing.T) {
	r := sampleReport()
	r.Machine.Envoy = "1.40.0 (.envoy-version)"
	r.Envoy = &EnvoyTable{
		Version: "1.40.0", Intro: "through Envoy", Concurrencies: []int{64},
		Columns: []Scenario{{Name: "envoy+noop", Description: "no-op"}, {Name: "envoy+preview", Description: "idemgate"}},
		Cells: []Cell{
			{Scenario: "envoy+noop", Concurrency: 64, Figures: figures(3000, 20*time.Millisecond)},
			{Scenario: "envoy+preview", Concurrency: 64, Figures: figures(2850, 21*time.Millisecond)},
		},
		Ratios:   []Ratio{{Name: "envoy+preview / envoy+noop", Num: "envoy+preview", Den: "envoy+noop", Target: 0.90, TargetConcurrency: 64}},
		CPURoles: []string{"Envoy", "ext_proc server"}, CPUConcurrency: 64, CPUBase: "envoy+noop",
		CPU:         []CPURow{{Column: "envoy+noop", MicrosPerRequest: []float64{200, 60}}, {Column: "envoy+preview", MicrosPerRequest: []float64{240, 85}}},
		Notes:       []string{"shared machine"},
		RoundRatios: []RoundRatio{{Name: "envoy+preview / envoy+noop", PerConcurrency: map[int][]float64{64: {0.97, 0.88, 0.93, 0.91}}}},
	}
	md := r.Markdown()
	require.Contains(t, md, "| envoy+preview / envoy+noop | 0.92 (0.88–0.97) |")
	envoyAt, extprocAt := strings.Index(md, "## Through Envoy 1.40.0"), strings.Index(md, "## ext_proc level")
	require.Positive(t, envoyAt)
	require.Greater(t, extprocAt, envoyAt)
	require.Contains(t, md, "| envoy+preview / envoy+noop | 0.95 | ≥ 0.90 at c=64 | yes |")
	require.Contains(t, md, "| envoy+preview | 240 | 85 | 325 | 0.80 |")
	require.Contains(t, md, "| Envoy | 1.40.0 (.envoy-version) |")
	v, ok := r.Envoy.RatioAt(r.Envoy.Ratios[0], 64)
	require.True(t, ok)
	require.InDelta(t, 0.95, v, 1e-9)
}
