package e2e

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/e2e/internal/stack"
	"github.com/idemgate/idemgate/e2e/payments"
)

// The failures that matter most (doc.go) over MCP, with the official Go SDK client, with the
// upstream answering JSON and SSE.

func forEachMCPMode(t *testing.T, run func(t *testing.T, sse bool)) {
	for _, sse := range []bool{false, true} {
		t.Run(map[bool]string{false: "json", true: "sse"}[sse], func(t *testing.T) { run(t, sse) })
	}
}

// mcpPreviewed previews a transfer and returns the confirm arguments with
// the fingerprint, and the nonce.
func mcpPreviewed(t *testing.T, cs *mcp.ClientSession, amount string) (map[string]any, string) {
	t.Helper()
	args := transferArgs(amount)
	pv, err := cs.CallTool(t.Context(), &mcp.CallToolParams{Name: payments.MCPPreviewTool, Arguments: args})
	require.NoError(t, err)
	require.False(t, pv.IsError)
	fp := structured(t, pv)["fingerprint"].(string)
	args["fingerprint"] = fp
	return args, nonceOf(t, fp)
}

// nonceOf reads the nonce out of a fingerprint's payload (the test may: the
// token carries no secret, only its MAC needs the key).
func nonceOf(t *testing.T, fp string) string {
	t.Helper()
	payload, _, ok := strings.Cut(fp, ".")
	require.True(t, ok, fp)
	raw, err := base64.RawURLEncoding.DecodeString(payload)
	require.NoError(t, err)
	var claims struct {
		N string `json:"n"`
	}
	require.NoError(t, json.Unmarshal(raw, &claims))
	require.Len(t, claims.N, 32)
	return claims.N
}

// TestMCPConcurrentConfirmsExecuteOnce (并发): 100 tools/call of one
// fingerprint at once, each its own POST with its own id: one execution;
// every other answer is the replay or in_progress, never a second transfer.
func TestMCPConcurrentConfirmsExecuteOnce(t *testing.T) {
	forEachMCPMode(t, func(t *testing.T, sse bool) {
		s := startStack(t, stack.Options{})
		s.Payments.SetMCPStreaming(sse)
		cs := mcpSession(t, s, "alice", "")
		args, nonce := mcpPreviewed(t, cs, "10.00")

		const n = 100
		results := make([]*mcp.CallToolResult, n)
		errs := make([]error, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				results[i], errs[i] = cs.CallTool(t.Context(), &mcp.CallToolParams{Name: payments.MCPConfirmTool, Arguments: args})
			})
		}
		wg.Wait()
		executed, replayed, waiting := 0, 0, 0
		for i := range n {
			require.NoError(t, errs[i])
			r := results[i]
			switch sc := structured(t, r); {
			case !r.IsError && sc["transfer_id"] != nil:
				executed++
			case !r.IsError && sc["status"] == "already_completed":
				replayed++
			case r.IsError && sc["status"] == "in_progress":
				waiting++
			default:
				t.Fatalf("unexpected answer %d: %+v", i, sc)
			}
		}
		require.Equal(t, 1, executed)
		require.Equal(t, n, executed+replayed+waiting)
		require.Equal(t, 1, s.Payments.Executions())
		require.Equal(t, 1, s.Payments.ExecutionsForKey(nonce))
		requireRow(t, s, nonce, "DONE")
	})
}

// TestMCPReplayAfterRedisFlushall (缓存清空): after FLUSHALL the retry is
// answered from PostgreSQL, nothing executes again.
func TestMCPReplayAfterRedisFlushall(t *testing.T) {
	forEachMCPMode(t, func(t *testing.T, sse bool) {
		s := startStack(t, stack.Options{})
		s.Payments.SetMCPStreaming(sse)
		cs := mcpSession(t, s, "alice", "")
		args, nonce := mcpPreviewed(t, cs, "75.10")
		first, err := cs.CallTool(t.Context(), &mcp.CallToolParams{Name: payments.MCPConfirmTool, Arguments: args})
		require.NoError(t, err)
		require.False(t, first.IsError)

		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		defer cancel()
		require.NoError(t, s.RedisClient().FlushAll(ctx).Err())

		again, err := cs.CallTool(t.Context(), &mcp.CallToolParams{Name: payments.MCPConfirmTool, Arguments: args})
		require.NoError(t, err)
		env := structured(t, again)
		require.Equal(t, "already_completed", env["status"])
		require.Equal(t, structured(t, first), env["result"])
		require.Equal(t, 1, s.Payments.Executions())
		requireRow(t, s, nonce, "DONE")
	})
}

