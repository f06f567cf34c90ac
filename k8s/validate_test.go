package k8s

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/rbac/v3"               // typed_config of the sidecar bootstrap
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/listener/http_inspector/v3" // typed_config of the sidecar bootstrap
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/listener/original_dst/v3"   // typed_config of the sidecar bootstrap
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/tcp_proxy/v3" // typed_config of the sidecar bootstrap
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	networkingv1alpha3 "istio.io/api/networking/v1alpha3"

	"github.com/idemgate/idemgate/envoy/envoytest"
)

// The pinned Envoy validates the Envoy configs k8s/ ships: base's sidecar
// config as the envoy container runs it (the ConfigMap's file, the
// container's flags), and the Istio EnvoyFilter applied to a sidecar-like
// bootstrap (testdata/istio-sidecar-inbound.yaml).

func TestBaseEnvoyPassesEnvoyValidate(t *testing.T) {
	bin := envoytest.RequireEnvoy(t)
	objs := render(t, baseDir)
	pod := &deployment(t, objs).Spec.Template.Spec
	c := container(t, pod, "envoy")
	require.Equal(t, []string{"envoy"}, c.Command, "the image's envoy binary")
	cfg := configMapFile(t, objs, pod, c, flagValue(c.Args, "-c"))
	_, err := envoytest.ValidateCommand(bin, cfg, t.TempDir(), c.Args)
	require.NoError(t, err)
}

func sidecarBootstrap(t *testing.T) *bootstrapv3.Bootstrap {
	t.Helper()
	raw, err := os.ReadFile("testdata/istio-sidecar-inbound.yaml")
	require.NoError(t, err)
	var bs bootstrapv3.Bootstrap
	require.NoError(t, envoytest.UnmarshalYAML(raw, &bs))
	return &bs
}

func marshalBootstrap(t *testing.T, bs *bootstrapv3.Bootstrap) []byte {
	t.Helper()
	js, err := protojson.Marshal(bs)
	require.NoError(t, err)
	return js
}

func TestIstioEnvoyFilterPassesEnvoyValidate(t *testing.T) {
	bin := envoytest.RequireEnvoy(t)
	ef := envoyFilter(t, render(t, istioDir))

	t.Run("the sidecar bootstrap alone", func(t *testing.T) {
		_, err := envoytest.ValidateConfig(bin, marshalBootstrap(t, sidecarBootstrap(t)), t.TempDir())
		require.NoError(t, err)
	})

	bs := sidecarBootstrap(t)
	require.NoError(t, applyEnvoyFilter(bs, ef))
	patched := marshalBootstrap(t, bs)
	_, err := envoytest.ValidateConfig(bin, patched, t.TempDir())
	require.NoError(t, err, "patched bootstrap:\n%s", patched)

	t.Run("the patches landed where the EnvoyFilter says", func(t *testing.T) {
		hcm := inboundHCM(t, bs, 8080)
		var names []string
		for _, f := range hcm.GetHttpFilters() {
			names = append(names, f.GetName())
		}
		require.Equal(t, []string{"idemgate.strip_subject", "envoy.filters.http.jwt_authn", "envoy.filters.http.rbac", "idemgate", "envoy.filters.http.router"}, names)
		require.True(t, hcm.GetNormalizePath().GetValue())
		require.True(t, hcm.GetMergeSlashes())
		require.Equal(t, hcmv3.HttpConnectionManager_UNESCAPE_AND_REDIRECT, hcm.GetPathWithEscapedSlashesAction(), "the MERGE overrides Istio's KEEP_UNCHANGED")
		require.Equal(t, "inbound_0.0.0.0_8080", hcm.GetStatPrefix(), "the MERGE kept Istio's own settings")
		var routes []string
		for _, r := range hcm.GetRouteConfig().GetVirtualHosts()[0].GetRoutes() {
			routes = append(routes, r.GetName())
		}
		require.Equal(t, []string{"transfer_preview", "transfer_confirm", "transfer_status", "transfer_mcp", "default"}, routes)
		require.NotNil(t, hcm.GetLocalReplyConfig(), "the MERGE added the request_too_large envelope")
		var clusters []string
		for _, c := range bs.GetStaticResources().GetClusters() {
			clusters = append(clusters, c.GetName())
		}
		require.Contains(t, clusters, "idemgate")
	})

	t.Run("a patch that matches nothing is an error", func(t *testing.T) {
		// The same EnvoyFilter on a sidecar whose app port is another one:
		// Istio would skip the patches silently and leave ext_proc out.
		moved := proto.Clone(ef).(*networkingv1alpha3.EnvoyFilter)
		for _, p := range moved.GetConfigPatches() {
			if l := p.GetMatch().GetListener(); l != nil {
				l.PortNumber = 9999
			}
		}
		require.ErrorContains(t, applyEnvoyFilter(sidecarBootstrap(t), moved), "matched nothing")
	})

	t.Run("Envoy rejects the cluster added twice", func(t *testing.T) {
		// What `context: ANY` would do (Istio adds the cluster once per
		// matching context): the strict decoding accepts each copy, Envoy
		// refuses the pair. (A route to a missing cluster would not do here:
		// Istio's inbound route_config sets validate_clusters: false.)
		twice := proto.Clone(ef).(*networkingv1alpha3.EnvoyFilter)
		for _, p := range ef.GetConfigPatches() {
			if p.GetApplyTo() == networkingv1alpha3.EnvoyFilter_CLUSTER {
				twice.ConfigPatches = append(twice.ConfigPatches, proto.Clone(p).(*networkingv1alpha3.EnvoyFilter_EnvoyConfigObjectPatch))
			}
		}
		bs := sidecarBootstrap(t)
		require.NoError(t, applyEnvoyFilter(bs, twice))
		out, err := envoytest.ValidateConfig(bin, marshalBootstrap(t, bs), t.TempDir())
		require.Error(t, err)
		require.Contains(t, out, "duplicate cluster 'idemgate'")
	})
}

