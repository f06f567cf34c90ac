package testutil

import (
	"bytes"
	"net"
	"sync"
	"sync/atomic"
	"testing"
)

// CutProxy forwards loopback TCP connections to a target and, when armed,
// cuts one of them after the server has answered a chosen request: the
// request ran, its reply never reaches the client. That is the failure a
// client must not answer by sending the request again.
type CutProxy struct {
	Addr   string
	target string
	ln     net.Listener
	armed  atomic.Pointer[[]byte]
	cuts   atomic.Int64
	wg     sync.WaitGroup
	mu     sync.Mutex
	conns  map[net.Conn]struct{}
}

// StartCutProxy listens on addr ("127.0.0.1:0" for any free port) and
// forwards to target until the test ends.
func StartCutProxy(t testing.TB, addr, target string) *CutProxy {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("failed to listen for the proxy: %v", err)
	}
	p := &CutProxy{Addr: ln.Addr().String(), target: target, ln: ln, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

// CutAfterReplyTo arms the proxy: the next client chunk containing marker
// (case-insensitive) is delivered, and the connection is closed as soon as
// the server's reply arrives, the reply dropped. One cut per call.
func (p *CutProxy) CutAfterReplyTo(marker string) {
	m := bytes.ToLower([]byte(marker))
	p.armed.Store(&m)
}

// Cuts is how many connections were cut.
func (p *CutProxy) Cuts() int64 { return p.cuts.Load() }

func (p *CutProxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.wg.Add(1)
		go p.serve(c)
	}
}

func (p *CutProxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.conns == nil {
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *CutProxy) serve(client net.Conn) {
	defer p.wg.Done()
	server, err := net.Dial("tcp", p.target)
	if err != nil {
		client.Close()
		return
	}
	if !p.track(client) || !p.track(server) {
		client.Close()
		server.Close()
		return
	}
	var cutting atomic.Bool
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 64<<10)
		for {
			n, err := server.Read(buf)
			if n > 0 && cutting.Load() {
				// The request ran; its reply is lost with the connection.
				p.cuts.Add(1)
				client.Close()
				server.Close()
				return
			}
			if n > 0 {
				if _, werr := client.Write(buf[:n]); werr != nil {
					return
				}
			}
			if err != nil {
				client.Close()
				return
			}
		}
	}()
	buf := make([]byte, 64<<10)
	for {
		n, err := client.Read(buf)
		if n > 0 {
			if m := p.armed.Load(); m != nil && bytes.Contains(bytes.ToLower(buf[:n]), *m) && p.armed.CompareAndSwap(m, nil) {
				cutting.Store(true)
			}
			if _, werr := server.Write(buf[:n]); werr != nil {
				break
			}
		}
		if err != nil {
			break
		}
	}
	server.Close()
	<-done
}

func (p *CutProxy) close() {
	p.ln.Close()
	p.mu.Lock()
	for c := range p.conns {
		c.Close()
	}
	p.conns = nil
	p.mu.Unlock()
	p.wg.Wait()
}
