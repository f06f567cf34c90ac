package payments

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"
)

// keyTransport sets Idempotency-Key on every request, as idemgate does on a
// confirm.
type keyTransport struct{ key atomic.Value }

func (k *keyTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	if v, _ := k.key.Load().(string); v != "" {
		r.Header.Set(IdempotencyKeyHeader, v)
	}
	return http.DefaultTransport.RoundTrip(r)
}

func connect(t *testing.T, url string, rt http.RoundTripper, progress *atomic.Int32) *mcp.ClientSession {
	t.Helper()
	c := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, &mcp.ClientOptions{
		ProgressNotificationHandler: func(context.Context, *mcp.ProgressNotificationClientRequest) { progress.Add(1) },
	})
	cs, err := c.Connect(t.Context(), &mcp.StreamableClientTransport{Endpoint: url, HTTPClient: &http.Client{Transport: rt}}, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = cs.Close() })
	return cs
}

func TestMCPTools(t *testing.T) {
	for _, sse := range []bool{false, true} {
		t.Run(map[bool]string{false: "json", true: "sse"}[sse], func(t *testing.T) {
			s := New(Options{})
			s.SetMCPStreaming(sse)
			hs := httptest.NewServer(s)
			t.Cleanup(hs.Close)
			rt := &keyTransport{}
			var progress atomic.Int32
			cs := connect(t, hs.URL+MCPPath, rt, &progress)

			tools, err := cs.ListTools(t.Context(), nil)
			require.NoError(t, err)
			require.Len(t, tools.Tools, 2)

			args := map[string]any{"amount": "100.00", "currency": "EUR", "payee": map[string]any{"account_id": "DE89"}, "memo": "rent"}
			res, err := cs.CallTool(t.Context(), &mcp.CallToolParams{Name: MCPPreviewTool, Arguments: args})
			require.NoError(t, err)
			require.False(t, res.IsError)
			var q map[string]any
			raw, _ := json.Marshal(res.StructuredContent)
			require.NoError(t, json.Unmarshal(raw, &q))
			require.Equal(t, "1.00", q["fee"])
			require.Equal(t, 0, s.Executions())

			// Without a key: refused, nothing executes.
			res, err = cs.CallTool(t.Context(), &mcp.CallToolParams{Name: MCPConfirmTool, Arguments: args})
			require.NoError(t, err)
			require.True(t, res.IsError)

			rt.key.Store("k-1")
			params := &mcp.CallToolParams{Name: MCPConfirmTool, Arguments: args}
			params.SetProgressToken("p1")
			first, err := cs.CallTool(t.Context(), params)
			require.NoError(t, err)
			require.False(t, first.IsError)
			again, err := cs.CallTool(t.Context(), &mcp.CallToolParams{Name: MCPConfirmTool, Arguments: args})
			require.NoError(t, err)
			require.Equal(t, first.StructuredContent, again.StructuredContent, "a repeated key gets the stored result")
			require.Equal(t, 1, s.Executions())
			require.Equal(t, 1, s.ExecutionsForKey("k-1"))
			if sse {
				require.Eventually(t, func() bool { return progress.Load() >= 1 }, 2e9, 1e7, "progress before the result")
			}

			// A strict schema: an unknown argument (a fingerprint) is refused.
			rt.key.Store("k-2")
			args["fingerprint"] = "x"
			res, err = cs.CallTool(t.Context(), &mcp.CallToolParams{Name: MCPConfirmTool, Arguments: args})
			require.NoError(t, err)
			require.True(t, res.IsError)
			require.Equal(t, 1, s.Executions())
		})
	}
}

func TestMCPCutAfterExecute(t *testing.T) {
	s := New(Options{})
	s.SetMCPStreaming(true)
	hs := httptest.NewServer(s)
	t.Cleanup(hs.Close)
	s.SetFaults(Faults{ResetAfterExecute: true, Times: 1})
	body := `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"transfer_confirm","arguments":{"amount":"1.00","currency":"EUR","payee":{"account_id":"a"}},"_meta":{"progressToken":"p"}}}`
	req, _ := http.NewRequestWithContext(t.Context(), "POST", hs.URL+MCPPath, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Mcp-Protocol-Version", "2025-11-25")
	req.Header.Set(IdempotencyKeyHeader, "k")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	got, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, 1, s.Executions())
	require.Contains(t, string(got), "notifications/progress", "events before the cut arrive")
	require.NotContains(t, string(got), `"result"`, "the result never does")
}
