package mcp

import (
	"bytes"
	"slices"
	"strconv"
	"strings"

	"github.com/idemgate/idemgate/internal/jsonx"
)

// ReplayedKey marks a replayed tool result in its _meta.
const ReplayedKey = "io.idemgate/replayed"

// Stored is the recorded JSON-RPC response to a confirm, as a replay or a
// status answer shows it.
type Stored struct {
	raw, result, err []byte
}

// StoredOf reads a recorded response.
func StoredOf(raw []byte) Stored {
	ms, _ := jsonx.Members(raw)
	return Stored{raw: raw, result: jsonx.Lookup(ms, "result"), err: jsonx.Lookup(ms, "error")}
}

// EnvelopeResult is what an envelope carries as the original result: the
// result's structuredContent, or {"error": …} for a JSON-RPC error, or the
// record as it is when it is neither.
func (s Stored) EnvelopeResult() []byte {
	switch {
	case s.result != nil:
		return jsonx.MemberOf(s.result, "structuredContent")
	case s.err != nil:
		return jsonx.Edit(nil, nil, jsonx.Set{Key: "error", Raw: s.err})
	}
	return s.raw
}

// Task returns the recorded task handle, marked replayed, when the
// recorded result was one: every retry then polls the one task.
func (s Stored) Task() ([]byte, bool) {
	if rt, _ := jsonx.String(jsonx.MemberOf(s.result, "resultType")); rt != "task" {
		return nil, false
	}
	return jsonx.Edit(s.result, nil, jsonx.Set{Key: "_meta", Raw: ReplayedMeta(jsonx.MemberOf(s.result, "_meta"))}), true
}

// Content is the recorded result's content blocks.
func (s Stored) Content() [][]byte {
	blocks, _ := jsonx.Elements(jsonx.MemberOf(s.result, "content"))
	return blocks
}

// ReplayedMeta is a result's _meta with the replayed mark added.
func ReplayedMeta(meta []byte) []byte {
	if !jsonx.IsObject(meta) {
		meta = []byte("{}")
	}
	return jsonx.Edit(meta, nil, jsonx.Set{Key: ReplayedKey, Raw: []byte("true")})
}

// TextBlock appends a text content block.
func TextBlock(b []byte, text string) []byte {
	b = append(b, `{"type":"text","text":`...)
	b = jsonx.AppendString(b, text)
	return append(b, '}')
}

// Placeholders of a preview's text block, filled on every preview.
const (
	fingerprintPlaceholder = "{fingerprint}"
	expiresAtPlaceholder   = "{expires_at}"
)

// PreviewBlock is a preview's text block rendered once as JSON with its
// {fingerprint} and {expires_at} placeholders left in: JSON escaping keeps
// both as they are, and the values put in their place (base64url and dots,
// an RFC 3339 time) need no escaping, so each preview only copies bytes.
type PreviewBlock struct {
	template []byte
	text     string
}

// NewPreviewBlock renders the block of text (a preview text with both
// placeholders).
func NewPreviewBlock(text string) PreviewBlock {
	return PreviewBlock{template: TextBlock(nil, text), text: text}
}

// Fill returns the block with the fingerprint and its expiry in place of
// the placeholders: what TextBlock makes of the text with them replaced.
func (p PreviewBlock) Fill(fingerprint, expiresAt string) []byte {
	return p.AppendFilled(nil, fingerprint, expiresAt)
}

// AppendFilled is Fill appending the block to dst (a pooled buffer).
func (p PreviewBlock) AppendFilled(dst []byte, fingerprint, expiresAt string) []byte {
	if !jsonx.WrittenAsIs(fingerprint) || !jsonx.WrittenAsIs(expiresAt) {
		// Not a value idemgate signs; rendered the slow, general way.
		r := strings.NewReplacer(fingerprintPlaceholder, fingerprint, expiresAtPlaceholder, expiresAt)
		return TextBlock(dst, r.Replace(p.text))
	}
	out := slices.Grow(dst, len(p.template)+len(fingerprint)+len(expiresAt))
	t := p.template
	for {
		i := bytes.IndexByte(t, '{')
		if i < 0 {
			return append(out, t...)
		}
		out = append(out, t[:i]...)
		t = t[i:]
		switch {
		case bytes.HasPrefix(t, []byte(fingerprintPlaceholder)):
			out = append(out, fingerprint...)
			t = t[len(fingerprintPlaceholder):]
		case bytes.HasPrefix(t, []byte(expiresAtPlaceholder)):
			out = append(out, expiresAt...)
			t = t[len(expiresAtPlaceholder):]
		default:
			out = append(out, '{')
			t = t[1:]
		}
	}
}

// ToolResult is what an MCP client shows its model of an idemgate answer:
// a tool result (never a JSON-RPC error: clients turn errors into
// exceptions the model never sees) with structuredContent = envelope,
// content = one text block (text) followed by more, isError as given, and
// _meta marking a replay. Under protocol 2026-07-28 and later it says
// resultType complete.
func ToolResult(version string, envelope []byte, text string, isError, replayed bool, more [][]byte) []byte {
	content := make([][]byte, 0, 1+len(more))
	content = append(content, TextBlock(nil, text))
	content = append(content, more...)
	b := make([]byte, 0, len(envelope)*2+256)
	b = append(b, '{')
	if version >= HeaderVersion {
		b = append(b, `"resultType":"complete",`...)
	}
	b = append(b, `"content":`...)
	b = append(b, jsonx.AppendElements(nil, content...)...)
	b = append(b, `,"structuredContent":`...)
	b = append(b, envelope...)
	b = append(b, `,"isError":`...)
	b = strconv.AppendBool(b, isError)
	if replayed {
		b = append(b, `,"_meta":`...)
		b = append(b, ReplayedMeta(nil)...)
	}
	return append(b, '}')
}
