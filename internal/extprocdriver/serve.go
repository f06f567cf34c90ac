package extprocdriver

import (
	"fmt"
	"net"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
)

// ServeLoopback serves srv over plain gRPC on a free loopback port, for a
// driver to Dial: fake and reference ext_proc servers in tests. stop ends
// the server and its streams.
func ServeLoopback(srv extprocv3.ExternalProcessorServer) (addr string, stop func(), err error) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, fmt.Errorf("failed to listen on loopback: %w", err)
	}
	gs := grpc.NewServer()
	extprocv3.RegisterExternalProcessorServer(gs, srv)
	go func() { _ = gs.Serve(lis) }()
	return lis.Addr().String(), gs.Stop, nil
}
