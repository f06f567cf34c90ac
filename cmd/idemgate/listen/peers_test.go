package listen

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/cmd/idemgate/settings"
	"github.com/idemgate/idemgate/extproc/security"
	"github.com/idemgate/idemgate/internal/testutil"
)

// events records what Peers reports.
type events struct {
	mu  sync.Mutex
	got []security.Event
}

func (e *events) Report(_ context.Context, ev security.Event) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.got = append(e.got, ev)
}

// TestPeersJudgeInTheHandshake: over TLS 1.2 and 1.3 alike, the allowed
// identity completes the handshake; no certificate, another CA's, and an
// unlisted SAN fail it, each reported with the peer and presented SANs
// and counted by reason. A SAN is compared whole: a prefix of an allowed
// one is not allowed.
func TestPeersJudgeInTheHandshake(t *testing.T) {
	dir := t.TempDir()
	ca := testutil.NewCA(t, "mesh")
	server := ca.Issue(t, testutil.Leaf{Name: "idemgate", DNS: []string{"idemgate.test"}})
	files := settings.ListenerTLS{CertFile: filepath.Join(dir, "c"), KeyFile: filepath.Join(dir, "k"), ClientCAFile: filepath.Join(dir, "ca")}
	testutil.WriteFile(t, files.CertFile, server.CertPEM)
	testutil.WriteFile(t, files.KeyFile, server.KeyPEM)
	testutil.WriteFile(t, files.ClientCAFile, ca.PEM)
	m := NewMetrics(prometheus.NewRegistry())
	var logs bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&logs, nil))
	f, err := LoadFiles(GRPC, files, m, logger)
	require.NoError(t, err)
	rec := &events{}
	p := NewPeers(f, []string{"spiffe://cluster.local/ns/payments/sa/envoy", "envoy.payments.svc"}, rec, m, logger)

	lis, err := tls.Listen("tcp", "127.0.0.1:0", p.tlsConfig())
	require.NoError(t, err)
	defer lis.Close()
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				if err := c.(*tls.Conn).Handshake(); err == nil {
					_, _ = c.Write([]byte("admitted"))
				}
			}()
		}
	}()
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	dial := func(version uint16, certs ...tls.Certificate) error {
		c, err := tls.Dial("tcp", lis.Addr().String(), &tls.Config{
			RootCAs: roots, ServerName: "idemgate.test", Certificates: certs, MinVersion: version, MaxVersion: version,
		})
		if err != nil {
			return err
		}
		defer c.Close()
		// TLS 1.3: the server judges the client after the client's
		// handshake finished; the answer tells.
		b, _ := io.ReadAll(c)
		if string(b) != "admitted" {
			return fmt.Errorf("not admitted (read %q)", b)
		}
		return nil
	}
	other := testutil.NewCA(t, "other")
	good := ca.Issue(t, testutil.Leaf{Name: "envoy", Client: true, DNS: []string{"envoy.payments.svc"}})
	for _, version := range []uint16{tls.VersionTLS12, tls.VersionTLS13} {
		rec.got = nil
		require.NoError(t, dial(version, good.KeyPair), "allowed DNS SAN")
		require.Error(t, dial(version))
		require.Error(t, dial(version, other.Issue(t, testutil.Leaf{Name: "x", Client: true, URIs: []string{"spiffe://cluster.local/ns/payments/sa/envoy"}}).KeyPair))
		require.Error(t, dial(version, ca.Issue(t, testutil.Leaf{Name: "y", Client: true, URIs: []string{"spiffe://cluster.local/ns/payments/sa/envoy/x"}}).KeyPair))
		require.Len(t, rec.got, 3)
		for i, want := range []struct{ refusal, san string }{
			{RefusedNoCertificate, "none"},
			{RefusedUntrusted, "spiffe://cluster.local/ns/payments/sa/envoy"},
			{RefusedSAN, "spiffe://cluster.local/ns/payments/sa/envoy/x"},
		} {
			ev := rec.got[i]
			require.Equal(t, security.ReasonPeerRefused, ev.Reason)
			require.Equal(t, want.refusal, ev.Refusal)
			require.Equal(t, want.san, ev.PresentedSAN)
			require.Equal(t, GRPC, ev.Listener)
			require.True(t, strings.HasPrefix(ev.Peer, "127.0.0.1:"), ev.Peer)
		}
	}
	for _, r := range []string{RefusedNoCertificate, RefusedUntrusted, RefusedSAN} {
		require.Equal(t, 2.0, value(t, m.refused.WithLabelValues(r)), r)
	}
}

// TestPresentedIsBounded: what a peer's certificate puts in a log line is
// printable and bounded.
func TestPresentedIsBounded(t *testing.T) {
	ca := testutil.NewCA(t, "mesh")
	long := ca.Issue(t, testutil.Leaf{Name: "z", Client: true, DNS: []string{strings.Repeat("a", 600) + ".example"}})
	got := presented(long.Cert)
	require.Len(t, got, maxPresented+3)
	require.True(t, strings.HasSuffix(got, "..."))
	require.Equal(t, "none", presented(nil))
}
