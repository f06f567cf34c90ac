package k8s

import (
	"slices"
	"strconv"
	"testing"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	headermutationv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/header_mutation/v3"
	routerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	networkingv1alpha3 "istio.io/api/networking/v1alpha3"
	securityv1 "istio.io/api/security/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/idemgate/idemgate/envoy/envoytest"
)

func envoyFilter(t *testing.T, objs []object) *networkingv1alpha3.EnvoyFilter {
	t.Helper()
	efs := istioSpecs[*networkingv1alpha3.EnvoyFilter](objs)
	require.Len(t, efs, 1)
	return efs[0]
}

// patchPort is the listener or route-configuration port a patch is scoped to.
func patchPort(p *networkingv1alpha3.EnvoyFilter_EnvoyConfigObjectPatch) uint32 {
	if l := p.GetMatch().GetListener(); l != nil {
		return l.GetPortNumber()
	}
	return p.GetMatch().GetRouteConfiguration().GetPortNumber()
}

// decodedPatches holds every EnvoyFilter patch value decoded into its Envoy
// v3 type, strictly (unknown fields and unresolvable typed_config are errors;
// complete objects also pass their validation rules).
type decodedPatches struct {
	stripSubject   *hcmv3.HttpFilter // INSERT_FIRST in the inbound HCM
	extProc        *hcmv3.HttpFilter // INSERT_BEFORE envoy.filters.http.router
	cluster        *clusterv3.Cluster
	hcmMerge       *hcmv3.HttpConnectionManager // partial, merged into Istio's
	insertedRoutes []*routev3.Route             // INSERT_BEFORE `default`, in order
}

func decodePatches(t *testing.T, ef *networkingv1alpha3.EnvoyFilter) decodedPatches {
	t.Helper()
	var out decodedPatches
	for i, p := range ef.GetConfigPatches() {
		js, err := protojson.Marshal(p.GetPatch().GetValue())
		require.NoError(t, err)
		require.Equal(t, networkingv1alpha3.EnvoyFilter_SIDECAR_INBOUND, p.GetMatch().GetContext(),
			"patch %d: everything attaches to the app's inbound side (ANY would add the cluster twice)", i)
		op := p.GetPatch().GetOperation()
		switch p.GetApplyTo() {
		case networkingv1alpha3.EnvoyFilter_NETWORK_FILTER:
			require.Equal(t, networkingv1alpha3.EnvoyFilter_Patch_MERGE, op)
			require.Equal(t, "envoy.filters.network.http_connection_manager", p.GetMatch().GetListener().GetFilterChain().GetFilter().GetName())
			var f listenerv3.Filter
			require.NoError(t, envoytest.UnmarshalPartialJSON(js, &f), "patch %d", i)
			var hcm hcmv3.HttpConnectionManager
			require.NoError(t, f.GetTypedConfig().UnmarshalTo(&hcm), "patch %d", i)
			out.hcmMerge = &hcm
		case networkingv1alpha3.EnvoyFilter_HTTP_FILTER:
			var f hcmv3.HttpFilter
			require.NoError(t, envoytest.UnmarshalJSON(js, &f), "patch %d", i)
			require.Equal(t, "envoy.filters.network.http_connection_manager", p.GetMatch().GetListener().GetFilterChain().GetFilter().GetName())
			switch {
			case op == networkingv1alpha3.EnvoyFilter_Patch_INSERT_FIRST:
				require.True(t, f.GetTypedConfig().MessageIs(&headermutationv3.HeaderMutation{}), "patch %d: only the subject strip goes first", i)
				out.stripSubject = &f
			case op == networkingv1alpha3.EnvoyFilter_Patch_INSERT_BEFORE &&
				p.GetMatch().GetListener().GetFilterChain().GetFilter().GetSubFilter().GetName() == "envoy.filters.http.router":
				out.extProc = &f
			default:
				t.Fatalf("patch %d: unexpected HTTP_FILTER %v", i, op)
			}
		case networkingv1alpha3.EnvoyFilter_CLUSTER:
			require.Equal(t, networkingv1alpha3.EnvoyFilter_Patch_ADD, op)
			var c clusterv3.Cluster
			require.NoError(t, envoytest.UnmarshalJSON(js, &c), "patch %d", i)
			out.cluster = &c
		case networkingv1alpha3.EnvoyFilter_HTTP_ROUTE:
			rc := p.GetMatch().GetRouteConfiguration()
			require.Equal(t, "default", rc.GetVhost().GetRoute().GetName(), "patch %d", i)
			// Istio names the inbound virtual host after the Service port
			// (inbound|http|80), not the container port the patch is scoped
			// to; a name that disagrees makes the patch silently not apply.
			require.Empty(t, rc.GetVhost().GetName(), "patch %d: match the route, not the virtual host's name", i)
			// Only inserted routes: idemgate's matcher decides where it runs,
			// so no route (Istio's `default` included) switches it off.
			require.Equal(t, networkingv1alpha3.EnvoyFilter_Patch_INSERT_BEFORE, op, "patch %d: unexpected HTTP_ROUTE %v", i, op)
			var r routev3.Route
			require.NoError(t, envoytest.UnmarshalJSON(js, &r), "patch %d", i)
			out.insertedRoutes = append(out.insertedRoutes, &r)
		default:
			t.Fatalf("patch %d: unexpected applyTo %v", i, p.GetApplyTo())
		}
	}
	require.NotNil(t, out.stripSubject)
	require.NotNil(t, out.extProc)
	require.NotNil(t, out.cluster)
	require.NotNil(t, out.hcmMerge)
	require.NotEmpty(t, out.insertedRoutes)
	return out
}