// TestMCPCrashBetweenExecutionAndRecord (崩溃注入): idemgate is killed -9
// after the upstream executed and before its answer reached idemgate. The
// retry is told to wait while the dead owner's lease runs, then takes over
// and re-sends the same Idempotency-Key; payments answers from its key store
// with the transfer it already made. One execution.
func TestMCPCrashBetweenExecutionAndRecord(t *testing.T) {
	forEachMCPMode(t, func(t *testing.T, sse bool) {
		s := startStack(t, stack.Options{InFlightTTL: crashLease})
		s.Payments.SetMCPStreaming(sse)
		cs := mcpSession(t, s, "alice", "")
		args, nonce := mcpPreviewed(t, cs, "999.99")

		s.Payments.SetFaults(payments.Faults{DelayAfterExecute: crashAnswerDelay, Times: 1})
		done := make(chan error, 1)
		go func() {
			r, err := cs.CallTool(context.WithoutCancel(t.Context()), &mcp.CallToolParams{Name: payments.MCPConfirmTool, Arguments: args})
			if err == nil && !r.IsError {
				t.Errorf("the confirm whose gateway died got a success: %+v", r)
			}
			done <- err
		}()
		require.Eventually(t, func() bool { return s.Payments.Executions() == 1 }, 30*time.Second, 5*time.Millisecond)
		s.Idemgate.Kill()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Fatal("the confirm got no answer after idemgate died")
		}
		requireRow(t, s, nonce, "IN_FLIGHT")
		require.NoError(t, s.Idemgate.Start())

		// A fresh session: the old one's HTTP connection saw the failure.
		cs = mcpSession(t, s, "alice", "")
		var r *mcp.CallToolResult
		require.Eventually(t, func() bool {
			var err error
			r, err = cs.CallTool(t.Context(), &mcp.CallToolParams{Name: payments.MCPConfirmTool, Arguments: args})
			return err == nil && !(r.IsError && structured(t, r)["status"] == "in_progress")
		}, 4*crashLease, 200*time.Millisecond, "the retry never got past in_progress")
		require.False(t, r.IsError, "%+v", structured(t, r))
		rec, ok := s.Payments.RecordForKey(nonce)
		require.True(t, ok)
		require.Equal(t, rec.TransferID, structured(t, r)["transfer_id"], "the takeover got the first transfer back")
		require.Equal(t, 1, s.Payments.Executions())
		require.GreaterOrEqual(t, s.Payments.Stats().Replays, 1, "answered from the key store")
		requireRow(t, s, nonce, "DONE")
	})
}

