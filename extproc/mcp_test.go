package extproc

import (
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/extproc/mcp"
	"github.com/idemgate/idemgate/state"
	"github.com/idemgate/idemgate/state/memory"
)

const mcpConfigYAML = `
signing: {active_key: k1, keys: {k1: {env: K1}}}
limits: {max_body_bytes: 8192}
store: {timeout: 2s}
operations:
  - name: transfer
    scope: payments.transfer
    mcp: {endpoint: /mcp, preview_tool: transfer_preview, confirm_tool: transfer_confirm, status_tool: transfer_status}
    params: [{path: amount, type: decimal}, currency, payee.account_id]
    result_ref: transfer_id
  - name: refund
    scope: payments.refund
    mcp: {endpoint: /mcp, preview_tool: refund_preview, confirm_tool: refund_confirm, status_tool: refund_status}
    params: [charge_id]
    downstream_idempotency_header: ""
`

// newMCPEnv is an env serving mcpConfigYAML (with extra YAML appended to
// the top level, e.g. a messages language).
func newMCPEnv(t testing.TB, extra string) *env {
	t.Helper()
	e := newEnv(t, nil, nil)
	e.cfg = testConfig(t, mcpConfigYAML+extra)
	e.useStore(t, memory.New(memory.Options{Now: e.clock.Now}))
	return e
}

// rpc builds a JSON-RPC request body; id and params are raw JSON.
func rpc(id, method, params string) []byte {
	return []byte(`{"jsonrpc":"2.0","id":` + id + `,"method":"` + method + `","params":` + params + `}`)
}

func callParams(tool, args string) string {
	return `{"name":"` + tool + `","arguments":` + args + `,"_meta":{"progressToken":"p1"}}`
}

func transferArgs(amount, fp string) string {
	s := `{"amount":` + amount + `,"currency":"EUR","payee":{"account_id":"DE89"},"memo":"rent"`
	if fp != "" {
		s += `,"fingerprint":"` + fp + `"`
	}
	return s + `}`
}

// mcpPost is a POST to /mcp; modern adds the 2026-07-28 headers.
func mcpPost(subject string, body []byte, extra ...header) httpRequest {
	hs := []header{{"x-request-id", "req-mcp"}, {"content-type", "application/json"}, {"accept", "application/json, text/event-stream"}}
	if subject != "" {
		hs = append(hs, header{"x-idemgate-subject", subject})
	}
	return httpRequest{method: "POST", path: "/mcp", headers: append(hs, extra...), body: body}
}

func modern(method, name string) []header {
	hs := []header{{"mcp-protocol-version", "2026-07-28"}, {"mcp-method", method}}
	if name != "" {
		hs = append(hs, header{"mcp-name", name})
	}
	return hs
}

// mcpServer is a hand-written MCP upstream for the unit tests: it answers
// tools/list, the preview tools and the confirm tools (deduplicating by
// Idempotency-Key like the demo), in JSON or SSE.
type mcpServer struct {
	mu         sync.Mutex
	sse        bool
	executions int
	byKey      map[string]upstreamReply
	lastArgs   map[string]any
	lastMeta   map[string]any
	// confirm overrides the confirm tool's JSON-RPC result/error member
	// (raw, e.g. `"error":{...}`) or the whole reply.
	confirm func(n int) (member string, reply *upstreamReply)
}

func newMCPServer(sse bool) *mcpServer {
	return &mcpServer{sse: sse, byKey: map[string]upstreamReply{}}
}

func (s *mcpServer) Executions() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.executions
}

func (s *mcpServer) reply(id json.RawMessage, member string) upstreamReply {
	msg := `{"jsonrpc":"2.0","id":` + string(id) + `,` + member + `}`
	if !s.sse {
		return upstreamReply{status: 200, headers: []header{{"content-type", "application/json"}}, body: []byte(msg)}
	}
	body := "id: e1\ndata:\n\n" +
		"event: message\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{\"progressToken\":\"p1\",\"progress\":1}}\n\n" +
		"event: message\nid: e2\ndata: " + msg + "\n\n"
	return upstreamReply{status: 200, headers: []header{{"content-type", "text/event-stream"}}, body: []byte(body)}
}

