package main

import (
	"bytes"
	"strconv"
	"sync/atomic"

	"github.com/idemgate/idemgate/extproc/envelope"
	"github.com/idemgate/idemgate/extproc/mcp"
)

// The MCP side of the through-Envoy benchmark: the transfer operation as
// the MCP tool pair of envoy/idemgate.yaml (operations[transfer_mcp]) on the
// upstream's /mcp endpoint, called the way a 2026-07-28 client calls a tool:
// a JSON-RPC tools/call POST with Mcp-Method and Mcp-Name mirrored into
// headers, which lets idemgate decide at the request headers.
const (
	mcpPath            = "/mcp"
	mcpScope           = "payments.transfer.mcp"
	mcpProtocolVersion = "2026-07-28"
	mcpPreviewTool     = "transfer_preview"
	mcpConfirmTool     = "transfer_confirm"
	mcpStatusTool      = "transfer_status"
	// mcpUnguardedTool is a tool idemgate does not guard: its name is not
	// one of the operation's, so the call passes at the request headers.
	// The upstream answers it exactly as it answers the preview tool, so
	// the no-op column sending it prices the same upstream work.
	mcpUnguardedTool = "quote_lookup"
)

// mcpCallBody is a tools/call request with id and the tool's arguments (a
// JSON object).
func mcpCallBody(id int, tool string, args []byte) []byte {
	b := make([]byte, 0, len(args)+96)
	b = append(b, `{"jsonrpc":"2.0","id":`...)
	b = strconv.AppendInt(b, int64(id), 10)
	b = append(b, `,"method":"tools/call","params":{"name":"`...)
	b = append(b, tool...)
	b = append(b, `","arguments":`...)
	b = append(b, args...)
	return append(b, `}}`...)
}

// mcpHeaders are the request headers of a 2026-07-28 tools/call of tool.
func mcpHeaders(tool string) []string {
	return []string{
		"Accept", "application/json, text/event-stream",
		"Mcp-Protocol-Version", mcpProtocolVersion,
		"Mcp-Method", "tools/call",
		"Mcp-Name", tool,
	}
}

// mcpRequestID is the id mcpCallBody wrote into body (the client checks the
// answer carries it), or nil for a body that is not a tools/call.
func mcpRequestID(body []byte) []byte {
	const prefix = `{"jsonrpc":"2.0","id":`
	if !bytes.HasPrefix(body, []byte(prefix)) {
		return nil
	}
	rest := body[len(prefix):]
	end := bytes.IndexByte(rest, ',')
	if end < 0 {
		return nil
	}
	return rest[:end]
}

// mcpSource sends tools/calls of one tool with a fresh id per request:
// fixed arguments (the preview tool, the unguarded one; subjects
// round-robin), or the arguments of minted confirms (each once, or
// round-robin up to limit for replays: a retry after a lost answer is a
// new request with a new id).
type mcpSource struct {
	tool   string
	tokens []string // with args: the JWT of request i is tokens[i%len]
	args   []byte
	items  []confirmItem // else: each item's body is a confirm's arguments
	cycle  bool
	limit  uint64
	n      atomic.Uint64
}

func (s *mcpSource) Next(int) *httpRequest {
	i := s.n.Add(1) - 1
	if s.limit > 0 && i >= s.limit {
		return nil
	}
	r := &httpRequest{path: mcpPath, headers: mcpHeaders(s.tool)}
	if s.items == nil {
		r.auth, r.body = s.tokens[i%uint64(len(s.tokens))], mcpCallBody(int(i), s.tool, s.args)
		return r
	}
	if !s.cycle && i >= uint64(len(s.items)) {
		return nil
	}
	it := s.items[i%uint64(len(s.items))]
	r.auth, r.body = s.tokens[it.subject%subjectCount], mcpCallBody(int(i), s.tool, it.body)
	return r
}

// mcpPreviewBlock is the text block idemgate appends to the content of a
// signed transfer_preview result carrying token and expires: rendered with
// the packages idemgate renders it with (extproc/envelope's English
// catalogue, the benchmark config's language, with the operation's tool
// names and fingerprint field; extproc/mcp's preview block).
func mcpPreviewBlock(token, expires string) []byte {
	texts := envelope.MCPTexts("en", envelope.MCPTool{
		PreviewTool: mcpPreviewTool, ConfirmTool: mcpConfirmTool, StatusTool: mcpStatusTool, Field: "fingerprint",
	})
	return mcp.NewPreviewBlock(texts.PreviewBlock).Fill(token, expires)
}
