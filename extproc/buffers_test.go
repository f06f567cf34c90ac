package extproc

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestBufferPoolKeepsOnlyModestBuffers(t *testing.T) {
	var bp bufferPool
	b := bp.get()
	require.Zero(t, len(*b))
	*b = append(*b, "hello"...)
	bp.put(b)
	again := bp.get()
	require.Zero(t, len(*again), "a pooled buffer comes back empty")

	big := make([]byte, 0, maxPooledBody+1)
	bp.put(&big) // dropped, not pooled
	for i := 0; i < 10; i++ {
		got := bp.get()
		require.LessOrEqual(t, cap(*got), maxPooledBody)
	}
}

// Replies built in pooled buffers stay intact for the client even when the
// next request reuses the memory (gRPC serialises a reply during Send).
func TestRepliesSurviveBufferReuse(t *testing.T) {
	e := newEnv(t, nil, nil)
	d := e.startGRPC(t)
	var bodies []string
	for i := 0; i < 20; i++ {
		res := do(t, d, post("/v1/transfers/preview", "alice", transferBody(`1`, "EUR", "DE89", "")), previewOK)
		bodies = append(bodies, string(res.body))
		e.claimsOf(t, res.json(t)["fingerprint"].(string), "alice", "payments.transfer")
	}
	for i := range bodies {
		for j := i + 1; j < len(bodies); j++ {
			require.NotEqual(t, bodies[i], bodies[j], "every preview carries its own fingerprint")
		}
	}
}