// inboundHCM returns the connection manager of the inbound filter chain for port.
func inboundHCM(t *testing.T, bs *bootstrapv3.Bootstrap, port uint32) *hcmv3.HttpConnectionManager {
	t.Helper()
	for _, l := range bs.GetStaticResources().GetListeners() {
		for _, fc := range l.GetFilterChains() {
			if fc.GetFilterChainMatch().GetDestinationPort().GetValue() != port {
				continue
			}
			for _, f := range fc.GetFilters() {
				var hcm hcmv3.HttpConnectionManager
				if f.GetTypedConfig().MessageIs(&hcm) {
					require.NoError(t, f.GetTypedConfig().UnmarshalTo(&hcm))
					return &hcm
				}
			}
		}
	}
	t.Fatalf("no inbound connection manager for port %d", port)
	return nil
}

// applyEnvoyFilter applies ef's patches to a sidecar bootstrap the way
// istiod applies them to the config it generates, for the patch kinds and
// operations k8s/istio uses (anything else is an error, so a new kind of
// patch cannot go unvalidated):
//
//   - context SIDECAR_INBOUND: listener virtualInbound; listener.portNumber
//     and routeConfiguration.portNumber select its filter chain whose
//     filter_chain_match.destination_port is that port;
//   - NETWORK_FILTER MERGE: the filter named by filterChain.filter; its
//     typed_config is unpacked, merged (proto.Merge) and packed again, as
//     Istio does when both have the same type;
//   - HTTP_FILTER INSERT_FIRST / INSERT_BEFORE subFilter: into that
//     connection manager's http_filters;
//   - CLUSTER ADD: appended to the clusters;
//   - HTTP_ROUTE MERGE / INSERT_BEFORE: the route vhost.route.name of the
//     virtual host vhost.name (any virtual host when the name is empty, as in
//     Istio) in that connection manager's route_config.
//
// Within one kind, patches apply in the order written, as in Istio. Unlike
// Istio, a patch that matches nothing is an error: in a test it means the
// EnvoyFilter and the sidecar it targets disagree.
func applyEnvoyFilter(bs *bootstrapv3.Bootstrap, ef *networkingv1alpha3.EnvoyFilter) error {
	for i, p := range ef.GetConfigPatches() {
		if err := applyPatch(bs, p); err != nil {
			return fmt.Errorf("patch %d (%s %s): %w", i, p.GetApplyTo(), p.GetPatch().GetOperation(), err)
		}
	}
	return nil
}

