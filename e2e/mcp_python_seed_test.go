package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/e2e/demoauth"
	"github.com/idemgate/idemgate/e2e/internal/stack"
	"github.com/idemgate/idemgate/e2e/payments"
)

// The failures that matter most (doc.go) over MCP again, with the official Python SDK client
// (testdata/mcp_python_agent.py, driven one command at a time so that the
// faults go in between its calls), with the upstream answering JSON and SSE.

// pyAgent is a running mcp_python_agent.py.
type pyAgent struct {
	t      *testing.T
	stdin  io.WriteCloser
	stderr *stack.LogBuffer

	mu      sync.Mutex
	nextID  int
	waiting map[int]chan pyAnswer
	exited  bool
}

// pyAnswer is one answer line: a call's result or the exception the SDK
// raised; Results for the parallel op.
type pyAnswer struct {
	ID      int        `json:"id"`
	Result  *pySeen    `json:"result"`
	Error   *pyError   `json:"error"`
	Results []pyAnswer `json:"results"`
	// Tools are what connect listed: each tool's input schema by name.
	Tools map[string]map[string]any `json:"tools"`
}

type pyError struct {
	Type    string `json:"type"`
	Message string `json:"message"`
	Code    *int   `json:"code"`
}

func (a pyAnswer) String() string {
	raw, _ := json.Marshal(a)
	return string(raw)
}

// startPyAgent starts the Python agent for user against the stack's /mcp,
// speaking the SDK's latest protocol version (mode auto) unless a connect
// says otherwise. Its stderr is printed when the test fails.
func startPyAgent(t *testing.T, s *stack.Stack, user string) *pyAgent {
	t.Helper()
	py := mcpPython(t)
	token, err := demoauth.Mint(user, time.Hour, time.Now())
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.WithoutCancel(t.Context()))
	cmd := exec.CommandContext(ctx, py, filepath.Join("testdata", "mcp_python_agent.py"), s.URL()+payments.MCPPath, token, "auto")
	a := &pyAgent{t: t, stderr: &stack.LogBuffer{}, waiting: map[int]chan pyAnswer{}}
	cmd.Stderr = a.stderr
	cmd.WaitDelay = 5 * time.Second
	a.stdin, err = cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	readerDone := make(chan struct{})
	go a.read(stdout, readerDone)
	t.Cleanup(func() {
		_ = a.stdin.Close() // the agent ends at the end of its stdin
		select {
		case <-readerDone:
		case <-time.After(10 * time.Second):
		}
		cancel()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("python agent stderr:\n%s", a.stderr.String())
		}
	})
	return a
}

func (a *pyAgent) read(stdout io.Reader, done chan<- struct{}) {
	defer close(done)
	sc := bufio.NewScanner(stdout)
	sc.Buffer(make([]byte, 0, 1<<20), 16<<20)
	for sc.Scan() {
		var ans pyAnswer
		if err := json.Unmarshal(sc.Bytes(), &ans); err != nil {
			a.t.Errorf("python agent wrote %q: %v", sc.Text(), err)
			continue
		}
		a.mu.Lock()
		ch := a.waiting[ans.ID]
		delete(a.waiting, ans.ID)
		a.mu.Unlock()
		if ch != nil {
			ch <- ans
		}
	}
	a.mu.Lock()
	a.exited = true
	for id, ch := range a.waiting {
		close(ch)
		delete(a.waiting, id)
	}
	a.mu.Unlock()
}

// send writes one command; its answer arrives on the channel, which is
// closed without one if the agent exits first.
func (a *pyAgent) send(cmd map[string]any) <-chan pyAnswer {
	a.t.Helper()
	ch := make(chan pyAnswer, 1)
	a.mu.Lock()
	a.nextID++
	id := a.nextID
	if a.exited {
		close(ch)
	} else {
		a.waiting[id] = ch
	}
	a.mu.Unlock()
	cmd["id"] = id
	line, err := json.Marshal(cmd)
	require.NoError(a.t, err)
	_, err = a.stdin.Write(append(line, '\n'))
	require.NoError(a.t, err, "python agent stdin:\n%s", a.stderr.String())
	return ch
}

