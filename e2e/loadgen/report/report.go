// Package report renders the load benchmark as markdown (BENCHMARKS.md): the
// ratio table first, then the raw figures per server and concurrency, the
// memory measurement, the machine and the exact command.
package report

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Figures are one server's measurement at one concurrency.
type Figures struct {
	// RPS counts requests per second that ended with the scenario's
	// expected outcome (errors excluded: a server that fails fast must not
	// look fast). Latencies cover every completed request.
	RPS                float64
	P50, P90, P99, Max time.Duration
	Requests           uint64
	// Errors counts requests whose outcome was not the one the scenario
	// expects (ext_proc failures and unexpected statuses).
	Errors uint64
	// Outcomes lists the outcomes seen, e.g. "200 ×10342, local 409 ×2".
	Outcomes string
	// Note flags something a reader must know (source ran out, profiled).
	Note string
}

// Cell is one (scenario, concurrency) measurement; Skipped says why there
// is none.
type Cell struct {
	Scenario    string
	Concurrency int
	Figures     *Figures
	Skipped     string
}

// Scenario names and explains a row group of the raw table.
type Scenario struct {
	Name        string
	Description string
}

// Ratio is one row of the ratio table: Num's req/s over Den's req/s at each
// concurrency. Target applies at TargetConcurrency (0: not judged).
type Ratio struct {
	Name              string
	Num, Den          string
	Target            float64
	Stretch           float64 // a second, later target (0: none)
	TargetConcurrency int
	Note              string
}

// Memory is the resident-memory measurement with many open streams.
type Memory struct {
	Route     string
	Streams   int
	Reached   int
	BodyBytes int
	Before    uint64 // VmRSS bytes before the streams were opened
	Open      uint64 // VmRSS bytes while they were open
	After     uint64 // VmRSS bytes after they completed
	Skipped   string
	Note      string
}

// PerStream is the RSS growth per open stream.
func (m Memory) PerStream() float64 {
	if m.Reached == 0 {
		return 0
	}
	return (float64(m.Open) - float64(m.Before)) / float64(m.Reached)
}

// Report is everything BENCHMARKS.md shows.
type Report struct {
	Generated     time.Time
	Command       string
	Machine       Machine
	Settings      []string
	Concurrencies []int
	Scenarios     []Scenario
	Cells         []Cell
	Ratios        []Ratio
	Memory        []Memory
	Notes         []string
	// Envoy is the through-Envoy table, shown first; nil when not run.
	Envoy *EnvoyTable
}

// EnvoyTable is the through-Envoy benchmark: HTTP requests to a real Envoy
// per column (Envoy alone, Envoy + a no-op ext_proc server, Envoy +
// idemgate…), with its own ratios, notes and settings.
type EnvoyTable struct {
	Version       string
	Intro         string
	Concurrencies []int
	Columns       []Scenario
	Cells         []Cell
	Ratios        []Ratio
	// CPU splits each column's CPU per request between the processes
	// (CPURoles) at CPUConcurrency.
	CPURoles       []string
	CPUConcurrency int
	CPU            []CPURow
	CPUBase        string // the column the CPU ratios are taken against
	// RoundRatios are the ratios of each round on its own.
	RoundRatios []RoundRatio
	Notes       []string
	Settings    []string
}

// RoundRatio is one ratio taken round by round (both sides measured
// minutes apart at most), per concurrency.
type RoundRatio struct {
	Name           string
	PerConcurrency map[int][]float64
}

// CPURow is one column's CPU microseconds per request, one per role.
type CPURow struct {
	Column           string
	MicrosPerRequest []float64
}

// cpuTotal is a column's CPU per request over every role.
func (e *EnvoyTable) cpuTotal(column string) (float64, bool) {
	for _, row := range e.CPU {
		if row.Column == column {
			total := 0.0
			for _, v := range row.MicrosPerRequest {
				total += v
			}
			return total, total > 0
		}
	}
	return 0, false
}

// table is the EnvoyTable as a Report, to render it with the same code.
func (e *EnvoyTable) table() *Report {
	return &Report{Concurrencies: e.Concurrencies, Scenarios: e.Columns, Cells: e.Cells, Ratios: e.Ratios}
}

// RatioAt is Report.RatioAt on the through-Envoy cells.
func (e *EnvoyTable) RatioAt(ra Ratio, c int) (float64, bool) { return e.table().RatioAt(ra, c) }

