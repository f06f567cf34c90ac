package tiered

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

type manualClock struct{ t time.Time }

func (c *manualClock) now() time.Time { return c.t }

func TestBreaker(t *testing.T) {
	clock := &manualClock{t: time.Unix(1000, 0)}
	var changes []string
	b := newBreaker(3, time.Second, clock.now, func(from, to string) { changes = append(changes, from+">"+to) })

	ok, c := b.allow()
	require.True(t, ok)
	require.Equal(t, ordinaryCall, c)

	// Fast failures open it only at the threshold, and a success resets the count.
	b.failure(ordinaryCall)
	b.failure(ordinaryCall)
	b.success(ordinaryCall)
	b.failure(ordinaryCall)
	b.failure(ordinaryCall)
	require.Equal(t, BreakerClosed, b.current())
	b.failure(ordinaryCall)
	require.Equal(t, BreakerOpen, b.current())

	// Open: nobody passes until the cool-down is over.
	ok, _ = b.allow()
	require.False(t, ok)
	clock.t = clock.t.Add(999 * time.Millisecond)
	ok, _ = b.allow()
	require.False(t, ok)

	// After it, exactly one probe passes.
	clock.t = clock.t.Add(time.Millisecond)
	ok, c = b.allow()
	require.True(t, ok)
	require.Equal(t, probeCall, c)
	require.Equal(t, BreakerHalfOpen, b.current())
	ok, _ = b.allow()
	require.False(t, ok, "only one probe at a time")

	// A failed probe opens it for another cool-down.
	b.failure(probeCall)
	require.Equal(t, BreakerOpen, b.current())
	ok, _ = b.allow()
	require.False(t, ok)

	// An abandoned probe (caller's deadline) lets the next call probe.
	clock.t = clock.t.Add(time.Second)
	ok, c = b.allow()
	require.True(t, ok)
	require.Equal(t, probeCall, c)
	b.abandon(probeCall)
	ok, c = b.allow()
	require.True(t, ok)
	require.Equal(t, probeCall, c)

	// A successful probe closes it.
	b.success(probeCall)
	require.Equal(t, BreakerClosed, b.current())
	ok, c = b.allow()
	require.True(t, ok)
	require.Equal(t, ordinaryCall, c)

	// One timeout opens it at once.
	b.timeout(ordinaryCall)
	require.Equal(t, BreakerOpen, b.current())

	require.Equal(t, []string{
		"closed>open", "open>half_open", "half_open>open", "open>half_open", "half_open>closed", "closed>open",
	}, changes)
}
