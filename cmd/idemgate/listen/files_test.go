package listen

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"log/slog"
	"math/big"
	"net"
	"path/filepath"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/cmd/idemgate/settings"
	"github.com/idemgate/idemgate/internal/testutil"
)

// served is the serial of the certificate a new handshake with cfg gets.
func served(t *testing.T, cfg *tls.Config, roots *x509.CertPool) *big.Int {
	t.Helper()
	lis, err := tls.Listen("tcp", "127.0.0.1:0", cfg)
	require.NoError(t, err)
	defer lis.Close()
	go func() {
		c, err := lis.Accept()
		if err == nil {
			_ = c.(*tls.Conn).Handshake()
			c.Close()
		}
	}()
	c, err := tls.Dial("tcp", lis.Addr().String(), &tls.Config{RootCAs: roots, ServerName: "idemgate.test", MinVersion: tls.VersionTLS12})
	require.NoError(t, err)
	defer c.Close()
	return c.ConnectionState().PeerCertificates[0].SerialNumber
}

// TestFilesReload: changed files are served to new handshakes; a change
// that does not load keeps the previous certificate and, once it is still
// broken at the next poll, counts one error and logs it.
func TestFilesReload(t *testing.T) {
	dir := t.TempDir()
	ca := testutil.NewCA(t, "CA")
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	leaf := testutil.Leaf{Name: "idemgate", DNS: []string{"idemgate.test"}, IPs: []net.IP{net.IPv4(127, 0, 0, 1)}}
	first := ca.Issue(t, leaf)
	files := settings.ListenerTLS{CertFile: filepath.Join(dir, "tls.crt"), KeyFile: filepath.Join(dir, "tls.key"), ClientCAFile: filepath.Join(dir, "ca.crt")}
	testutil.WriteFile(t, files.CertFile, first.CertPEM)
	testutil.WriteFile(t, files.KeyFile, first.KeyPEM)
	testutil.WriteFile(t, files.ClientCAFile, ca.PEM)

	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	var logs bytes.Buffer
	f, err := LoadFiles(GRPC, files, m, slog.New(slog.NewTextHandler(&logs, nil)))
	require.NoError(t, err)
	cfg := f.ServerConfig()
	require.Equal(t, first.Serial, served(t, cfg, roots))
	require.Equal(t, float64(first.Cert.NotAfter.Unix()), value(t, m.expiry.WithLabelValues(GRPC, "cert")))
	require.Equal(t, float64(ca.Cert.NotAfter.Unix()), value(t, m.expiry.WithLabelValues(GRPC, "client_ca")))

	f.poll() // nothing changed
	require.Zero(t, value(t, m.reloads.WithLabelValues(GRPC, "ok")))

	second := ca.Issue(t, leaf)
	testutil.WriteFile(t, files.CertFile, second.CertPEM)
	f.poll() // the certificate without its key: not reported yet
	require.Equal(t, first.Serial, served(t, cfg, roots), "a half-done change keeps the previous certificate")
	testutil.WriteFile(t, files.KeyFile, second.KeyPEM)
	f.poll()
	require.Equal(t, second.Serial, served(t, cfg, roots))
	require.Equal(t, 1.0, value(t, m.reloads.WithLabelValues(GRPC, "ok")))
	require.Zero(t, value(t, m.reloads.WithLabelValues(GRPC, "error")), "the in-between state was not an error")

	testutil.WriteFile(t, files.ClientCAFile, []byte("not a certificate"))
	f.poll()
	require.Zero(t, value(t, m.reloads.WithLabelValues(GRPC, "error")))
	f.poll()
	f.poll()
	require.Equal(t, 1.0, value(t, m.reloads.WithLabelValues(GRPC, "error")), "reported once")
	require.Contains(t, logs.String(), "changed TLS files do not load: still serving the previous certificate")
	require.Contains(t, logs.String(), "holds no PEM certificate")
	require.Equal(t, second.Serial, served(t, cfg, roots))
	require.NotNil(t, f.current().clientCAs)

	testutil.WriteFile(t, files.ClientCAFile, append(append([]byte{}, ca.PEM...), testutil.NewCA(t, "next CA").PEM...))
	f.poll()
	require.Equal(t, 2.0, value(t, m.reloads.WithLabelValues(GRPC, "ok")), "fixed files load again")
}

// TestLoadFilesRefusesBrokenFiles: serve does not start on files that do
// not load.
func TestLoadFilesRefusesBrokenFiles(t *testing.T) {
	dir := t.TempDir()
	ca := testutil.NewCA(t, "CA")
	a, b := ca.Issue(t, testutil.Leaf{Name: "a"}), ca.Issue(t, testutil.Leaf{Name: "b"})
	files := settings.ListenerTLS{CertFile: filepath.Join(dir, "tls.crt"), KeyFile: filepath.Join(dir, "tls.key")}
	testutil.WriteFile(t, files.CertFile, a.CertPEM)
	testutil.WriteFile(t, files.KeyFile, b.KeyPEM)
	m := NewMetrics(prometheus.NewRegistry())
	_, err := LoadFiles(Approval, files, m, slog.New(slog.DiscardHandler))
	require.ErrorContains(t, err, "are not a certificate and its key")
	files.ClientCAFile = filepath.Join(dir, "missing.pem")
	testutil.WriteFile(t, files.KeyFile, a.KeyPEM)
	_, err = LoadFiles(GRPC, files, m, slog.New(slog.DiscardHandler))
	require.ErrorContains(t, err, "no such file or directory")
}

// value reads a counter or gauge.
func value(t *testing.T, m prometheus.Metric) float64 {
	t.Helper()
	var out dto.Metric
	require.NoError(t, m.Write(&out))
	if out.Counter != nil {
		return out.Counter.GetValue()
	}
	return out.Gauge.GetValue()
}