func (r *Report) cell(scenario string, c int) *Cell {
	for i := range r.Cells {
		if r.Cells[i].Scenario == scenario && r.Cells[i].Concurrency == c {
			return &r.Cells[i]
		}
	}
	return nil
}

// RatioAt returns Num/Den req/s at concurrency c, false when either side is
// missing.
func (r *Report) RatioAt(ra Ratio, c int) (float64, bool) {
	n, d := r.cell(ra.Num, c), r.cell(ra.Den, c)
	if n == nil || d == nil || n.Figures == nil || d.Figures == nil || d.Figures.RPS == 0 {
		return 0, false
	}
	return n.Figures.RPS / d.Figures.RPS, true
}

// Markdown renders the report.
func (r *Report) Markdown() string {
	var b strings.Builder
	b.WriteString("# idemgate load benchmark\n\n")
	b.WriteString("Generated by `e2e/loadgen` (`make bench`); every number below comes from one run of the command shown at the end")
	if r.Envoy != nil {
		b.WriteString(": first through a real Envoy (HTTP requests), then at the ext_proc level (the load tool plays Envoy)")
	}
	b.WriteString(".\n\n")
	if r.Envoy != nil {
		r.Envoy.writeMarkdown(&b)
		b.WriteString("\n## ext_proc level\n\n")
	}
	b.WriteString("The load tool plays Envoy's ext_proc filter as `envoy/envoy.yaml` configures it (one gRPC stream per HTTP request: ")
	b.WriteString("request headers, buffered request body, response headers, buffered response body, each sent after the previous reply). ")
	b.WriteString("Each server runs as its own process on the same machine as the load tool, so both share its cores the same way for every row.\n\n")

	b.WriteString("## Ratios (requests/s of the first over the second, same run)\n\n")
	r.writeRatios(&b)

	b.WriteString("\n## Raw figures\n\n")
	r.writeFigures(&b)

	if len(r.Memory) > 0 {
		b.WriteString("\n## Memory per open stream\n\n")
		r.writeMemory(&b)
	}

	if len(r.Scenarios) > 0 {
		b.WriteString("\n## Servers\n\n")
		for _, s := range r.Scenarios {
			fmt.Fprintf(&b, "- **%s**: %s\n", s.Name, s.Description)
		}
	}
	if len(r.Notes) > 0 {
		b.WriteString("\n## Notes\n\n")
		for _, n := range r.Notes {
			fmt.Fprintf(&b, "- %s\n", n)
		}
	}

	b.WriteString("\n## Machine\n\n")
	r.Machine.writeMarkdown(&b)
	if len(r.Settings) > 0 {
		b.WriteString("\n## Settings\n\n")
		for _, s := range r.Settings {
			fmt.Fprintf(&b, "- %s\n", s)
		}
	}
	b.WriteString("\n## Command\n\n```\n")
	b.WriteString(r.Command)
	b.WriteString("\n```\n")
	if !r.Generated.IsZero() {
		fmt.Fprintf(&b, "\nRun finished %s.\n", r.Generated.UTC().Format(time.RFC3339))
	}
	return b.String()
}

