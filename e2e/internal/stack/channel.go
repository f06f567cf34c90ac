package stack

import (
	"fmt"
	"path/filepath"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/anypb"
	"sigs.k8s.io/yaml"

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

// editIdemgateCluster rewrites the bootstrap's idemgate cluster: its
// endpoint becomes a pipe (Envoy's unix socket address) when pipe is set,
// and it gets an UpstreamTlsContext with tlsOpts.
func editIdemgateCluster(bootstrap []byte, pipe string, tlsOpts *GRPCTLS) ([]byte, error) {
	if pipe == "" && tlsOpts == nil {
		return bootstrap, nil
	}
	var bs bootstrapv3.Bootstrap
	if err := envoytest.UnmarshalYAML(bootstrap, &bs); err != nil {
		return nil, err
	}
	var cl *clusterv3.Cluster
	for _, c := range bs.GetStaticResources().GetClusters() {
		if c.GetName() == envoytest.IdemgateCluster {
			cl = c
		}
	}
	if cl == nil {
		return nil, fmt.Errorf("the bootstrap has no %s cluster", envoytest.IdemgateCluster)
	}
	if pipe != "" {
		eps := cl.GetLoadAssignment().GetEndpoints()
		if len(eps) != 1 || len(eps[0].GetLbEndpoints()) != 1 || eps[0].GetLbEndpoints()[0].GetEndpoint() == nil {
			return nil, fmt.Errorf("the %s cluster should have exactly one endpoint", envoytest.IdemgateCluster)
		}
		eps[0].GetLbEndpoints()[0].GetEndpoint().Address = &corev3.Address{Address: &corev3.Address_Pipe{Pipe: &corev3.Pipe{Path: pipe}}}
	}
	if tlsOpts != nil {
		file := func(name string) *corev3.DataSource {
			return &corev3.DataSource{Specifier: &corev3.DataSource_Filename{Filename: name}}
		}
		ctx, err := anypb.New(&tlsv3.UpstreamTlsContext{
			Sni: tlsOpts.ServerSAN,
			CommonTlsContext: &tlsv3.CommonTlsContext{
				// gRPC servers require ALPN h2 over TLS.
				AlpnProtocols: []string{"h2"},
				TlsCertificates: []*tlsv3.TlsCertificate{{
					CertificateChain: file(tlsOpts.EnvoyCertFile), PrivateKey: file(tlsOpts.EnvoyKeyFile),
				}},
				ValidationContextType: &tlsv3.CommonTlsContext_ValidationContext{ValidationContext: &tlsv3.CertificateValidationContext{
					TrustedCa: file(tlsOpts.EnvoyTrustedCAFile),
					MatchTypedSubjectAltNames: []*tlsv3.SubjectAltNameMatcher{{
						SanType: tlsv3.SubjectAltNameMatcher_DNS,
						Matcher: &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Exact{Exact: tlsOpts.ServerSAN}},
					}},
				}},
			},
		})
		if err != nil {
			return nil, err
		}
		cl.TransportSocket = &corev3.TransportSocket{Name: "envoy.transport_sockets.tls", ConfigType: &corev3.TransportSocket_TypedConfig{TypedConfig: ctx}}
	}
	if err := bs.ValidateAll(); err != nil {
		return nil, fmt.Errorf("the edited bootstrap is invalid: %w", err)
	}
	out, err := protojson.Marshal(&bs)
	if err != nil {
		return nil, err
	}
	return yaml.JSONToYAML(out)
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
