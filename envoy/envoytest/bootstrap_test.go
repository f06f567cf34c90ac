package envoytest

import (
	"testing"
	"time"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/encoding/protojson"
	"sigs.k8s.io/yaml"

	"github.com/idemgate/idemgate/envoy"
	"github.com/idemgate/idemgate/internal/testutil"
)

// TestRenderBootstrap: the edited envoy.yaml points the listener, the admin
// port and both clusters at the given addresses, changes only the confirm
// route's timeout and ext_proc's message_timeout, and the pinned Envoy
// accepts it (--mode validate) as it accepts the shipped file.
func TestRenderBootstrap(t *testing.T) {
	out, err := RenderBootstrap(envoy.BootstrapYAML(), Edits{
		Listen: "127.0.0.1:2001", Admin: "127.0.0.1:2002",
		Clusters:            map[string]string{"idemgate": "127.0.0.1:2003", "payments": "127.0.0.1:2004"},
		ConfirmRouteTimeout: 1500 * time.Millisecond,
		MessageTimeout:      8 * time.Second,
	})
	require.NoError(t, err)

	js, err := yaml.YAMLToJSON(out)
	require.NoError(t, err)
	var bs bootstrapv3.Bootstrap
	require.NoError(t, protojson.Unmarshal(js, &bs))
	require.NoError(t, bs.ValidateAll())

	sa := bs.GetAdmin().GetAddress().GetSocketAddress()
	require.Equal(t, "127.0.0.1", sa.GetAddress())
	require.Equal(t, uint32(2002), sa.GetPortValue())
	l := bs.GetStaticResources().GetListeners()[0]
	require.Equal(t, uint32(2001), l.GetAddress().GetSocketAddress().GetPortValue())
	ports := map[string]uint32{}
	for _, c := range bs.GetStaticResources().GetClusters() {
		ports[c.GetName()] = c.GetLoadAssignment().GetEndpoints()[0].GetLbEndpoints()[0].GetEndpoint().GetAddress().GetSocketAddress().GetPortValue()
	}
	require.Equal(t, map[string]uint32{"idemgate": 2003, "payments": 2004}, ports)

	var h hcmv3.HttpConnectionManager
	require.NoError(t, l.GetFilterChains()[0].GetFilters()[0].GetTypedConfig().UnmarshalTo(&h))
	timeouts := map[string]time.Duration{}
	for _, r := range h.GetRouteConfig().GetVirtualHosts()[0].GetRoutes() {
		if ra, ok := r.GetAction().(*routev3.Route_Route); ok {
			timeouts[r.GetName()] = ra.Route.GetTimeout().AsDuration()
		}
	}
	require.Equal(t, map[string]time.Duration{
		"transfer_preview": 10 * time.Second, "transfer_confirm": 1500 * time.Millisecond,
		"transfer_status": 5 * time.Second, "catch_all": 15 * time.Second, "transfer_mcp": 30 * time.Second,
	}, timeouts)
	var found bool
	filters, err := UnpackFilters(h.GetHttpFilters())
	require.NoError(t, err)
	for _, f := range filters {
		if f.Name != ExtProcFilter {
			continue
		}
		ep, ok := f.Config.(*extprocv3.ExternalProcessor)
		require.True(t, ok, "%s is ext_proc inside its matcher", ExtProcFilter)
		require.NotNil(t, f.Matcher)
		require.Equal(t, 8*time.Second, ep.GetMessageTimeout().AsDuration())
		require.False(t, ep.GetFailureModeAllow(), "never fail open")
		found = true
	}
	require.True(t, found)

	// The retry and path edits, for the tests that need them.
	edited, err := RenderBootstrap(envoy.BootstrapYAML(), Edits{ConfirmRetryOn: "connect-failure", RawPaths: true})
	require.NoError(t, err)
	js, err = yaml.YAMLToJSON(edited)
	require.NoError(t, err)
	var ebs bootstrapv3.Bootstrap
	require.NoError(t, protojson.Unmarshal(js, &ebs))
	var eh hcmv3.HttpConnectionManager
	require.NoError(t, ebs.GetStaticResources().GetListeners()[0].GetFilterChains()[0].GetFilters()[0].GetTypedConfig().UnmarshalTo(&eh))
	require.False(t, eh.GetNormalizePath().GetValue())
	require.False(t, eh.GetMergeSlashes())
	require.True(t, h.GetNormalizePath().GetValue(), "as shipped, paths are normalised")
	for _, r := range eh.GetRouteConfig().GetVirtualHosts()[0].GetRoutes() {
		if r.GetName() == ConfirmRoute {
			require.Equal(t, "connect-failure", r.GetRoute().GetRetryPolicy().GetRetryOn())
		}
	}

	// Envoy itself accepts the edited file (and the unedited one).
	requireEnvoyValidates(t, out)
	out, err = RenderBootstrap(envoy.BootstrapYAML(), Edits{})
	require.NoError(t, err)
	requireEnvoyValidates(t, out)

	_, err = RenderBootstrap(envoy.BootstrapYAML(), Edits{Clusters: map[string]string{"nope": "127.0.0.1:1"}})
	require.ErrorContains(t, err, `no cluster "nope"`)
}

