package extproc

import (
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	"github.com/idemgate/idemgate/extproc/config"
)

// A processor is what one kind of stream does with its messages once the
// request headers chose it (onRequestHeaders): decide the request, from its
// body or (headersOnly) from the headers alone when no body follows, then
// handle the upstream's response headers and body. Each answers like
// handle: the reply, and whether the stream ends with it. The end of a
// stream is no processor's business: what it settles depends on the claim
// alone (finish).
//
// The processors are a closed set dispatched by a switch per phase rather
// than func values or an interface: a call through either makes the
// exchange escape to the heap, one more allocation on every stream.
type processor uint8

const (
	// passThrough is every stream's processor until its request headers
	// chose another: each message goes on unchanged.
	passThrough processor = iota
	// previewProcessor keeps the request's params, then signs a fingerprint
	// into a successful answer (preview.go).
	previewProcessor
	// confirmProcessor verifies and claims, then records the upstream's
	// answer (confirm.go).
	confirmProcessor
	// statusProcessor answers the request itself; the upstream is never
	// called (status.go).
	statusProcessor
	// mcpProcessor reads the JSON-RPC message and runs one of the above on
	// a guarded tools/call's arguments (mcp_request.go, mcp_response.go).
	mcpProcessor
)

// processorFor is the processor of an operation's route.
func processorFor(k config.Kind) processor {
	switch k {
	case config.KindPreview:
		return previewProcessor
	case config.KindConfirm:
		return confirmProcessor
	}
	return statusProcessor
}

func (p processor) request(ex *exchange, body []byte, headersOnly bool) (*extprocv3.ProcessingResponse, bool) {
	switch p {
	case previewProcessor:
		return ex.previewRequest(body, headersOnly)
	case confirmProcessor:
		return ex.confirmRequest(body, headersOnly)
	case statusProcessor:
		return ex.statusRequest(body, headersOnly)
	case mcpProcessor:
		return ex.mcpRequestBody(body, headersOnly)
	}
	return requestBodyReply(nil), false
}

func (p processor) responseHeaders(ex *exchange, h *extprocv3.HttpHeaders) (*extprocv3.ProcessingResponse, bool) {
	switch p {
	case previewProcessor:
		return ex.previewResponseHeaders(h)
	case confirmProcessor:
		return ex.confirmResponseHeaders(h)
	case mcpProcessor:
		return ex.mcpResponseHeaders(h)
	}
	// Pass-through, and status (answered at the request: the upstream is
	// never called).
	return responseHeadersReply(nil, nil), false
}

func (p processor) responseBody(ex *exchange, body []byte) (*extprocv3.ProcessingResponse, bool) {
	switch p {
	case previewProcessor:
		return ex.previewResponseBody(body)
	case confirmProcessor:
		return ex.confirmResponseBody(body)
	case mcpProcessor:
		return ex.mcpResponseBody(body)
	}
	return responseBodyReply(nil, nil, false), false
}
