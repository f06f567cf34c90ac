package soak

import (
	"encoding/xml"
	"math"
	"strings"
	"testing"
	"time"
)

// series builds a series sampled every 10 s from values.
func series(name string, b Bound, values ...float64) Series {
	s := Series{Name: name, Bound: b}
	for i, v := range values {
		s.Points = append(s.Points, Point{At: time.Duration(i) * 10 * time.Second, Value: v})
	}
	return s
}

func ramp(n int, from, step float64) []float64 {
	out := make([]float64, n)
	for i := range out {
		out[i] = from + float64(i)*step
	}
	return out
}

// TestCheckFlatNoisyAndGrowing: the growth check passes a flat series with
// noise and outliers (a sample during a fault), fails a steady leak and a
// step, and judges only after the warm-up.
func TestCheckFlatNoisyAndGrowing(t *testing.T) {
	b := Bound{Ratio: 1.2, Slack: 10}
	noisy := make([]float64, 60)
	for i := range noisy {
		noisy[i] = 100 + float64(i%5)*3
	}
	noisy[50] = 900 // one outlier in the last third
	if v := Check(series("noisy", b, noisy...), 0); v.Grew || v.Insufficient {
		t.Errorf("flat with noise and an outlier: %s", v)
	}
	if v := Check(series("leak", b, ramp(60, 100, 2)...), 0); !v.Grew {
		t.Errorf("a steady leak (100 -> 218): %s", v)
	}
	step := append(ramp(30, 100, 0), ramp(30, 160, 0)...)
	if v := Check(series("step", b, step...), 0); !v.Grew {
		t.Errorf("a step of 60 %%: %s", v)
	}
	// A start-up ramp inside the warm-up is not judged.
	warm := append(ramp(30, 10, 3), ramp(60, 100, 0)...)
	if v := Check(series("warm", b, warm...), 0); !v.Grew {
		t.Errorf("without warm-up the start-up ramp counts: %s", v)
	}
	if v := Check(series("warm", b, warm...), 300*time.Second); v.Grew || v.Insufficient {
		t.Errorf("after a 5 min warm-up the series is flat: %s", v)
	}
	// The slack lets a small count move: 6 -> 12 connections is within
	// 6*1.2+6.
	if v := Check(series("conns", Bound{Ratio: 1.2, Slack: 6}, append(ramp(30, 6, 0), ramp(30, 12, 0)...)...), 0); v.Grew {
		t.Errorf("within the slack: %s", v)
	}
}

func TestCheckSkipsUnreadableSamplesAndNeedsEnough(t *testing.T) {
	b := Bound{Ratio: 1.2}
	vals := ramp(30, 100, 0)
	for i := 0; i < len(vals); i += 3 {
		vals[i] = math.NaN()
	}
	if v := Check(series("gaps", b, vals...), 0); v.Grew || v.Insufficient || v.Samples != 20 {
		t.Errorf("NaN samples are left out: %+v", v)
	}
	if v := Check(series("short", b, ramp(8, 100, 0)...), 0); !v.Insufficient {
		t.Errorf("8 samples cannot be judged: %+v", v)
	}
}

// TestSVGIsWellFormed: the plot parses as XML, has the line with one point
// per readable sample, the warm-up and the limit.
func TestSVGIsWellFormed(t *testing.T) {
	vals := ramp(40, 100<<20, 1<<16)
	vals[7] = math.NaN()
	s := series("idemgate_rss", Bound{Ratio: 1.2, Slack: 8 << 20}, vals...)
	s.Unit = "bytes"
	v := Check(s, 60*time.Second)
	svg := SVG(s, 60*time.Second, v)
	dec := xml.NewDecoder(strings.NewReader(svg))
	var paths []string
	for {
		tok, err := dec.Token()
		if err != nil {
			if err.Error() != "EOF" {
				t.Fatalf("not well-formed XML: %v\n%s", err, svg)
			}
			break
		}
		if se, ok := tok.(xml.StartElement); ok && se.Name.Local == "path" {
			for _, a := range se.Attr {
				if a.Name.Local == "d" {
					paths = append(paths, a.Value)
				}
			}
		}
	}
	line := paths[len(paths)-1]
	if got := strings.Count(line, "L") + strings.Count(line, "M"); got != 39 {
		t.Errorf("the line has %d points, want 39 (40 samples, one unreadable)", got)
	}
	if strings.Count(line, "M") != 2 {
		t.Errorf("the line is not broken at the unreadable sample: %s", line)
	}
	for _, want := range []string{"warm-up", "limit ", "MiB", "idemgate_rss"} {
		if !strings.Contains(svg, want) {
			t.Errorf("the plot has no %q", want)
		}
	}
}

func TestReportListsEverySeries(t *testing.T) {
	ss := []Series{series("a", Bound{Ratio: 1.2, Slack: 1}, ramp(30, 10, 0)...), series("b", Bound{Ratio: 1.2}, ramp(30, 10, 5)...)}
	vs := []Verdict{Check(ss[0], 0), Check(ss[1], 0)}
	r := Report(Run{Duration: 20 * time.Minute, Warmup: 5 * time.Minute, Every: 5 * time.Second, Seed: 1, Pods: 3, Agents: 6,
		Faults: map[string]int{"postgres_cut": 3}, Started: time.Unix(0, 0)}, ss, vs)
	for _, want := range []string{"| a |", "| b |", "flat", "**grew**", "![a](a.svg)", "![b](b.svg)", "postgres_cut ×3", "DURATION=20m0s"} {
		if !strings.Contains(r, want) {
			t.Errorf("the report has no %q:\n%s", want, r)
		}
	}
}

func TestStatusKBAndInfoField(t *testing.T) {
	v, err := statusKB([]byte("Name:\tidemgate\nVmRSS:\t  12345 kB\nThreads: 9\n"), "VmRSS")
	if err != nil || v != 12345*1024 {
		t.Errorf("statusKB = %v, %v", v, err)
	}
	if _, err := statusKB([]byte("VmRSS: 12 MB\n"), "VmRSS"); err == nil {
		t.Error("a unit other than kB must fail")
	}
	f, err := infoField("# Memory\r\nused_memory:1048576\r\nused_memory_human:1.00M\r\n", "used_memory")
	if err != nil || f != 1048576 {
		t.Errorf("infoField = %v, %v", f, err)
	}
	if _, err := infoField("# Memory\r\n", "used_memory"); err == nil {
		t.Error("a missing field must fail")
	}
}
