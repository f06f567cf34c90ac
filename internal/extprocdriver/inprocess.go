package extprocdriver

import (
	"context"
	"io"
	"sync"
	"sync/atomic"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// InProcess is a Client that serves each stream by calling Server.Process
// in a goroutine, the two sides joined by channels: no gRPC, no sockets.
type InProcess struct {
	Server extprocv3.ExternalProcessorServer
	// ShareReplies hands the client the server's reply itself instead of a
	// copy. gRPC copies a reply by serialising it, so a server may reuse its
	// memory once Send returned; sharing is only for sequential benchmarks
	// that read each reply before sending the next message (their
	// allocation counts are then the server's, not a copy's).
	ShareReplies bool
}

var _ Client = (*InProcess)(nil)

// Process opens a stream (Client).
func (p *InProcess) Process(ctx context.Context, _ ...grpc.CallOption) (extprocv3.ExternalProcessor_ProcessClient, error) {
	return p.Open(ctx), nil
}

// Open starts Server.Process on a new stream and returns Envoy's end of it.
// Cancelling ctx (or Close) resets the stream: the server's context ends.
func (p *InProcess) Open(ctx context.Context) *Stream {
	ctx, cancel := context.WithCancel(ctx)
	s := &Stream{
		ctx:    ctx,
		cancel: cancel,
		in:     make(chan *extprocv3.ProcessingRequest, 4),
		out:    make(chan *extprocv3.ProcessingResponse, 4),
		done:   make(chan struct{}),
	}
	ss := &serverStream{s: s, share: p.ShareReplies}
	go func() {
		s.err = p.Server.Process(ss)
		close(s.done)
	}()
	return s
}

// Stream is Envoy's end of one in-process stream.
type Stream struct {
	grpc.ClientStream // not implemented beyond what the driver uses
	ctx               context.Context
	cancel            context.CancelFunc
	in                chan *extprocv3.ProcessingRequest
	out               chan *extprocv3.ProcessingResponse
	closeOnce         sync.Once
	sendErr           atomic.Pointer[error]
	received          atomic.Int32
	done              chan struct{}
	err               error // what Process returned, once done is closed
}

// Send hands the server a message. Once the server returned it is io.EOF
// (Recv says how the stream ended), as with gRPC.
func (s *Stream) Send(req *extprocv3.ProcessingRequest) error {
	select {
	case s.in <- req:
		return nil
	case <-s.done:
		return io.EOF
	case <-s.ctx.Done():
		return status.FromContextError(s.ctx.Err()).Err()
	}
}

// Recv waits for the server's next reply. When the server returned it is
// io.EOF for a nil error, else that error; when the stream was reset it is
// the context's status.
func (s *Stream) Recv() (*extprocv3.ProcessingResponse, error) {
	select {
	case resp := <-s.out:
		return resp, nil
	case <-s.done:
		// Process may have sent its last reply just before returning.
		select {
		case resp := <-s.out:
			return resp, nil
		default:
		}
		if s.err == nil {
			return nil, io.EOF
		}
		return nil, s.err
	case <-s.ctx.Done():
		return nil, status.FromContextError(s.ctx.Err()).Err()
	}
}

// CloseSend half-closes: the server's Recv returns io.EOF.
func (s *Stream) CloseSend() error {
	s.closeOnce.Do(func() { close(s.in) })
	return nil
}

// Close ends the stream the way Envoy does: half-close, then reset.
func (s *Stream) Close() {
	_ = s.CloseSend()
	s.cancel()
}

// Context is the stream's context.
func (s *Stream) Context() context.Context { return s.ctx }

// Header is empty: no metadata crosses an in-process stream.
func (s *Stream) Header() (metadata.MD, error) { return nil, nil }

// Trailer is empty.
func (s *Stream) Trailer() metadata.MD { return nil }

// FailSends makes every later Send of the server fail with err, as a broken
// transport does.
func (s *Stream) FailSends(err error) { s.sendErr.Store(&err) }

// Received is how many messages the server has read.
func (s *Stream) Received() int { return int(s.received.Load()) }

// Done is closed when Process has returned; Err then says what it returned.
func (s *Stream) Done() <-chan struct{} { return s.done }

// Err is what Process returned (nil before Done is closed).
func (s *Stream) Err() error {
	select {
	case <-s.done:
		return s.err
	default:
		return nil
	}
}

// serverStream is the server's end: ExternalProcessor_ProcessServer.
type serverStream struct {
	grpc.ServerStream // not implemented beyond what a server uses
	s                 *Stream
	share             bool
}

func (f *serverStream) Context() context.Context { return f.s.ctx }

func (f *serverStream) Recv() (*extprocv3.ProcessingRequest, error) {
	select {
	case <-f.s.ctx.Done():
		return nil, f.s.ctx.Err()
	case req, ok := <-f.s.in:
		if !ok {
			return nil, io.EOF
		}
		f.s.received.Add(1)
		return req, nil
	}
}

// Send hands the client a copy of resp (unless ShareReplies).
func (f *serverStream) Send(resp *extprocv3.ProcessingResponse) error {
	if p := f.s.sendErr.Load(); p != nil {
		return *p
	}
	if !f.share {
		resp = proto.Clone(resp).(*extprocv3.ProcessingResponse)
	}
	select {
	case f.s.out <- resp:
		return nil
	case <-f.s.ctx.Done():
		return f.s.ctx.Err()
	}
}

func (f *serverStream) SetHeader(metadata.MD) error  { return nil }
func (f *serverStream) SendHeader(metadata.MD) error { return nil }
func (f *serverStream) SetTrailer(metadata.MD)       {}