// writeMarkdown renders the through-Envoy section (level-2 heading, its
// parts at level 3).
func (e *EnvoyTable) writeMarkdown(b *strings.Builder) {
	fmt.Fprintf(b, "## Through Envoy %s\n\n", e.Version)
	if e.Intro != "" {
		b.WriteString(e.Intro + "\n\n")
	}
	t := e.table()
	b.WriteString("### Ratios (requests/s of the first over the second, same run)\n\n")
	t.writeRatios(b)
	if len(e.RoundRatios) > 0 {
		b.WriteString("\n### The same ratios round by round: median (lowest–highest)\n\n")
		b.WriteString("Each round measures every column once, one after the other, so a round's ratio compares cells taken seconds apart; the spread shows how much the shared machine moved them.\n\n")
		b.WriteString("| ratio |")
		for _, c := range e.Concurrencies {
			fmt.Fprintf(b, " c=%d |", c)
		}
		b.WriteString("\n|---|")
		for range e.Concurrencies {
			b.WriteString("---:|")
		}
		b.WriteString("\n")
		for _, rr := range e.RoundRatios {
			fmt.Fprintf(b, "| %s |", rr.Name)
			for _, c := range e.Concurrencies {
				v := slices.Clone(rr.PerConcurrency[c])
				if len(v) == 0 {
					b.WriteString(" n/a |")
					continue
				}
				slices.Sort(v)
				fmt.Fprintf(b, " %.2f (%.2f–%.2f) |", median(v), v[0], v[len(v)-1])
			}
			b.WriteString("\n")
		}
	}
	b.WriteString("\n### Raw figures (all rounds together)\n\n")
	t.writeFigures(b)
	if len(e.CPU) > 0 {
		fmt.Fprintf(b, "\n### Where the CPU goes (c=%d, µs of CPU per request, from /proc/<pid>/stat over every cell incl. warm-up)\n\n", e.CPUConcurrency)
		b.WriteString("| column |")
		for _, r := range e.CPURoles {
			fmt.Fprintf(b, " %s |", r)
		}
		base, hasBase := e.cpuTotal(e.CPUBase)
		b.WriteString(" total |")
		if hasBase {
			fmt.Fprintf(b, " %s total / this total |", e.CPUBase)
		}
		b.WriteString("\n|---|")
		for range e.CPURoles {
			b.WriteString("---:|")
		}
		b.WriteString("---:|")
		if hasBase {
			b.WriteString("---:|")
		}
		b.WriteString("\n")
		for _, row := range e.CPU {
			fmt.Fprintf(b, "| %s |", row.Column)
			for _, v := range row.MicrosPerRequest {
				fmt.Fprintf(b, " %.0f |", v)
			}
			total, _ := e.cpuTotal(row.Column)
			fmt.Fprintf(b, " %.0f |", total)
			if hasBase {
				fmt.Fprintf(b, " %.2f |", base/total)
			}
			b.WriteString("\n")
		}
		if hasBase {
			fmt.Fprintf(b, "\nThe last column is the rate ratio to %s that CPU alone predicts when the cores are the bottleneck: it does not move with what else runs on the machine as much as the measured ratios do.\n", e.CPUBase)
		}
		b.WriteString("\nRedis and PostgreSQL are the shared servers' whole CPU during the cells (Redis's INFO cpu; every postgres process plus the exited backends the postmaster reaped), so they include other work on those servers. CPU time is counted in 10 ms ticks. A process's cost per request rises when its rate falls (fewer events per wake-up), so the predicted ratio is meaningful between columns of similar rates (the no-op, preview and replay columns), not for the store columns.\n")
	}
	if len(e.Columns) > 0 {
		b.WriteString("\n### Columns\n\n")
		for _, s := range e.Columns {
			fmt.Fprintf(b, "- **%s**: %s\n", s.Name, s.Description)
		}
	}
	if len(e.Notes) > 0 {
		b.WriteString("\n### Notes\n\n")
		for _, n := range e.Notes {
			fmt.Fprintf(b, "- %s\n", n)
		}
	}
	if len(e.Settings) > 0 {
		b.WriteString("\n### Settings\n\n")
		for _, s := range e.Settings {
			fmt.Fprintf(b, "- %s\n", s)
		}
	}
}

func (r *Report) writeRatios(b *strings.Builder) {
	b.WriteString("| ratio |")
	for _, c := range r.Concurrencies {
		fmt.Fprintf(b, " c=%d |", c)
	}
	b.WriteString(" target | met |\n|---|")
	for range r.Concurrencies {
		b.WriteString("---:|")
	}
	b.WriteString("---|---|\n")
	for _, ra := range r.Ratios {
		fmt.Fprintf(b, "| %s |", ra.Name)
		for _, c := range r.Concurrencies {
			if v, ok := r.RatioAt(ra, c); ok {
				fmt.Fprintf(b, " %.2f |", v)
			} else {
				b.WriteString(" n/a |")
			}
		}
		target, met := "—", "—"
		if ra.Target > 0 && ra.TargetConcurrency > 0 {
			target = fmt.Sprintf("≥ %.2f at c=%d", ra.Target, ra.TargetConcurrency)
			if ra.Stretch > 0 {
				target += fmt.Sprintf(", then ≥ %.2f", ra.Stretch)
			}
			met = "n/a"
			if v, ok := r.RatioAt(ra, ra.TargetConcurrency); ok {
				met = yesNo(v >= ra.Target)
				if ra.Stretch > 0 {
					met += ", stretch " + yesNo(v >= ra.Stretch)
				}
			}
		}
		fmt.Fprintf(b, " %s | %s |\n", target, met)
	}
	var notes []string
	for _, ra := range r.Ratios {
		if ra.Note != "" {
			notes = append(notes, fmt.Sprintf("*%s*: %s", ra.Name, ra.Note))
		}
	}
	if len(notes) > 0 {
		b.WriteString("\n")
		for _, n := range notes {
			fmt.Fprintf(b, "- %s\n", n)
		}
	}
}

