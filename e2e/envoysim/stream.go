package envoysim

import (
	"context"
	"sync"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
)

// procStream is one ext_proc gRPC stream (one per HTTP request, never
// reused) on a pooled ClientConn. Opening, sending and receiving happen on
// goroutines so the exchange loop never blocks on gRPC; everything the server
// sends comes back as events.
type procStream struct {
	post   func(event) bool
	ctx    context.Context
	cancel context.CancelFunc

	mu      sync.Mutex
	cond    *sync.Cond
	queue   []*extprocv3.ProcessingRequest
	closing bool
}

// evGRPCMsg is a ProcessingResponse from the server.
type evGRPCMsg struct{ resp *extprocv3.ProcessingResponse }

// evGRPCEnd is the end of the stream as seen by Recv: io.EOF for a server
// that returned status OK, a status error otherwise.
type evGRPCEnd struct{ err error }

func startProcStream(conn *grpc.ClientConn, md metadata.MD, post func(event) bool) *procStream {
	ctx, cancel := context.WithCancel(context.Background())
	if len(md) > 0 {
		ctx = metadata.NewOutgoingContext(ctx, md)
	}
	s := &procStream{post: post, ctx: ctx, cancel: cancel}
	s.cond = sync.NewCond(&s.mu)
	go s.run(conn)
	return s
}

func (s *procStream) run(conn *grpc.ClientConn) {
	stream, err := extprocv3.NewExternalProcessorClient(conn).Process(s.ctx)
	if err != nil {
		s.post(evGRPCEnd{err: err})
		s.cancel()
		return
	}
	go func() {
		for {
			resp, err := stream.Recv()
			if err != nil {
				s.post(evGRPCEnd{err: err})
				return
			}
			if !s.post(evGRPCMsg{resp: resp}) {
				return
			}
		}
	}()
	sendFailed := false
	for {
		s.mu.Lock()
		for len(s.queue) == 0 && !s.closing {
			s.cond.Wait()
		}
		if s.closing {
			s.mu.Unlock()
			break
		}
		msg := s.queue[0]
		s.queue = s.queue[1:]
		s.mu.Unlock()
		// A failed Send means the stream is over; Recv reports the status.
		if !sendFailed && stream.Send(msg) != nil {
			sendFailed = true
		}
	}
	// Envoy's default close: half-close, then reset right away. The server
	// usually sees codes.Canceled, not a clean io.EOF.
	_ = stream.CloseSend()
	s.cancel()
}

func (s *procStream) send(m *extprocv3.ProcessingRequest) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.closing {
		s.queue = append(s.queue, m)
		s.cond.Signal()
	}
}

// close drops unsent messages, half-closes and cancels the stream.
func (s *procStream) close() {
	s.mu.Lock()
	s.closing = true
	s.queue = nil
	s.cond.Broadcast()
	s.mu.Unlock()
	// If a Send is stuck on flow control (or the stream is still being
	// opened), make sure the reset still happens.
	time.AfterFunc(time.Second, s.cancel)
}
