package soak

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"
)

// Run describes a finished soak for its report.
type Run struct {
	Duration, Warmup, Every time.Duration
	Seed                    int64
	Pods, Agents            int
	Faults                  map[string]int // how many of each kind were injected
	Started                 time.Time
}

// Report is the markdown report: the run, one row per series with its
// verdict and bound, and each series' plot (written beside it as
// <name>.svg).
func Report(r Run, series []Series, verdicts []Verdict) string {
	var b strings.Builder
	b.WriteString("# Soak report\n\n")
	kinds := slices.Sorted(maps.Keys(r.Faults))
	faults := make([]string, len(kinds))
	for i, k := range kinds {
		faults[i] = fmt.Sprintf("%s ×%d", k, r.Faults[k])
	}
	fmt.Fprintf(&b, "`make soak DURATION=%s` started %s: %d idemgate replicas behind the pinned Envoy, %d chaos agents at a steady rate (seed %d), faults: %s. "+
		"Sampled every %s; the first %s are warm-up. A series passes when the median of the last third of the samples after the warm-up is at most the median of the first third times the ratio plus the slack.\n\n",
		r.Duration, r.Started.UTC().Format(time.RFC3339), r.Pods, r.Agents, r.Seed, strings.Join(faults, ", "), r.Every, r.Warmup)
	b.WriteString("| series | first third | last third | limit (ratio, slack) | samples | verdict |\n|---|---|---|---|---|---|\n")
	for i, s := range series {
		v := verdicts[i]
		verdict := "flat"
		switch {
		case v.Insufficient:
			verdict = "too few samples"
		case v.Grew:
			verdict = "**grew**"
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s (×%.2f, +%s) | %d | %s |\n", s.Name, formatValue(v.First, s.Unit), formatValue(v.Last, s.Unit),
			formatValue(v.Limit, s.Unit), s.Bound.Ratio, formatValue(s.Bound.Slack, s.Unit), v.Samples, verdict)
	}
	b.WriteString("\n")
	for _, s := range series {
		fmt.Fprintf(&b, "![%s](%s.svg)\n\n", s.Name, s.Name)
	}
	return b.String()
}
