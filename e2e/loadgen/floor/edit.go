package floor

import (
	"bytes"
	"errors"
	"sync"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	"github.com/idemgate/idemgate/extproc/bodyreply"
)

// EditOptions configure an Edit floor: the fixed values it writes into
// every answer, which a preview of idemgate signs and renders anew.
type EditOptions struct {
	// Token is the fingerprint of an HTTP preview (the
	// Idempotency-Fingerprint header and the body member).
	Token string
	// MCPToken is the fingerprint of an MCP preview (default: Token).
	// idemgate's MCP operation has its own scope, so its tokens are a few
	// bytes longer.
	MCPToken string
	// Expires is the expiry member's value (RFC 3339, as idemgate writes it).
	Expires string
	// MCPBlock is the text block appended to an MCP result's content: the
	// JSON object {"type":"text","text":"..."} carrying MCPToken.
	MCPBlock []byte
	// Field names the fingerprint member (default "fingerprint"); the
	// expiry member is Field + "_expires_at", as idemgate names it.
	Field string
	// MCPPath is the MCP endpoint (default "/mcp"); every other path is
	// answered as an HTTP preview.
	MCPPath string
	// BodyOnly makes it the same-answer floor of a preview in 3 messages
	// (mcp.preview_response_headers: false, preview.fingerprint_header:
	// false): its reply to the request headers switches the response
	// headers off, as NoopBodyOnly's and idemgate's do, and its reply to the
	// response body sets no header (the headers have left; Envoy sends the
	// new body chunked).
	BodyOnly bool
}

// Edit is the same-answer floor: it sends the mutations idemgate sends
// for a signed preview, with none of idemgate's work (no JSON parsing, no
// hashing, no signing, no store). Like Noop it answers the request headers,
// the request body and the response headers with CONTINUE (4 messages);
// to the response body:
//
//   - on an HTTP path, a body mutation that is the upstream's JSON object
//     with the fingerprint and expiry members inserted before its last '}',
//     and header mutations setting idempotency-fingerprint and the new
//     content-length (idemgate's reply, built by the same bodyreply.Reply);
//   - on the MCP path, a body mutation with the two members inserted at the
//     end of result.structuredContent and the text block appended to
//     result.content, and content-length set.
//
// and, as idemgate does after its last reply, it then ends the stream
// itself (OK) rather than waiting for Envoy to close it as Noop does. With
// EditOptions.BodyOnly it does the same in 3 messages (see there).
//
// The byte operations find their places by the layout of the benchmark's
// upstream (e2e/loadgen/upstream.go), not by parsing: a body they do not
// fit is passed through unchanged, which the benchmark counts as an error.
type Edit struct {
	extprocv3.UnimplementedExternalProcessorServer
	token, mcpToken []byte // header values, shared by every reply
	members         []byte // ,"fingerprint":"…","fingerprint_expires_at":"…"
	mcpMembers      []byte // the same with MCPToken
	mcpBlock        []byte
	mcpPath         string
	bodyOnly        bool
	buffers         sync.Pool // of *[]byte: a reply's new body, until sent
}

var _ extprocv3.ExternalProcessorServer = (*Edit)(nil)

// NewEdit builds everything fixed of the answers once.
func NewEdit(o EditOptions) (*Edit, error) {
	if o.Token == "" || o.Expires == "" || len(o.MCPBlock) == 0 {
		return nil, errors.New("the edit floor needs a token, an expiry and an MCP text block")
	}
	if o.MCPToken == "" {
		o.MCPToken = o.Token
	}
	if o.Field == "" {
		o.Field = "fingerprint"
	}
	if o.MCPPath == "" {
		o.MCPPath = "/mcp"
	}
	members := func(token string) []byte {
		return []byte(`,"` + o.Field + `":"` + token + `","` + o.Field + `_expires_at":"` + o.Expires + `"`)
	}
	return &Edit{
		token: []byte(o.Token), mcpToken: []byte(o.MCPToken),
		members: members(o.Token), mcpMembers: members(o.MCPToken),
		mcpBlock: bytes.Clone(o.MCPBlock), mcpPath: o.MCPPath, bodyOnly: o.BodyOnly,
	}, nil
}

