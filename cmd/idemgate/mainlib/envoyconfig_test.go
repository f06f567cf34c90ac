package mainlib

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/envoy/envoytest"
	"github.com/idemgate/idemgate/internal/testutil"
)

// TestEnvoyConfigCommand: `idemgate envoy-config` prints
// envoy/ext_proc-filter.yaml for the shipped config (the cluster address from
// its grpc_listen), needs no secret, takes the address and cluster from
// flags, and refuses bad input.
func TestEnvoyConfigCommand(t *testing.T) {
	t.Setenv("IDEMGATE_KEY_K1", "")
	os.Unsetenv("IDEMGATE_KEY_K1")
	var out, errOut bytes.Buffer
	require.NoError(t, Main(t.Context(), []string{"envoy-config", "--config", "../../../envoy/idemgate.yaml"}, &out, &errOut), errOut.String())
	want, err := os.ReadFile("../../../envoy/ext_proc-filter.yaml")
	require.NoError(t, err)
	require.Equal(t, strings.Replace(string(want), "--config envoy/idemgate.yaml", "--config ../../../envoy/idemgate.yaml", 1), out.String())

	out.Reset()
	require.NoError(t, Main(t.Context(), []string{"envoy-config", "--config", "../../../envoy/idemgate.yaml", "--idemgate-address", "idemgate.payments.svc:9000", "--upstream-cluster", "api"}, &out, &errOut))
	require.Contains(t, out.String(), "socket_address: {address: idemgate.payments.svc, port_value: 9000}")
	require.Contains(t, out.String(), "type: STRICT_DNS", "a name needs DNS resolution")
	require.Contains(t, out.String(), "cluster: api\n")

	for _, args := range [][]string{{"envoy-config"}, {"envoy-config", "--bogus"}} {
		out.Reset()
		require.ErrorIs(t, Main(t.Context(), args, &out, &errOut), ErrUsage, "%v", args)
		require.Empty(t, out.String())
	}
	require.Error(t, Main(t.Context(), []string{"envoy-config", "--config", "../../../envoy/idemgate.yaml", "--idemgate-address", "nope"}, &out, &errOut))
}

// TestEnvoyConfigTLSAndSocket: with grpc_tls the cluster gets Envoy's client
// certificate, idemgate's CA and the SAN of idemgate's certificate (read
// from grpc_tls.cert_file unless --idemgate-san is given), at the routable
// host grpc_listen names (or the certificate's DNS name for a wildcard
// host); with a unix socket grpc_listen the endpoint is that pipe.
func TestEnvoyConfigTLSAndSocket(t *testing.T) {
	shipped, err := os.ReadFile("../../../envoy/idemgate.yaml")
	require.NoError(t, err)
	files := testutil.WriteTLSFiles(t)
	write := func(listen string, withTLS bool) string {
		cfg := strings.Replace(string(shipped), `grpc_listen: "127.0.0.1:50051"`, "grpc_listen: "+listen, 1)
		if withTLS {
			cfg = fmt.Sprintf("grpc_tls: {cert_file: %q, key_file: %q, client_ca_file: %q, client_sans: [envoy.payments.svc]}\n",
				files.ServerCertFile, files.ServerKeyFile, files.CAFile) + cfg
		}
		path := filepath.Join(t.TempDir(), "idemgate.yaml")
		require.NoError(t, os.WriteFile(path, []byte(cfg), 0o600))
		return path
	}
	run := func(args ...string) *envoytest.Pieces {
		t.Helper()
		var out, errOut bytes.Buffer
		require.NoError(t, Main(t.Context(), append([]string{"envoy-config"}, args...), &out, &errOut), errOut.String())
		p, err := envoytest.DecodePieces(out.Bytes())
		require.NoError(t, err, out.String())
		require.Len(t, p.Clusters, 1)
		return p
	}
	tlsOf := func(p *envoytest.Pieces) *tlsv3.UpstreamTlsContext {
		var ctx tlsv3.UpstreamTlsContext
		require.NoError(t, p.Clusters[0].GetTransportSocket().GetTypedConfig().UnmarshalTo(&ctx))
		return &ctx
	}

	t.Run("routable host with grpc_tls: the host, the defaults, the certificate's SAN", func(t *testing.T) {
		p := run("--config", write(`"10.1.2.3:50051"`, true))
		host, port, err := envoytest.SingleEndpoint(p.Clusters[0])
		require.NoError(t, err)
		require.Equal(t, "10.1.2.3", host)
		require.EqualValues(t, 50051, port)
		ctx := tlsOf(p)
		common := ctx.GetCommonTlsContext()
		require.Equal(t, defaultEnvoyClientCert, common.GetTlsCertificates()[0].GetCertificateChain().GetFilename())
		require.Equal(t, defaultEnvoyClientKey, common.GetTlsCertificates()[0].GetPrivateKey().GetFilename())
		require.Equal(t, defaultIdemgateCA, common.GetValidationContext().GetTrustedCa().GetFilename())
		require.Equal(t, "localhost", common.GetValidationContext().GetMatchTypedSubjectAltNames()[0].GetMatcher().GetExact(), "the server certificate's DNS SAN")
		require.Equal(t, "localhost", ctx.GetSni())
	})
	t.Run("wildcard host with grpc_tls: the SAN's name; flags override", func(t *testing.T) {
		cfg := write(`":50051"`, true)
		host, _, err := envoytest.SingleEndpoint(run("--config", cfg).Clusters[0])
		require.NoError(t, err)
		require.Equal(t, "localhost", host)
		p := run("--config", cfg, "--idemgate-address", "idemgate.payments.svc:7000", "--idemgate-san", "spiffe://cluster.local/ns/payments/sa/idemgate",
			"--envoy-client-cert", "/c.pem", "--envoy-client-key", "/k.pem", "--idemgate-ca", "/ca.pem")
		host, port, err := envoytest.SingleEndpoint(p.Clusters[0])
		require.NoError(t, err)
		require.Equal(t, "idemgate.payments.svc", host)
		require.EqualValues(t, 7000, port)
		ctx := tlsOf(p)
		require.Empty(t, ctx.GetSni(), "no SNI for a URI SAN unless asked")
		require.Equal(t, "spiffe://cluster.local/ns/payments/sa/idemgate", ctx.GetCommonTlsContext().GetValidationContext().GetMatchTypedSubjectAltNames()[0].GetMatcher().GetExact())
		require.Equal(t, "/c.pem", ctx.GetCommonTlsContext().GetTlsCertificates()[0].GetCertificateChain().GetFilename())
	})
	t.Run("unix socket: a pipe, no TLS", func(t *testing.T) {
		p := run("--config", write("unix:///run/idemgate/extproc.sock", false))
		require.Nil(t, p.Clusters[0].GetTransportSocket())
		ep := p.Clusters[0].GetLoadAssignment().GetEndpoints()[0].GetLbEndpoints()[0].GetEndpoint()
		require.Equal(t, "/run/idemgate/extproc.sock", ep.GetAddress().GetPipe().GetPath())
	})
	t.Run("grpc_tls whose certificate is not readable here needs --idemgate-san", func(t *testing.T) {
		cfg := write(`"10.1.2.3:50051"`, true)
		require.NoError(t, os.Remove(files.ServerCertFile))
		var out, errOut bytes.Buffer
		err := Main(t.Context(), []string{"envoy-config", "--config", cfg}, &out, &errOut)
		require.ErrorContains(t, err, "--idemgate-san is required")
		require.Empty(t, out.String())
		run("--config", cfg, "--idemgate-san", "idemgate.payments.svc")
	})
}
