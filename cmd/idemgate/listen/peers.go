package listen

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"log/slog"
	"net"
	"slices"
	"strings"

	"google.golang.org/grpc/credentials"

	"github.com/idemgate/idemgate/extproc/security"
)

// Reporter is where refused peers are reported (security.Reporter).
type Reporter interface {
	Report(ctx context.Context, e security.Event)
}

// Peers admits to the ext_proc listener only a client whose certificate
// chains to the current client CAs and carries a URI or DNS SAN in
// client_sans (docs/design.md §12). It decides in the TLS handshake, before
// gRPC reads a byte: a refused peer opens no stream.
type Peers struct {
	files    *Files
	allowed  []string
	reporter Reporter
	metrics  *Metrics
	logger   *slog.Logger
}

// NewPeers checks clients against files' client CA and the allowed SANs.
func NewPeers(files *Files, allowedSANs []string, reporter Reporter, metrics *Metrics, logger *slog.Logger) *Peers {
	return &Peers{files: files, allowed: allowedSANs, reporter: reporter, metrics: metrics, logger: logger}
}

// Credentials are the gRPC server's transport credentials: TLS 1.2 or
// later, the current certificate, and the peer check at every handshake.
func (p *Peers) Credentials() credentials.TransportCredentials {
	return &peerCredentials{TransportCredentials: credentials.NewTLS(p.tlsConfig()), peers: p}
}

// tlsConfig builds each handshake's configuration from the material
// current when the client says hello, so a rotation applies to the next
// handshake and the check knows the peer's address.
func (p *Peers) tlsConfig() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetConfigForClient: func(hello *tls.ClientHelloInfo) (*tls.Config, error) {
			m := p.files.current()
			peer := addrString(hello.Conn.RemoteAddr())
			return &tls.Config{
				MinVersion:   tls.VersionTLS12,
				Certificates: []tls.Certificate{*m.cert},
				// Asked for, not required by crypto/tls: a client that sends
				// none must reach verify to be reported like the others.
				ClientAuth: tls.RequestClientCert,
				NextProtos: []string{"h2"},
				VerifyConnection: func(cs tls.ConnectionState) error {
					return p.verify(peer, m.clientCAs, cs)
				},
			}, nil
		},
	}
}

// refusal is the handshake error of a refused peer, already reported.
type refusal struct{ reason string }

func (r *refusal) Error() string { return "peer refused: " + r.reason }

// verify admits the peer or reports and refuses it.
func (p *Peers) verify(peer string, roots *x509.CertPool, cs tls.ConnectionState) error {
	if len(cs.PeerCertificates) == 0 {
		return p.refuse(peer, RefusedNoCertificate, nil)
	}
	leaf := cs.PeerCertificates[0]
	intermediates := x509.NewCertPool()
	for _, c := range cs.PeerCertificates[1:] {
		intermediates.AddCert(c)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{
		Roots: roots, Intermediates: intermediates, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}); err != nil {
		return p.refuse(peer, RefusedUntrusted, leaf)
	}
	for _, san := range sans(leaf) {
		if slices.Contains(p.allowed, san) {
			return nil
		}
	}
	return p.refuse(peer, RefusedSAN, leaf)
}

// refuse reports a refused peer: a security event and the counters.
func (p *Peers) refuse(peer, reason string, leaf *x509.Certificate) error {
	p.metrics.Refused(reason)
	p.reporter.Report(context.Background(), security.Event{
		Reason:   security.ReasonPeerRefused,
		Listener: GRPC, Peer: peer, PresentedSAN: presented(leaf), Refusal: reason,
	})
	return &refusal{reason: reason}
}

// handshakeFailed counts a handshake that failed before a certificate
// was judged. It is no security event: a TCP probe or a plaintext client
// ends here too, and cannot have opened anything.
func (p *Peers) handshakeFailed(peer net.Addr, err error) {
	p.metrics.Refused(RefusedHandshake)
	p.logger.Warn("ext_proc TLS handshake failed", "listener", GRPC, "peer", addrString(peer), "error", err)
}

// addrString is a peer's address for a log line; a unix socket's peer
// may have none.
func addrString(a net.Addr) string {
	if a == nil || a.String() == "" {
		return "unix"
	}
	return a.String()
}

// sans are a certificate's URI and DNS SANs.
func sans(c *x509.Certificate) []string {
	out := make([]string, 0, len(c.URIs)+len(c.DNSNames))
	for _, u := range c.URIs {
		out = append(out, u.String())
	}
	return append(out, c.DNSNames...)
}

// maxPresented bounds what a peer's certificate puts in a log line.
const maxPresented = 512

// presented is the SANs a peer presented, for the security event: "none"
// without a certificate, printable and bounded (the peer chose them).
func presented(c *x509.Certificate) string {
	if c == nil {
		return "none"
	}
	s := strings.Join(sans(c), ",")
	if s == "" {
		return "none"
	}
	s = strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return '?'
		}
		return r
	}, s)
	if len(s) > maxPresented {
		s = s[:maxPresented] + "..."
	}
	return s
}

// peerCredentials is gRPC's TLS credentials, counting handshakes that
// fail before the peer check.
type peerCredentials struct {
	credentials.TransportCredentials
	peers *Peers
}

func (c *peerCredentials) ServerHandshake(raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	conn, info, err := c.TransportCredentials.ServerHandshake(raw)
	var r *refusal
	if err != nil && !errors.As(err, &r) {
		c.peers.handshakeFailed(raw.RemoteAddr(), err)
	}
	return conn, info, err
}

func (c *peerCredentials) Clone() credentials.TransportCredentials {
	return &peerCredentials{TransportCredentials: c.TransportCredentials.Clone(), peers: c.peers}
}
