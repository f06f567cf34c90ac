package payments

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sync/atomic"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// The MCP face of the demo payments service: POST /mcp (Streamable HTTP,
// built on the official Go SDK) serves two tools that do what the HTTP
// routes do, through the same validation, the same unique-key store and the
// same execution counter:
//
//	transfer_preview  quote a transfer (nothing executes)
//	transfer_confirm  execute it; honours the Idempotency-Key header like
//	                  POST /v1/transfers/confirm (a repeated key gets the
//	                  stored result back, nothing executes twice)
//
// The tools know nothing of fingerprints: their input schemas refuse unknown
// arguments, which is why idemgate takes the fingerprint out of a confirm
// before forwarding it. Answers are JSON by default; SetMCPStreaming(true)
// (or POST /_admin/mcp {"sse": true}) switches to an SSE stream per request,
// with a progress notification before the result when the client asked for
// progress. Faults apply to executing confirms as on the HTTP route;
// FailStatus becomes JSON-RPC error -32603 and ResetAfterExecute a response
// that ends without the result.

// MCPPath is where the MCP endpoint is mounted.
const MCPPath = "/mcp"

// MCP tool names.
const (
	MCPPreviewTool = "transfer_preview"
	MCPConfirmTool = "transfer_confirm"
)

// mcpTransferSchema is the input schema of both tools: the HTTP body's
// fields, nothing else.
var mcpTransferSchema = json.RawMessage(`{
  "type": "object",
  "properties": {
    "amount": {"type": ["string", "number"], "description": "Positive decimal with at most two decimal places, e.g. \"100.00\""},
    "currency": {"type": "string", "description": "ISO 4217 code, e.g. EUR"},
    "payee": {
      "type": "object",
      "properties": {"account_id": {"type": "string"}, "name": {"type": "string"}},
      "required": ["account_id"],
      "additionalProperties": false
    },
    "memo": {"type": "string", "description": "Free text shown to the payee"}
  },
  "required": ["amount", "currency", "payee"],
  "additionalProperties": false
}`)

// mcpArgs are the tools' arguments.
type mcpArgs struct {
	transferRequest
	Memo string `json:"memo,omitempty"`
}

// mcpFace holds the two Streamable HTTP handlers (JSON and SSE answers) and
// which one serves.
type mcpFace struct {
	json, sse http.Handler
	streaming atomic.Bool
}

func (s *Server) newMCP() *mcpFace {
	srv := mcp.NewServer(&mcp.Implementation{Name: "demo-payments", Version: "1.0.0"}, nil)
	srv.AddTool(&mcp.Tool{
		Name:        MCPPreviewTool,
		Description: "Quote a transfer: fee and total. Nothing is executed.",
		InputSchema: mcpTransferSchema,
	}, s.mcpPreview)
	srv.AddTool(&mcp.Tool{
		Name:        MCPConfirmTool,
		Description: "Execute a transfer previewed with " + MCPPreviewTool + ". Moves money.",
		InputSchema: mcpTransferSchema,
	}, s.mcpConfirm)
	get := func(*http.Request) *mcp.Server { return srv }
	// Stateless: every request stands alone (no Mcp-Session-Id to keep),
	// which 2026-07-28 requires and older clients accept.
	return &mcpFace{
		json: mcp.NewStreamableHTTPHandler(get, &mcp.StreamableHTTPOptions{Stateless: true, JSONResponse: true}),
		sse:  mcp.NewStreamableHTTPHandler(get, &mcp.StreamableHTTPOptions{Stateless: true}),
	}
}

func (f *mcpFace) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	cw := &cuttableWriter{ResponseWriter: w}
	r = r.WithContext(context.WithValue(r.Context(), cutKey{}, &cw.cut))
	if f.streaming.Load() {
		f.sse.ServeHTTP(cw, r)
		return
	}
	f.json.ServeHTTP(cw, r)
}

// cutKey carries a request's cut switch to the tool handler (the SDK passes
// the HTTP request's context values on to it).
type cutKey struct{}

// cuttableWriter loses everything written after its cut switch is on: the
// response then ends without the JSON-RPC result, as when a server closes
// its SSE stream in the middle of a call (the ResetAfterExecute fault of
// /mcp: the money has moved, the client never learns it).
type cuttableWriter struct {
	http.ResponseWriter
	cut atomic.Bool
}

func (c *cuttableWriter) Write(b []byte) (int, error) {
	if c.cut.Load() {
		return 0, http.ErrHandlerTimeout
	}
	return c.ResponseWriter.Write(b)
}