// wait reads an answer of send, failing the test after within.
func (a *pyAgent) wait(ch <-chan pyAnswer, within time.Duration) pyAnswer {
	a.t.Helper()
	select {
	case ans, ok := <-ch:
		require.True(a.t, ok, "the python agent exited:\n%s", a.stderr.String())
		return ans
	case <-time.After(within):
		a.t.Fatalf("no answer from the python agent within %s:\n%s", within, a.stderr.String())
		return pyAnswer{}
	}
}

func (a *pyAgent) do(cmd map[string]any) pyAnswer {
	a.t.Helper()
	return a.wait(a.send(cmd), 2*time.Minute)
}

// connect opens the agent's session name (tools/list included).
func (a *pyAgent) connect(name string) {
	a.t.Helper()
	a.connectMode(name, "auto")
}

// connectMode is connect in the SDK's mode (auto, or legacy: initialize and
// a session id); it returns the tools the SDK listed.
func (a *pyAgent) connectMode(name, mode string) map[string]map[string]any {
	a.t.Helper()
	ans := a.do(map[string]any{"op": "connect", "session": name, "mode": mode})
	require.Nil(a.t, ans.Error, "the python SDK could not connect: %s", ans)
	return ans.Tools
}

// callAsync starts a tools/call on session name.
func (a *pyAgent) callAsync(name, tool string, args map[string]any) <-chan pyAnswer {
	a.t.Helper()
	return a.send(map[string]any{"op": "call", "session": name, "tool": tool, "args": args})
}

func (a *pyAgent) call(name, tool string, args map[string]any) pyAnswer {
	a.t.Helper()
	return a.wait(a.callAsync(name, tool, args), 2*time.Minute)
}

// result is what the SDK returned, failing the test if it raised.
func (a *pyAgent) result(ans pyAnswer) *pySeen {
	a.t.Helper()
	require.Nil(a.t, ans.Error, "the python SDK raised: %s", ans)
	require.NotNil(a.t, ans.Result, "%s", ans)
	return ans.Result
}

// pyPreviewed previews a transfer on session name and returns the confirm
// arguments with the fingerprint, and the nonce.
func pyPreviewed(t *testing.T, a *pyAgent, name, amount string) (map[string]any, string) {
	t.Helper()
	args := transferArgs(amount)
	pv := a.result(a.call(name, payments.MCPPreviewTool, args))
	require.False(t, pv.IsError, "%+v", pv)
	fp, _ := pv.Structured["fingerprint"].(string)
	require.NotEmpty(t, fp)
	args["fingerprint"] = fp
	return args, nonceOf(t, fp)
}

// failedCall is true when the SDK raised or returned an isError result.
func failedCall(ans pyAnswer) bool {
	return ans.Error != nil || ans.Result == nil || ans.Result.IsError
}

// TestMCPPythonConcurrentConfirmsExecuteOnce (并发): 100 call_tool of one
// fingerprint at once from the Python SDK (asyncio.gather on one session,
// each its own POST and id): one execution; every other answer is the replay
// or in_progress.
func TestMCPPythonConcurrentConfirmsExecuteOnce(t *testing.T) {
	forEachMCPMode(t, func(t *testing.T, sse bool) {
		s := startStack(t, stack.Options{})
		s.Payments.SetMCPStreaming(sse)
		a := startPyAgent(t, s, "alice")
		a.connect("a")
		args, nonce := pyPreviewed(t, a, "a", "10.00")

		const n = 100
		ans := a.do(map[string]any{"op": "parallel", "session": "a", "n": n, "tool": payments.MCPConfirmTool, "args": args})
		require.Nil(t, ans.Error, "%s", ans)
		require.Len(t, ans.Results, n)
		executed, replayed, waiting := 0, 0, 0
		for i, one := range ans.Results {
			r := a.result(one)
			switch sc := r.Structured; {
			case !r.IsError && sc["transfer_id"] != nil:
				executed++
			case !r.IsError && sc["status"] == "already_completed":
				require.Equal(t, true, r.Meta["io.idemgate/replayed"], "answer %d: %+v", i, r)
				replayed++
			case r.IsError && sc["status"] == "in_progress":
				waiting++
			default:
				t.Fatalf("unexpected answer %d: %+v", i, r)
			}
		}
		t.Logf("%d executed, %d replayed, %d told to wait", executed, replayed, waiting)
		require.Equal(t, 1, executed)
		require.Equal(t, n, executed+replayed+waiting)
		require.Equal(t, 1, s.Payments.Executions())
		require.Equal(t, 1, s.Payments.ExecutionsForKey(nonce))
		requireRow(t, s, nonce, "DONE")
	})
}