const upstreamTools = `[` +
	`{"name":"transfer_preview","description":"Quote a transfer","inputSchema":{"type":"object","properties":{"amount":{"type":"string"}}},"outputSchema":{"type":"object","properties":{"quote":{"type":"object"}},"additionalProperties":false}},` +
	`{"name":"transfer_confirm","description":"Execute a transfer","inputSchema":{"type":"object","properties":{"amount":{"type":"string"}},"required":["amount"],"additionalProperties":false},"outputSchema":{"type":"object"}},` +
	`{"name":"weather","inputSchema":{"type":"object"}}]`

func (s *mcpServer) handle(headers map[string]string, body []byte) upstreamReply {
	var req struct {
		ID     json.RawMessage `json:"id"`
		Method string          `json:"method"`
		Params struct {
			Name      string         `json:"name"`
			Arguments map[string]any `json:"arguments"`
			Meta      map[string]any `json:"_meta"`
			Cursor    string         `json:"cursor"`
		} `json:"params"`
	}
	if err := json.Unmarshal(body, &req); err != nil {
		return upstreamReply{status: 400}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case req.Method == "tools/list" && req.Params.Cursor == "":
		return s.reply(req.ID, `"result":{"tools":`+upstreamTools+`,"nextCursor":"page2"}`)
	case req.Method == "tools/list":
		return s.reply(req.ID, `"result":{"tools":[{"name":"refund_confirm","inputSchema":{"type":"object"}}]}`)
	case req.Method == "tools/call" && strings.HasSuffix(req.Params.Name, "_preview"):
		return s.reply(req.ID, `"result":{"content":[{"type":"text","text":"fee 0.50"}],"structuredContent":{"quote":{"fee":"0.50"}}}`)
	case req.Method == "tools/call" && strings.HasSuffix(req.Params.Name, "_confirm"):
		s.lastArgs, s.lastMeta = req.Params.Arguments, req.Params.Meta
		key := headers["idempotency-key"]
		if r, ok := s.byKey[key]; ok && key != "" {
			// Same key: the first answer again, with this request's id.
			return s.reply(req.ID, strings.TrimSuffix(strings.SplitN(string(r.body), `,`, 3)[2], "}"))
		}
		s.executions++
		member := fmt.Sprintf(`"result":{"content":[{"type":"text","text":"executed tr_%d"}],"structuredContent":{"transfer_id":"tr_%d","state":"executed"}}`, s.executions, s.executions)
		if s.confirm != nil {
			m, whole := s.confirm(s.executions)
			if whole != nil {
				return *whole
			}
			if m != "" {
				member = m
			}
		}
		r := s.reply(req.ID, member)
		if key != "" && strings.HasPrefix(member, `"result"`) && !strings.Contains(member, "input_required") {
			// Like a real idempotent server: only a finished call is kept.
			s.byKey[key] = upstreamReply{body: []byte(`{"jsonrpc":"2.0","id":0,` + member + `}`)}
		}
		return r
	}
	return s.reply(req.ID, `"result":{}`)
}

// finalMessage returns the JSON-RPC response in a client-visible body
// (JSON, or the SSE event with a result or error).
func finalMessage(t testing.TB, body []byte) map[string]any {
	t.Helper()
	raw := body
	if strings.Contains(string(body), "data:") {
		raw = nil
		for _, ev := range mcp.ParseSSE(body) {
			if strings.Contains(string(ev.Data), `"result"`) || strings.Contains(string(ev.Data), `"error"`) {
				raw = ev.Data
			}
		}
	}
	var m map[string]any
	require.NoError(t, json.Unmarshal(raw, &m), string(body))
	return m
}

// toolResult checks an answer idemgate wrote itself as a tool result and
// returns its result member.
func toolResult(t testing.TB, res result, id string, status string, isError bool) map[string]any {
	t.Helper()
	require.NotNil(t, res.immediate, "expected idemgate to answer itself")
	require.Equal(t, 200, res.status, string(res.body))
	require.Equal(t, "application/json", res.headers["content-type"])
	require.True(t, strings.HasPrefix(string(res.body), `{"jsonrpc":"2.0","id":`+id+`,"result":`), "id byte for byte: %s", res.body)
	m := finalMessage(t, res.body)
	r := m["result"].(map[string]any)
	require.Equal(t, isError, r["isError"], string(res.body))
	sc := r["structuredContent"].(map[string]any)
	require.Equal(t, status, sc["status"], string(res.body))
	for _, k := range []string{"meaning", "instruction", "trace_id"} {
		require.Contains(t, sc, k)
	}
	text := r["content"].([]any)[0].(map[string]any)
	require.Equal(t, "text", text["type"])
	require.Contains(t, text["text"], sc["meaning"])
	require.Contains(t, text["text"], sc["instruction"])
	return r
}

