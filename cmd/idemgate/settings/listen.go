package settings

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/url"
	"path/filepath"
	"strings"
)

// unixScheme prefixes a listen address that is a unix socket path.
const unixScheme = "unix://"

// ListenerTLS is the compiled TLS of a listener: the files serve reads
// (and re-reads when they change), with paths resolved against the config
// file's directory. ClientCAFile and ClientSANs are set for grpc_tls only.
type ListenerTLS struct {
	CertFile     string
	KeyFile      string
	ClientCAFile string
	ClientSANs   []string
}

// UnixSocketPath returns the socket path of a unix:///abs/path listen
// address; ok is false for a host:port address.
func UnixSocketPath(listen string) (path string, ok bool) {
	if !strings.HasPrefix(listen, unixScheme) {
		return "", false
	}
	return strings.TrimPrefix(listen, unixScheme), true
}

// IsLoopback reports whether a host:port listen address binds only a
// loopback interface: 127.0.0.0/8, ::1 or localhost. ":port", 0.0.0.0,
// any other IP and any other host name are routable (a name can resolve
// to anything).
func IsLoopback(listen string) bool {
	host, _, err := net.SplitHostPort(listen)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// IsPrivate reports whether only this host's processes can reach listen:
// a loopback address or a unix socket.
func IsPrivate(listen string) bool {
	_, unix := UnixSocketPath(listen)
	return unix || IsLoopback(listen)
}

// Listener names a listener in the messages of ListenRule: its key and
// the keys that open it to the network.
type Listener struct {
	Key, TLSKey, SwitchKey string
	// Risk says what plaintext on a routable address would expose.
	Risk string
	// Example is a unix socket path offered in the message.
	Example string
}

// GRPC and Approval are the two listeners the rule applies to.
var (
	GRPC = Listener{Key: "grpc_listen", TLSKey: "grpc_tls", SwitchKey: "grpc_plaintext_remote",
		Risk: "anyone who reaches it could drive idemgate (mint fingerprints for any subject, obtain attestations)", Example: "unix:///run/idemgate/extproc.sock"}
	Approval = Listener{Key: "approval_listen", TLSKey: "approval_tls", SwitchKey: "approval_plaintext_remote",
		Risk: "approvers' bearer tokens and decisions would cross the network unencrypted", Example: "unix:///run/idemgate/approvals.sock"}
)

// ListenRule is the rule of docs/design.md §12 for one listen address
// (what check-config applies to the file and serve to a --grpc-listen
// override): a loopback address or a unix socket, or a routable address
// with TLS, or the explicit plaintext switch. It returns nil when listen
// may be served; the error says what to do.
func ListenRule(l Listener, listen string, withTLS, plaintextRemote bool) error {
	if path, ok := UnixSocketPath(listen); ok {
		if !filepath.IsAbs(path) || filepath.Clean(path) != path {
			return fmt.Errorf("invalid unix socket address %q: use unix:// and an absolute, clean path, e.g. %s", listen, l.Example)
		}
		return nil
	}
	if _, port, err := net.SplitHostPort(listen); err != nil || port == "" {
		return fmt.Errorf("invalid listen address %q: use host:port, :port or unix:///absolute/path", listen)
	}
	if IsLoopback(listen) || withTLS || plaintextRemote {
		return nil
	}
	return fmt.Errorf("%q is a routable address served in plaintext: %s. "+
		"Use a loopback address (127.0.0.1:port), a unix socket (%s), or set %s; "+
		"%s: true is the explicit way around (serve then warns at every start)", listen, l.Risk, l.Example, l.TLSKey, l.SwitchKey)
}

// PlaintextRemote reports whether a listener serves plaintext on a
// routable address because of the explicit switch (the
// idemgate_listener_plaintext_remote gauge).
func PlaintextRemote(listen string, tlsCfg *ListenerTLS, plaintextRemote bool) bool {
	return plaintextRemote && tlsCfg == nil && listen != "" && !IsPrivate(listen)
}

// checkListen applies ListenRule to the file's address and the switch.
func (c *compiler) checkListen(l Listener, listen string, withTLS, plaintextRemote bool) {
	if err := ListenRule(l, listen, withTLS, plaintextRemote); err != nil {
		c.ch.Errorf(p(l.Key), "%v", err)
		return
	}
	switch {
	case plaintextRemote && withTLS:
		c.ch.Errorf(p(l.SwitchKey), "set %s or %s: true, not both", l.TLSKey, l.SwitchKey)
	case plaintextRemote && IsPrivate(listen):
		c.ch.Warnf(p(l.SwitchKey), "has no effect: %s (%s) is not routable", l.Key, listen)
	}
}

// grpcTLS compiles grpc_tls: the server certificate and key, the client
// CA and the allowed client SANs, all required (a listener that accepted
// any certificate of a public CA would let anyone in).
func (c *compiler) grpcTLS(t *GRPCTLS, baseDir string) *ListenerTLS {
	if t == nil {
		return nil
	}
	at := func(segs ...any) []any { return append(p("grpc_tls"), segs...) }
	out := c.serverCert(at(), t.CertFile, t.KeyFile, baseDir)
	if t.ClientCAFile == "" {
		c.ch.Errorf(at("client_ca_file"), "required: the CA certificates that sign Envoy's client certificate")
	} else {
		out.ClientCAFile = resolve(baseDir, t.ClientCAFile)
		if data, ok := c.readTLSFile(at(), "client_ca_file", "client CA", t.ClientCAFile); ok {
			if !x509.NewCertPool().AppendCertsFromPEM(data) {
				c.ch.Errorf(at("client_ca_file"), "%s holds no PEM certificate", t.ClientCAFile)
			}
		}
	}
	if len(t.ClientSANs) == 0 {
		c.ch.Errorf(at("client_sans"), "required: the URI (SPIFFE ID) or DNS SANs of the client certificates allowed to connect")
	}
	for i, san := range t.ClientSANs {
		if err := checkSAN(san); err != nil {
			c.ch.Errorf(at("client_sans", i), "%v", err)
		}
	}
	out.ClientSANs = append([]string(nil), t.ClientSANs...)
	return out
}

// approvalTLS compiles approval_tls.
func (c *compiler) approvalTLS(t *ApprovalTLS, baseDir string) *ListenerTLS {
	if t == nil {
		return nil
	}
	return c.serverCert(p("approval_tls"), t.CertFile, t.KeyFile, baseDir)
}

// serverCert checks a listener's certificate and key: both named, both
// readable, and the key the certificate's.
func (c *compiler) serverCert(path []any, certFile, keyFile, baseDir string) *ListenerTLS {
	at := func(key string) []any { return append(clonePath(path), key) }
	out := &ListenerTLS{CertFile: resolve(baseDir, certFile), KeyFile: resolve(baseDir, keyFile)}
	if certFile == "" {
		c.ch.Errorf(at("cert_file"), "required: the server certificate chain (PEM)")
	}
	if keyFile == "" {
		c.ch.Errorf(at("key_file"), "required: the server certificate's private key (PEM)")
	}
	if certFile == "" || keyFile == "" {
		return out
	}
	certPEM, certOK := c.readTLSFile(path, "cert_file", "server certificate", certFile)
	keyPEM, keyOK := c.readTLSFile(path, "key_file", "server key", keyFile)
	if certOK && keyOK {
		if _, err := tls.X509KeyPair(certPEM, keyPEM); err != nil {
			c.ch.Errorf(at("key_file"), "%s and %s are not a certificate and its key: %v", certFile, keyFile, err)
		}
	}
	return out
}

// checkSAN accepts a URI with a scheme (spiffe://...) or a DNS name.
func checkSAN(san string) error {
	if san == "" || strings.ContainsAny(san, " \t\r\n") {
		return fmt.Errorf("invalid SAN %q: a URI such as spiffe://cluster.local/ns/NS/sa/SA or a DNS name", san)
	}
	if strings.Contains(san, "://") {
		u, err := url.Parse(san)
		if err != nil || u.Scheme == "" || u.Host == "" {
			return fmt.Errorf("invalid URI SAN %q: a URI such as spiffe://cluster.local/ns/NS/sa/SA", san)
		}
		return nil
	}
	if strings.ContainsAny(san, "/:@") {
		return fmt.Errorf("invalid DNS SAN %q: a DNS name, or a URI with its scheme (spiffe://...)", san)
	}
	return nil
}

// resolve makes a file the config names relative to the config's directory.
func resolve(baseDir, file string) string {
	if file == "" || filepath.IsAbs(file) || baseDir == "" {
		return file
	}
	return filepath.Join(baseDir, file)
}
