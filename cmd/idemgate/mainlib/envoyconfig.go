package mainlib

import (
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"os"

	"github.com/idemgate/idemgate/cmd/idemgate/settings"
	"github.com/idemgate/idemgate/envoy/pieces"
)

// The defaults of envoy-config's TLS flags: where Envoy finds its client
// certificate and idemgate's CA (a Secret mounted at /etc/envoy/tls).
const (
	defaultEnvoyClientCert = "/etc/envoy/tls/tls.crt"
	defaultEnvoyClientKey  = "/etc/envoy/tls/tls.key"
	defaultIdemgateCA      = "/etc/envoy/tls/idemgate-ca.crt"
)

// envoyConfig prints the Envoy pieces that attach idemgate, derived from
// the operations of a config (envoy/pieces).
func envoyConfig(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("envoy-config", stderr)
	path := fs.String("config", "", "config file whose operations to guard")
	addr := fs.String("idemgate-address", "", "host:port or unix:///path where Envoy reaches idemgate (default: from grpc_listen: its unix socket, 127.0.0.1 and its port, or with grpc_tls its host or the server certificate's DNS name)")
	upstream := fs.String("upstream-cluster", "payments", "the Envoy cluster of the operation routes")
	clientCert := fs.String("envoy-client-cert", defaultEnvoyClientCert, "with grpc_tls: Envoy's client certificate chain (PEM), a SAN of it in grpc_tls.client_sans")
	clientKey := fs.String("envoy-client-key", defaultEnvoyClientKey, "with grpc_tls: the key of --envoy-client-cert")
	ca := fs.String("idemgate-ca", defaultIdemgateCA, "with grpc_tls: the CA certificates (PEM) that sign idemgate's server certificate")
	san := fs.String("idemgate-san", "", "with grpc_tls: the URI or DNS SAN idemgate's certificate must carry (default: the first URI, else DNS, SAN of grpc_tls.cert_file when it is readable here)")
	sni := fs.String("idemgate-sni", "", "with grpc_tls: the server name Envoy sends (default: the SAN when it is a DNS name)")
	if _, err := parseFlags(fs, args); err != nil {
		return err
	}
	if *path == "" {
		fmt.Fprintln(stderr, "envoy-config: --config is required")
		return ErrUsage
	}
	cfg, err := loadOffline(*path, stderr)
	if err != nil {
		return err
	}
	o := pieces.Options{ConfigPath: *path, IdemgateAddress: *addr, UpstreamCluster: *upstream}
	if cfg.GRPCTLS != nil {
		t := &pieces.UpstreamTLS{ClientCert: *clientCert, ClientKey: *clientKey, CA: *ca, SAN: *san, SNI: *sni}
		if t.SAN == "" {
			if t.SAN, err = certificateSAN(cfg.GRPCTLS.CertFile); err != nil {
				return fmt.Errorf("--idemgate-san is required: %w", err)
			}
		}
		if t.SNI == "" && pieces.SANType(t.SAN) == "DNS" {
			t.SNI = t.SAN
		}
		o.TLS = t
	}
	if o.IdemgateAddress == "" {
		if o.IdemgateAddress, err = envoyAddress(cfg, o.TLS); err != nil {
			return err
		}
	}
	out, err := pieces.Render(cfg.Runtime, o)
	if err != nil {
		return err
	}
	_, err = stdout.Write(out)
	return err
}

// envoyAddress is where Envoy reaches grpc_listen by default: the unix
// socket itself; with grpc_tls the host written there (a routable
// listener is meant to be reached from elsewhere), or for a wildcard host
// the DNS SAN Envoy verifies; otherwise 127.0.0.1 (a sidecar).
func envoyAddress(cfg *settings.Settings, t *pieces.UpstreamTLS) (string, error) {
	if _, ok := settings.UnixSocketPath(cfg.GRPCListen); ok {
		return cfg.GRPCListen, nil
	}
	host, port, err := net.SplitHostPort(cfg.GRPCListen)
	if err != nil {
		return "", fmt.Errorf("grpc_listen %q: %w", cfg.GRPCListen, err)
	}
	if t == nil || settings.IsLoopback(cfg.GRPCListen) {
		return net.JoinHostPort("127.0.0.1", port), nil
	}
	if ip := net.ParseIP(host); host != "" && (ip == nil || !ip.IsUnspecified()) {
		return net.JoinHostPort(host, port), nil
	}
	if pieces.SANType(t.SAN) == "DNS" {
		return net.JoinHostPort(t.SAN, port), nil
	}
	return "", fmt.Errorf("grpc_listen %q binds every interface: give --idemgate-address (the host Envoy reaches idemgate at)", cfg.GRPCListen)
}

// certificateSAN is the first URI SAN, else the first DNS SAN, of the leaf
// certificate in file.
func certificateSAN(file string) (string, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("grpc_tls.cert_file is not readable here: %w", err)
	}
	block, _ := pem.Decode(data)
	if block == nil || block.Type != "CERTIFICATE" {
		return "", fmt.Errorf("grpc_tls.cert_file %s holds no PEM certificate", file)
	}
	leaf, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return "", fmt.Errorf("grpc_tls.cert_file %s: %w", file, err)
	}
	if len(leaf.URIs) > 0 {
		return leaf.URIs[0].String(), nil
	}
	if len(leaf.DNSNames) > 0 {
		return leaf.DNSNames[0], nil
	}
	return "", errors.New("grpc_tls.cert_file has no URI or DNS SAN")
}