func protocolError(t testing.TB, res result, httpStatus int, code float64) map[string]any {
	t.Helper()
	require.NotNil(t, res.immediate)
	require.Equal(t, httpStatus, res.status, string(res.body))
	m := finalMessage(t, res.body)
	e := m["error"].(map[string]any)
	require.Equal(t, code, e["code"], string(res.body))
	return m
}

// mcpPreview previews a transfer over MCP and returns the fingerprint.
func mcpPreview(t testing.TB, d dialer, up *mcpServer, subject, amount string) string {
	t.Helper()
	res := do(t, d, mcpPost(subject, rpc(`1`, "tools/call", callParams("transfer_preview", transferArgs(amount, "")))), up.handle)
	require.Nil(t, res.immediate, string(res.body))
	sc := finalMessage(t, res.body)["result"].(map[string]any)["structuredContent"].(map[string]any)
	fp, _ := sc["fingerprint"].(string)
	require.NotEmpty(t, fp, string(res.body))
	return fp
}

func TestMCP(t *testing.T) {
	for _, sse := range []bool{false, true} {
		t.Run(map[bool]string{false: "json", true: "sse"}[sse], func(t *testing.T) {
			e := newMCPEnv(t, "")
			runMCPSuite(t, e, fakeDialer{srv: e.srv}, sse)
		})
	}
	t.Run("grpc", func(t *testing.T) {
		e := newMCPEnv(t, "")
		runMCPSuite(t, e, e.startGRPC(t), true)
	})
}