// requireEnvoyValidates runs `envoy --mode validate` on bootstrap. No Envoy
// is a failure (FindEnvoy says how to install it), never a skip.
func requireEnvoyValidates(t *testing.T, bootstrap []byte) {
	t.Helper()
	out, err := ValidateConfig(RequireEnvoy(t), bootstrap, t.TempDir())
	require.NoError(t, err, "envoy --mode validate refused the bootstrap:\n%s", out)
}

// TestRenderBootstrapDropsExtProc: the load benchmark's column without
// ext_proc loses that filter and nothing else.
func TestRenderBootstrapDropsExtProc(t *testing.T) {
	e := Edits{Listen: "127.0.0.1:1001", Admin: "127.0.0.1:1002", Clusters: map[string]string{IdemgateCluster: "127.0.0.1:1003", PaymentsCluster: "127.0.0.1:1004"}}
	with, err := RenderBootstrap(envoy.BootstrapYAML(), e)
	require.NoError(t, err)
	e.DropExtProc = true
	without, err := RenderBootstrap(envoy.BootstrapYAML(), e)
	require.NoError(t, err)
	for _, addr := range []string{"1001", "1002", "1003", "1004"} {
		require.Contains(t, string(with), "portValue: "+addr)
		require.Contains(t, string(without), "portValue: "+addr)
	}
	filters := func(y []byte) []string {
		g, err := DecodeBootstrap(y)
		require.NoError(t, err)
		var names []string
		for _, f := range g.Filters {
			names = append(names, f.Name)
		}
		return names
	}
	require.Equal(t, []string{"idemgate.strip_subject", "envoy.filters.http.jwt_authn", "idemgate", "envoy.filters.http.router"}, filters(with))
	require.Equal(t, []string{"idemgate.strip_subject", "envoy.filters.http.jwt_authn", "envoy.filters.http.router"}, filters(without))
	requireEnvoyValidates(t, without)
}

// TestRenderBootstrapPrivateChannel: the idemgate cluster on a unix socket
// (a pipe address) and with IdemgateUpstreamTLS (as envoy-config writes
// it); the pinned Envoy accepts both.
func TestRenderBootstrapPrivateChannel(t *testing.T) {
	bin := RequireEnvoy(t)
	files := testutil.WriteTLSFiles(t)
	out, err := RenderBootstrap(envoy.BootstrapYAML(), Edits{
		Clusters:   map[string]string{IdemgateCluster: "unix:///run/idemgate/extproc.sock"},
		ClusterTLS: map[string]*tlsv3.UpstreamTlsContext{IdemgateCluster: IdemgateUpstreamTLS(files.ClientCertFile, files.ClientKeyFile, files.CAFile, "spiffe://cluster.local/ns/p/sa/idemgate")},
	})
	require.NoError(t, err)
	var bs bootstrapv3.Bootstrap
	require.NoError(t, UnmarshalYAML(out, &bs))
	c, err := cluster(&bs, IdemgateCluster)
	require.NoError(t, err)
	require.Equal(t, "/run/idemgate/extproc.sock", c.GetLoadAssignment().GetEndpoints()[0].GetLbEndpoints()[0].GetEndpoint().GetAddress().GetPipe().GetPath())
	var ctx tlsv3.UpstreamTlsContext
	require.NoError(t, c.GetTransportSocket().GetTypedConfig().UnmarshalTo(&ctx))
	san := ctx.GetCommonTlsContext().GetValidationContext().GetMatchTypedSubjectAltNames()[0]
	require.Equal(t, tlsv3.SubjectAltNameMatcher_URI, san.GetSanType())
	require.Equal(t, []string{"h2"}, ctx.GetCommonTlsContext().GetAlpnProtocols())
	msg, err := ValidateConfig(bin, out, t.TempDir())
	require.NoError(t, err, msg)

	_, err = RenderBootstrap(envoy.BootstrapYAML(), Edits{ClusterTLS: map[string]*tlsv3.UpstreamTlsContext{"nope": {}}})
	require.ErrorContains(t, err, `no cluster "nope"`)
}
