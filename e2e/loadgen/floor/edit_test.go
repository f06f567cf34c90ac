package floor

import (
	"encoding/json"
	"io"
	"strconv"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	"github.com/idemgate/idemgate/extproc/envelope"
	"github.com/idemgate/idemgate/extproc/mcp"
	"github.com/idemgate/idemgate/internal/extprocdriver"
	"github.com/idemgate/idemgate/internal/jsonx"
)

// Answers laid out as the benchmark's upstream writes them (compact JSON;
// an MCP result with content first, then structuredContent, then isError).
const (
	editQuote     = `{"quote_id":"qt_1","amount":"1250.00","payee":{"account_id":"DE89","name":"Müller"},"fx_rate":null,"warnings":[]}`
	editMCPAnswer = `{"jsonrpc":"2.0","id":7,"result":{"content":[{"type":"text","text":"Quote qt_1: 1250.00 EUR {to} [Müller]."}],"structuredContent":` +
		editQuote + `,"isError":false}}`
	editToken   = "eyJ2IjoxLCJrIjoiazEifQ.c2lnbmF0dXJl"
	editMCPTok  = "eyJ2IjoxLCJrIjoiazEiLCJzIjoibWNwIn0.c2lnbmF0dXJl"
	editExpires = "2026-05-01T09:27:44Z"
)

// editBlock is the text block idemgate appends, rendered with its own
// packages as extproc does for the benchmark's MCP operation.
func editBlock() []byte {
	texts := envelope.MCPTexts("en", envelope.MCPTool{PreviewTool: "transfer_preview", ConfirmTool: "transfer_confirm", StatusTool: "transfer_status", Field: "fingerprint"})
	return mcp.NewPreviewBlock(texts.PreviewBlock).Fill(editMCPTok, editExpires)
}

func newTestEdit(t *testing.T) *Edit {
	t.Helper()
	s, err := NewEdit(EditOptions{Token: editToken, MCPToken: editMCPTok, Expires: editExpires, MCPBlock: editBlock()})
	require.NoError(t, err)
	return s
}

func editRequest(path, answer string) *extprocdriver.Request {
	return &extprocdriver.Request{
		Headers: []*corev3.HeaderValue{
			hv(":authority", "api.payments.example"), hv(":path", path), hv(":method", "POST"),
			hv(":scheme", "https"), hv("content-type", "application/json"), hv("content-length", "2"),
		},
		Body:           []byte(`{}`),
		UpstreamStatus: 200,
		ResponseHeaders: []*corev3.HeaderValue{
			hv(":status", "200"), hv("content-type", "application/json"), hv("content-length", strconv.Itoa(len(answer))),
		},
		ResponseBody: []byte(answer),
	}
}

// TestEditSignsHTTPPreviewsLikeIdemgate: an HTTP preview's answer is
// idemgate's own splice of the two members (jsonx.Splice, as
// previewResponseBody does) byte for byte, with idempotency-fingerprint and
// content-length set through raw_value; the request messages and the
// response headers get CONTINUE with nothing changed.
func TestEditSignsHTTPPreviewsLikeIdemgate(t *testing.T) {
	conns := serve(t, newTestEdit(t))
	want, err := jsonx.Splice(nil, []byte(editQuote),
		jsonx.Set{Key: "fingerprint", Text: editToken}, jsonx.Set{Key: "fingerprint_expires_at", Text: editExpires})
	require.NoError(t, err)
	for i := 0; i < 3; i++ {
		out, v := extprocdriver.EnvoyFilter().Trace(t.Context(), conns.Next(), editRequest("/v1/transfers/preview", editQuote), nil)
		require.Equal(t, extprocdriver.Outcome{Status: 200, Marks: extprocdriver.MarkResponseHeaders | extprocdriver.MarkResponseBody}, out,
			"only the response headers and body changed, through raw_value")
		require.Equal(t, 4, v.Replies)
		require.True(t, v.UpstreamCalled)
		require.Equal(t, []byte(`{}`), v.UpstreamBody)
		require.Equal(t, string(want), string(v.Body))
		require.Equal(t, editToken, v.Headers["idempotency-fingerprint"])
		require.Equal(t, strconv.Itoa(len(want)), v.Headers["content-length"])

		var doc map[string]any
		require.NoError(t, json.Unmarshal(v.Body, &doc))
		require.Equal(t, editToken, doc["fingerprint"])
		require.Equal(t, editExpires, doc["fingerprint_expires_at"])
		require.Equal(t, "qt_1", doc["quote_id"])
	}
}

