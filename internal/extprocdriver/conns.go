package extprocdriver

import (
	"context"
	"fmt"
	"sync/atomic"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
)

// envoyWindow is Envoy's default HTTP/2 stream and connection window
// (initial_stream_window_size / initial_connection_window_size, 256 MiB):
// Envoy never throttles a buffered body with flow control, so neither do we.
const envoyWindow = 256 << 20

// Conns is a fixed set of HTTP/2 connections (one grpc.ClientConn each) to one
// server; streams are spread over them round-robin.
type Conns struct {
	conns   []*grpc.ClientConn
	clients []Client
	next    atomic.Uint64
}

// Dial opens n connections to addr (host:port, loopback) and waits until
// every one is ready.
func Dial(ctx context.Context, addr string, n int) (*Conns, error) {
	if n < 1 {
		return nil, fmt.Errorf("need at least one connection, got %d", n)
	}
	c := &Conns{}
	for i := 0; i < n; i++ {
		cc, err := grpc.NewClient("passthrough:///"+addr,
			grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithInitialWindowSize(envoyWindow),
			grpc.WithInitialConnWindowSize(envoyWindow),
			grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64<<20)),
		)
		if err != nil {
			c.Close()
			return nil, fmt.Errorf("failed to create connection %d to %s: %w", i, addr, err)
		}
		c.conns = append(c.conns, cc)
		c.clients = append(c.clients, extprocv3.NewExternalProcessorClient(cc))
		cc.Connect()
	}
	for i, cc := range c.conns {
		if err := waitReady(ctx, cc); err != nil {
			c.Close()
			return nil, fmt.Errorf("connection %d to %s: %w", i, addr, err)
		}
	}
	return c, nil
}

func waitReady(ctx context.Context, cc *grpc.ClientConn) error {
	for {
		s := cc.GetState()
		switch s {
		case connectivity.Ready:
			return nil
		case connectivity.Idle:
			cc.Connect()
		}
		if !cc.WaitForStateChange(ctx, s) {
			return fmt.Errorf("failed to connect (last state %s): %w", s, ctx.Err())
		}
	}
}

// Next returns the client for the next stream (round-robin).
func (c *Conns) Next() Client {
	return c.clients[(c.next.Add(1)-1)%uint64(len(c.clients))]
}

// Len is the number of connections.
func (c *Conns) Len() int { return len(c.conns) }

// Close closes every connection.
func (c *Conns) Close() {
	for _, cc := range c.conns {
		_ = cc.Close()
	}
}
