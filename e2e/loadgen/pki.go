package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// The SANs of the benchmark's ext_proc mTLS: idemgate's server certificate
// and Envoy's client certificate (grpc_tls.client_sans).
const (
	benchServerSAN = "idemgate.bench.invalid"
	benchClientSAN = "envoy.bench.invalid"
)

// benchTLS are the PEM files of the mTLS column: a throwaway CA and the two
// certificates it signs.
type benchTLS struct {
	CAFile, ServerCert, ServerKey, ClientCert, ClientKey string
}

// writeBenchTLS creates the CA and certificates in dir (valid for a day:
// longer than any run).
func writeBenchTLS(dir string) (*benchTLS, error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "idemgate loadgen CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, fmt.Errorf("failed to create the benchmark CA: %w", err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, err
	}
	t := &benchTLS{CAFile: filepath.Join(dir, "ca.pem")}
	if err := writePEMFile(t.CAFile, "CERTIFICATE", caDER); err != nil {
		return nil, err
	}
	issue := func(serial int64, san string, usage x509.ExtKeyUsage) (string, string, error) {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return "", "", err
		}
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: san},
			NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
			DNSNames: []string{san}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			return "", "", fmt.Errorf("failed to issue %s: %w", san, err)
		}
		keyDER, err := x509.MarshalECPrivateKey(key)
		if err != nil {
			return "", "", err
		}
		cert, keyFile := filepath.Join(dir, san+".pem"), filepath.Join(dir, san+"-key.pem")
		if err := writePEMFile(cert, "CERTIFICATE", der); err != nil {
			return "", "", err
		}
		return cert, keyFile, writePEMFile(keyFile, "EC PRIVATE KEY", keyDER)
	}
	if t.ServerCert, t.ServerKey, err = issue(2, benchServerSAN, x509.ExtKeyUsageServerAuth); err != nil {
		return nil, err
	}
	if t.ClientCert, t.ClientKey, err = issue(3, benchClientSAN, x509.ExtKeyUsageClientAuth); err != nil {
		return nil, err
	}
	return t, nil
}

func writePEMFile(path, blockType string, der []byte) error {
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: blockType, Bytes: der}), 0o600)
}
