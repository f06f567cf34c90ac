// Package floor holds the reference ext_proc servers idemgate is measured
// against: Noop, the protocol floor (CONTINUE to everything, nothing else),
// NoopBodyOnly, the same without the response headers (3 messages),
// Answer, the floor of an answer after the request body (two messages;
// a fixed answer, or idemgate's replay answer passed to NewAnswer),
// IO, the I/O floor (Noop plus exactly the store round trips of one
// first-time confirm), and Edit, the same-answer floor (Noop, but answering
// the response body with the mutations of idemgate's signed preview, fixed
// values spliced in by byte operations).
package floor

import (
	"errors"
	"io"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// The CONTINUE replies, built once: a reply with no CommonResponse is
// CONTINUE with no mutation. Sending shares them across streams, which is
// safe because messages are only read once built.
var (
	continueRequestHeaders = &extprocv3.ProcessingResponse{
		Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{}},
	}
	continueRequestBody = &extprocv3.ProcessingResponse{
		Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{}},
	}
	continueResponseHeaders = &extprocv3.ProcessingResponse{
		Response: &extprocv3.ProcessingResponse_ResponseHeaders{ResponseHeaders: &extprocv3.HeadersResponse{}},
	}
	continueResponseBody = &extprocv3.ProcessingResponse{
		Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: &extprocv3.BodyResponse{}},
	}
	continueRequestTrailers = &extprocv3.ProcessingResponse{
		Response: &extprocv3.ProcessingResponse_RequestTrailers{RequestTrailers: &extprocv3.TrailersResponse{}},
	}
	continueResponseTrailers = &extprocv3.ProcessingResponse{
		Response: &extprocv3.ProcessingResponse_ResponseTrailers{ResponseTrailers: &extprocv3.TrailersResponse{}},
	}
)

// continueFor returns the CONTINUE reply matching a message.
func continueFor(req *extprocv3.ProcessingRequest) (*extprocv3.ProcessingResponse, error) {
	switch req.GetRequest().(type) {
	case *extprocv3.ProcessingRequest_RequestHeaders:
		return continueRequestHeaders, nil
	case *extprocv3.ProcessingRequest_RequestBody:
		return continueRequestBody, nil
	case *extprocv3.ProcessingRequest_ResponseHeaders:
		return continueResponseHeaders, nil
	case *extprocv3.ProcessingRequest_ResponseBody:
		return continueResponseBody, nil
	case *extprocv3.ProcessingRequest_RequestTrailers:
		return continueRequestTrailers, nil
	case *extprocv3.ProcessingRequest_ResponseTrailers:
		return continueResponseTrailers, nil
	}
	return nil, status.Error(codes.InvalidArgument, "unknown ext_proc message")
}

// streamEnded reports a Recv error that is Envoy ending the stream normally.
func streamEnded(err error) bool {
	return errors.Is(err, io.EOF) || status.Code(err) == codes.Canceled
}

// Noop is the protocol floor: it answers every message with CONTINUE.
type Noop struct {
	extprocv3.UnimplementedExternalProcessorServer
}

var _ extprocv3.ExternalProcessorServer = Noop{}

// Process answers one stream.
func (Noop) Process(stream extprocv3.ExternalProcessor_ProcessServer) error {
	return answerEach(stream, func(req *extprocv3.ProcessingRequest) (*extprocv3.ProcessingResponse, bool, error) {
		resp, err := continueFor(req)
		return resp, false, err
	})
}

// answerEach runs a stream: reply answers each message and says whether
// its answer ends the stream; Envoy ending it is no error.
func answerEach(stream extprocv3.ExternalProcessor_ProcessServer, reply func(*extprocv3.ProcessingRequest) (*extprocv3.ProcessingResponse, bool, error)) error {
	for {
		req, err := stream.Recv()
		if err != nil {
			if streamEnded(err) {
				return nil
			}
			return err
		}
		resp, last, err := reply(req)
		if err != nil {
			return err
		}
		if err := stream.Send(resp); err != nil {
			if streamEnded(err) {
				return nil
			}
			return err
		}
		if last {
			return nil
		}
	}
}