func runMCPSuite(t *testing.T, e *env, d dialer, sse bool) {
	const alice, bob = "user-alice", "user-bob"

	t.Run("tools/list: fingerprint argument on the confirm tool, status tools on the last page", func(t *testing.T) {
		up := newMCPServer(sse)
		res := do(t, d, mcpPost(alice, rpc(`"l1"`, "tools/list", `{}`)), up.handle)
		require.Nil(t, res.immediate)
		r := finalMessage(t, res.body)["result"].(map[string]any)
		require.Equal(t, "page2", r["nextCursor"], "cursor untouched")
		tools := r["tools"].([]any)
		require.Len(t, tools, 3, "no status tool before the last page")
		confirm := tools[1].(map[string]any)
		schema := confirm["inputSchema"].(map[string]any)
		require.Equal(t, []any{"amount", "fingerprint"}, schema["required"])
		require.Equal(t, false, schema["additionalProperties"])
		fpArg := schema["properties"].(map[string]any)["fingerprint"].(map[string]any)
		require.Equal(t, "string", fpArg["type"])
		require.Contains(t, fpArg["description"], "transfer_preview")
		require.Contains(t, fpArg["description"], "unchanged")
		require.NotContains(t, confirm, "outputSchema")
		previewOut := tools[0].(map[string]any)["outputSchema"].(map[string]any)["properties"].(map[string]any)
		require.Contains(t, previewOut, "fingerprint")
		require.Contains(t, previewOut, "fingerprint_expires_at")
		require.Contains(t, string(res.body), `{"name":"weather","inputSchema":{"type":"object"}}`, "other tools byte for byte")

		res = do(t, d, mcpPost(alice, rpc(`2`, "tools/list", `{"cursor":"page2"}`), modern("tools/list", "")...), up.handle)
		r = finalMessage(t, res.body)["result"].(map[string]any)
		tools = r["tools"].([]any)
		require.Len(t, tools, 3)
		require.Contains(t, tools[0].(map[string]any)["inputSchema"].(map[string]any)["properties"], "fingerprint")
		require.Equal(t, "transfer_status", tools[1].(map[string]any)["name"])
		require.Equal(t, "refund_status", tools[2].(map[string]any)["name"])
		require.Equal(t, []any{"fingerprint"}, tools[1].(map[string]any)["inputSchema"].(map[string]any)["required"])
	})

	t.Run("preview: fingerprint in structuredContent and a text block, no storage", func(t *testing.T) {
		up := newMCPServer(sse)
		before := e.store.Total()
		res := do(t, d, mcpPost(alice, rpc(`"p-1"`, "tools/call", callParams("transfer_preview", transferArgs(`"100.00"`, "")))), up.handle)
		require.Nil(t, res.immediate)
		m := finalMessage(t, res.body)
		require.Equal(t, "p-1", m["id"])
		r := m["result"].(map[string]any)
		sc := r["structuredContent"].(map[string]any)
		fp := sc["fingerprint"].(string)
		require.Equal(t, map[string]any{"fee": "0.50"}, sc["quote"])
		require.Equal(t, e.clock.Now().Add(15*time.Minute).Format(time.RFC3339), sc["fingerprint_expires_at"])
		content := r["content"].([]any)
		require.Len(t, content, 2)
		require.Equal(t, "fee 0.50", content[0].(map[string]any)["text"])
		require.Contains(t, content[1].(map[string]any)["text"], fp)
		require.Contains(t, content[1].(map[string]any)["text"], "transfer_confirm")
		e.claimsOf(t, fp, alice, "payments.transfer")
		require.Equal(t, before, e.store.Total(), "preview makes no store call")
		if sse {
			require.Contains(t, string(res.body), "id: e1\ndata:\n\n", "priming event kept")
			require.Contains(t, string(res.body), `"method":"notifications/progress"`, "progress passes unchanged")
			require.Contains(t, string(res.body), "event: message\nid: e2\ndata: {", "the final event keeps its fields")
		}
	})

	t.Run("confirm executes once; a retry with a new id is replayed with that id", func(t *testing.T) {
		up := newMCPServer(sse)
		fp := mcpPreview(t, d, up, alice, `"100.00"`)
		nonce := e.claimsOf(t, fp, alice, "payments.transfer").Nonce
		res := do(t, d, mcpPost(alice, rpc(`"c-1"`, "tools/call", callParams("transfer_confirm", transferArgs(`100`, fp))), modern("tools/call", "transfer_confirm")...), up.handle)
		require.Nil(t, res.immediate)
		require.Equal(t, 1, up.Executions())
		require.Equal(t, nonce, res.upstreamHdrs["idempotency-key"])
		require.NotContains(t, up.lastArgs, "fingerprint", "the fingerprint leaves the arguments")
		require.Equal(t, "rent", up.lastArgs["memo"])
		require.Equal(t, nonce, up.lastMeta["io.idemgate/idempotency-key"])
		require.Equal(t, "p1", up.lastMeta["progressToken"], "other _meta kept")
		require.Equal(t, "tr_1", finalMessage(t, res.body)["result"].(map[string]any)["structuredContent"].(map[string]any)["transfer_id"], "the upstream's answer reaches the client")
		rec, _ := e.record(t, nonce)
		require.Equal(t, state.Done, rec.State)

		for _, id := range []string{`"c-2"`, `7`, `"x\u0041"`} {
			res = do(t, d, mcpPost(alice, rpc(id, "tools/call", callParams("transfer_confirm", transferArgs(`"100.0"`, fp)))), neverCalled(t))
			r := toolResult(t, res, id, "already_completed", false)
			sc := r["structuredContent"].(map[string]any)
			require.Equal(t, "tr_1", sc["result_ref"])
			require.Equal(t, map[string]any{"transfer_id": "tr_1", "state": "executed"}, sc["result"])
			content := r["content"].([]any)
			require.Len(t, content, 2)
			require.Equal(t, "executed tr_1", content[1].(map[string]any)["text"], "original blocks after the envelope's text")
			require.Equal(t, map[string]any{"io.idemgate/replayed": true}, r["_meta"])
			require.Equal(t, "true", res.headers["idempotent-replayed"])
		}
		require.Equal(t, 1, up.Executions())

		res = do(t, d, mcpPost(alice, rpc(`9`, "tools/call", callParams("transfer_status", `{"fingerprint":"`+fp+`"}`)), modern("tools/call", "transfer_status")...), neverCalled(t))
		r := toolResult(t, res, `9`, "completed", false)
		require.Equal(t, map[string]any{"transfer_id": "tr_1", "state": "executed"}, r["structuredContent"].(map[string]any)["result"])
	})

	t.Run("refusals are tool results with isError", func(t *testing.T) {
		up := newMCPServer(sse)
		fp := mcpPreview(t, d, up, alice, `100`)
		res := do(t, d, mcpPost(alice, rpc(`"d"`, "tools/call", callParams("transfer_confirm", transferArgs(`101`, fp)))), neverCalled(t))
		r := toolResult(t, res, `"d"`, "params_changed", true)
		require.Equal(t, []any{"amount"}, r["structuredContent"].(map[string]any)["changed_fields"])
		require.Contains(t, e.logs.String(), "event=security_alert")

		res = do(t, d, mcpPost(alice, rpc(`3`, "tools/call", callParams("transfer_confirm", transferArgs(`100`, "")))), neverCalled(t))
		toolResult(t, res, `3`, "fingerprint_required", true)
		res = do(t, d, mcpPost(bob, rpc(`4`, "tools/call", callParams("transfer_confirm", transferArgs(`100`, fp)))), neverCalled(t))
		toolResult(t, res, `4`, "fingerprint_subject_mismatch", true)
		res = do(t, d, mcpPost("", rpc(`5`, "tools/call", callParams("transfer_preview", transferArgs(`100`, "")))), neverCalled(t))
		toolResult(t, res, `5`, "subject_required", true)
		res = do(t, d, mcpPost(alice, rpc(`6`, "tools/call", callParams("transfer_status", `{"fingerprint":"`+fp+`"}`))), neverCalled(t))
		toolResult(t, res, `6`, "not_started", false)
		// The binding rule: a duplicate key is refused before the upstream.
		res = do(t, d, mcpPost(alice, rpc(`8`, "tools/call", callParams("transfer_confirm", `{"amount":100,"amount":1,"currency":"EUR","fingerprint":"`+fp+`"}`))), neverCalled(t))
		toolResult(t, res, `8`, "invalid_params", true)
		require.Contains(t, e.logs.String(), "reason=ambiguous_key")
		// And keys equal under case folding on a bound path (the fingerprint
		// package's binding rule, applied to params.arguments).
		res = do(t, d, mcpPost(alice, rpc(`10`, "tools/call", callParams("transfer_confirm", `{"amount":100,"Amount":1,"currency":"EUR","payee":{"account_id":"DE89"},"fingerprint":"`+fp+`"}`))), neverCalled(t))
		r = toolResult(t, res, `10`, "invalid_params", true)
		require.Contains(t, r["structuredContent"].(map[string]any)["detail"], "ambiguous key")
		res = do(t, d, mcpPost(alice, rpc(`11`, "tools/call", callParams("transfer_preview", `{"amount":100,"currency":"EUR","payee":{"account_id":"DE89","Account_ID":"X"}}`))), neverCalled(t))
		toolResult(t, res, `11`, "invalid_params", true)
		require.Equal(t, 0, up.Executions())
	})

	outcome := func(t *testing.T, tool string, member string, whole *upstreamReply) (fp, nonce string, up *mcpServer) {
		up = newMCPServer(sse)
		up.confirm = func(n int) (string, *upstreamReply) {
			if n == 1 {
				return member, whole
			}
			return "", nil
		}
		args := transferArgs(`100`, "")
		scope := "payments.transfer"
		if tool == "refund" {
			args, scope = `{"charge_id":"ch_1"}`, "payments.refund"
		}
		res := do(t, d, mcpPost(alice, rpc(`1`, "tools/call", callParams(tool+"_preview", args))), up.handle)
		fp = finalMessage(t, res.body)["result"].(map[string]any)["structuredContent"].(map[string]any)["fingerprint"].(string)
		nonce = e.claimsOf(t, fp, alice, scope).Nonce
		withFP := strings.TrimSuffix(args, "}") + `,"fingerprint":"` + fp + `"}`
		do(t, d, mcpPost(alice, rpc(`2`, "tools/call", callParams(tool+"_confirm", withFP))), up.handle)
		return fp, nonce, up
	}
	confirmAgain := func(t *testing.T, tool, fp string, up *mcpServer) result {
		args := transferArgs(`100`, fp)
		if tool == "refund" {
			args = `{"charge_id":"ch_1","fingerprint":"` + fp + `"}`
		}
		return do(t, d, mcpPost(alice, rpc(`"again"`, "tools/call", callParams(tool+"_confirm", args))), up.handle)
	}

	t.Run("isError and -32602 are definite: replayed as already_failed", func(t *testing.T) {
		for _, member := range []string{
			`"result":{"content":[{"type":"text","text":"insufficient funds"}],"isError":true}`,
			`"error":{"code":-32602,"message":"bad amount"}`,
		} {
			fp, nonce, up := outcome(t, "transfer", member, nil)
			rec, _ := e.record(t, nonce)
			require.Equal(t, state.Failed, rec.State, member)
			res := confirmAgain(t, "transfer", fp, up)
			r := toolResult(t, res, `"again"`, "already_failed", true)
			require.Equal(t, 1, up.Executions())
			if strings.Contains(member, "isError") {
				require.Equal(t, "insufficient funds", r["content"].([]any)[1].(map[string]any)["text"])
			} else {
				require.Equal(t, map[string]any{"error": map[string]any{"code": float64(-32602), "message": "bad amount"}}, r["structuredContent"].(map[string]any)["result"])
			}
		}
	})

	t.Run("ambiguous outcomes release the record: the retry re-sends the same key", func(t *testing.T) {
		cut := &upstreamReply{status: 200, headers: []header{{"content-type", "text/event-stream"}},
			body: []byte("event: message\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{\"progress\":1}}\n\n")}
		cases := map[string]struct {
			member string
			whole  *upstreamReply
		}{
			"-32603":                 {member: `"error":{"code":-32603,"message":"db timeout"}`},
			"http 503":               {whole: &upstreamReply{status: 503, body: []byte("busy")}},
			"reset":                  {whole: &upstreamReply{reset: true}},
			"stream closed early":    {whole: cut},
			"input_required":         {member: `"result":{"resultType":"input_required","inputRequests":{}}`},
			"202 without a response": {whole: &upstreamReply{status: 202}},
		}
		for name, c := range cases {
			t.Run(name, func(t *testing.T) {
				fp, nonce, up := outcome(t, "transfer", c.member, c.whole)
				require.Eventually(t, func() bool {
					rec, found := e.recordNow(nonce)
					return found && rec.State == state.InFlight && rec.LeaseExpired
				}, 5*time.Second, 10*time.Millisecond, "released at once, not left for the lease")
				res := confirmAgain(t, "transfer", fp, up)
				require.Nil(t, res.immediate, string(res.body))
				require.Equal(t, nonce, res.upstreamHdrs["idempotency-key"])
				require.Equal(t, 2, up.Executions())
				rec, _ := e.record(t, nonce)
				require.Equal(t, state.Done, rec.State)
			})
		}
		t.Run("a downstream that ignores keys needs reconciliation", func(t *testing.T) {
			fp, _, up := outcome(t, "refund", `"error":{"code":-32603,"message":"db timeout"}`, nil)
			res := confirmAgain(t, "refund", fp, up)
			toolResult(t, res, `"again"`, "needs_reconciliation", true)
			require.Equal(t, 1, up.Executions())
		})
	})

	t.Run("a task handle is DONE and every retry gets the same task", func(t *testing.T) {
		task := `"result":{"resultType":"task","taskId":"task-42","status":"working","ttlMs":60000,"pollIntervalMs":5000}`
		fp, _, up := outcome(t, "transfer", task, nil)
		res := confirmAgain(t, "transfer", fp, up)
		require.NotNil(t, res.immediate)
		m := finalMessage(t, res.body)
		require.Equal(t, "again", m["id"])
		r := m["result"].(map[string]any)
		require.Equal(t, "task", r["resultType"])
		require.Equal(t, "task-42", r["taskId"])
		require.Equal(t, true, r["_meta"].(map[string]any)["io.idemgate/replayed"])
		require.Equal(t, 1, up.Executions())
	})
}

