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

	ok, probe := b.allow()
	require.True(t, ok)
	require.False(t, probe)

	// Fast failures open it only at the threshold, and a success resets the count.
	b.failure(false, false)
	b.failure(false, false)
	b.success(false)
	b.failure(false, false)
	b.failure(false, false)
	require.Equal(t, BreakerClosed, b.current())
	b.failure(false, false)
	require.Equal(t, BreakerOpen, b.current())

	// Open: nobody passes until the cool-down is over.
	ok, _ = b.allow()
	require.False(t, ok)
	clock.t = clock.t.Add(999 * time.Millisecond)
	ok, _ = b.allow()
	require.False(t, ok)

	// After it, exactly one probe passes.
	clock.t = clock.t.Add(time.Millisecond)
	ok, probe = b.allow()
	require.True(t, ok)
	require.True(t, probe)
	require.Equal(t, BreakerHalfOpen, b.current())
	ok, _ = b.allow()
	require.False(t, ok, "only one probe at a time")

	// A failed probe opens it for another cool-down.
	b.failure(true, false)
	require.Equal(t, BreakerOpen, b.current())
	ok, _ = b.allow()
	require.False(t, ok)

	// An abandoned probe (caller's deadline) lets the next call probe.
	clock.t = clock.t.Add(time.Second)
	ok, probe = b.allow()
	require.True(t, ok)
	require.True(t, probe)
	b.abandon(true)
	ok, probe = b.allow()
	require.True(t, ok)
	require.True(t, probe)

	// A successful probe closes it.
	b.success(true)
	require.Equal(t, BreakerClosed, b.current())
	ok, probe = b.allow()
	require.True(t, ok)
	require.False(t, probe)

	// One timeout opens it at once.
	b.failure(false, true)
	require.Equal(t, BreakerOpen, b.current())

	require.Equal(t, []string{
		"closed>open", "open>half_open", "half_open>open", "open>half_open", "half_open>closed", "closed>open",
	}, changes)
}