// Answer is the protocol floor of an answer idemgate gives itself after
// the request body (a replay): CONTINUE to the request headers, then an
// ImmediateResponse to the request body. Two messages, no store call, no
// upstream call. The zero Answer sends a fixed one of its own (200, a short
// JSON body, Idempotent-Replayed: true); NewAnswer gives it another: the
// benchmark passes idemgate's own replay answer, so that floor prices the
// bytes idemgate sends (the same-answer floor of a replay).
type Answer struct {
	extprocv3.UnimplementedExternalProcessorServer
	reply *extprocv3.ProcessingResponse // nil: fixedAnswer
}

var _ extprocv3.ExternalProcessorServer = Answer{}

// NewAnswer returns the Answer floor that sends immediate to every request
// body.
func NewAnswer(immediate *extprocv3.ImmediateResponse) Answer {
	return Answer{reply: &extprocv3.ProcessingResponse{
		Response: &extprocv3.ProcessingResponse_ImmediateResponse{ImmediateResponse: immediate},
	}}
}

// fixedAnswer is the reply of the zero Answer, built once.
var fixedAnswer = &extprocv3.ProcessingResponse{
	Response: &extprocv3.ProcessingResponse_ImmediateResponse{ImmediateResponse: &extprocv3.ImmediateResponse{
		Status: &typev3.HttpStatus{Code: typev3.StatusCode_OK},
		Headers: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{
			{Header: &corev3.HeaderValue{Key: "content-type", RawValue: []byte("application/json")}},
			{Header: &corev3.HeaderValue{Key: "idempotent-replayed", RawValue: []byte("true")}},
		}},
		Body: []byte(`{"status":"already_completed","retryable":false}`),
	}},
}

// Process answers one stream.
func (a Answer) Process(stream extprocv3.ExternalProcessor_ProcessServer) error {
	reply := a.reply
	if reply == nil {
		reply = fixedAnswer
	}
	return answerEach(stream, func(req *extprocv3.ProcessingRequest) (*extprocv3.ProcessingResponse, bool, error) {
		if _, isBody := req.GetRequest().(*extprocv3.ProcessingRequest_RequestBody); isBody {
			return reply, true, nil
		}
		resp, err := continueFor(req)
		return resp, false, err
	})
}

// NoopBodyOnly is the protocol floor of a preview whose fingerprint lives
// in the body only (preview.fingerprint_header: false): like Noop, but its
// reply to the request headers switches the response headers off
// (mode_override, as idemgate does), so a request costs 3 messages.
type NoopBodyOnly struct {
	extprocv3.UnimplementedExternalProcessorServer
}

var _ extprocv3.ExternalProcessorServer = NoopBodyOnly{}

// bodyOnlyRequestHeaders is NoopBodyOnly's reply to the request headers,
// built once: the override idemgate sends (body modes explicit, since an
// omitted one means NONE).
var bodyOnlyRequestHeaders = &extprocv3.ProcessingResponse{
	Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{}},
	ModeOverride: &filterv3.ProcessingMode{
		ResponseHeaderMode:  filterv3.ProcessingMode_SKIP,
		RequestBodyMode:     filterv3.ProcessingMode_BUFFERED,
		ResponseBodyMode:    filterv3.ProcessingMode_BUFFERED,
		RequestTrailerMode:  filterv3.ProcessingMode_SKIP,
		ResponseTrailerMode: filterv3.ProcessingMode_SKIP,
	},
}

// Process answers one stream.
func (NoopBodyOnly) Process(stream extprocv3.ExternalProcessor_ProcessServer) error {
	return answerEach(stream, func(req *extprocv3.ProcessingRequest) (*extprocv3.ProcessingResponse, bool, error) {
		if _, isHeaders := req.GetRequest().(*extprocv3.ProcessingRequest_RequestHeaders); isHeaders {
			return bodyOnlyRequestHeaders, false, nil
		}
		resp, err := continueFor(req)
		return resp, false, err
	})
}