func TestMCPTrafficSelection(t *testing.T) {
	e := newMCPEnv(t, "")
	d := fakeDialer{srv: e.srv}
	up := newMCPServer(false)
	const alice = "user-alice"

	t.Run("2026-07-28 headers: the body decides, other traffic passes after it", func(t *testing.T) {
		for _, c := range []struct {
			hs   []header
			body []byte
		}{
			{modern("tools/call", "weather"), rpc(`1`, "tools/call", callParams("weather", `{}`))},
			{modern("resources/read", "file:///x"), rpc(`1`, "resources/read", `{"uri":"file:///x"}`)},
			{modern("server/discover", ""), rpc(`1`, "server/discover", `{}`)},
		} {
			res := do(t, d, mcpPost(alice, c.body, c.hs...), up.handle)
			require.True(t, res.upstreamCalled)
			require.Equal(t, 3, res.replies, "request headers, request body, response headers with body processing off")
		}
	})
	t.Run("headers naming an unguarded tool over a body calling the confirm tool are refused", func(t *testing.T) {
		// An upstream that ignores the mirrored headers would run the body.
		res := do(t, d, mcpPost(alice, rpc(`1`, "tools/call", callParams("transfer_confirm", transferArgs(`1`, ""))), modern("tools/call", "weather")...), neverCalled(t))
		protocolError(t, res, 400, -32020)
		res = do(t, d, mcpPost(alice, rpc(`1`, "tools/call", callParams("transfer_confirm", transferArgs(`1`, ""))), modern("resources/read", "file:///x")...), neverCalled(t))
		protocolError(t, res, 400, -32020)
	})
	t.Run("headers that disagree with the body are refused with -32020", func(t *testing.T) {
		res := do(t, d, mcpPost(alice, rpc(`1`, "tools/call", callParams("transfer_confirm", `{}`)), modern("tools/call", "transfer_preview")...), neverCalled(t))
		protocolError(t, res, 400, -32020)
		res = do(t, d, mcpPost(alice, rpc(`1`, "tools/call", callParams("transfer_confirm", `{}`)), modern("tools/list", "")...), neverCalled(t))
		protocolError(t, res, 400, -32020)
		res = do(t, d, mcpPost(alice, rpc(`1`, "tools/call", callParams("transfer_confirm", `{}`)), header{"mcp-protocol-version", "2026-07-28"}, header{"mcp-method", "tools/call"}), neverCalled(t))
		protocolError(t, res, 400, -32020)
		// The base64 sentinel form is decoded before comparing.
		res = do(t, d, mcpPost(alice, rpc(`1`, "tools/call", callParams("transfer_confirm", transferArgs(`1`, ""))), modern("tools/call", "=?base64?dHJhbnNmZXJfY29uZmlybQ==?=")...), neverCalled(t))
		toolResult(t, res, `1`, "fingerprint_required", true)
	})
	t.Run("older protocol versions pass untouched, response not buffered", func(t *testing.T) {
		res := do(t, d, mcpPost(alice, rpc(`0`, "initialize", `{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"c","version":"1"}}`),
			header{"mcp-session-id", "s-1"}), up.handle)
		require.True(t, res.upstreamCalled)
		require.Equal(t, "s-1", res.upstreamHdrs["mcp-session-id"])
		require.Equal(t, 3, res.replies, "request headers, request body, response headers with body processing off")
		res = do(t, d, mcpPost(alice, []byte(`{"jsonrpc":"2.0","method":"notifications/initialized"}`), header{"mcp-protocol-version", "2025-06-18"}), up.handle)
		require.True(t, res.upstreamCalled)
	})
	t.Run("a batch with a guarded call is refused, others pass", func(t *testing.T) {
		batch := []byte(`[` + string(rpc(`1`, "tools/list", `{}`)) + `,` + string(rpc(`2`, "tools/call", callParams("transfer_confirm", `{}`))) + `]`)
		res := do(t, d, mcpPost(alice, batch), neverCalled(t))
		protocolError(t, res, 400, -32600)
		res = do(t, d, mcpPost(alice, []byte(`[`+string(rpc(`1`, "ping", `{}`))+`]`)), up.handle)
		require.True(t, res.upstreamCalled)
	})
	t.Run("members two readers could read differently are refused", func(t *testing.T) {
		for _, body := range []string{
			`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"weather","arguments":{}},"params":{"name":"transfer_confirm","arguments":{}}}`,
			`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"weather","Name":"transfer_confirm","arguments":{}}}`,
			`{"jsonrpc":"2.0","id":1,"method":"tools/call","Method":"tools/list","params":{"name":"weather"}}`,
			`[{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"weather","name":"transfer_confirm"}}]`,
		} {
			res := do(t, d, mcpPost(alice, []byte(body)), neverCalled(t))
			protocolError(t, res, 400, -32600)
		}
	})
	t.Run("a guarded tool called as a notification is refused", func(t *testing.T) {
		res := do(t, d, mcpPost(alice, []byte(`{"jsonrpc":"2.0","method":"tools/call","params":{"name":"transfer_confirm","arguments":{}}}`)), neverCalled(t))
		m := protocolError(t, res, 400, -32600)
		require.Nil(t, m["id"])
	})
	t.Run("unparseable JSON-RPC is a JSON-RPC error", func(t *testing.T) {
		res := do(t, d, mcpPost(alice, []byte(`{"jsonrpc":`)), neverCalled(t))
		protocolError(t, res, 400, -32700)
	})
}

