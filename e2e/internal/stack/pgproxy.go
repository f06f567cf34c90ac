package stack

import (
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// TCPProxy forwards loopback connections to a target address until it is
// cut. The stack puts one between idemgate and PostgreSQL so a test can make
// PostgreSQL unreachable without touching the shared server.
type TCPProxy struct {
	ln     net.Listener
	target string

	mu     sync.Mutex
	cut    bool
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup

	latency atomic.Int64 // nanoseconds added before each client→target chunk
}

// SetLatency delays every chunk the client sends by d (0: none), so each
// query round trip to the target takes at least d: a slow store, without
// touching the shared server.
func (p *TCPProxy) SetLatency(d time.Duration) { p.latency.Store(int64(d)) }

// StartTCPProxy listens on a free loopback port and forwards to target.
func StartTCPProxy(target string) (*TCPProxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("failed to listen for the TCP proxy: %w", err)
	}
	p := &TCPProxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the proxy's host:port.
func (p *TCPProxy) Addr() string { return p.ln.Addr().String() }

// Cut closes every open connection and closes new ones at once, as a
// network partition seen from the client would (connection reset).
func (p *TCPProxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = true
	for c := range p.conns {
		closeHard(c)
	}
}

// Restore forwards new connections again.
func (p *TCPProxy) Restore() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = false
}

// Close stops the proxy and closes every connection.
func (p *TCPProxy) Close() {
	p.mu.Lock()
	p.closed = true
	for c := range p.conns {
		closeHard(c)
	}
	p.mu.Unlock()
	_ = p.ln.Close()
	p.wg.Wait()
}

func closeHard(c net.Conn) {
	if tcp, ok := c.(*net.TCPConn); ok {
		_ = tcp.SetLinger(0) // RST, not FIN
	}
	_ = c.Close()
}

func (p *TCPProxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		if p.cut || p.closed {
			p.mu.Unlock()
			closeHard(c)
			continue
		}
		p.mu.Unlock()
		p.wg.Add(1)
		go p.forward(c)
	}
}

func (p *TCPProxy) forward(client net.Conn) {
	defer p.wg.Done()
	server, err := net.Dial("tcp", p.target)
	if err != nil {
		closeHard(client)
		return
	}
	p.mu.Lock()
	if p.cut || p.closed {
		p.mu.Unlock()
		closeHard(client)
		closeHard(server)
		return
	}
	p.conns[client] = struct{}{}
	p.conns[server] = struct{}{}
	p.mu.Unlock()

	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		done <- struct{}{}
	}
	go func() {
		buf := make([]byte, 32<<10)
		for {
			n, err := client.Read(buf)
			if n > 0 {
				if d := time.Duration(p.latency.Load()); d > 0 {
					time.Sleep(d)
				}
				if _, werr := server.Write(buf[:n]); werr != nil {
					break
				}
			}
			if err != nil {
				break
			}
		}
		done <- struct{}{}
	}()
	go pipe(client, server)
	<-done
	// One side ended: end both, so the other copy returns too.
	closeHard(client)
	closeHard(server)
	<-done
	p.mu.Lock()
	delete(p.conns, client)
	delete(p.conns, server)
	p.mu.Unlock()
}