// TestEditSignsMCPPreviewsLikeIdemgate: an MCP preview's answer is what
// idemgate's own injection (mcp.PreviewOf(...).AppendInjected, as
// mcpInjectPreview does) makes of it, byte for byte: the members in
// structuredContent, the block last in content, content-length set and no
// header otherwise, a valid JSON-RPC result for the request's id.
func TestEditSignsMCPPreviewsLikeIdemgate(t *testing.T) {
	conns := serve(t, newTestEdit(t))
	msg, err := mcp.ReadMessage([]byte(editMCPAnswer))
	require.NoError(t, err)
	res, ok := mcp.PreviewOf(msg)
	require.True(t, ok)
	want := res.AppendInjected(nil, []jsonx.Set{{Key: "fingerprint", Text: editMCPTok}, {Key: "fingerprint_expires_at", Text: editExpires}}, editBlock())
	for _, path := range []string{"/mcp", "/mcp?session=1"} {
		out, v := extprocdriver.EnvoyFilter().Trace(t.Context(), conns.Next(), editRequest(path, editMCPAnswer), nil)
		require.Equal(t, extprocdriver.Outcome{Status: 200, Marks: extprocdriver.MarkResponseHeaders | extprocdriver.MarkResponseBody}, out, path)
		require.Equal(t, 4, v.Replies)
		require.Equal(t, string(want), string(v.Body), path)
		require.Equal(t, strconv.Itoa(len(want)), v.Headers["content-length"])
		require.NotContains(t, v.Headers, "idempotency-fingerprint", "idemgate sets no header on an MCP preview")

		var msg struct {
			JSONRPC string `json:"jsonrpc"`
			ID      int    `json:"id"`
			Result  struct {
				Content []struct {
					Type, Text string
				} `json:"content"`
				StructuredContent map[string]any `json:"structuredContent"`
				IsError           bool           `json:"isError"`
			} `json:"result"`
		}
		require.NoError(t, json.Unmarshal(v.Body, &msg))
		require.Equal(t, "2.0", msg.JSONRPC)
		require.Equal(t, 7, msg.ID)
		require.Equal(t, editMCPTok, msg.Result.StructuredContent["fingerprint"])
		require.Equal(t, editExpires, msg.Result.StructuredContent["fingerprint_expires_at"])
		require.Equal(t, "qt_1", msg.Result.StructuredContent["quote_id"])
		require.Len(t, msg.Result.Content, 2)
		require.Equal(t, "text", msg.Result.Content[1].Type)
		require.Contains(t, msg.Result.Content[1].Text, editMCPTok)
		require.False(t, msg.Result.IsError)
	}
}

// TestEditBodyOnlyAnswersInThreeMessages: with BodyOnly the floor switches
// the response headers off at the request headers (as idemgate does for
// mcp.preview_response_headers: false) and answers the response body with
// the same bytes as idemgate and no header: Envoy has sent the headers
// already, so it would drop any header set now.
func TestEditBodyOnlyAnswersInThreeMessages(t *testing.T) {
	s, err := NewEdit(EditOptions{Token: editToken, MCPToken: editMCPTok, Expires: editExpires, MCPBlock: editBlock(), BodyOnly: true})
	require.NoError(t, err)
	conns := serve(t, s)
	msg, err := mcp.ReadMessage([]byte(editMCPAnswer))
	require.NoError(t, err)
	res, ok := mcp.PreviewOf(msg)
	require.True(t, ok)
	want := res.AppendInjected(nil, []jsonx.Set{{Key: "fingerprint", Text: editMCPTok}, {Key: "fingerprint_expires_at", Text: editExpires}}, editBlock())
	filter := extprocdriver.EnvoyFilter()
	filter.ResponseCode = true
	out, v := filter.Trace(t.Context(), conns.Next(), editRequest("/mcp", editMCPAnswer), nil)
	require.Equal(t, extprocdriver.Outcome{Status: 200, Marks: extprocdriver.MarkModeOverride | extprocdriver.MarkResponseBody}, out,
		"the response headers switched off, the body replaced, no header set that Envoy would drop")
	require.Equal(t, 3, v.Replies)
	require.Equal(t, string(want), string(v.Body))
}

// TestEditPassesWhatItCannotPlace: a body without the layout the byte
// operations rely on is passed through unchanged (the benchmark then
// counts the answer as unsigned, an error).
func TestEditPassesWhatItCannotPlace(t *testing.T) {
	conns := serve(t, newTestEdit(t))
	for _, tc := range []struct{ path, body string }{
		{"/v1/transfers/preview", `["not an object"]`},
		{"/mcp", `{"jsonrpc":"2.0","id":1,"error":{"code":-32602,"message":"bad"}}`},
		{"/mcp", editQuote},
	} {
		out, v := extprocdriver.EnvoyFilter().Trace(t.Context(), conns.Next(), editRequest(tc.path, tc.body), nil)
		require.Equal(t, extprocdriver.Outcome{Status: 200}, out, tc.body)
		require.Equal(t, tc.body, string(v.Body))
	}
}

func TestNewEditNeedsItsValues(t *testing.T) {
	_, err := NewEdit(EditOptions{Token: editToken, Expires: editExpires})
	require.Error(t, err)
}

// TestEditEndsTheStreamAfterItsLastReply: like idemgate, the server closes
// the stream (OK) once it has answered the response body, without waiting
// for Envoy to close its side; each earlier message gets an empty CONTINUE.
func TestEditEndsTheStreamAfterItsLastReply(t *testing.T) {
	conns := serve(t, newTestEdit(t))
	st, err := conns.Next().Process(t.Context())
	require.NoError(t, err)
	hm := func(hs ...*corev3.HeaderValue) *corev3.HeaderMap { return &corev3.HeaderMap{Headers: hs} }
	for _, req := range []*extprocv3.ProcessingRequest{
		{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: hm(hv(":path", "/v1/transfers/preview"))}}},
		{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: []byte(`{}`), EndOfStream: true}}},
		{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{Headers: hm(hv(":status", "200"))}}},
	} {
		require.NoError(t, st.Send(req))
		resp, err := st.Recv()
		require.NoError(t, err)
		want, err := continueFor(req)
		require.NoError(t, err)
		require.True(t, proto.Equal(want, resp), "an empty CONTINUE: %v", resp)
	}
	require.NoError(t, st.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{
		ResponseBody: &extprocv3.HttpBody{Body: []byte(editQuote), EndOfStream: true}}}))
	resp, err := st.Recv()
	require.NoError(t, err)
	require.NotNil(t, resp.GetResponseBody().GetResponse().GetBodyMutation())
	_, err = st.Recv()
	require.ErrorIs(t, err, io.EOF, "the server ended the stream")
}