func TestMCPChinese(t *testing.T) {
	e := newMCPEnv(t, "messages: {language: zh}\n")
	d := fakeDialer{srv: e.srv}
	up := newMCPServer(false)
	res := do(t, d, mcpPost("user-alice", rpc(`1`, "tools/list", `{"cursor":"page2"}`)), up.handle)
	tools := finalMessage(t, res.body)["result"].(map[string]any)["tools"].([]any)
	require.Contains(t, tools[0].(map[string]any)["inputSchema"].(map[string]any)["properties"].(map[string]any)["fingerprint"].(map[string]any)["description"], "原样")
	require.Contains(t, tools[1].(map[string]any)["description"], "查询")
	fp := mcpPreview(t, d, up, "user-alice", `1`)
	res = do(t, d, mcpPost("user-alice", rpc(`2`, "tools/call", callParams("transfer_confirm", transferArgs(`2`, fp)))), neverCalled(t))
	r := toolResult(t, res, `2`, "params_changed", true)
	require.Contains(t, r["content"].([]any)[0].(map[string]any)["text"], "transfer_preview")
	require.Regexp(t, `\p{Han}`, r["structuredContent"].(map[string]any)["meaning"])
}

// TestMCPTrustedHeadersFastPath: with mcp.trust_upstream_headers on every
// operation of the endpoint, the 2026-07-28 headers decide at once and other
// traffic is not buffered (one message). That trusts the upstream to refuse
// a body that disagrees with them: one that ignores them would run a confirm
// idemgate never saw (shown here), which is why the default reads the body.
func TestMCPTrustedHeadersFastPath(t *testing.T) {
	trusted := strings.ReplaceAll(mcpConfigYAML, "mcp: {endpoint: /mcp,", "mcp: {trust_upstream_headers: true, endpoint: /mcp,")
	e := newEnv(t, nil, nil)
	e.cfg = testConfig(t, trusted)
	e.useStore(t, memory.New(memory.Options{Now: e.clock.Now}))
	d := fakeDialer{srv: e.srv}
	up := newMCPServer(false)
	for _, hs := range [][]header{modern("tools/call", "weather"), modern("resources/read", "file:///x"), modern("server/discover", "")} {
		res := do(t, d, mcpPost("user-alice", rpc(`1`, "tools/call", callParams("weather", `{}`)), hs...), up.handle)
		require.True(t, res.upstreamCalled)
		require.Equal(t, 1, res.replies, "one reply at request headers, every later phase off")
	}
	called := false
	res := do(t, d, mcpPost("user-alice", rpc(`1`, "tools/call", callParams("transfer_confirm", transferArgs(`1`, ""))), modern("tools/call", "weather")...),
		func(map[string]string, []byte) upstreamReply {
			called = true
			return upstreamReply{status: 200}
		})
	require.True(t, called, "trusted: the mismatch is the upstream's to refuse")
	require.Nil(t, res.immediate)
}