// TestMCPPythonReplayAfterRedisFlushall (缓存清空): after FLUSHALL the retry
// is answered from PostgreSQL, nothing executes again.
func TestMCPPythonReplayAfterRedisFlushall(t *testing.T) {
	forEachMCPMode(t, func(t *testing.T, sse bool) {
		s := startStack(t, stack.Options{})
		s.Payments.SetMCPStreaming(sse)
		a := startPyAgent(t, s, "alice")
		a.connect("a")
		args, nonce := pyPreviewed(t, a, "a", "75.10")
		first := a.result(a.call("a", payments.MCPConfirmTool, args))
		require.False(t, first.IsError, "%+v", first)

		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		defer cancel()
		require.NoError(t, s.RedisClient().FlushAll(ctx).Err())

		again := a.result(a.call("a", payments.MCPConfirmTool, args))
		require.False(t, again.IsError, "%+v", again)
		require.Equal(t, "already_completed", again.Structured["status"])
		require.Equal(t, first.Structured, again.Structured["result"])
		require.Equal(t, first.Structured["transfer_id"], again.Structured["result_ref"])
		require.Equal(t, true, again.Meta["io.idemgate/replayed"])
		require.Equal(t, 1, s.Payments.Executions())
		requireRow(t, s, nonce, "DONE")
	})
}

// TestMCPPythonCrashBetweenExecutionAndRecord (崩溃注入): idemgate is
// killed -9 after the upstream executed and before its answer reached
// idemgate; the Python SDK's call fails (it raises or gets an isError, it
// does not crash). The retry from a new session is told to wait while the
// dead owner's lease runs, then takes over and re-sends the same key:
// payments answers with the transfer it already made. One execution.
func TestMCPPythonCrashBetweenExecutionAndRecord(t *testing.T) {
	forEachMCPMode(t, func(t *testing.T, sse bool) {
		s := startStack(t, stack.Options{InFlightTTL: crashLease})
		s.Payments.SetMCPStreaming(sse)
		a := startPyAgent(t, s, "alice")
		a.connect("a")
		args, nonce := pyPreviewed(t, a, "a", "999.99")

		s.Payments.SetFaults(payments.Faults{DelayAfterExecute: crashAnswerDelay, Times: 1})
		pending := a.callAsync("a", payments.MCPConfirmTool, args)
		require.Eventually(t, func() bool { return s.Payments.Executions() == 1 }, 30*time.Second, 5*time.Millisecond)
		s.Idemgate.Kill()
		cut := a.wait(pending, 30*time.Second)
		require.True(t, failedCall(cut), "the confirm whose gateway died got a success: %s", cut)
		t.Logf("the python SDK saw the dead gateway as: %s", cut)
		requireRow(t, s, nonce, "IN_FLIGHT")
		require.NoError(t, s.Idemgate.Start())

		// A fresh session, as the Go SDK test does.
		a.connect("b")
		var r *pySeen
		var last pyAnswer
		require.Eventually(t, func() bool {
			last = a.call("b", payments.MCPConfirmTool, args)
			if last.Error != nil || last.Result == nil {
				return false
			}
			r = last.Result
			return !(r.IsError && r.Structured["status"] == "in_progress")
		}, 4*crashLease, 200*time.Millisecond, "the retry never got past in_progress (last %s)", &last)
		require.False(t, r.IsError, "%+v", r)
		rec, ok := s.Payments.RecordForKey(nonce)
		require.True(t, ok)
		require.Equal(t, rec.TransferID, r.Structured["transfer_id"], "the takeover got the first transfer back")
		require.Equal(t, 1, s.Payments.Executions())
		require.GreaterOrEqual(t, s.Payments.Stats().Replays, 1, "answered from the key store")
		requireRow(t, s, nonce, "DONE")
	})
}

