package soak

import (
	"fmt"
	"math"
	"strings"
	"time"
)

// SVG draws s as a line over time: axes with their ranges, the warm-up
// shaded, and the bound's limit as a dashed line when v judged the series.
// Hand-written SVG, so the report needs no plotting library.
func SVG(s Series, warmup time.Duration, v Verdict) string {
	const w, h, left, right, top, bottom = 640.0, 240.0, 70.0, 10.0, 24.0, 30.0
	lo, hi := math.Inf(1), math.Inf(-1)
	var end time.Duration
	for _, p := range s.Points {
		if math.IsNaN(p.Value) {
			continue
		}
		lo, hi = math.Min(lo, p.Value), math.Max(hi, p.Value)
		end = max(end, p.At)
	}
	if !v.Insufficient {
		hi = math.Max(hi, v.Limit)
	}
	if math.IsInf(lo, 1) { // no readable sample
		lo, hi = 0, 1
	}
	lo = math.Min(lo, 0) // from zero: growth reads as height
	if hi <= lo {
		hi = lo + 1
	}
	if end <= 0 {
		end = time.Second
	}
	x := func(at time.Duration) float64 { return left + (w-left-right)*float64(at)/float64(end) }
	y := func(val float64) float64 { return top + (h-top-bottom)*(1-(val-lo)/(hi-lo)) }

	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" viewBox="0 0 %.0f %.0f" font-family="sans-serif" font-size="11">`+"\n", w, h, w, h)
	fmt.Fprintf(&b, `<rect width="%.0f" height="%.0f" fill="white"/>`+"\n", w, h)
	fmt.Fprintf(&b, `<text x="%.0f" y="14" font-size="13">%s</text>`+"\n", left, escape(s.Name))
	if warmup > 0 && warmup < end {
		fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="#eee"/>`+"\n", x(0), top, x(warmup)-x(0), h-top-bottom)
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" fill="#888">warm-up</text>`+"\n", x(0)+4, top+12)
	}
	fmt.Fprintf(&b, `<path d="M%.1f %.1f V%.1f H%.1f" fill="none" stroke="black"/>`+"\n", left, top, h-bottom, w-right)
	fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="end">%s</text>`+"\n", left-4, y(hi)+4, formatValue(hi, s.Unit))
	fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="end">%s</text>`+"\n", left-4, y(lo), formatValue(lo, s.Unit))
	fmt.Fprintf(&b, `<text x="%.1f" y="%.1f">0</text>`+"\n", left, h-bottom+14)
	fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="end">%s</text>`+"\n", w-right, h-bottom+14, end.Round(time.Second))
	if !v.Insufficient {
		fmt.Fprintf(&b, `<path d="M%.1f %.1f H%.1f" stroke="#c00" stroke-dasharray="4 3"/>`+"\n", x(warmup), y(v.Limit), w-right)
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" fill="#c00" text-anchor="end">limit %s</text>`+"\n", w-right, y(v.Limit)-3, formatValue(v.Limit, s.Unit))
	}
	// The line, broken where a sample is missing.
	var d strings.Builder
	pen := false
	for _, p := range s.Points {
		if math.IsNaN(p.Value) {
			pen = false
			continue
		}
		cmd := "L"
		if !pen {
			cmd = "M"
		}
		fmt.Fprintf(&d, "%s%.1f %.1f ", cmd, x(p.At), y(p.Value))
		pen = true
	}
	if d.Len() > 0 {
		fmt.Fprintf(&b, `<path d="%s" fill="none" stroke="#1f60c4" stroke-width="1.5"/>`+"\n", strings.TrimSpace(d.String()))
	}
	b.WriteString("</svg>\n")
	return b.String()
}

func formatValue(v float64, unit string) string {
	if unit == "bytes" {
		return fmt.Sprintf("%.1f MiB", v/(1<<20))
	}
	return fmt.Sprintf("%.0f", v)
}

func escape(s string) string {
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;").Replace(s)
}
