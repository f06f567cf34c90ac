package e2e

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/e2e/demoauth"
	"github.com/idemgate/idemgate/e2e/internal/stack"
	"github.com/idemgate/idemgate/e2e/payments"
)

// bearer adds the user's JWT to every request, the way an MCP client
// configured with a token does; nothing else of idemgate is known to it.
type bearer struct {
	token string
	next  http.RoundTripper
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.next.RoundTrip(r)
}

// mcpSession connects the official Go SDK client to the stack's /mcp as
// user, speaking protocolVersion ("" = the SDK's latest, 2026-07-28).
func mcpSession(t *testing.T, s *stack.Stack, user, protocolVersion string) *mcp.ClientSession {
	t.Helper()
	token, err := demoauth.Mint(user, time.Hour, time.Now())
	require.NoError(t, err)
	c := mcp.NewClient(&mcp.Implementation{Name: "e2e-go-sdk", Version: "1.0.0"}, nil)
	transport := &mcp.StreamableClientTransport{
		Endpoint:   s.URL() + payments.MCPPath,
		HTTPClient: &http.Client{Transport: bearer{token: token, next: http.DefaultTransport}, Timeout: 60 * time.Second},
		// The demo server is stateless; no standalone GET stream is needed.
		DisableStandaloneSSE: true,
	}
	cs, err := c.Connect(t.Context(), transport, &mcp.ClientSessionOptions{ProtocolVersion: protocolVersion})
	require.NoError(t, err)
	t.Cleanup(func() { _ = cs.Close() })
	return cs
}

// structured decodes a result's structuredContent.
func structured(t *testing.T, r *mcp.CallToolResult) map[string]any {
	t.Helper()
	raw, err := json.Marshal(r.StructuredContent)
	require.NoError(t, err)
	var m map[string]any
	require.NoError(t, json.Unmarshal(raw, &m), string(raw))
	return m
}

func transferArgs(amount string) map[string]any {
	return map[string]any{"amount": amount, "currency": "EUR", "payee": map[string]any{"account_id": "acct_leo"}, "memo": "rent"}
}

// TestMCPGoSDK drives the MCP endpoint through the front (real Envoy with
// ENVOY_BIN) with the official Go SDK client: tools/list, preview, confirm,
// a retry (a new JSON-RPC id: replayed, one execution), a drifted amount and
// the status tool — with the upstream answering JSON and SSE, and with the
// client speaking 2026-07-28 (Mcp-Method/Mcp-Name headers) and 2025-11-25
// (initialize, no headers). With mcp.preview_response_headers: false the
// 2026-07-28 client's preview costs Envoy 3 ext_proc messages, the older
// client's 4, and everything else is the same.
func TestMCPGoSDK(t *testing.T) {
	for _, c := range []struct {
		name, version string
		sse           bool
		// previewMessages is what a preview costs when threeMessages.
		threeMessages   bool
		previewMessages int64
	}{
		{"2026-07-28 json", "", false, false, 0},
		{"2026-07-28 sse", "", true, false, 0},
		{"2025-11-25 sse", "2025-11-25", true, false, 0},
		{"2026-07-28 json, preview in 3 messages", "", false, true, 3},
		{"2026-07-28 sse, preview in 3 messages", "", true, true, 3},
		{"2025-11-25 sse, preview in 3 messages asked", "2025-11-25", true, true, 4},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := startStack(t, stack.Options{MCPPreviewWithoutResponseHeaders: c.threeMessages})
			s.Payments.SetMCPStreaming(c.sse)
			cs := mcpSession(t, s, "alice", c.version)
			ctx := t.Context()

			tools, err := cs.ListTools(ctx, nil)
			require.NoError(t, err)
			if c.version == "" {
				// server/discover carried its Mcp-Method header, but the body
				// decided (mcp.trust_upstream_headers is off): no stream was
				// let through on its headers alone.
				n, err := s.Idemgate.Metric("idemgate_passthrough_streams_total")
				require.NoError(t, err)
				require.Zero(t, n)
			}
			byName := map[string]*mcp.Tool{}
			for _, tool := range tools.Tools {
				byName[tool.Name] = tool
			}
			require.Contains(t, byName, "transfer_status", "the status tool is listed")
			schema, err := json.Marshal(byName[payments.MCPConfirmTool].InputSchema)
			require.NoError(t, err)
			var in struct {
				Properties map[string]struct {
					Description string `json:"description"`
				} `json:"properties"`
				Required []string `json:"required"`
			}
			require.NoError(t, json.Unmarshal(schema, &in))
			require.Contains(t, in.Required, "fingerprint")
			require.Contains(t, in.Properties["fingerprint"].Description, "transfer_preview")

			args := transferArgs("25.00")
			var pv *mcp.CallToolResult
			sent := extProcMessagesSentBy(t, s.Envoy, func() {
				pv, err = cs.CallTool(ctx, &mcp.CallToolParams{Name: payments.MCPPreviewTool, Arguments: args})
			})
			require.NoError(t, err)
			if c.threeMessages {
				require.Equal(t, c.previewMessages, sent, "ext_proc messages of the preview")
			}
			require.False(t, pv.IsError)
			fp, _ := structured(t, pv)["fingerprint"].(string)
			require.NotEmpty(t, fp)
			last := pv.Content[len(pv.Content)-1].(*mcp.TextContent)
			require.Contains(t, last.Text, fp, "the text block carries the token for content-only clients")

			args["fingerprint"] = fp
			first, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: payments.MCPConfirmTool, Arguments: args})
			require.NoError(t, err)
			require.False(t, first.IsError, "%+v", first.Content)
			transferID := structured(t, first)["transfer_id"]
			require.NotEmpty(t, transferID)
			require.Equal(t, 1, s.Payments.Executions())

			// The retry is a new request with a new id (the SDK numbers them).
			args["memo"] = "rent for May" // free text is not bound
			again, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: payments.MCPConfirmTool, Arguments: args})
			require.NoError(t, err)
			require.False(t, again.IsError)
			env := structured(t, again)
			require.Equal(t, "already_completed", env["status"])
			require.Equal(t, transferID, env["result_ref"])
			require.Equal(t, true, again.Meta["io.idemgate/replayed"])
			require.Equal(t, 1, s.Payments.Executions(), "one execution")

			args["amount"] = "2500.00"
			drift, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: payments.MCPConfirmTool, Arguments: args})
			require.NoError(t, err)
			require.True(t, drift.IsError, "a refusal is an isError tool result the model reads")
			require.Equal(t, "params_changed", structured(t, drift)["status"])
			require.Contains(t, drift.Content[0].(*mcp.TextContent).Text, "transfer_preview")
			require.Equal(t, 1, s.Payments.Executions())

			st, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "transfer_status", Arguments: map[string]any{"fingerprint": fp}})
			require.NoError(t, err)
			require.False(t, st.IsError)
			sc := structured(t, st)
			require.Equal(t, "completed", sc["status"])
			require.Equal(t, transferID, sc["result"].(map[string]any)["transfer_id"])
			require.True(t, strings.HasPrefix(fp, "ey"), "a fingerprint is base64url JSON")
		})
	}
}
