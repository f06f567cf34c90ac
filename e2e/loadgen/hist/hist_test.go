package hist

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// exactQuantile is the nearest-rank quantile of sorted samples, the
// definition Quantile approximates.
func exactQuantile(sorted []time.Duration, q float64) time.Duration {
	rank := int(math.Ceil(q * float64(len(sorted))))
	if rank < 1 {
		rank = 1
	}
	return sorted[rank-1]
}

func TestBucketsAreContiguousAndBoundValues(t *testing.T) {
	// Every bucket's range starts right after the previous one's, and every
	// value maps to a bucket whose range contains it.
	prevHigh := int64(-1)
	for i := 0; i < numBuckets; i++ {
		hi := highest(i)
		require.Greater(t, hi, prevHigh, "bucket %d", i)
		require.Equal(t, i, bucket(prevHigh+1), "first value of bucket %d", i)
		require.Equal(t, i, bucket(hi), "last value of bucket %d", i)
		// Below 2*subCount every bucket holds one value (exact); above, the
		// relative width stays within the advertised precision.
		lo := prevHigh + 1
		if lo < 2*subCount {
			require.Equal(t, lo, hi, "bucket %d is exact", i)
		} else {
			require.LessOrEqual(t, float64(hi-lo+1)/float64(lo), 1.0/subCount, "bucket %d width", i)
		}
		prevHigh = hi
	}
	require.Equal(t, numBuckets-1, bucket(math.MaxInt64), "values beyond the range land in the top bucket")
}

func TestQuantilesMatchSortedSamples(t *testing.T) {
	for _, tc := range []struct {
		name string
		gen  func(r *rand.Rand) time.Duration
		n    int
	}{
		{"uniform 50us-5ms", func(r *rand.Rand) time.Duration {
			return 50*time.Microsecond + time.Duration(r.Int64N(int64(5*time.Millisecond)))
		}, 20000},
		{"exponential around 300us", func(r *rand.Rand) time.Duration {
			return time.Duration(r.ExpFloat64() * float64(300*time.Microsecond))
		}, 50000},
		{"bimodal with a slow tail", func(r *rand.Rand) time.Duration {
			if r.IntN(100) == 0 {
				return 200*time.Millisecond + time.Duration(r.Int64N(int64(time.Second)))
			}
			return 100*time.Microsecond + time.Duration(r.Int64N(int64(50*time.Microsecond)))
		}, 30000},
		{"tiny exact values", func(r *rand.Rand) time.Duration { return time.Duration(r.IntN(200)) }, 1000},
		{"single sample", func(*rand.Rand) time.Duration { return 1234567 * time.Nanosecond }, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := rand.New(rand.NewPCG(1, 2))
			h := New()
			samples := make([]time.Duration, tc.n)
			for i := range samples {
				samples[i] = tc.gen(r)
				h.Record(samples[i])
			}
			slices.Sort(samples)
			require.Equal(t, uint64(tc.n), h.Count())
			require.Equal(t, samples[len(samples)-1], h.Max())
			require.Equal(t, samples[0], h.Min())
			for _, q := range []float64{0, 0.5, 0.9, 0.99, 0.999, 1} {
				want := exactQuantile(samples, q)
				got := h.Quantile(q)
				require.GreaterOrEqual(t, got, want, "q=%v never below the true sample", q)
				require.LessOrEqual(t, float64(got-want), float64(want)/subCount+1, "q=%v within precision (got %v want %v)", q, got, want)
				require.LessOrEqual(t, got, h.Max(), "q=%v never above the maximum", q)
			}
			var sum float64
			for _, s := range samples {
				sum += float64(s)
			}
			require.InDelta(t, sum/float64(tc.n), float64(h.Mean()), 1)
		})
	}
}

func TestMergeEqualsRecordingEverything(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	all, a, b := New(), New(), New()
	for i := 0; i < 10000; i++ {
		d := time.Duration(r.Int64N(int64(20 * time.Millisecond)))
		all.Record(d)
		if i%3 == 0 {
			a.Record(d)
		} else {
			b.Record(d)
		}
	}
	a.Merge(b)
	a.Merge(New()) // an empty histogram changes nothing, min included
	require.Equal(t, all.Count(), a.Count())
	require.Equal(t, all.Min(), a.Min())
	require.Equal(t, all.Max(), a.Max())
	require.Equal(t, all.counts, a.counts)
	for _, q := range []float64{0.5, 0.9, 0.99} {
		require.Equal(t, all.Quantile(q), a.Quantile(q))
	}
}

func TestEmptyAndNegative(t *testing.T) {
	h := New()
	require.Zero(t, h.Quantile(0.5))
	require.Zero(t, h.Max())
	require.Zero(t, h.Min())
	require.Zero(t, h.Mean())
	h.Record(-time.Second)
	require.Equal(t, uint64(1), h.Count())
	require.Zero(t, h.Quantile(0.99))
}

func TestRecordDoesNotAllocate(t *testing.T) {
	h := New()
	allocs := testing.AllocsPerRun(1000, func() { h.Record(123 * time.Microsecond) })
	require.Zero(t, allocs)
}