// median of sorted values.
func median(v []float64) float64 {
	n := len(v)
	if n%2 == 1 {
		return v[n/2]
	}
	return (v[n/2-1] + v[n/2]) / 2
}

func yesNo(ok bool) string {
	if ok {
		return "yes"
	}
	return "no"
}

func (r *Report) writeFigures(b *strings.Builder) {
	b.WriteString("| server | c | ok req/s | p50 ms | p90 ms | p99 ms | max ms | requests | errors | outcomes |\n")
	b.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|\n")
	for _, s := range r.scenarioOrder() {
		for _, c := range r.Concurrencies {
			cell := r.cell(s, c)
			if cell == nil {
				continue
			}
			if cell.Figures == nil {
				fmt.Fprintf(b, "| %s | %d | — | — | — | — | — | — | — | skipped: %s |\n", s, c, escape(cell.Skipped))
				continue
			}
			f := cell.Figures
			outcomes := escape(f.Outcomes)
			if f.Note != "" {
				outcomes += " (" + escape(f.Note) + ")"
			}
			fmt.Fprintf(b, "| %s | %d | %.0f | %s | %s | %s | %s | %d | %d | %s |\n",
				s, c, f.RPS, ms(f.P50), ms(f.P90), ms(f.P99), ms(f.Max), f.Requests, f.Errors, outcomes)
		}
	}
}

// scenarioOrder lists scenarios in the order of r.Scenarios, then any other
// scenario that has cells, in first-seen order.
func (r *Report) scenarioOrder() []string {
	var order []string
	seen := map[string]bool{}
	for _, s := range r.Scenarios {
		if !seen[s.Name] {
			seen[s.Name] = true
			order = append(order, s.Name)
		}
	}
	for _, c := range r.Cells {
		if !seen[c.Scenario] {
			seen[c.Scenario] = true
			order = append(order, c.Scenario)
		}
	}
	return order
}

func (r *Report) writeMemory(b *strings.Builder) {
	b.WriteString("| route | open streams | request body | RSS before | RSS while open | RSS after | per open stream |\n")
	b.WriteString("|---|---:|---:|---:|---:|---:|---:|\n")
	for _, m := range r.Memory {
		if m.Skipped != "" {
			fmt.Fprintf(b, "| %s | — | — | — | — | — | skipped: %s |\n", m.Route, escape(m.Skipped))
			continue
		}
		streams := strconv.Itoa(m.Reached)
		if m.Reached != m.Streams {
			streams = fmt.Sprintf("%d of %d", m.Reached, m.Streams)
		}
		per := fmt.Sprintf("%.1f KiB", m.PerStream()/1024)
		if m.Note != "" {
			per += " (" + escape(m.Note) + ")"
		}
		fmt.Fprintf(b, "| %s | %s | %d B | %s | %s | %s | %s |\n",
			m.Route, streams, m.BodyBytes, mib(m.Before), mib(m.Open), mib(m.After), per)
	}
}

// ms renders a duration in milliseconds with enough digits to compare.
func ms(d time.Duration) string {
	v := float64(d) / float64(time.Millisecond)
	switch {
	case v >= 100:
		return strconv.FormatFloat(math.Round(v), 'f', 0, 64)
	case v >= 10:
		return strconv.FormatFloat(v, 'f', 1, 64)
	default:
		return strconv.FormatFloat(v, 'f', 2, 64)
	}
}

func mib(b uint64) string {
	if b == 0 {
		return "—"
	}
	return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20))
}

// escape keeps a free-text cell from breaking the table.
func escape(s string) string {
	s = strings.ReplaceAll(s, "|", `\|`)
	return strings.ReplaceAll(s, "\n", " ")
}
