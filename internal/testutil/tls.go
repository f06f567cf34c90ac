package testutil

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// TLSFiles are PEM files for one test: a CA, a server certificate for
// 127.0.0.1 and localhost, and a client certificate, all signed by the CA.
type TLSFiles struct {
	CAFile, ServerCertFile, ServerKeyFile, ClientCertFile, ClientKeyFile string
}

// WriteTLSFiles creates a throwaway CA and the certificates signed by it in
// a temporary directory.
func WriteTLSFiles(t testing.TB) TLSFiles {
	t.Helper()
	dir := t.TempDir()
	caKey := newKey(t)
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "idemgate test CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatalf("failed to create the test CA: %v", err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatalf("failed to parse the test CA: %v", err)
	}
	files := TLSFiles{CAFile: filepath.Join(dir, "ca.pem")}
	writePEM(t, files.CAFile, "CERTIFICATE", caDER)
	issue := func(serial int64, name string, usage x509.ExtKeyUsage) (certFile, keyFile string) {
		key := newKey(t)
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(serial),
			Subject:      pkix.Name{CommonName: name},
			NotBefore:    time.Now().Add(-time.Hour),
			NotAfter:     time.Now().Add(24 * time.Hour),
			KeyUsage:     x509.KeyUsageDigitalSignature,
			ExtKeyUsage:  []x509.ExtKeyUsage{usage},
			DNSNames:     []string{"localhost"},
			IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			t.Fatalf("failed to issue the %s certificate: %v", name, err)
		}
		keyDER, err := x509.MarshalECPrivateKey(key)
		if err != nil {
			t.Fatalf("failed to encode the %s key: %v", name, err)
		}
		certFile, keyFile = filepath.Join(dir, name+".pem"), filepath.Join(dir, name+"-key.pem")
		writePEM(t, certFile, "CERTIFICATE", der)
		writePEM(t, keyFile, "EC PRIVATE KEY", keyDER)
		return certFile, keyFile
	}
	files.ServerCertFile, files.ServerKeyFile = issue(2, "server", x509.ExtKeyUsageServerAuth)
	files.ClientCertFile, files.ClientKeyFile = issue(3, "client", x509.ExtKeyUsageClientAuth)
	return files
}

func newKey(t testing.TB) *ecdsa.PrivateKey {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatalf("failed to generate a key: %v", err)
	}
	return key
}

func writePEM(t testing.TB, path, blockType string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: blockType, Bytes: der}), 0o600); err != nil {
		t.Fatalf("failed to write %s: %v", path, err)
	}
}

// ClientCerts says whether a TLS server asks its clients for a
// certificate.
type ClientCerts bool

const (
	AnyClient          ClientCerts = false // no certificate asked for
	RequireClientCerts ClientCerts = true  // one signed by the test CA
)

// StartRedisTLS starts a redis-server that accepts only TLS on its port
// (no plain-text port) and, with RequireClientCerts, only clients
// presenting a certificate signed by files.CAFile.
func StartRedisTLS(t testing.TB, clients ClientCerts) (*RedisServer, TLSFiles) {
	t.Helper()
	files := WriteTLSFiles(t)
	authClients := "no"
	if clients == RequireClientCerts {
		authClients = "yes"
	}
	srv := startRedis(t, func(port int) []string {
		return []string{
			"--port", "0", "--tls-port", strconv.Itoa(port),
			"--tls-cert-file", files.ServerCertFile, "--tls-key-file", files.ServerKeyFile,
			"--tls-ca-cert-file", files.CAFile, "--tls-auth-clients", authClients,
		}
	})
	return srv, files
}