// Header names, lower case as Envoy hands them over.
const (
	hdrPath        = ":path"
	hdrFingerprint = "idempotency-fingerprint"
)

// The anchors of the MCP upstream's result: content comes first and ends
// right before structuredContent, which ends right before isError.
var (
	mcpContentStart = []byte(`"content":[`)
	mcpStructured   = []byte(`,"structuredContent":{`)
	mcpIsError      = []byte(`,"isError":`)
)

// Process answers one stream.
func (s *Edit) Process(stream extprocv3.ExternalProcessor_ProcessServer) error {
	var (
		mcp   bool
		reply bodyreply.Reply // the stream's one response-body reply, built as idemgate builds its own
		buf   *[]byte
	)
	defer func() {
		if buf != nil {
			s.buffers.Put(buf)
		}
	}()
	return answerEach(stream, func(req *extprocv3.ProcessingRequest) (*extprocv3.ProcessingResponse, bool, error) {
		switch r := req.GetRequest().(type) {
		case *extprocv3.ProcessingRequest_RequestHeaders:
			mcp = s.isMCP(r.RequestHeaders.GetHeaders())
			if s.bodyOnly {
				return bodyOnlyRequestHeaders, false, nil
			}
		case *extprocv3.ProcessingRequest_ResponseBody:
			if buf == nil {
				buf, _ = s.buffers.Get().(*[]byte)
				if buf == nil {
					buf = new([]byte)
				}
			}
			body := r.ResponseBody.GetBody()
			var out []byte
			if mcp {
				out = s.editMCP((*buf)[:0], body)
			} else {
				out = s.editHTTP((*buf)[:0], body)
			}
			if out == nil {
				return continueResponseBody, true, nil
			}
			*buf = out
			reply.Reset()
			if !s.bodyOnly {
				if !mcp {
					reply.SetHeader(hdrFingerprint, s.token)
				}
				reply.SetContentLength(len(out))
			}
			return reply.Message(out, true), true, nil
		}
		resp, err := continueFor(req)
		return resp, false, err
	})
}

// isMCP reports whether the request's :path is the MCP endpoint (a query
// string aside).
func (s *Edit) isMCP(hm *corev3.HeaderMap) bool {
	for _, h := range hm.GetHeaders() {
		if h.GetKey() != hdrPath {
			continue
		}
		p := h.RawValue
		if len(p) == 0 {
			p = []byte(h.GetValue())
		}
		if i := bytes.IndexByte(p, '?'); i >= 0 {
			p = p[:i]
		}
		return string(p) == s.mcpPath
	}
	return false
}

// editHTTP appends to dst the JSON object body with the members inserted
// before its last '}' (nil when body has none).
func (s *Edit) editHTTP(dst, body []byte) []byte {
	i := bytes.LastIndexByte(body, '}')
	if i < 0 {
		return nil
	}
	dst = append(dst, body[:i]...)
	dst = append(dst, s.members...)
	return append(dst, body[i:]...)
}

// editMCP appends to dst the JSON-RPC response body with the block
// appended to result.content and the members inserted at the end of
// result.structuredContent (nil when body is not laid out as the
// upstream's).
func (s *Edit) editMCP(dst, body []byte) []byte {
	c := bytes.Index(body, mcpContentStart)
	sc := bytes.Index(body, mcpStructured)
	ie := bytes.LastIndex(body, mcpIsError)
	if c < 0 || sc < c || ie < sc || body[sc-1] != ']' || body[ie-1] != '}' {
		return nil
	}
	contentEnd, scEnd := sc-1, ie-1 // the ']' and the '}' closing them
	dst = append(dst, body[:contentEnd]...)
	if contentEnd > c+len(mcpContentStart) {
		dst = append(dst, ',')
	}
	dst = append(dst, s.mcpBlock...)
	dst = append(dst, body[contentEnd:scEnd]...)
	dst = append(dst, s.mcpMembers...)
	return append(dst, body[scEnd:]...)
}