// Istio's name for the inbound cluster of a port (pilot's
// buildSidecarInboundHTTPRouteConfig); the virtual host is named after the
// Service port instead (inbound|http|80 for service.yaml).
func inboundCluster(port uint32) string { return "inbound|" + itoa(port) + "||" }

func itoa(v uint32) string { return strconv.FormatUint(uint64(v), 10) }

// assembleInbound builds the inbound HTTP connection manager the way Istio
// will after applying the patches: its own filters reduced to what matters
// (strip first, idemgate right before the router), our routes before its
// `default` route (prefix "/", no timeout). The envoy/ invariants then run on
// it unchanged.
func assembleInbound(t *testing.T, d decodedPatches, port uint32) *envoytest.Gateway {
	t.Helper()
	def := &routev3.Route{
		Name:   "default",
		Match:  &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"}},
		Action: &routev3.Route_Route{Route: &routev3.RouteAction{ClusterSpecifier: &routev3.RouteAction_Cluster{Cluster: inboundCluster(port)}, Timeout: durationpb.New(0)}},
	}
	hcm := proto.Clone(d.hcmMerge).(*hcmv3.HttpConnectionManager)
	hcm.RouteSpecifier = &hcmv3.HttpConnectionManager_RouteConfig{RouteConfig: &routev3.RouteConfiguration{
		Name: inboundCluster(port),
		VirtualHosts: []*routev3.VirtualHost{{
			Name: "inbound|http|80", Domains: []string{"*"},
			Routes: append(slices.Clone(d.insertedRoutes), def),
		}},
	}}
	router := &hcmv3.HttpFilter{Name: "envoy.filters.http.router"}
	filters, err := envoytest.UnpackFilters([]*hcmv3.HttpFilter{d.stripSubject, d.extProc})
	require.NoError(t, err)
	filters = append(filters, envoytest.Filter{Name: router.GetName(), Config: &routerv3.Router{}})
	hcm.HttpFilters = []*hcmv3.HttpFilter{d.stripSubject, d.extProc, router}
	return &envoytest.Gateway{
		HCM:      hcm,
		Filters:  filters,
		Clusters: map[string]*clusterv3.Cluster{d.cluster.GetName(): d.cluster},
		Listener: &listenerv3.Listener{},
	}
}

