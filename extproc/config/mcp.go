package config

import (
	"fmt"
	"strings"

	"github.com/idemgate/idemgate/extproc/route"
)

// MCPSpec is operations[].mcp as written: the operation is a pair of tools
// of an MCP server reached over Streamable HTTP (docs/design.md §9), plus a
// status tool idemgate answers itself.
type MCPSpec struct {
	// Endpoint is the MCP endpoint's path (POST), e.g. /mcp.
	Endpoint string `yaml:"endpoint"`
	// PreviewTool is the upstream's quoting tool: its successful results
	// get a fingerprint.
	PreviewTool string `yaml:"preview_tool"`
	// ConfirmTool is the upstream's executing tool: it runs once per
	// fingerprint.
	ConfirmTool string `yaml:"confirm_tool"`
	// StatusTool is answered by idemgate and appended to tools/list.
	StatusTool string `yaml:"status_tool"`
	// TrustUpstreamHeaders lets idemgate decide a 2026-07-28 request from
	// its Mcp-Method and Mcp-Name headers alone and pass a call it does not
	// guard without reading the body. Safe only with an MCP server that
	// refuses a body disagreeing with those headers (the specification
	// requires it; an older or hand-written server may not check), so off
	// by default: idemgate then reads every request body on the endpoint.
	TrustUpstreamHeaders bool `yaml:"trust_upstream_headers"`
	// PreviewResponseHeaders (default true) sends idemgate the preview
	// tool's response headers. false: a 2026-07-28 call of the preview tool
	// (its Mcp-Name header names it) skips that ext_proc message, one of
	// four, and idemgate reads the upstream's status from Envoy's
	// response.code attribute, which the filter must then send (idemgate
	// envoy-config asks for it). An MCP preview's fingerprint lives in the
	// result alone, so nothing else is lost (docs/performance.md "Fewer
	// messages per stream").
	PreviewResponseHeaders *bool `yaml:"preview_response_headers"`
}

// MCPTools is the compiled mcp block of an operation.
type MCPTools struct {
	Endpoint    string
	PreviewTool string
	ConfirmTool string
	StatusTool  string
	// TrustUpstreamHeaders is mcp.trust_upstream_headers.
	TrustUpstreamHeaders bool
	// PreviewStatusFromAttribute: mcp.preview_response_headers is false, so
	// a preview call named by its Mcp-Name header skips its response
	// headers and reads the status from response.code.
	PreviewStatusFromAttribute bool
}

// MCPEndpoint is one MCP endpoint path with every guarded tool on it.
type MCPEndpoint struct {
	Path string
	// Tools maps a tool name to its operation and role (preview, confirm or
	// status).
	Tools map[string]Target
	// Ops lists the endpoint's operations in configured order (tools/list
	// appends their status tools in this order).
	Ops []*Operation
	// TrustUpstreamHeaders: every operation on the endpoint set
	// mcp.trust_upstream_headers (one that did not keeps the body read).
	TrustUpstreamHeaders bool
}

// MCPEndpoint returns the MCP endpoint a request goes to, or nil. Only POST
// carries JSON-RPC messages: GET and DELETE (the 2025-era standalone stream
// and session end) are never idemgate's business.
func (rt *Runtime) MCPEndpoint(method, path string) *MCPEndpoint {
	if len(rt.MCPEndpoints) == 0 || method != "POST" {
		return nil
	}
	return rt.MCPEndpoints[route.StripQuery(path)]
}

// mcpTools checks the tool names of an MCP operation and makes the preview
// and status tools the names its envelopes mention. The top-level
// preview_tool and status_tool belong to HTTP operations; an MCP operation
// names its tools once, under mcp.
func (c *compiler) mcpTools(op *Operation, o *OperationSpec, at func(...any) []any) {
	m := o.MCP
	if o.PreviewTool != "" {
		c.errorf(at("preview_tool"), "an MCP operation names its tools under mcp: use mcp.preview_tool")
	}
	if o.StatusTool != "" {
		c.errorf(at("status_tool"), "an MCP operation names its tools under mcp: use mcp.status_tool")
	}
	seen := map[string]string{}
	for _, t := range []struct{ key, name, what string }{
		{"preview_tool", m.PreviewTool, "the upstream tool that quotes (its results get the fingerprint)"},
		{"confirm_tool", m.ConfirmTool, "the upstream tool that executes (once per fingerprint)"},
		{"status_tool", m.StatusTool, "the tool idemgate answers itself and adds to tools/list"},
	} {
		switch {
		case t.name == "":
			c.errorf(at("mcp", t.key), "required: %s", t.what)
		case !toolNamePattern.MatchString(t.name):
			c.errorf(at("mcp", t.key), "invalid tool name %q (1-128 characters of A-Z a-z 0-9 _ . : / -)", t.name)
		default:
			if first, dup := seen[t.name]; dup {
				c.errorf(at("mcp", t.key), "tool %q is already mcp.%s: the three tools must differ", t.name, first)
			}
			seen[t.name] = t.key
		}
	}
	op.PreviewTool, op.StatusTool = m.PreviewTool, m.StatusTool
}