func applyPatch(bs *bootstrapv3.Bootstrap, p *networkingv1alpha3.EnvoyFilter_EnvoyConfigObjectPatch) error {
	if ctx := p.GetMatch().GetContext(); ctx != networkingv1alpha3.EnvoyFilter_SIDECAR_INBOUND {
		return fmt.Errorf("context %s: only SIDECAR_INBOUND is modelled", ctx)
	}
	value, err := protojson.Marshal(p.GetPatch().GetValue())
	if err != nil {
		return err
	}
	op := p.GetPatch().GetOperation()
	switch p.GetApplyTo() {
	case networkingv1alpha3.EnvoyFilter_CLUSTER:
		if op != networkingv1alpha3.EnvoyFilter_Patch_ADD {
			return fmt.Errorf("unsupported operation")
		}
		var c clusterv3.Cluster
		if err := envoytest.UnmarshalJSON(value, &c); err != nil {
			return err
		}
		bs.GetStaticResources().Clusters = append(bs.GetStaticResources().Clusters, &c)
		return nil

	case networkingv1alpha3.EnvoyFilter_NETWORK_FILTER:
		lm := p.GetMatch().GetListener()
		if op != networkingv1alpha3.EnvoyFilter_Patch_MERGE {
			return fmt.Errorf("unsupported operation")
		}
		var patch listenerv3.Filter
		if err := envoytest.UnmarshalPartialJSON(value, &patch); err != nil {
			return err
		}
		return forEachFilter(bs, lm.GetPortNumber(), lm.GetFilterChain().GetFilter().GetName(), func(f *listenerv3.Filter) error {
			return mergeTypedConfig(f.GetTypedConfig(), patch.GetTypedConfig())
		})

	case networkingv1alpha3.EnvoyFilter_HTTP_FILTER:
		lm := p.GetMatch().GetListener()
		var patch hcmv3.HttpFilter
		if err := envoytest.UnmarshalJSON(value, &patch); err != nil {
			return err
		}
		return forEachHCM(bs, lm.GetPortNumber(), lm.GetFilterChain().GetFilter().GetName(), func(h *hcmv3.HttpConnectionManager) error {
			switch op {
			case networkingv1alpha3.EnvoyFilter_Patch_INSERT_FIRST:
				h.HttpFilters = slices.Insert(h.HttpFilters, 0, proto.Clone(&patch).(*hcmv3.HttpFilter))
			case networkingv1alpha3.EnvoyFilter_Patch_INSERT_BEFORE:
				sub := lm.GetFilterChain().GetFilter().GetSubFilter().GetName()
				at := slices.IndexFunc(h.HttpFilters, func(f *hcmv3.HttpFilter) bool { return f.GetName() == sub })
				if at < 0 {
					return fmt.Errorf("no http filter %q", sub)
				}
				h.HttpFilters = slices.Insert(h.HttpFilters, at, proto.Clone(&patch).(*hcmv3.HttpFilter))
			default:
				return fmt.Errorf("unsupported operation")
			}
			return nil
		})

	case networkingv1alpha3.EnvoyFilter_HTTP_ROUTE:
		rm := p.GetMatch().GetRouteConfiguration()
		var patch routev3.Route
		switch op {
		case networkingv1alpha3.EnvoyFilter_Patch_MERGE:
			err = envoytest.UnmarshalPartialJSON(value, &patch)
		case networkingv1alpha3.EnvoyFilter_Patch_INSERT_BEFORE:
			err = envoytest.UnmarshalJSON(value, &patch)
		default:
			return fmt.Errorf("unsupported operation")
		}
		if err != nil {
			return err
		}
		return forEachHCM(bs, rm.GetPortNumber(), "envoy.filters.network.http_connection_manager", func(h *hcmv3.HttpConnectionManager) error {
			for _, vh := range h.GetRouteConfig().GetVirtualHosts() {
				if name := rm.GetVhost().GetName(); name != "" && vh.GetName() != name {
					continue
				}
				at := slices.IndexFunc(vh.Routes, func(r *routev3.Route) bool { return r.GetName() == rm.GetVhost().GetRoute().GetName() })
				if at < 0 {
					return fmt.Errorf("virtual host %s has no route %q", vh.GetName(), rm.GetVhost().GetRoute().GetName())
				}
				if op == networkingv1alpha3.EnvoyFilter_Patch_MERGE {
					proto.Merge(vh.Routes[at], &patch)
				} else {
					vh.Routes = slices.Insert(vh.Routes, at, proto.Clone(&patch).(*routev3.Route))
				}
				return nil
			}
			return fmt.Errorf("no virtual host %q", rm.GetVhost().GetName())
		})
	}
	return fmt.Errorf("unsupported applyTo")
}

