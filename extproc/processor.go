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
type processor struct {
	request         func(ex *exchange, body []byte, headersOnly bool) (*extprocv3.ProcessingResponse, bool)
	responseHeaders func(ex *exchange, h *extprocv3.HttpHeaders) (*extprocv3.ProcessingResponse, bool)
	responseBody    func(ex *exchange, body []byte) (*extprocv3.ProcessingResponse, bool)
}

var (
	// previewProcessor keeps the request's params, then signs a fingerprint
	// into a successful answer (preview.go).
	previewProcessor = &processor{
		request:         (*exchange).previewRequest,
		responseHeaders: (*exchange).previewResponseHeaders,
		responseBody:    (*exchange).previewResponseBody,
	}
	// confirmProcessor verifies and claims, then records the upstream's
	// answer (confirm.go).
	confirmProcessor = &processor{
		request:         (*exchange).confirmRequest,
		responseHeaders: (*exchange).confirmResponseHeaders,
		responseBody:    (*exchange).confirmResponseBody,
	}
	// statusProcessor answers the request itself; the upstream is never
	// called (status.go).
	statusProcessor = &processor{
		request:         (*exchange).statusRequest,
		responseHeaders: passResponseHeaders,
		responseBody:    passResponseBody,
	}
	// mcpProcessor reads the JSON-RPC message and runs one of the above on
	// a guarded tools/call's arguments (mcp_request.go, mcp_response.go).
	mcpProcessor = &processor{
		request:         (*exchange).mcpRequestBody,
		responseHeaders: (*exchange).mcpResponseHeaders,
		responseBody:    (*exchange).mcpResponseBody,
	}
	// passThrough is every stream's processor until its request headers
	// chose another: each message goes on unchanged.
	passThrough = &processor{
		request:         passRequest,
		responseHeaders: passResponseHeaders,
		responseBody:    passResponseBody,
	}
)

// processorFor is the processor of an operation's route.
func processorFor(k config.Kind) *processor {
	switch k {
	case config.KindPreview:
		return previewProcessor
	case config.KindConfirm:
		return confirmProcessor
	}
	return statusProcessor
}

func passRequest(*exchange, []byte, bool) (*extprocv3.ProcessingResponse, bool) {
	return requestBodyReply(nil), false
}

func passResponseHeaders(*exchange, *extprocv3.HttpHeaders) (*extprocv3.ProcessingResponse, bool) {
	return responseHeadersReply(nil, nil), false
}

func passResponseBody(*exchange, []byte) (*extprocv3.ProcessingResponse, bool) {
	return responseBodyReply(nil, nil, false), false
}
