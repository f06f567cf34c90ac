package pieces_test

import (
	"testing"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	httpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/envoy/envoytest"
	"github.com/idemgate/idemgate/envoy/pieces"
	"github.com/idemgate/idemgate/internal/testutil"
)

// TestClusterTLSAndPipe: with TLS options the idemgate cluster carries an
// UpstreamTlsContext (Envoy's client certificate, idemgate's CA and SAN,
// SNI, TLS 1.2 or later, ALPN h2) and stays HTTP/2; with a unix socket its
// endpoint is a pipe. Both decode strictly and the pinned Envoy's
// --mode validate accepts them pasted into a bootstrap.
func TestClusterTLSAndPipe(t *testing.T) {
	bin := envoytest.RequireEnvoy(t)
	files := testutil.WriteTLSFiles(t)
	for _, tc := range []struct {
		name, addr string
		tls        *pieces.UpstreamTLS
		check      func(t *testing.T, c *clusterv3.Cluster)
	}{
		{"mTLS, DNS SAN", "idemgate.payments.svc:50051", &pieces.UpstreamTLS{
			ClientCert: files.ClientCertFile, ClientKey: files.ClientKeyFile, CA: files.CAFile, SAN: "idemgate.payments.svc", SNI: "idemgate.payments.svc",
		}, func(t *testing.T, c *clusterv3.Cluster) {
			ctx := upstreamTLS(t, c)
			require.Equal(t, "idemgate.payments.svc", ctx.GetSni())
			common := ctx.GetCommonTlsContext()
			require.Equal(t, tlsv3.TlsParameters_TLSv1_2, common.GetTlsParams().GetTlsMinimumProtocolVersion())
			require.Equal(t, []string{"h2"}, common.GetAlpnProtocols(), "gRPC servers require ALPN h2")
			require.Len(t, common.GetTlsCertificates(), 1)
			require.Equal(t, files.ClientCertFile, common.GetTlsCertificates()[0].GetCertificateChain().GetFilename())
			require.Equal(t, files.ClientKeyFile, common.GetTlsCertificates()[0].GetPrivateKey().GetFilename())
			vc := common.GetValidationContext()
			require.Equal(t, files.CAFile, vc.GetTrustedCa().GetFilename())
			require.Len(t, vc.GetMatchTypedSubjectAltNames(), 1)
			san := vc.GetMatchTypedSubjectAltNames()[0]
			require.Equal(t, tlsv3.SubjectAltNameMatcher_DNS, san.GetSanType())
			require.Equal(t, "idemgate.payments.svc", san.GetMatcher().GetExact())
			host, port, err := envoytest.SingleEndpoint(c)
			require.NoError(t, err)
			require.Equal(t, "idemgate.payments.svc", host)
			require.EqualValues(t, 50051, port)
			require.Equal(t, clusterv3.Cluster_STRICT_DNS, c.GetType())
		}},
		{"mTLS, SPIFFE SAN, no SNI", "10.0.0.7:50051", &pieces.UpstreamTLS{
			ClientCert: files.ClientCertFile, ClientKey: files.ClientKeyFile, CA: files.CAFile, SAN: "spiffe://cluster.local/ns/payments/sa/idemgate",
		}, func(t *testing.T, c *clusterv3.Cluster) {
			ctx := upstreamTLS(t, c)
			require.Empty(t, ctx.GetSni())
			san := ctx.GetCommonTlsContext().GetValidationContext().GetMatchTypedSubjectAltNames()[0]
			require.Equal(t, tlsv3.SubjectAltNameMatcher_URI, san.GetSanType())
			require.Equal(t, "spiffe://cluster.local/ns/payments/sa/idemgate", san.GetMatcher().GetExact())
		}},
		{"unix socket", "unix:///run/idemgate/extproc.sock", nil, func(t *testing.T, c *clusterv3.Cluster) {
			require.Nil(t, c.GetTransportSocket(), "the socket file's mode is the access control")
			eps := c.GetLoadAssignment().GetEndpoints()
			require.Len(t, eps, 1)
			require.Len(t, eps[0].GetLbEndpoints(), 1)
			require.Equal(t, "/run/idemgate/extproc.sock", eps[0].GetLbEndpoints()[0].GetEndpoint().GetAddress().GetPipe().GetPath())
			require.Equal(t, clusterv3.Cluster_STATIC, c.GetType())
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := pieces.Options{ConfigPath: "test.yaml", IdemgateAddress: tc.addr, UpstreamCluster: "payments", TLS: tc.tls}
			p := render(t, templatedConfig, o)
			require.Len(t, p.Clusters, 1)
			c := p.Clusters[0]
			var opts httpv3.HttpProtocolOptions
			require.NoError(t, c.GetTypedExtensionProtocolOptions()["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"].UnmarshalTo(&opts))
			require.NotNil(t, opts.GetExplicitHttpConfig().GetHttp2ProtocolOptions(), "gRPC needs HTTP/2")
			tc.check(t, c)

			out := renderRaw(t, templatedConfig, o)
			bootstrap, err := envoytest.PasteIntoBootstrap(out, envoytest.PasteOptions{UpstreamAddr: "127.0.0.1:8081"})
			require.NoError(t, err)
			msg, err := envoytest.ValidateConfig(bin, bootstrap, t.TempDir())
			require.NoError(t, err, msg)
		})
	}
}

func upstreamTLS(t *testing.T, c *clusterv3.Cluster) *tlsv3.UpstreamTlsContext {
	t.Helper()
	ts := c.GetTransportSocket()
	require.NotNil(t, ts)
	require.Equal(t, "envoy.transport_sockets.tls", ts.GetName())
	var ctx tlsv3.UpstreamTlsContext
	require.NoError(t, ts.GetTypedConfig().UnmarshalTo(&ctx))
	return &ctx
}

// TestRenderRefusesIncompleteTLS: TLS without one of its files or the SAN,
// and a relative or too long socket path, are refused.
func TestRenderRefusesIncompleteTLS(t *testing.T) {
	s := parse(t, templatedConfig)
	full := pieces.UpstreamTLS{ClientCert: "/c", ClientKey: "/k", CA: "/ca", SAN: "idemgate"}
	for _, o := range []pieces.Options{
		{IdemgateAddress: "127.0.0.1:50051", UpstreamCluster: "api", TLS: &pieces.UpstreamTLS{ClientKey: "/k", CA: "/ca", SAN: "idemgate"}},
		{IdemgateAddress: "127.0.0.1:50051", UpstreamCluster: "api", TLS: &pieces.UpstreamTLS{ClientCert: "/c", ClientKey: "/k", SAN: "idemgate"}},
		{IdemgateAddress: "127.0.0.1:50051", UpstreamCluster: "api", TLS: &pieces.UpstreamTLS{ClientCert: "/c", ClientKey: "/k", CA: "/ca"}},
		{IdemgateAddress: "unix://run/x.sock", UpstreamCluster: "api"},
		{IdemgateAddress: "unix:///" + string(make([]byte, 120)), UpstreamCluster: "api", TLS: &full},
	} {
		_, err := pieces.Render(s.Runtime, o)
		require.Error(t, err, "%+v", o)
	}
}