// TestMCPStreamClosedBeforeTheResult: the upstream executes and its answer
// ends without the JSON-RPC result (an SSE stream closed mid-call; under
// 2026-07-28 a closed stream cancels the request, so the server may have
// half-acted). idemgate settles that as ambiguous at once — the status tool
// says the attempt was interrupted, without waiting for the lease — and the
// retry re-sends the same key: payments answers with the transfer it made.
func TestMCPStreamClosedBeforeTheResult(t *testing.T) {
	forEachMCPMode(t, func(t *testing.T, sse bool) {
		s := startStack(t, stack.Options{})
		s.Payments.SetMCPStreaming(sse)
		cs := mcpSession(t, s, "alice", "")
		args, nonce := mcpPreviewed(t, cs, "12.34")

		s.Payments.SetFaults(payments.Faults{ResetAfterExecute: true, Times: 1})
		ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
		r, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: payments.MCPConfirmTool, Arguments: args})
		cancel()
		require.True(t, err != nil || r.IsError, "the cut call must not look like a success: %+v", r)
		require.Equal(t, 1, s.Payments.Executions())

		cs = mcpSession(t, s, "alice", "")
		st, err := cs.CallTool(t.Context(), &mcp.CallToolParams{Name: "transfer_status", Arguments: map[string]any{"fingerprint": args["fingerprint"]}})
		require.NoError(t, err)
		require.Equal(t, "not_started", structured(t, st)["status"], "released at once, not left in progress for the lease (2m)")

		again, err := cs.CallTool(t.Context(), &mcp.CallToolParams{Name: payments.MCPConfirmTool, Arguments: args})
		require.NoError(t, err)
		require.False(t, again.IsError, "%+v", structured(t, again))
		rec, ok := s.Payments.RecordForKey(nonce)
		require.True(t, ok)
		require.Equal(t, rec.TransferID, structured(t, again)["transfer_id"])
		require.Equal(t, 1, s.Payments.Executions())
		requireRow(t, s, nonce, "DONE")
	})
}

// TestMCPStaleOwnersLateAnswerDoesNotOverwrite (乱序): the first confirm
// executes but answers late; its lease ends, the retry takes over (same
// key) and is answered from payments' key store: DONE. The first call's
// late answer is then refused as NOT_OWNER and overwrites nothing; its
// client still gets what the upstream answered it.
func TestMCPStaleOwnersLateAnswerDoesNotOverwrite(t *testing.T) {
	forEachMCPMode(t, func(t *testing.T, sse bool) {
		const lease = 2 * time.Second
		s := startStack(t, stack.Options{InFlightTTL: lease})
		s.Payments.SetMCPStreaming(sse)
		cs := mcpSession(t, s, "alice", "")
		args, nonce := mcpPreviewed(t, cs, "30.00")

		s.Payments.SetFaults(payments.Faults{DelayAfterExecute: 4 * lease, Times: 1})
		type answer struct {
			r   *mcp.CallToolResult
			err error
		}
		done := make(chan answer, 1)
		go func() {
			r, err := cs.CallTool(context.WithoutCancel(t.Context()), &mcp.CallToolParams{Name: payments.MCPConfirmTool, Arguments: args})
			done <- answer{r, err}
		}()
		require.Eventually(t, func() bool { return s.Payments.Executions() == 1 }, 30*time.Second, 5*time.Millisecond)
		stale := requireRow(t, s, nonce, "IN_FLIGHT")

		// After the lease, the retry takes over and gets the transfer back.
		var second *mcp.CallToolResult
		require.Eventually(t, func() bool {
			r, err := cs.CallTool(t.Context(), &mcp.CallToolParams{Name: payments.MCPConfirmTool, Arguments: args})
			second = r
			return err == nil && !r.IsError
		}, 5*lease, 100*time.Millisecond, "the retry never took over")
		transferID := structured(t, second)["transfer_id"]
		require.NotEmpty(t, transferID)
		fresh := requireRow(t, s, nonce, "DONE")
		require.Greater(t, fresh.Fence, stale.Fence)

		var first answer
		select {
		case first = <-done:
		case <-time.After(30 * time.Second):
			t.Fatal("the first confirm got no answer")
		}
		require.NoError(t, first.err)
		require.Equal(t, transferID, structured(t, first.r)["transfer_id"], "the stale owner's client gets its upstream answer")
		require.Eventually(t, func() bool {
			return metric(t, s, `idemgate_not_owner_total{operation="transfer_mcp"}`) == 1
		}, 10*time.Second, 20*time.Millisecond, "the refused completion is counted")
		kept := requireRow(t, s, nonce, "DONE")
		require.Equal(t, fresh.Fence, kept.Fence)
		require.Equal(t, fresh.Owner, kept.Owner)
		require.Equal(t, 1, s.Payments.Executions())
	})
}