// TestMCPResponseIsPickedByID: an event stream may carry a response to
// another request before the one to this request; idemgate edits only the
// message whose id is this request's (the fingerprint goes to the preview
// that asked for it, never to a stranger's result).
func TestMCPResponseIsPickedByID(t *testing.T) {
	e := newMCPEnv(t, "")
	d := fakeDialer{srv: e.srv}
	quote := func(id string) string {
		return `{"jsonrpc":"2.0","id":` + id + `,"result":{"content":[{"type":"text","text":"quote"}],"structuredContent":{"quote":{"fee":"0.50"}}}}`
	}
	stranger, ours := quote(`2`), quote(`"1"`)
	stream := "event: message\ndata: " + stranger + "\n\nevent: message\ndata: " + ours + "\n\n"
	res := do(t, d, mcpPost("user-alice", rpc(`"1"`, "tools/call", callParams("transfer_preview", transferArgs(`"5"`, ""))), modern("tools/call", "transfer_preview")...),
		func(map[string]string, []byte) upstreamReply {
			return upstreamReply{status: 200, headers: []header{{"content-type", "text/event-stream"}}, body: []byte(stream)}
		})
	require.Nil(t, res.immediate)
	events := mcp.ParseSSE(res.body)
	require.Len(t, events, 2)
	require.Equal(t, stranger, string(events[0].Data), "the other request's response passes untouched")
	require.Contains(t, string(events[1].Data), `"fingerprint"`, "this request's response gets the fingerprint")
	require.Contains(t, string(events[1].Data), `"id":"1"`)
}
