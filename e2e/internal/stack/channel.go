package stack

import (
	"path/filepath"

	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"

	"github.com/idemgate/idemgate/envoy/envoytest"
)

// GRPCTLS puts mutual TLS on the ext_proc channel (docs/design.md §12):
// idemgate serves grpc_tls with the server files and admits ClientSANs
// signed by ClientCAFile; Envoy's idemgate cluster presents the Envoy
// client certificate and verifies idemgate's against EnvoyTrustedCAFile
// and ServerSAN. Paths are absolute (the test's temporary directory).
type GRPCTLS struct {
	ServerCertFile, ServerKeyFile, ClientCAFile string
	ClientSANs                                  []string
	EnvoyCertFile, EnvoyKeyFile                 string
	EnvoyTrustedCAFile                          string
	ServerSAN                                   string
}

// grpcTLSConfig is grpc_tls for idemgate.yaml.
func (g *GRPCTLS) grpcTLSConfig() map[string]any {
	sans := make([]any, len(g.ClientSANs))
	for i, s := range g.ClientSANs {
		sans[i] = s
	}
	return map[string]any{
		"cert_file": g.ServerCertFile, "key_file": g.ServerKeyFile,
		"client_ca_file": g.ClientCAFile, "client_sans": sans,
	}
}

// unixSocketListen is grpc_listen for Options.GRPCUnixSocket, in dir.
func unixSocketListen(dir string) string {
	return "unix://" + filepath.Join(dir, "extproc.sock")
}

// clusterTLS is the idemgate cluster's UpstreamTlsContext, as `idemgate
// envoy-config` writes it for grpc_tls; nil without TLS.
func (g *GRPCTLS) clusterTLS() map[string]*tlsv3.UpstreamTlsContext {
	if g == nil {
		return nil
	}
	return map[string]*tlsv3.UpstreamTlsContext{
		envoytest.IdemgateCluster: envoytest.IdemgateUpstreamTLS(g.EnvoyCertFile, g.EnvoyKeyFile, g.EnvoyTrustedCAFile, g.ServerSAN),
	}
}

// StartExtraEnvoy starts a second Envoy on the stack's bootstrap (its own
// ports): its connections to idemgate, and their handshakes, are new.
func (s *Stack) StartExtraEnvoy(bin string) *Envoy {
	s.t.Helper()
	e, err := startEnvoy(s.t, bin, s.Bootstrap)
	if err != nil {
		s.t.Fatalf("the extra envoy did not start: %v", err)
	}
	s.t.Cleanup(e.Close)
	return e
}

// AgentVia is an agent of user sending through e.
func (s *Stack) AgentVia(e *Envoy, user string) *Agent {
	s.t.Helper()
	a, err := newAgent(user, "http://"+e.ListenAddr, s.client)
	if err != nil {
		s.t.Fatal(err)
	}
	return a
}

// Base is the front the agent sends to (http://host:port).
func (a *Agent) Base() string { return a.base }
