package listen

import (
	"cmp"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync/atomic"
	"time"

	"github.com/idemgate/idemgate/cmd/idemgate/settings"
)

// DefaultPollInterval is how often a listener's TLS files are checked for
// a change. Reading three small files a second costs nothing measurable,
// and unlike a watch on the files it sees every way they are replaced
// (kubelet's symlink swap of a Secret volume, cert-manager's csi driver,
// a plain rewrite).
const DefaultPollInterval = time.Second

// material is one consistent load of a listener's TLS files.
type material struct {
	cert *tls.Certificate
	// clientCAs is nil for a listener without client certificates.
	clientCAs *x509.CertPool
}

// Files holds a listener's current TLS material and re-reads its files
// when their content changes: new handshakes use the new material,
// connections already established keep theirs. A change that does not
// load (a half-written file, a key that is not the certificate's) keeps
// the previous material, is logged and counted as result="error".
type Files struct {
	listener string
	files    settings.ListenerTLS
	metrics  *Metrics
	logger   *slog.Logger
	cur      atomic.Pointer[material]
	// sum is the content of the files the current material was loaded
	// from; failed is that of a change that did not load, so it is
	// reported once, not every poll.
	sum, failed [sha256.Size]byte
	// pending is a change that failed to load once: files are often
	// written one after the other (certificate, then key), so a failure is
	// reported only if the same content still fails at the next poll.
	pending [sha256.Size]byte
}

// LoadFiles reads a listener's TLS files; they must load now (serve does
// not start without them).
func LoadFiles(listener string, files settings.ListenerTLS, metrics *Metrics, logger *slog.Logger) (*Files, error) {
	f := &Files{listener: listener, files: files, metrics: metrics, logger: logger}
	sum, contents, err := f.read()
	if err != nil {
		return nil, err
	}
	m, err := f.load(contents)
	if err != nil {
		return nil, err
	}
	f.sum = sum
	f.cur.Store(m)
	return f, nil
}

// Watch re-reads the files every interval until ctx is done.
func (f *Files) Watch(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			f.poll()
		}
	}
}

// poll reloads the files if their content changed.
func (f *Files) poll() {
	sum, contents, err := f.read()
	if sum == f.sum || sum == f.failed {
		return
	}
	var m *material
	if err == nil {
		m, err = f.load(contents)
	}
	if err == nil {
		f.cur.Store(m)
		f.sum, f.pending = sum, [sha256.Size]byte{}
		f.metrics.Reloaded(f.listener, nil)
		f.logger.Info("TLS files reloaded: new handshakes use them", "listener", f.listener, "cert", f.files.CertFile)
		return
	}
	if sum != f.pending {
		f.pending = sum
		return
	}
	f.failed = sum
	f.metrics.Reloaded(f.listener, err)
	f.logger.Error("changed TLS files do not load: still serving the previous certificate", "listener", f.listener, "error", err)
}

// read returns the files' contents, a digest of them all and the first
// error reading one; an unreadable file (missing mid-rotation) enters the
// digest as its error, so it is a content of its own.
func (f *Files) read() ([sha256.Size]byte, [][]byte, error) {
	names := []string{f.files.CertFile, f.files.KeyFile}
	if f.files.ClientCAFile != "" {
		names = append(names, f.files.ClientCAFile)
	}
	h := sha256.New()
	contents := make([][]byte, len(names))
	var readErr error
	for i, name := range names {
		b, err := os.ReadFile(name)
		if err != nil {
			readErr = cmp.Or(readErr, err)
			b = []byte("unreadable: " + err.Error())
		}
		contents[i] = b
		_ = binary.Write(h, binary.BigEndian, uint64(len(b)))
		h.Write(b)
	}
	var sum [sha256.Size]byte
	copy(sum[:], h.Sum(nil))
	return sum, contents, readErr
}

// load parses the files' contents and records their expiry.
func (f *Files) load(contents [][]byte) (*material, error) {
	cert, err := tls.X509KeyPair(contents[0], contents[1])
	if err != nil {
		return nil, fmt.Errorf("%s and %s are not a certificate and its key: %w", f.files.CertFile, f.files.KeyFile, err)
	}
	m := &material{cert: &cert}
	var caExpiry time.Time
	if f.files.ClientCAFile != "" {
		m.clientCAs, caExpiry, err = parseCAs(contents[2])
		if err != nil {
			return nil, fmt.Errorf("%s: %w", f.files.ClientCAFile, err)
		}
	}
	f.metrics.SetExpiry(f.listener, "cert", cert.Leaf.NotAfter)
	if m.clientCAs != nil {
		f.metrics.SetExpiry(f.listener, "client_ca", caExpiry)
	}
	return m, nil
}

// parseCAs reads a PEM bundle of CA certificates; expiry is the earliest
// NotAfter among them.
func parseCAs(data []byte) (*x509.CertPool, time.Time, error) {
	pool := x509.NewCertPool()
	var expiry time.Time
	n := 0
	for rest := data; ; {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			break
		}
		if b.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			return nil, time.Time{}, err
		}
		pool.AddCert(c)
		if n == 0 || c.NotAfter.Before(expiry) {
			expiry = c.NotAfter
		}
		n++
	}
	if n == 0 {
		return nil, time.Time{}, errors.New("holds no PEM certificate")
	}
	return pool, expiry, nil
}

// current is the material new handshakes use.
func (f *Files) current() *material { return f.cur.Load() }

// ServerConfig is the TLS of a listener without client certificates (the
// approvers' API): TLS 1.2 or later, the current certificate at each
// handshake.
func (f *Files) ServerConfig() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			return f.current().cert, nil
		},
	}
}