// mcpOperation checks what an MCP operation cannot have and compiles its mcp
// block. result_ref is a path inside the tool result's structuredContent;
// the stored result is the whole JSON-RPC response, so the compiled path is
// prefixed with result.structuredContent.
func (c *compiler) mcpOperation(op *Operation, o *OperationSpec, at func(...any) []any) {
	m := o.MCP
	tools := &MCPTools{Endpoint: m.Endpoint, PreviewTool: m.PreviewTool, ConfirmTool: m.ConfirmTool, StatusTool: m.StatusTool,
		TrustUpstreamHeaders: m.TrustUpstreamHeaders}
	if h := m.PreviewResponseHeaders; h != nil {
		tools.PreviewStatusFromAttribute = !*h
	}
	switch {
	case m.Endpoint == "":
		c.errorf(at("mcp", "endpoint"), "required: the MCP endpoint's path, e.g. /mcp")
	case !strings.HasPrefix(m.Endpoint, "/") || strings.ContainsAny(m.Endpoint, "?#{}"):
		c.errorf(at("mcp", "endpoint"), "invalid endpoint %q: a path starting with / without query or {variables}", m.Endpoint)
	default:
		if _, err := route.ParseTemplate(m.Endpoint); err != nil {
			c.errorf(at("mcp", "endpoint"), "invalid endpoint %q: %v", m.Endpoint, err)
		}
	}
	if o.Replay == "raw" {
		c.errorf(at("replay"), "an MCP operation always replays as a tool result (replay: raw would send the original JSON-RPC id, which the client no longer waits for)")
	}
	for j, prm := range o.Params {
		if strings.HasPrefix(prm.Path, "path.") {
			c.errorf(at("params", j), "%s: an MCP operation has no path variables; params are paths inside params.arguments", prm.Path)
		}
	}
	if len(op.ResultRef) > 0 {
		op.ResultRef = append([]string{"result", "structuredContent"}, op.ResultRef...)
	}
	op.MCP = tools
}

// mcpEndpoints groups the MCP operations by endpoint. Several operations may
// share one endpoint (one MCP server with several tool pairs) but not a tool
// name, and an endpoint must not also be an HTTP route.
func (c *compiler) mcpEndpoints(ops []*Operation, routes *route.Table[Target]) map[string]*MCPEndpoint {
	var out map[string]*MCPEndpoint
	for i, op := range ops {
		if op.MCP == nil || op.MCP.Endpoint == "" {
			continue
		}
		at := func(segs ...any) []any { return append(p("operations", i), segs...) }
		ep := out[op.MCP.Endpoint]
		if ep == nil {
			if routes != nil {
				if t, _, hit := routes.Match("POST", op.MCP.Endpoint); hit {
					c.errorf(at("mcp", "endpoint"), "POST %s is also the %s route of operation %q", op.MCP.Endpoint, t.Kind, t.Op.Name)
					continue
				}
			}
			if out == nil {
				out = map[string]*MCPEndpoint{}
			}
			ep = &MCPEndpoint{Path: op.MCP.Endpoint, Tools: map[string]Target{}, TrustUpstreamHeaders: true}
			out[op.MCP.Endpoint] = ep
		}
		ep.Ops = append(ep.Ops, op)
		ep.TrustUpstreamHeaders = ep.TrustUpstreamHeaders && op.MCP.TrustUpstreamHeaders
		for _, t := range []struct {
			key, name string
			kind      Kind
		}{
			{"preview_tool", op.MCP.PreviewTool, KindPreview},
			{"confirm_tool", op.MCP.ConfirmTool, KindConfirm},
			{"status_tool", op.MCP.StatusTool, KindStatus},
		} {
			if t.name == "" {
				continue
			}
			if prev, dup := ep.Tools[t.name]; dup && prev.Op != op {
				c.errorf(at("mcp", t.key), "tool %q on %s is already a tool of operation %q", t.name, ep.Path, prev.Op.Name)
				continue
			}
			ep.Tools[t.name] = Target{Op: op, Kind: t.kind}
		}
	}
	return out
}

// writeMCPSummary explains an MCP operation in check-config's summary: what
// idemgate does with each of its tools.
func writeMCPSummary(b *strings.Builder, op *Operation, downstream string) {
	m := op.MCP
	fmt.Fprintf(b, "    mcp      POST %s (tools/list: %s gains a required %s argument, %s is added)\n", m.Endpoint, m.ConfirmTool, op.FingerprintField, m.StatusTool)
	fmt.Fprintf(b, "    preview  tool %s  successful results get %s in structuredContent and a text block\n", m.PreviewTool, op.FingerprintField)
	if m.PreviewStatusFromAttribute {
		b.WriteString("             its response headers skipped: the status is Envoy's response.code (3 ext_proc messages)\n")
	}
	if op.HonoursKeys() {
		downstream += fmt.Sprintf(" and params._meta[%q]", MCPIdempotencyMetaKey)
	}
	fmt.Fprintf(b, "    confirm  tool %s  %s, once per fingerprint\n", m.ConfirmTool, downstream)
	fmt.Fprintf(b, "    status   tool %s  answered by idemgate, poll after %s\n", m.StatusTool, op.PollAfter)
}

// MCPIdempotencyMetaKey is the params._meta key that carries the nonce to
// an MCP upstream beside the Idempotency-Key header (docs/design.md §9).
const MCPIdempotencyMetaKey = "io.idemgate/idempotency-key"