// forEachFilter calls edit on every network filter named name in the
// inbound filter chains for port, and fails when there is none.
func forEachFilter(bs *bootstrapv3.Bootstrap, port uint32, name string, edit func(*listenerv3.Filter) error) error {
	matched := 0
	for _, l := range bs.GetStaticResources().GetListeners() {
		if l.GetName() != "virtualInbound" {
			continue
		}
		for _, fc := range l.GetFilterChains() {
			if fc.GetFilterChainMatch().GetDestinationPort().GetValue() != port {
				continue
			}
			for _, f := range fc.GetFilters() {
				if f.GetName() != name {
					continue
				}
				if err := edit(f); err != nil {
					return err
				}
				matched++
			}
		}
	}
	if matched == 0 {
		return fmt.Errorf("matched nothing: no %s in an inbound filter chain for port %d", name, port)
	}
	return nil
}

// forEachHCM is forEachFilter for a connection manager, decoded for edit
// and packed again after it.
func forEachHCM(bs *bootstrapv3.Bootstrap, port uint32, name string, edit func(*hcmv3.HttpConnectionManager) error) error {
	return forEachFilter(bs, port, name, func(f *listenerv3.Filter) error {
		var h hcmv3.HttpConnectionManager
		if err := f.GetTypedConfig().UnmarshalTo(&h); err != nil {
			return fmt.Errorf("%s is not an http_connection_manager: %w", name, err)
		}
		if err := edit(&h); err != nil {
			return err
		}
		packed, err := anypb.New(&h)
		if err != nil {
			return err
		}
		f.ConfigType = &listenerv3.Filter_TypedConfig{TypedConfig: packed}
		return nil
	})
}

// mergeTypedConfig merges patch into dst, both Anys of the same type,
// field by field: merging the Anys themselves would replace dst's whole
// serialized value with the fragment's.
func mergeTypedConfig(dst, patch *anypb.Any) error {
	if dst.GetTypeUrl() != patch.GetTypeUrl() {
		return fmt.Errorf("typed_config %s cannot merge into %s", patch.GetTypeUrl(), dst.GetTypeUrl())
	}
	base, err := dst.UnmarshalNew()
	if err != nil {
		return err
	}
	frag, err := patch.UnmarshalNew()
	if err != nil {
		return err
	}
	proto.Merge(base, frag)
	packed, err := anypb.New(base)
	if err != nil {
		return err
	}
	dst.Value = packed.GetValue()
	return nil
}

func TestApplyEnvoyFilterRefusesWhatItDoesNotModel(t *testing.T) {
	ef := proto.Clone(envoyFilter(t, render(t, istioDir))).(*networkingv1alpha3.EnvoyFilter)
	ef.ConfigPatches[0].Patch.Operation = networkingv1alpha3.EnvoyFilter_Patch_REPLACE
	err := applyEnvoyFilter(sidecarBootstrap(t), ef)
	require.ErrorContains(t, err, "unsupported operation")
	require.True(t, strings.HasPrefix(err.Error(), "patch 0 (NETWORK_FILTER REPLACE)"), err.Error())
}