// Flush passes through, so SSE events before the cut reach the client.
func (c *cuttableWriter) Flush() {
	if f, ok := c.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// Unwrap lets http.ResponseController reach the real writer.
func (c *cuttableWriter) Unwrap() http.ResponseWriter { return c.ResponseWriter }

// SetMCPStreaming makes /mcp answer requests with an SSE stream (true) or
// one JSON object (false, the default).
func (s *Server) SetMCPStreaming(sse bool) { s.mcp.streaming.Store(sse) }

// parseArgs validates the arguments exactly like the HTTP body, refusing
// unknown ones (a strict upstream).
func parseArgs(raw json.RawMessage) (transfer, error) {
	var a mcpArgs
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	dec.DisallowUnknownFields()
	if err := dec.Decode(&a); err != nil {
		return transfer{}, fmt.Errorf("invalid arguments: %w", err)
	}
	cents, err := parseAmount(a.Amount)
	if err != nil {
		return transfer{}, err
	}
	if !currencyPattern.MatchString(a.Currency) {
		return transfer{}, fmt.Errorf("currency must be a three-letter upper-case ISO 4217 code")
	}
	if a.Payee == nil || a.Payee.AccountID == "" {
		return transfer{}, fmt.Errorf("payee.account_id is required")
	}
	return transfer{amountCents: cents, currency: a.Currency, accountID: a.Payee.AccountID, payeeName: a.Payee.Name}, nil
}

// toolResult carries body (a JSON object) as structuredContent and as text.
func toolResult(body []byte) *mcp.CallToolResult {
	return &mcp.CallToolResult{
		Content:           []mcp.Content{&mcp.TextContent{Text: string(body)}},
		StructuredContent: json.RawMessage(body),
	}
}

func toolError(err error) *mcp.CallToolResult {
	return &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: err.Error()}}}
}

func (s *Server) mcpPreview(_ context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	t, err := parseArgs(req.Params.Arguments)
	if err != nil {
		return toolError(err), nil
	}
	body, err := json.Marshal(s.quote(t))
	if err != nil {
		return nil, err
	}
	return toolResult(body), nil
}

func (s *Server) mcpConfirm(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	t, err := parseArgs(req.Params.Arguments)
	if err != nil {
		return toolError(err), nil
	}
	var key string
	if req.Extra != nil {
		key = req.Extra.Header.Get(IdempotencyKeyHeader)
	}
	s.mu.Lock()
	s.stats.Confirms++
	ignore := s.ignoreKeys
	s.mu.Unlock()
	if !ignore && key == "" {
		return toolError(fmt.Errorf("send an Idempotency-Key header")), nil
	}
	if token := req.Params.GetProgressToken(); token != nil && req.Session != nil {
		_ = req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: token, Progress: 0, Message: "executing"})
	}
	var entry *keyEntry
	if !ignore {
		var replay *Record
		entry, replay = s.reserve(ctx, key)
		if replay != nil {
			return toolResult(replay.Body), nil
		}
		if entry == nil {
			return nil, ctx.Err()
		}
	}
	s.mu.Lock()
	f := s.takeFaults()
	s.mu.Unlock()
	if f.FailStatus != 0 {
		s.release(key, entry)
		s.mu.Lock()
		s.stats.InjectedFailures++
		s.mu.Unlock()
		// An internal JSON-RPC error: nothing executed, but the client cannot
		// know that.
		return nil, &jsonrpc.Error{Code: -32603, Message: "fault injection: nothing was executed"}
	}
	if f.DelayBeforeExecute > 0 && !sleepCtx(ctx, f.DelayBeforeExecute) {
		s.release(key, entry)
		s.mu.Lock()
		s.stats.AbandonedBeforeExecute++
		s.mu.Unlock()
		return nil, ctx.Err()
	}
	rec := s.execute(t, key, entry)
	if f.DelayAfterExecute > 0 {
		sleepCtx(context.WithoutCancel(ctx), f.DelayAfterExecute)
	}
	if cut, ok := ctx.Value(cutKey{}).(*atomic.Bool); ok && f.ResetAfterExecute {
		s.mu.Lock()
		s.stats.InjectedResets++
		s.mu.Unlock()
		s.logger.Info("payments: MCP answer cut after execution", "transfer_id", rec.TransferID)
		cut.Store(true)
	}
	return toolResult(rec.Body), nil
}
