package soak

import (
	"fmt"
	"math"
	"slices"
	"time"
)

// Point is one sample: when after the start, and its value.
type Point struct {
	At    time.Duration
	Value float64
}

// Series is one quantity sampled over the run.
type Series struct {
	Name string // e.g. "rss"
	// Unit is how the report prints values: "bytes" or "" (a count).
	Unit   string
	Points []Point
	// Bound is the growth the series may show after the warm-up.
	Bound Bound
}

// Bound says how much a series may grow: the median of the last third of
// the samples after the warm-up may exceed the median of the first third by
// at most Ratio times it plus Slack. Medians, not means, so that a sample
// taken during a fault (a replica stopped, a pool reconnecting) does not
// decide; thirds, so that a slow leak shows as a step the bound can see
// while the run's noise does not.
type Bound struct {
	Ratio float64
	Slack float64
}

// Verdict is the growth check's answer for one series.
type Verdict struct {
	Name         string
	First, Last  float64 // medians of the first and last third after warm-up
	Limit        float64 // First*Ratio + Slack
	Samples      int     // samples after warm-up
	Grew         bool
	Insufficient bool // too few samples after warm-up to judge
}

func (v Verdict) String() string {
	switch {
	case v.Insufficient:
		return fmt.Sprintf("%s: only %d samples after the warm-up, cannot judge", v.Name, v.Samples)
	case v.Grew:
		return fmt.Sprintf("%s grew: last-third median %.0f > limit %.0f (first-third median %.0f)", v.Name, v.Last, v.Limit, v.First)
	}
	return fmt.Sprintf("%s flat: last-third median %.0f <= limit %.0f (first-third median %.0f)", v.Name, v.Last, v.Limit, v.First)
}

// minJudged is the fewest samples after warm-up the check judges from:
// three per third.
const minJudged = 9

// Check judges s after warmup. NaN values (a sample that could not be
// read, e.g. /metrics of a stopped replica) are left out.
func Check(s Series, warmup time.Duration) Verdict {
	var vals []float64
	for _, p := range s.Points {
		if p.At >= warmup && !math.IsNaN(p.Value) {
			vals = append(vals, p.Value)
		}
	}
	v := Verdict{Name: s.Name, Samples: len(vals)}
	if len(vals) < minJudged {
		v.Insufficient = true
		return v
	}
	third := len(vals) / 3
	v.First = median(vals[:third])
	v.Last = median(vals[len(vals)-third:])
	v.Limit = v.First*s.Bound.Ratio + s.Bound.Slack
	v.Grew = v.Last > v.Limit
	return v
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}