func TestIstioEnvoyFilter(t *testing.T) {
	objs := render(t, istioDir)
	d := deployment(t, objs)
	ef := envoyFilter(t, objs)
	_, cfg := idemgateConfig(t, objs)
	patches := decodePatches(t, ef)
	appPort := container(t, &d.Spec.Template.Spec, "app").Ports[0].ContainerPort

	t.Run("scoped to the app's pods by workloadSelector", func(t *testing.T) {
		sel := ef.GetWorkloadSelector().GetLabels()
		require.NotEmpty(t, sel)
		require.True(t, labels.SelectorFromSet(sel).Matches(labels.Set(d.Spec.Template.Labels)))
	})
	t.Run("every patch is scoped to the app port", func(t *testing.T) {
		for _, p := range ef.GetConfigPatches() {
			if p.GetApplyTo() != networkingv1alpha3.EnvoyFilter_CLUSTER {
				require.EqualValues(t, appPort, patchPort(p))
			}
		}
	})
	t.Run("routes point at Istio's inbound cluster for the port", func(t *testing.T) {
		for _, r := range patches.insertedRoutes {
			if r.GetRoute() != nil {
				require.Equal(t, inboundCluster(uint32(appPort)), r.GetRoute().GetCluster(), r.GetName())
			}
		}
	})
	t.Run("ext_proc asks for response.code (a body-only preview's status)", func(t *testing.T) {
		unpacked, err := envoytest.UnpackFilters([]*hcmv3.HttpFilter{patches.extProc})
		require.NoError(t, err)
		ep, ok := unpacked[0].Config.(*extprocv3.ExternalProcessor)
		require.True(t, ok, "the idemgate filter does not wrap ext_proc")
		require.Equal(t, []string{"response.code"}, ep.GetResponseAttributes())
		require.Empty(t, ep.GetRequestAttributes())
	})
	t.Run("the filters and the cluster are `idemgate envoy-config`'s for the config beside them", func(t *testing.T) {
		// One shape: the EnvoyFilter inserts exactly the pieces' filters
		// and cluster, generated from the overlay's idemgate.yaml with its
		// previews' fingerprint_header: false. That switch only adds
		// response_attributes: [response.code] to the ext_proc filter, which
		// the EnvoyFilter always carries so that the mode can be switched on
		// in idemgate.yaml alone.
		raw, _ := idemgateConfig(t, objs)
		p := renderPiecesOf(t, withBodyOnlyPreviews(t, raw), inboundCluster(uint32(appPort)))
		plain := renderPieces(t, objs, inboundCluster(uint32(appPort)))
		require.Len(t, p.FiltersBeforeAuthentication, 1)
		require.True(t, proto.Equal(p.FiltersBeforeAuthentication[0], patches.stripSubject), "subject strip differs from the pieces'")
		require.Len(t, p.Filters, 1)
		require.True(t, proto.Equal(p.Filters[0], patches.extProc), "idemgate filter differs from the pieces' for the config with a body-only preview")
		require.False(t, proto.Equal(plain.Filters[0], patches.extProc), "the pieces for the config as shipped ask for no attribute: the EnvoyFilter does")
		require.True(t, proto.Equal(plain.Clusters[0], p.Clusters[0]) && len(plain.Routes) == len(p.Routes) &&
			proto.Equal(plain.LocalReplyConfig, p.LocalReplyConfig), "fingerprint_header changes only the ext_proc filter")
		require.True(t, proto.Equal(p.Clusters[0], patches.cluster), "idemgate cluster differs from the pieces'")
		require.Len(t, patches.insertedRoutes, len(p.Routes))
		for i, r := range p.Routes {
			require.True(t, proto.Equal(r, patches.insertedRoutes[i]), "route %s differs from the pieces'", r.GetName())
		}
		require.True(t, proto.Equal(p.LocalReplyConfig, patches.hcmMerge.GetLocalReplyConfig()), "local_reply_config differs from the pieces'")
	})

	g := assembleInbound(t, patches, uint32(appPort))
	// Checks that do not apply: Istio builds the filter chain (strip-first and
	// ext_proc-before-router are asserted by decodePatches), jwt_authn is
	// generated from RequestAuthentication (TestIstioIdentity), and the inbound
	// listener's buffer limit is Istio's (Envoy's default, 1 MiB).
	skip := map[string]bool{
		"filters run header_mutation, jwt_authn, ext_proc, router": true,
		"jwt_authn sets the subject header on every operation":     true,
		"buffer limit equals limits.max_body_bytes":                true,
	}
	for _, check := range envoytest.BootstrapChecks() {
		if skip[check.Name] {
			continue
		}
		t.Run(check.Name, func(t *testing.T) {
			require.NoError(t, check.Run(g, cfg))
		})
	}
	require.EqualValues(t, envoytest.DefaultMaxBodyBytes, cfg.Limits.MaxBodyBytes,
		"Istio's inbound buffer limit is Envoy's 1 MiB default; raise it with a LISTENER patch if you raise max_body_bytes")
}

func TestIstioIdentity(t *testing.T) {
	objs := render(t, istioDir)
	d := deployment(t, objs)
	_, cfg := idemgateConfig(t, objs)
	podLabels := labels.Set(d.Spec.Template.Labels)

	t.Run("RequestAuthentication sets the subject header from sub", func(t *testing.T) {
		ras := istioSpecs[*securityv1.RequestAuthentication](objs)
		require.Len(t, ras, 1)
		require.True(t, labels.SelectorFromSet(ras[0].GetSelector().GetMatchLabels()).Matches(podLabels))
		require.NotEmpty(t, ras[0].GetJwtRules())
		for _, rule := range ras[0].GetJwtRules() {
			require.NotEmpty(t, rule.GetIssuer())
			require.NotEmpty(t, rule.GetAudiences())
			require.False(t, rule.GetForwardOriginalToken())
			require.True(t, slices.ContainsFunc(rule.GetOutputClaimToHeaders(), func(h *securityv1.ClaimToHeader) bool {
				return h.GetHeader() == cfg.Subject.Header && h.GetClaim() == "sub"
			}), "issuer %s must copy sub into %s", rule.GetIssuer(), cfg.Subject.Header)
		}
	})
	t.Run("AuthorizationPolicy refuses every operation without a verified token", func(t *testing.T) {
		aps := istioSpecs[*securityv1.AuthorizationPolicy](objs)
		require.Len(t, aps, 1)
		ap := aps[0]
		require.True(t, labels.SelectorFromSet(ap.GetSelector().GetMatchLabels()).Matches(podLabels))
		require.Equal(t, securityv1.AuthorizationPolicy_DENY, ap.GetAction())
		var denied []string
		for _, rule := range ap.GetRules() {
			require.Len(t, rule.GetFrom(), 1)
			require.Equal(t, []string{"*"}, rule.GetFrom()[0].GetSource().GetNotRequestPrincipals())
			for _, to := range rule.GetTo() {
				denied = append(denied, to.GetOperation().GetPaths()...)
			}
		}
		require.ElementsMatch(t, cfg.OperationPaths(), denied)
	})
}
