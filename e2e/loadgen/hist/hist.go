// Package hist is a fixed-size, log-linear latency histogram in the style of
// HdrHistogram: values up to 2^(subBits+1) ns are counted exactly, larger
// ones in buckets whose width is at most 1/2^subBits of their value, so every
// reported percentile is within 0.8 % of the true sample (and never above the
// recorded maximum). Recording is allocation-free and O(1); a Histogram is
// owned by one goroutine and histograms are merged after a run.
package hist

import (
	"math"
	"math/bits"
	"time"
)

const (
	// subBits sets the precision: 2^subBits sub-buckets per power of two.
	subBits  = 7
	subCount = 1 << subBits
	// maxShift bounds the range: values up to 2^(maxShift+subBits+1) ns
	// (about 9 minutes) are bucketed; larger ones land in the top bucket but
	// still set Max exactly.
	maxShift   = 31
	numBuckets = (maxShift + 2) * subCount
)

// Histogram counts durations in nanoseconds. The zero value is not usable;
// use New.
type Histogram struct {
	counts []uint64
	n      uint64
	sum    float64
	min    int64
	max    int64
}

// New returns an empty histogram.
func New() *Histogram {
	return &Histogram{counts: make([]uint64, numBuckets), min: math.MaxInt64}
}

// bucket returns the index of the bucket holding v (v >= 0).
func bucket(v int64) int {
	u := uint64(v)
	if u < 2*subCount {
		return int(u)
	}
	shift := bits.Len64(u) - (subBits + 1)
	if shift > maxShift {
		return numBuckets - 1
	}
	// u>>shift is in [subCount, 2*subCount): the sub-bucket within its
	// power of two, offset by the buckets of all smaller powers.
	return shift*subCount + int(u>>uint(shift))
}

// highest returns the largest value that falls into bucket i.
func highest(i int) int64 {
	if i < 2*subCount {
		return int64(i)
	}
	shift := i/subCount - 1
	m := int64(i - shift*subCount)
	return (m+1)<<uint(shift) - 1
}

// Record counts one duration; negative durations count as zero.
func (h *Histogram) Record(d time.Duration) {
	v := int64(d)
	if v < 0 {
		v = 0
	}
	h.counts[bucket(v)]++
	h.n++
	h.sum += float64(v)
	if v < h.min {
		h.min = v
	}
	if v > h.max {
		h.max = v
	}
}

// Merge adds every count of o to h.
func (h *Histogram) Merge(o *Histogram) {
	if o.n == 0 {
		return
	}
	for i, c := range o.counts {
		h.counts[i] += c
	}
	h.n += o.n
	h.sum += o.sum
	h.min = min(h.min, o.min)
	h.max = max(h.max, o.max)
}

// Count is the number of recorded values.
func (h *Histogram) Count() uint64 { return h.n }

// Max is the largest recorded value (exact); 0 when empty.
func (h *Histogram) Max() time.Duration { return time.Duration(h.max) }

// Min is the smallest recorded value (exact); 0 when empty.
func (h *Histogram) Min() time.Duration {
	if h.n == 0 {
		return 0
	}
	return time.Duration(h.min)
}

// Mean is the arithmetic mean (exact up to float rounding); 0 when empty.
func (h *Histogram) Mean() time.Duration {
	if h.n == 0 {
		return 0
	}
	return time.Duration(h.sum / float64(h.n))
}

// Quantile returns the value at quantile q in [0, 1]: the smallest value v
// such that at least ceil(q*n) recorded values are <= v (nearest rank), as
// the highest value of v's bucket, clamped to [Min, Max]. It is 0 when the
// histogram is empty.
func (h *Histogram) Quantile(q float64) time.Duration {
	if h.n == 0 {
		return 0
	}
	q = min(max(q, 0), 1)
	rank := uint64(math.Ceil(q * float64(h.n)))
	if rank == 0 {
		rank = 1
	}
	var seen uint64
	for i, c := range h.counts {
		seen += c
		if seen >= rank {
			v := highest(i)
			return time.Duration(min(max(v, h.min), h.max))
		}
	}
	return time.Duration(h.max)
}