// TestMCPPythonStreamClosedBeforeTheResult: the upstream executes and its
// answer ends without the JSON-RPC result; the Python SDK's call fails
// without crashing the agent. idemgate settles that as ambiguous at once
// (the status tool says not_started, not in progress for the lease) and the
// retry re-sends the same key: payments answers with the transfer it made.
func TestMCPPythonStreamClosedBeforeTheResult(t *testing.T) {
	forEachMCPMode(t, func(t *testing.T, sse bool) {
		s := startStack(t, stack.Options{})
		s.Payments.SetMCPStreaming(sse)
		a := startPyAgent(t, s, "alice")
		a.connect("a")
		args, nonce := pyPreviewed(t, a, "a", "12.34")

		s.Payments.SetFaults(payments.Faults{ResetAfterExecute: true, Times: 1})
		cut := a.wait(a.callAsync("a", payments.MCPConfirmTool, args), 30*time.Second)
		require.True(t, failedCall(cut), "the cut call must not look like a success: %s", cut)
		t.Logf("the python SDK saw the cut stream as: %s", cut)
		require.Equal(t, 1, s.Payments.Executions())

		a.connect("b")
		st := a.result(a.call("b", "transfer_status", map[string]any{"fingerprint": args["fingerprint"]}))
		require.Equal(t, "not_started", st.Structured["status"], "released at once, not left in progress for the lease (2m)")

		again := a.result(a.call("b", payments.MCPConfirmTool, args))
		require.False(t, again.IsError, "%+v", again)
		rec, ok := s.Payments.RecordForKey(nonce)
		require.True(t, ok)
		require.Equal(t, rec.TransferID, again.Structured["transfer_id"])
		require.Equal(t, 1, s.Payments.Executions())
		requireRow(t, s, nonce, "DONE")
	})
}

// TestMCPPythonStaleOwnersLateAnswerDoesNotOverwrite (乱序): the first
// confirm executes but answers late; its lease ends, the retry on the same
// session takes over (same key) and is answered from payments' key store:
// DONE. The first call's late answer is refused as NOT_OWNER and overwrites
// nothing; the Python SDK still gets what the upstream answered it.
func TestMCPPythonStaleOwnersLateAnswerDoesNotOverwrite(t *testing.T) {
	forEachMCPMode(t, func(t *testing.T, sse bool) {
		const lease = 2 * time.Second
		s := startStack(t, stack.Options{InFlightTTL: lease})
		s.Payments.SetMCPStreaming(sse)
		a := startPyAgent(t, s, "alice")
		a.connect("a")
		args, nonce := pyPreviewed(t, a, "a", "30.00")

		s.Payments.SetFaults(payments.Faults{DelayAfterExecute: 4 * lease, Times: 1})
		pending := a.callAsync("a", payments.MCPConfirmTool, args)
		require.Eventually(t, func() bool { return s.Payments.Executions() == 1 }, 30*time.Second, 5*time.Millisecond)
		stale := requireRow(t, s, nonce, "IN_FLIGHT")

		// After the lease, the retry takes over and gets the transfer back.
		var second *pySeen
		var last pyAnswer
		require.Eventually(t, func() bool {
			last = a.call("a", payments.MCPConfirmTool, args)
			second = last.Result
			return !failedCall(last)
		}, 5*lease, 100*time.Millisecond, "the retry never took over (last %s)", &last)
		transferID := second.Structured["transfer_id"]
		require.NotEmpty(t, transferID)
		fresh := requireRow(t, s, nonce, "DONE")
		require.Greater(t, fresh.Fence, stale.Fence)

		first := a.result(a.wait(pending, 30*time.Second))
		require.Equal(t, transferID, first.Structured["transfer_id"], "the stale owner's client gets its upstream answer")
		require.Eventually(t, func() bool {
			return metric(t, s, `idemgate_not_owner_total{operation="transfer_mcp"}`) == 1
		}, 10*time.Second, 20*time.Millisecond, "the refused completion is counted")
		kept := requireRow(t, s, nonce, "DONE")
		require.Equal(t, fresh.Fence, kept.Fence)
		require.Equal(t, fresh.Owner, kept.Owner)
		require.Equal(t, 1, s.Payments.Executions())
	})
}
