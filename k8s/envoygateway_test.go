package k8s

import (
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"path"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	egv1a1 "github.com/envoyproxy/gateway/api/v1alpha1"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	gwapiv1 "sigs.k8s.io/gateway-api/apis/v1"
	"sigs.k8s.io/yaml"

	"github.com/idemgate/idemgate/cmd/idemgate/settings"
	"github.com/idemgate/idemgate/envoy"
	"github.com/idemgate/idemgate/envoy/envoytest"
)

// The Envoy Gateway overlay (k8s/envoy-gateway) is held to the invariants of
// the other deployments, expressed in Envoy Gateway's API (v1.9, Gateway API
// v1.6): ext_proc fails closed with both bodies buffered and the shipped
// message timeout, it runs on the guarded routes and nowhere else, and the
// subject idemgate reads can only come from a verified JWT. Each invariant is
// a function returning an error, so TestEnvoyGatewayChecksCatchMutations can
// show that each one fails on a manifest that breaks it.

const (
	egDir = "envoy-gateway"
	// egGroup is Envoy Gateway's API group (Backend, EnvoyProxy).
	egGroup = "gateway.envoyproxy.io"
	// egExtServiceTimeout is the grpc_service.timeout Envoy Gateway writes into
	// every ext_proc filter it generates (defaultExtServiceRequestTimeout in its
	// xDS translator); no field of the API changes it.
	egExtServiceTimeout = 10 * time.Second
)

// Envoy Gateway's and Gateway API's kinds decode through the same strict codec
// (unknown and duplicate fields are errors) as the core kinds in render_test.go.
func init() {
	for _, add := range []func(*runtime.Scheme) error{egv1a1.AddToScheme, gwapiv1.Install} {
		if err := add(scheme); err != nil {
			panic(err) // static registration of compiled-in types; cannot fail at run time
		}
	}
}

// egManifests is the rendered overlay, sorted by kind.
type egManifests struct {
	cfg          *envoytest.IdemgateConfig
	gateways     []*gwapiv1.Gateway
	routes       []*gwapiv1.HTTPRoute
	routeFilters []*egv1a1.HTTPRouteFilter
	extensions   []*egv1a1.EnvoyExtensionPolicy
	security     []*egv1a1.SecurityPolicy
	clientPolicy []*egv1a1.ClientTrafficPolicy
	backends     []*egv1a1.Backend
	// proxy is the EnvoyProxy of the Gateway's proxy pods, which carry
	// idemgate as a sidecar.
	proxy   *egv1a1.EnvoyProxy
	netpols []*networkingv1.NetworkPolicy
	objs    []object
}

// egRender renders k8s/envoy-gateway strictly and reads the idemgate config
// the proxy pods' idemgate sidecar mounts.
func egRender() (*egManifests, error) {
	docs, err := build(egDir)
	if err != nil {
		return nil, err
	}
	m := &egManifests{}
	for _, d := range docs {
		typed, err := decodeStrict(d)
		if err != nil {
			return nil, fmt.Errorf("%s (from %s): %w", d.id, d.from, err)
		}
		m.objs = append(m.objs, object{id: d.id, from: d.from, typed: typed})
	}
	m.gateways = objectsOf[*gwapiv1.Gateway](m.objs)
	m.routes = objectsOf[*gwapiv1.HTTPRoute](m.objs)
	m.routeFilters = objectsOf[*egv1a1.HTTPRouteFilter](m.objs)
	m.extensions = objectsOf[*egv1a1.EnvoyExtensionPolicy](m.objs)
	m.security = objectsOf[*egv1a1.SecurityPolicy](m.objs)
	m.clientPolicy = objectsOf[*egv1a1.ClientTrafficPolicy](m.objs)
	m.backends = objectsOf[*egv1a1.Backend](m.objs)
	m.netpols = objectsOf[*networkingv1.NetworkPolicy](m.objs)
	if ds := objectsOf[*appsv1.Deployment](m.objs); len(ds) != 0 {
		return nil, fmt.Errorf("want no Deployment (idemgate runs in the proxy pods), have %d", len(ds))
	}
	ps := objectsOf[*egv1a1.EnvoyProxy](m.objs)
	if len(ps) != 1 {
		return nil, fmt.Errorf("want exactly one EnvoyProxy, have %d", len(ps))
	}
	m.proxy = ps[0]
	raw, err := m.mountedConfig()
	if err != nil {
		return nil, err
	}
	if m.cfg, err = envoytest.ReadIdemgateConfig(raw); err != nil {
		return nil, err
	}
	return m, nil
}

// proxyPod is the part of the proxy pods' spec the EnvoyProxy sets: its
// pod security context and volumes, idemgate's init container (a native
// sidecar) and the volume mounts of Envoy's own container.
func (m *egManifests) proxyPod() (pod *corev1.PodSpec, idemgate *corev1.Container, envoyMounts []corev1.VolumeMount, err error) {
	k := m.proxy.Spec.Provider
	if k == nil || k.Type != egv1a1.EnvoyProxyProviderTypeKubernetes || k.Kubernetes == nil || k.Kubernetes.EnvoyDeployment == nil {
		return nil, nil, nil, errors.New("the EnvoyProxy must configure the Kubernetes envoyDeployment")
	}
	d := k.Kubernetes.EnvoyDeployment
	pod = &corev1.PodSpec{InitContainers: d.InitContainers}
	if d.Pod != nil {
		pod.SecurityContext, pod.Volumes = d.Pod.SecurityContext, d.Pod.Volumes
	}
	if d.Container != nil {
		envoyMounts = d.Container.VolumeMounts
	}
	i := slices.IndexFunc(pod.InitContainers, func(c corev1.Container) bool { return c.Name == "idemgate" })
	if len(pod.InitContainers) != 1 || i != 0 {
		return nil, nil, nil, errors.New("the proxy pods must carry exactly the idemgate init container")
	}
	return pod, &pod.InitContainers[0], envoyMounts, nil
}

// mountedConfig returns the file the idemgate sidecar's --config names,
// from the ConfigMap volume mounted there.
func (m *egManifests) mountedConfig() ([]byte, error) {
	pod, c, _, err := m.proxyPod()
	if err != nil {
		return nil, err
	}
	if len(c.Args) == 0 || c.Args[0] != "serve" {
		return nil, fmt.Errorf("idemgate runs %v, want serve", c.Args)
	}
	file := flagValue(c.Args, "--config")
	for _, mnt := range c.VolumeMounts {
		key, ok := strings.CutPrefix(file, strings.TrimSuffix(mnt.MountPath, "/")+"/")
		if !ok {
			continue
		}
		for _, v := range pod.Volumes {
			if v.Name != mnt.Name || v.ConfigMap == nil {
				continue
			}
			for _, cm := range objectsOf[*corev1.ConfigMap](m.objs) {
				if cm.Name == v.ConfigMap.Name {
					if data, ok := cm.Data[key]; ok {
						return []byte(data), nil
					}
				}
			}
		}
	}
	return nil, fmt.Errorf("%s does not come from a rendered ConfigMap", file)
}

func mustRenderEG(t interface {
	Helper()
	Fatalf(string, ...any)
}) *egManifests {
	t.Helper()
	m, err := egRender()
	if err != nil {
		t.Fatalf("render %s: %v", egDir, err)
	}
	return m
}

// guardedPaths are the paths idemgate must see: every operation path of
// idemgate.yaml, MCP endpoints included.
func (m *egManifests) guardedPaths() []string {
	return m.cfg.OperationPaths()
}

// targetsOf returns the HTTPRoutes a policy attaches to, or an error for any
// target that is wider or vaguer than a whole HTTPRoute of this namespace.
func targetsOf(kind string, name string, refs egv1a1.PolicyTargetReferences) ([]string, error) {
	var errs []error
	if len(refs.TargetSelectors) > 0 {
		errs = append(errs, fmt.Errorf("%s %s uses targetSelectors: it would attach to whatever carries those labels", kind, name))
	}
	all := slices.Clone(refs.TargetRefs)
	//lint:ignore SA1019 a manifest may still use the deprecated singular form; it is checked like the rest
	if ref := refs.TargetRef; ref != nil {
		all = append(all, *ref)
	}
	var out []string
	for _, r := range all {
		switch {
		case r.Group != gwapiv1.GroupName || r.Kind != "HTTPRoute":
			errs = append(errs, fmt.Errorf("%s %s targets %s %s/%s: that attaches it to every route under it", kind, name, r.Kind, r.Group, r.Name))
		case r.SectionName != nil:
			errs = append(errs, fmt.Errorf("%s %s targets one rule (%s) of HTTPRoute %s: keep the guarded routes in an HTTPRoute of their own", kind, name, *r.SectionName, r.Name))
		default:
			out = append(out, string(r.Name))
		}
	}
	if len(all) == 0 {
		errs = append(errs, fmt.Errorf("%s %s targets nothing", kind, name))
	}
	return out, errors.Join(errs...)
}

// guardedRoutes are the HTTPRoutes the ext_proc policy targets.
func (m *egManifests) guardedRoutes() ([]*gwapiv1.HTTPRoute, error) {
	if len(m.extensions) != 1 {
		return nil, fmt.Errorf("want exactly one EnvoyExtensionPolicy, have %d", len(m.extensions))
	}
	p := m.extensions[0]
	names, err := targetsOf("EnvoyExtensionPolicy", p.Name, p.Spec.PolicyTargetReferences)
	if err != nil {
		return nil, err
	}
	var out []*gwapiv1.HTTPRoute
	for _, n := range names {
		i := slices.IndexFunc(m.routes, func(r *gwapiv1.HTTPRoute) bool { return r.Name == n })
		if i < 0 {
			return nil, fmt.Errorf("EnvoyExtensionPolicy %s targets HTTPRoute %s, which is not defined", p.Name, n)
		}
		out = append(out, m.routes[i])
	}
	return out, nil
}

// egExtProcFilter is the ext_proc filter config Envoy Gateway v1.9 generates
// for one extProc entry. It is written from Envoy Gateway's translator
// (internal/gatewayapi/envoyextensionpolicy.go buildExtProc,
// internal/xds/translator/extproc.go extProcConfig and buildProcessingMode):
// a processingMode.request or .response that is present sends those headers,
// its body field picks the body mode, everything else is skipped; trailers
// are only sent for FullDuplexStreamed. Reading the result with
// envoytest.CheckExtProc holds the policy to exactly the rules the hand-written
// Envoy configs are held to.
func egExtProcFilter(ep *egv1a1.ExtProc, cluster string) (*extprocv3.ExternalProcessor, error) {
	out := &extprocv3.ExternalProcessor{
		GrpcService: &corev3.GrpcService{
			TargetSpecifier: &corev3.GrpcService_EnvoyGrpc_{EnvoyGrpc: &corev3.GrpcService_EnvoyGrpc{ClusterName: cluster}},
			Timeout:         durationpb.New(egExtServiceTimeout),
		},
		ProcessingMode: &extprocv3.ProcessingMode{
			RequestHeaderMode:   extprocv3.ProcessingMode_SKIP,
			ResponseHeaderMode:  extprocv3.ProcessingMode_SKIP,
			RequestBodyMode:     extprocv3.ProcessingMode_NONE,
			ResponseBodyMode:    extprocv3.ProcessingMode_NONE,
			RequestTrailerMode:  extprocv3.ProcessingMode_SKIP,
			ResponseTrailerMode: extprocv3.ProcessingMode_SKIP,
		},
	}
	bodyMode := func(b *egv1a1.ExtProcBodyProcessingMode) (extprocv3.ProcessingMode_BodySendMode, bool) {
		if b == nil {
			return extprocv3.ProcessingMode_NONE, false
		}
		switch *b {
		case egv1a1.BufferedExtProcBodyProcessingMode:
			return extprocv3.ProcessingMode_BUFFERED, false
		case egv1a1.BufferedPartialExtBodyHeaderProcessingMode:
			return extprocv3.ProcessingMode_BUFFERED_PARTIAL, false
		case egv1a1.StreamedExtProcBodyProcessingMode:
			return extprocv3.ProcessingMode_STREAMED, false
		case egv1a1.FullDuplexStreamedExtBodyProcessingMode:
			return extprocv3.ProcessingMode_FULL_DUPLEX_STREAMED, true
		}
		return extprocv3.ProcessingMode_NONE, false
	}
	pm := out.ProcessingMode
	if mode := ep.ProcessingMode; mode != nil {
		if r := mode.Request; r != nil {
			pm.RequestHeaderMode = extprocv3.ProcessingMode_SEND
			var trailers bool
			pm.RequestBodyMode, trailers = bodyMode(r.Body)
			if trailers {
				pm.RequestTrailerMode = extprocv3.ProcessingMode_SEND
			}
			out.RequestAttributes = slices.Clone(r.Attributes)
		}
		if r := mode.Response; r != nil {
			pm.ResponseHeaderMode = extprocv3.ProcessingMode_SEND
			var trailers bool
			pm.ResponseBodyMode, trailers = bodyMode(r.Body)
			if trailers {
				pm.ResponseTrailerMode = extprocv3.ProcessingMode_SEND
			}
			out.ResponseAttributes = slices.Clone(r.Attributes)
		}
		out.AllowModeOverride = mode.AllowModeOverride
	}
	if ep.FailOpen != nil {
		out.FailureModeAllow = *ep.FailOpen
	}
	if ep.ShadowMode != nil {
		out.ObservabilityMode = *ep.ShadowMode
	}
	if ep.MessageTimeout != nil {
		d, err := time.ParseDuration(string(*ep.MessageTimeout))
		if err != nil {
			return nil, fmt.Errorf("messageTimeout: %w", err)
		}
		out.MessageTimeout = durationpb.New(d)
	}
	if md := ep.Metadata; md != nil && (md.AccessibleNamespaces != nil || md.WritableNamespaces != nil) {
		out.MetadataOptions = &extprocv3.MetadataOptions{}
		if md.AccessibleNamespaces != nil {
			out.MetadataOptions.ForwardingNamespaces = &extprocv3.MetadataOptions_MetadataNamespaces{Untyped: md.AccessibleNamespaces}
		}
		if md.WritableNamespaces != nil {
			out.MetadataOptions.ReceivingNamespaces = &extprocv3.MetadataOptions_MetadataNamespaces{Untyped: md.WritableNamespaces}
		}
	}
	if ep.StatusOnError != nil {
		out.StatusOnError = &typev3.HttpStatus{Code: typev3.StatusCode(*ep.StatusOnError)}
	}
	return out, nil
}

// snippetExtProc is the ext_proc filter of envoy/ext_proc-filter.yaml
// (inside its path matcher), the settings every deployment of idemgate
// shares.
func snippetExtProc() (*extprocv3.ExternalProcessor, error) {
	pieces, err := envoytest.DecodePieces(envoy.FilterSnippetYAML())
	if err != nil {
		return nil, err
	}
	unpacked, err := envoytest.UnpackFilters(pieces.Filters)
	if err != nil {
		return nil, err
	}
	ep, ok := unpacked[0].Config.(*extprocv3.ExternalProcessor)
	if !ok {
		return nil, errors.New("the pieces' filter does not wrap ext_proc")
	}
	return ep, nil
}

// checkEGExtProc: one ext_proc entry, failOpen written out as false, and the
// filter Envoy Gateway builds from it passes envoytest.CheckExtProc and equals
// the shipped snippet in every setting the two share.
func checkEGExtProc(m *egManifests) error {
	if len(m.extensions) != 1 || len(m.extensions[0].Spec.ExtProc) != 1 {
		return errors.New("want exactly one EnvoyExtensionPolicy with exactly one extProc")
	}
	p := m.extensions[0]
	if len(p.Spec.Wasm)+len(p.Spec.Lua)+len(p.Spec.DynamicModule) > 0 {
		return errors.New("the idemgate policy must not carry other extensions (they would run on the guarded routes only, next to idemgate)")
	}
	ep := &p.Spec.ExtProc[0]
	var errs []error
	if ep.FailOpen == nil {
		errs = append(errs, errors.New("failOpen must be written out as false, not left to the default"))
	}
	if ep.MessageTimeout == nil {
		errs = append(errs, errors.New("messageTimeout must be written out (Envoy's default is 200 ms)"))
	}
	filter, err := egExtProcFilter(ep, "idemgate")
	if err != nil {
		return errors.Join(append(errs, err)...)
	}
	// Envoy Gateway always writes grpc_service.timeout (10s), which
	// CheckExtProc forbids in the configs we write ourselves. Envoy's ext_proc
	// HTTP filter opens its stream with options that carry no timeout (its
	// openStream sets parent span, context, retry buffering and the remote
	// close timeout only), so the field bounds nothing here and a confirm
	// waiting on a slow upstream is not cut after 10 s; only message_timeout
	// applies, per message.
	gs := proto.Clone(filter.GetGrpcService()).(*corev3.GrpcService)
	gs.Timeout = nil
	filter.GrpcService = gs
	if err := envoytest.CheckExtProc(filter, m.cfg); err != nil {
		errs = append(errs, err)
	}
	want, err := snippetExtProc()
	if err != nil {
		return errors.Join(append(errs, err)...)
	}
	same := []struct {
		name      string
		got, want proto.Message
	}{
		{"processing mode", filter.GetProcessingMode(), want.GetProcessingMode()},
		{"message_timeout", filter.GetMessageTimeout(), want.GetMessageTimeout()},
	}
	// The pieces forward metadata only to a config that reads the subject
	// from it; the policy also forwards jwt_authn's for one that switches to
	// subject.metadata (the namespace costs bytes per message, nothing else).
	if want.GetMetadataOptions() != nil {
		same = append(same, struct {
			name      string
			got, want proto.Message
		}{"metadata_options", filter.GetMetadataOptions(), want.GetMetadataOptions()})
	}
	for _, s := range same {
		if !proto.Equal(s.got, s.want) {
			errs = append(errs, fmt.Errorf("%s is %v, envoy/ext_proc-filter.yaml has %v", s.name, s.got, s.want))
		}
	}
	if filter.GetAllowModeOverride() != want.GetAllowModeOverride() || filter.GetFailureModeAllow() != want.GetFailureModeAllow() {
		errs = append(errs, errors.New("allowModeOverride / failOpen differ from envoy/ext_proc-filter.yaml"))
	}
	// What `idemgate envoy-config` writes for a preview with
	// fingerprint_header: false, always: the mode is then idemgate.yaml's
	// switch alone. Without it such a preview is never signed.
	if got := filter.GetResponseAttributes(); !slices.Equal(got, []string{"response.code"}) {
		errs = append(errs, fmt.Errorf("processingMode.response.attributes is %v, want [response.code] (a preview with fingerprint_header: false reads its status from it)", got))
	}
	if got := filter.GetRequestAttributes(); len(got) > 0 {
		errs = append(errs, fmt.Errorf("processingMode.request.attributes is %v: idemgate reads none", got))
	}
	if ep.StatusOnError != nil && *ep.StatusOnError < 500 {
		errs = append(errs, fmt.Errorf("statusOnError %d tells the agent its request was wrong when idemgate was unreachable", *ep.StatusOnError))
	}
	return errors.Join(errs...)
}

// checkEGExtProcBackend: ext_proc streams to the idemgate Service on the port
// that reaches idemgate's grpc_listen, with gRPC health checks and keepalive
// (the shipped cluster's settings).
// checkEGExtProcBackend: the ext_proc backend is idemgate's unix socket in
// the Gateway's own proxy pods (a Backend with one unix endpoint, the
// socket of grpc_listen, in an emptyDir that only Envoy and the idemgate
// sidecar mount), the Gateway uses that EnvoyProxy, and the cluster is
// health-checked over gRPC with HTTP/2 keepalives.
func checkEGExtProcBackend(m *egManifests) error {
	if len(m.extensions) != 1 || len(m.extensions[0].Spec.ExtProc) != 1 {
		return errors.New("want exactly one EnvoyExtensionPolicy with exactly one extProc")
	}
	ep := &m.extensions[0].Spec.ExtProc[0]
	//lint:ignore SA1019 the deprecated singular backendRef must be absent
	if len(ep.BackendRefs) != 1 || ep.BackendRef != nil {
		return errors.New("extProc must name exactly one backend in backendRefs")
	}
	ref := ep.BackendRefs[0].BackendObjectReference
	if ref.Group == nil || *ref.Group != egGroup || ref.Kind == nil || *ref.Kind != "Backend" || ref.Namespace != nil || ref.Port != nil {
		return errors.New("the backend must be a gateway.envoyproxy.io Backend of this namespace, without a port (a unix socket)")
	}
	var errs []error
	socket, ok := settings.UnixSocketPath(m.cfg.GRPCListen)
	if !ok {
		errs = append(errs, fmt.Errorf("grpc_listen %s is not a unix socket: the ext_proc channel would be on the network", m.cfg.GRPCListen))
	}
	i := slices.IndexFunc(m.backends, func(b *egv1a1.Backend) bool { return b.Name == string(ref.Name) })
	if i < 0 {
		return errors.Join(append(errs, fmt.Errorf("extProc Backend %s is not defined", ref.Name))...)
	}
	b := m.backends[i]
	if len(b.Spec.Endpoints) != 1 || b.Spec.Endpoints[0].Unix == nil || b.Spec.Endpoints[0].Unix.Path != socket {
		errs = append(errs, fmt.Errorf("Backend %s must have exactly one unix endpoint, idemgate's socket %s", b.Name, socket))
	}
	if !slices.Equal(b.Spec.AppProtocols, []egv1a1.AppProtocolType{egv1a1.AppProtocolTypeH2C}) {
		errs = append(errs, fmt.Errorf("Backend %s must speak h2c (gRPC)", b.Name))
	}
	if len(m.gateways) != 1 {
		errs = append(errs, errors.New("want exactly one Gateway"))
	} else if infra := m.gateways[0].Spec.Infrastructure; infra == nil || infra.ParametersRef == nil ||
		infra.ParametersRef.Group != egGroup || infra.ParametersRef.Kind != "EnvoyProxy" || infra.ParametersRef.Name != m.proxy.Name {
		errs = append(errs, fmt.Errorf("Gateway %s must use EnvoyProxy %s (infrastructure.parametersRef): else its proxy pods carry no idemgate", m.gateways[0].Name, m.proxy.Name))
	}
	if err := checkSharedSocket(m, socket); err != nil {
		errs = append(errs, err)
	}
	bs := ep.BackendSettings
	switch {
	case bs == nil || bs.HealthCheck == nil || bs.HealthCheck.Active == nil || bs.HealthCheck.Active.Type != egv1a1.ActiveHealthCheckerTypeGRPC:
		errs = append(errs, errors.New("backendSettings.healthCheck.active must be a GRPC health check (grpc.health.v1)"))
	case bs.HTTP2 == nil || bs.HTTP2.ConnectionKeepalive == nil || bs.HTTP2.ConnectionKeepalive.Interval == nil || bs.HTTP2.ConnectionKeepalive.Timeout == nil:
		errs = append(errs, errors.New("backendSettings.http2.connectionKeepalive needs interval and timeout"))
	}
	return errors.Join(errs...)
}

// checkSharedSocket: the socket's directory is an emptyDir volume that the
// idemgate sidecar and Envoy's container mount, and nothing else.
func checkSharedSocket(m *egManifests, socket string) error {
	pod, c, envoyMounts, err := m.proxyPod()
	if err != nil {
		return err
	}
	dir := path.Dir(socket)
	mountOf := func(mounts []corev1.VolumeMount) string {
		for _, mnt := range mounts {
			if path.Clean(mnt.MountPath) == dir {
				return mnt.Name
			}
		}
		return ""
	}
	vol := mountOf(c.VolumeMounts)
	if vol == "" || mountOf(envoyMounts) != vol {
		return fmt.Errorf("the socket directory %s must be one volume mounted by both idemgate and Envoy", dir)
	}
	i := slices.IndexFunc(pod.Volumes, func(v corev1.Volume) bool { return v.Name == vol })
	if i < 0 || pod.Volumes[i].EmptyDir == nil {
		return fmt.Errorf("volume %s (the socket directory) must be an emptyDir of the pod", vol)
	}
	for _, mnt := range c.VolumeMounts {
		if mnt.Name == vol && mnt.ReadOnly {
			return errors.New("idemgate must be able to create its socket")
		}
	}
	return nil
}

// ruleMatch is one match of one HTTPRoute rule.
type ruleMatch struct {
	route *gwapiv1.HTTPRoute
	rule  *gwapiv1.HTTPRouteRule
	match gwapiv1.HTTPRouteMatch
}

func (r ruleMatch) String() string {
	name := "?"
	if r.rule.Name != nil {
		name = string(*r.rule.Name)
	}
	return "HTTPRoute " + r.route.Name + " rule " + name
}

func pathMatchOf(m gwapiv1.HTTPRouteMatch) (gwapiv1.PathMatchType, string) {
	typ, value := gwapiv1.PathMatchPathPrefix, "/" // Gateway API's defaults
	if p := m.Path; p != nil {
		if p.Type != nil {
			typ = *p.Type
		}
		if p.Value != nil {
			value = *p.Value
		}
	}
	return typ, value
}

// egRouteFor is the rule Envoy Gateway sends a POST to path to, among all
// HTTPRoutes on the listener: it orders path matches Exact, then
// RegularExpression, then PathPrefix by length (internal/gatewayapi/sort.go),
// and Envoy takes the first that matches. Header and query matches are not
// used by these manifests and count as not matching.
func egRouteFor(routes []*gwapiv1.HTTPRoute, path string) (ruleMatch, error) {
	var best *ruleMatch
	rank := func(m gwapiv1.HTTPRouteMatch) (int, int) {
		typ, value := pathMatchOf(m)
		switch typ {
		case gwapiv1.PathMatchExact:
			return 0, 0
		case gwapiv1.PathMatchRegularExpression:
			return 1, 0
		}
		return 2, -len(value)
	}
	for _, r := range routes {
		for i := range r.Spec.Rules {
			rule := &r.Spec.Rules[i]
			for _, m := range rule.Matches {
				ok, err := pathMatches(m, path)
				if err != nil {
					return ruleMatch{}, err
				}
				if !ok || (m.Method != nil && *m.Method != gwapiv1.HTTPMethodPost) || len(m.Headers) > 0 || len(m.QueryParams) > 0 {
					continue
				}
				if best != nil {
					r0, l0 := rank(best.match)
					r1, l1 := rank(m)
					if r1 > r0 || (r1 == r0 && l1 >= l0) {
						continue
					}
				}
				best = &ruleMatch{route: r, rule: rule, match: m}
			}
		}
	}
	if best == nil {
		return ruleMatch{}, fmt.Errorf("no rule matches POST %s", path)
	}
	return *best, nil
}

func pathMatches(m gwapiv1.HTTPRouteMatch, path string) (bool, error) {
	typ, value := pathMatchOf(m)
	switch typ {
	case gwapiv1.PathMatchExact:
		return path == value, nil
	case gwapiv1.PathMatchRegularExpression:
		// Envoy's safe_regex (RE2) matches the whole path; Go's regexp is RE2 too.
		re, err := regexp.Compile("^(?:" + value + ")$")
		if err != nil {
			return false, fmt.Errorf("regex %q: %w", value, err)
		}
		return re.MatchString(path), nil
	case gwapiv1.PathMatchPathPrefix:
		// Gateway API prefixes match whole path elements.
		prefix := strings.TrimSuffix(value, "/")
		return prefix == "" || path == prefix || strings.HasPrefix(path, prefix+"/"), nil
	}
	return false, fmt.Errorf("unknown path match type %q", typ)
}

func isGuarded(guarded []*gwapiv1.HTTPRoute, r *gwapiv1.HTTPRoute) bool {
	return slices.Contains(guarded, r)
}

// checkEGGuardedRoutes: idemgate runs on exactly the guarded paths. The
// policies target whole HTTPRoutes whose every match is an exact guarded
// path, and every guarded path is served by such a rule.
func checkEGGuardedRoutes(m *egManifests) error {
	guarded, err := m.guardedRoutes()
	if err != nil {
		return err
	}
	var errs []error
	paths := m.guardedPaths()
	for _, r := range guarded {
		for i := range r.Spec.Rules {
			if len(r.Spec.Rules[i].Matches) == 0 {
				errs = append(errs, fmt.Errorf("HTTPRoute %s rule %d has no matches: it matches every path", r.Name, i))
			}
			for _, mt := range r.Spec.Rules[i].Matches {
				typ, value := pathMatchOf(mt)
				if typ != gwapiv1.PathMatchExact || !slices.Contains(paths, value) {
					errs = append(errs, fmt.Errorf("HTTPRoute %s runs idemgate on %s %s, which is not a guarded path", r.Name, typ, value))
				}
			}
		}
	}
	for _, p := range paths {
		rm, err := egRouteFor(m.routes, p)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if !isGuarded(guarded, rm.route) {
			errs = append(errs, fmt.Errorf("POST %s is served by %s, which idemgate does not guard", p, rm))
		}
	}
	for _, p := range m.security {
		if _, err := targetsOf("SecurityPolicy", p.Name, p.Spec.PolicyTargetReferences); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// checkEGNearMisses: spellings of a guarded path that Envoy does not route to
// it (but a lenient upstream may treat as the same endpoint) are answered 404
// by the Gateway, never forwarded to the app unguarded.
func checkEGNearMisses(m *egManifests) error {
	guarded, err := m.guardedRoutes()
	if err != nil {
		return err
	}
	var errs []error
	for _, p := range m.guardedPaths() {
		for _, probe := range envoytest.NearMisses(p) {
			rm, err := egRouteFor(m.routes, probe)
			if err != nil {
				continue // no route: Envoy answers 404 itself
			}
			if isGuarded(guarded, rm.route) {
				continue
			}
			if status, ok := m.directResponse(rm.rule); !ok || status != 404 || len(rm.rule.BackendRefs) > 0 {
				errs = append(errs, fmt.Errorf("POST %s reaches %s unguarded", probe, rm))
			}
		}
	}
	return errors.Join(errs...)
}

// directResponse returns the status of the HTTPRouteFilter direct response a
// rule answers with, if it has one.
func (m *egManifests) directResponse(rule *gwapiv1.HTTPRouteRule) (int, bool) {
	for _, f := range rule.Filters {
		ref := f.ExtensionRef
		if f.Type != gwapiv1.HTTPRouteFilterExtensionRef || ref == nil || ref.Group != egv1a1.GroupName || ref.Kind != egv1a1.KindHTTPRouteFilter {
			continue
		}
		for _, hf := range m.routeFilters {
			if hf.Name == string(ref.Name) && hf.Spec.DirectResponse != nil && hf.Spec.DirectResponse.StatusCode != nil {
				return *hf.Spec.DirectResponse.StatusCode, true
			}
		}
	}
	return 0, false
}

// checkEGSubjectStripped: the client's subject header is removed by the
// ClientTrafficPolicy of the guarded routes' Gateway as an early request
// header mutation (the HTTP connection manager runs it before routing and
// before any HTTP filter, so before jwt_authn, which appends the verified
// claim and would otherwise leave the client's value beside it), and nothing
// adds or sets it anywhere else.
func checkEGSubjectStripped(m *egManifests) error {
	header := m.cfg.Subject.Header
	if header == "" {
		return nil // subject from metadata: idemgate never reads a header
	}
	guarded, err := m.guardedRoutes()
	if err != nil {
		return err
	}
	var errs []error
	gateways := map[string]bool{}
	for _, r := range guarded {
		for _, pr := range r.Spec.ParentRefs {
			if (pr.Kind != nil && *pr.Kind != "Gateway") || pr.Namespace != nil {
				errs = append(errs, fmt.Errorf("HTTPRoute %s has a parent other than a Gateway of its namespace", r.Name))
				continue
			}
			gateways[string(pr.Name)] = true
		}
	}
	stripped := map[string]bool{}
	for _, ctp := range m.clientPolicy {
		h := ctp.Spec.Headers
		removes := h != nil && h.EarlyRequestHeaders != nil &&
			slices.ContainsFunc(h.EarlyRequestHeaders.Remove, func(s string) bool { return strings.EqualFold(s, header) })
		if h != nil && h.EarlyRequestHeaders != nil {
			if headerFilterWrites(h.EarlyRequestHeaders.Set, h.EarlyRequestHeaders.Add, header) {
				errs = append(errs, fmt.Errorf("ClientTrafficPolicy %s sets %s itself", ctp.Name, header))
			}
		}
		if h != nil && h.WithUnderscoresAction != nil && *h.WithUnderscoresAction != egv1a1.WithUnderscoresActionRejectRequest {
			errs = append(errs, fmt.Errorf("ClientTrafficPolicy %s lets header names with underscores through (%s)", ctp.Name, *h.WithUnderscoresAction))
		}
		for _, tr := range ctp.Spec.TargetRefs {
			if tr.Kind == "Gateway" && tr.Group == gwapiv1.GroupName && tr.SectionName == nil && removes {
				stripped[string(tr.Name)] = true
			}
		}
	}
	for g := range gateways {
		if !stripped[g] {
			errs = append(errs, fmt.Errorf("no ClientTrafficPolicy on Gateway %s removes %s as an early request header (before jwt_authn)", g, header))
		}
	}
	for _, r := range m.routes {
		for _, rule := range r.Spec.Rules {
			for _, f := range rule.Filters {
				if hm := f.RequestHeaderModifier; hm != nil && headerFilterWrites(hm.Set, hm.Add, header) {
					errs = append(errs, fmt.Errorf("HTTPRoute %s writes %s: only the verified JWT may", r.Name, header))
				}
			}
		}
	}
	return errors.Join(errs...)
}

func headerFilterWrites(set, add []gwapiv1.HTTPHeader, header string) bool {
	for _, h := range append(slices.Clone(set), add...) {
		if strings.EqualFold(string(h.Name), header) {
			return true
		}
	}
	return false
}

// checkEGJWTSetsSubject: every guarded route requires a JWT (no optional, no
// fail-open) whose every provider pins issuer and audiences, has keys, and
// copies `sub` into the subject header.
func checkEGJWTSetsSubject(m *egManifests) error {
	guarded, err := m.guardedRoutes()
	if err != nil {
		return err
	}
	var errs []error
	for _, r := range guarded {
		var jwts []*egv1a1.JWT
		for _, p := range m.security {
			names, _ := targetsOf("SecurityPolicy", p.Name, p.Spec.PolicyTargetReferences)
			if slices.Contains(names, r.Name) && p.Spec.JWT != nil {
				jwts = append(jwts, p.Spec.JWT)
			}
		}
		if len(jwts) != 1 {
			errs = append(errs, fmt.Errorf("HTTPRoute %s must be targeted by exactly one SecurityPolicy with jwt, has %d", r.Name, len(jwts)))
			continue
		}
		if err := checkEGJWT(jwts[0], m.cfg); err != nil {
			errs = append(errs, fmt.Errorf("HTTPRoute %s: %w", r.Name, err))
		}
	}
	return errors.Join(errs...)
}

func checkEGJWT(j *egv1a1.JWT, cfg *envoytest.IdemgateConfig) error {
	var errs []error
	if (j.Optional != nil && *j.Optional) || (j.FailOpen != nil && *j.FailOpen) {
		errs = append(errs, errors.New("jwt.optional and jwt.failOpen must stay false: a request without a verified user must not reach idemgate"))
	}
	if len(j.Providers) == 0 {
		errs = append(errs, errors.New("jwt has no providers"))
	}
	for _, p := range j.Providers {
		if p.Issuer == "" || len(p.Audiences) == 0 {
			errs = append(errs, fmt.Errorf("provider %s: issuer and audiences must be pinned", p.Name))
		}
		switch {
		case p.RemoteJWKS != nil && p.LocalJWKS == nil:
			if !strings.HasPrefix(p.RemoteJWKS.URI, "https://") {
				errs = append(errs, fmt.Errorf("provider %s: the JWKS must be fetched over https", p.Name))
			}
		case p.LocalJWKS != nil && p.RemoteJWKS == nil:
			if p.LocalJWKS.Inline == nil && p.LocalJWKS.ValueRef == nil {
				errs = append(errs, fmt.Errorf("provider %s: localJWKS holds no keys", p.Name))
			}
		default:
			errs = append(errs, fmt.Errorf("provider %s: exactly one of remoteJWKS and localJWKS", p.Name))
		}
		if h := cfg.Subject.Header; h != "" && !slices.ContainsFunc(p.ClaimToHeaders, func(c egv1a1.ClaimToHeader) bool {
			return strings.EqualFold(c.Header, h) && c.Claim == "sub"
		}) {
			errs = append(errs, fmt.Errorf("provider %s: claimToHeaders does not set %s from sub", p.Name, h))
		}
		if md := cfg.Subject.Metadata; md != nil && md.Namespace == "envoy.filters.http.jwt_authn" && !strings.HasPrefix(md.Path, p.Name+".") {
			// Envoy Gateway stores the payload under the provider's name.
			errs = append(errs, fmt.Errorf("subject.metadata.path %q does not start at provider %s", md.Path, p.Name))
		}
	}
	return errors.Join(errs...)
}

// checkEGTimeouts: message_timeout is below every guarded route's timeout,
// so a slow idemgate shows as ext_proc's error and never as a cut upstream
// call, and the confirm route's timeout is the operation's upstream_timeout.
func checkEGTimeouts(m *egManifests) error {
	if len(m.extensions) != 1 || len(m.extensions[0].Spec.ExtProc) != 1 || m.extensions[0].Spec.ExtProc[0].MessageTimeout == nil {
		return errors.New("want one extProc with a messageTimeout")
	}
	mt, err := time.ParseDuration(string(*m.extensions[0].Spec.ExtProc[0].MessageTimeout))
	if err != nil {
		return err
	}
	guarded, err := m.guardedRoutes()
	if err != nil {
		return err
	}
	var errs []error
	for _, r := range guarded {
		for _, rule := range r.Spec.Rules {
			for _, mt0 := range rule.Matches {
				_, p := pathMatchOf(mt0)
				var timeout time.Duration
				if rule.Timeouts != nil && rule.Timeouts.Request != nil {
					if timeout, err = time.ParseDuration(string(*rule.Timeouts.Request)); err != nil {
						errs = append(errs, err)
						continue
					}
				}
				if timeout == 0 && slices.Contains(m.cfg.OperationPaths(), p) {
					errs = append(errs, fmt.Errorf("operation route %s has no timeouts.request", p))
					continue
				}
				if timeout != 0 && timeout <= mt {
					errs = append(errs, fmt.Errorf("route %s: timeout %v is not above messageTimeout %v", p, timeout, mt))
				}
				if op, ok := m.cfg.OperationFor(p); ok && op.UpstreamTimeout != 0 && timeout != time.Duration(op.UpstreamTimeout) {
					errs = append(errs, fmt.Errorf("confirm route %s: timeout %v, operation %s has upstream_timeout %v", p, timeout, op.Name, time.Duration(op.UpstreamTimeout)))
				}
			}
		}
	}
	return errors.Join(errs...)
}

// checkEGNoRetries: the Gateway never retries a guarded request. Envoy
// Gateway's retry policy (HTTPRoute retry or a BackendTrafficPolicy) retries
// on 503 and on reset with its defaults, after ext_proc: a retried confirm
// reaches an upstream that ignores idempotency keys twice, and idemgate only
// sees the last answer. (envoy/envoy.yaml retries only reset and
// connect-failure; here the route has no retry at all.)
func checkEGNoRetries(m *egManifests) error {
	guarded, err := m.guardedRoutes()
	if err != nil {
		return err
	}
	var errs []error
	for _, r := range guarded {
		for i, rule := range r.Spec.Rules {
			if rule.Retry != nil {
				errs = append(errs, fmt.Errorf("HTTPRoute %s rule %d retries", r.Name, i))
			}
		}
	}
	for _, btp := range objectsOf[*egv1a1.BackendTrafficPolicy](m.objs) {
		if btp.Spec.Retry != nil {
			errs = append(errs, fmt.Errorf("BackendTrafficPolicy %s configures retries", btp.Name))
		}
	}
	return errors.Join(errs...)
}

// checkEGListener: the listener's buffer limit is limits.max_body_bytes (what
// BUFFERED mode may hold) and paths are normalised before routing (Envoy
// Gateway always sets normalize_path; the policy must not loosen the rest).
func checkEGListener(m *egManifests) error {
	var errs []error
	found := false
	for _, ctp := range m.clientPolicy {
		if c := ctp.Spec.Connection; c != nil && c.BufferLimit != nil {
			found = true
			if c.BufferLimit.Value() != m.cfg.Limits.MaxBodyBytes {
				errs = append(errs, fmt.Errorf("ClientTrafficPolicy %s: bufferLimit %s is not limits.max_body_bytes (%d)", ctp.Name, c.BufferLimit, m.cfg.Limits.MaxBodyBytes))
			}
		}
		if p := ctp.Spec.Path; p != nil {
			if p.DisableMergeSlashes != nil && *p.DisableMergeSlashes {
				errs = append(errs, fmt.Errorf("ClientTrafficPolicy %s disables merging slashes: //v1/transfers/confirm would miss its route", ctp.Name))
			}
			if a := p.EscapedSlashesAction; a != nil && *a != egv1a1.UnescapeAndRedirect && *a != egv1a1.RejectRequestAction {
				errs = append(errs, fmt.Errorf("ClientTrafficPolicy %s: escapedSlashesAction %s lets %%2F spellings past the exact routes", ctp.Name, *a))
			}
		}
	}
	if !found {
		errs = append(errs, errors.New("no ClientTrafficPolicy sets connection.bufferLimit to limits.max_body_bytes"))
	}
	return errors.Join(errs...)
}

// egChecks are the invariants of the overlay, as in envoytest.BootstrapChecks.
func egChecks() []struct {
	name string
	run  func(*egManifests) error
} {
	return []struct {
		name string
		run  func(*egManifests) error
	}{
		{"ext_proc fails closed, buffers both bodies, with the shipped settings", checkEGExtProc},
		{"ext_proc reaches the idemgate Service over gRPC with health checks", checkEGExtProcBackend},
		{"idemgate and the JWT run on exactly the guarded routes", checkEGGuardedRoutes},
		{"near-miss paths never reach the app unguarded", checkEGNearMisses},
		{"the client's subject header is removed before jwt_authn", checkEGSubjectStripped},
		{"the JWT sets the subject from sub on every guarded route", checkEGJWTSetsSubject},
		{"messageTimeout fits store.timeout and every route timeout", checkEGTimeouts},
		{"buffer limit and path normalisation", checkEGListener},
		{"the Gateway never retries a guarded request", checkEGNoRetries},
	}
}

func TestEnvoyGatewayRendersStrictly(t *testing.T) {
	m := mustRenderEG(t)
	var ids []string
	for _, o := range m.objs {
		ids = append(ids, o.id.String())
	}
	require.ElementsMatch(t, []string{
		"gateway.networking.k8s.io/v1/GatewayClass/envoy-gateway",
		"gateway.networking.k8s.io/v1/Gateway/payments",
		"gateway.networking.k8s.io/v1/HTTPRoute/payments-api-idemgate",
		"gateway.networking.k8s.io/v1/HTTPRoute/payments-api",
		"gateway.envoyproxy.io/v1alpha1/HTTPRouteFilter/operation-near-miss",
		"gateway.envoyproxy.io/v1alpha1/EnvoyExtensionPolicy/idemgate",
		"gateway.envoyproxy.io/v1alpha1/SecurityPolicy/idemgate-subject",
		"gateway.envoyproxy.io/v1alpha1/ClientTrafficPolicy/payments",
		"gateway.envoyproxy.io/v1alpha1/EnvoyProxy/idemgate-sidecar",
		"gateway.envoyproxy.io/v1alpha1/Backend/idemgate",
		"networking.k8s.io/v1/NetworkPolicy/idemgate-proxies",
		"networking.k8s.io/v1/NetworkPolicy/payments-api",
		"v1/ConfigMap/idemgate-config",
	}, ids)
	t.Run("the Gateway is of an Envoy Gateway class and the routes attach to it", func(t *testing.T) {
		classes := objectsOf[*gwapiv1.GatewayClass](m.objs)
		require.Len(t, classes, 1)
		require.EqualValues(t, "gateway.envoyproxy.io/gatewayclass-controller", classes[0].Spec.ControllerName)
		require.Len(t, m.gateways, 1)
		require.EqualValues(t, classes[0].Name, m.gateways[0].Spec.GatewayClassName)
		for _, r := range m.routes {
			require.NotEmpty(t, r.Spec.ParentRefs, r.Name)
			for _, pr := range r.Spec.ParentRefs {
				require.EqualValues(t, m.gateways[0].Name, pr.Name, r.Name)
				require.NotNil(t, pr.SectionName, r.Name)
				require.True(t, slices.ContainsFunc(m.gateways[0].Spec.Listeners, func(l gwapiv1.Listener) bool { return l.Name == *pr.SectionName }), r.Name)
			}
			for _, rule := range r.Spec.Rules {
				for _, br := range rule.BackendRefs {
					require.EqualValues(t, "payments-api", br.Name, "every route forwards to the one application")
				}
			}
		}
	})
}

func TestEnvoyGatewayInvariants(t *testing.T) {
	m := mustRenderEG(t)
	for _, check := range egChecks() {
		t.Run(check.name, func(t *testing.T) {
			require.NoError(t, check.run(m))
		})
	}
}

// TestEnvoyGatewayChecksCatchMutations: every check fails on a manifest that
// breaks its invariant, so a passing TestEnvoyGatewayInvariants means
// something.
func TestEnvoyGatewayChecksCatchMutations(t *testing.T) {
	ext := func(m *egManifests) *egv1a1.ExtProc { return &m.extensions[0].Spec.ExtProc[0] }
	route := func(m *egManifests, name string) *gwapiv1.HTTPRoute {
		i := slices.IndexFunc(m.routes, func(r *gwapiv1.HTTPRoute) bool { return r.Name == name })
		require.GreaterOrEqual(t, i, 0, name)
		return m.routes[i]
	}
	provider := func(m *egManifests) *egv1a1.JWTProvider { return &m.security[0].Spec.JWT.Providers[0] }
	streamed := egv1a1.StreamedExtProcBodyProcessingMode
	tests := []struct {
		name   string
		check  func(*egManifests) error
		mutate func(*egManifests)
	}{
		{"failOpen: true", checkEGExtProc, func(m *egManifests) { ext(m).FailOpen = new(true) }},
		{"failOpen left to the default", checkEGExtProc, func(m *egManifests) { ext(m).FailOpen = nil }},
		{"shadow mode", checkEGExtProc, func(m *egManifests) { ext(m).ShadowMode = new(true) }},
		{"response body streamed", checkEGExtProc, func(m *egManifests) { ext(m).ProcessingMode.Response.Body = &streamed }},
		{"no response processing", checkEGExtProc, func(m *egManifests) { ext(m).ProcessingMode.Response = nil }},
		{"request body not sent", checkEGExtProc, func(m *egManifests) { ext(m).ProcessingMode.Request.Body = nil }},
		{"no mode override", checkEGExtProc, func(m *egManifests) { ext(m).ProcessingMode.AllowModeOverride = false }},
		{"no response.code attribute", checkEGExtProc, func(m *egManifests) { ext(m).ProcessingMode.Response.Attributes = nil }},
		{"response attributes in the request", checkEGExtProc, func(m *egManifests) {
			ext(m).ProcessingMode.Request.Attributes = ext(m).ProcessingMode.Response.Attributes
			ext(m).ProcessingMode.Response.Attributes = nil
		}},
		{"Envoy's 200ms message timeout", checkEGExtProc, func(m *egManifests) { ext(m).MessageTimeout = nil }},
		{"message timeout below 4 x store.timeout", checkEGExtProc, func(m *egManifests) { ext(m).MessageTimeout = new(gwapiv1.Duration("500ms")) }},
		{"backend is a Service on the network", checkEGExtProcBackend, func(m *egManifests) {
			ref := &ext(m).BackendRefs[0].BackendObjectReference
			ref.Group, ref.Kind, ref.Port = new(gwapiv1.Group("")), new(gwapiv1.Kind("Service")), new(gwapiv1.PortNumber(50051))
		}},
		{"Backend on a TCP address", checkEGExtProcBackend, func(m *egManifests) {
			m.backends[0].Spec.Endpoints[0] = egv1a1.BackendEndpoint{IP: &egv1a1.IPEndpoint{Address: "10.0.0.7", Port: 50051}}
		}},
		{"Backend on another socket", checkEGExtProcBackend, func(m *egManifests) {
			m.backends[0].Spec.Endpoints[0].Unix.Path = "/tmp/other.sock"
		}},
		{"idemgate on a TCP listener", checkEGExtProcBackend, func(m *egManifests) { m.cfg.GRPCListen = ":50051" }},
		{"Gateway without the EnvoyProxy", checkEGExtProcBackend, func(m *egManifests) { m.gateways[0].Spec.Infrastructure = nil }},
		{"Envoy does not mount the socket directory", checkEGExtProcBackend, func(m *egManifests) {
			m.proxy.Spec.Provider.Kubernetes.EnvoyDeployment.Container.VolumeMounts = nil
		}},
		{"no gRPC health check", checkEGExtProcBackend, func(m *egManifests) { ext(m).BackendSettings.HealthCheck = nil }},
		{"policy also targets the unguarded route", checkEGGuardedRoutes, func(m *egManifests) {
			m.extensions[0].Spec.TargetRefs = append(m.extensions[0].Spec.TargetRefs, gwapiv1.LocalPolicyTargetReferenceWithSectionName{
				LocalPolicyTargetReference: gwapiv1.LocalPolicyTargetReference{Group: gwapiv1.GroupName, Kind: "HTTPRoute", Name: "payments-api"},
			})
		}},
		{"policy targets the Gateway", checkEGGuardedRoutes, func(m *egManifests) {
			m.extensions[0].Spec.TargetRefs[0].Kind = "Gateway"
			m.extensions[0].Spec.TargetRefs[0].Name = "payments"
		}},
		{"guarded route gains a prefix rule", checkEGGuardedRoutes, func(m *egManifests) {
			r := route(m, "payments-api-idemgate")
			r.Spec.Rules = append(r.Spec.Rules, gwapiv1.HTTPRouteRule{Matches: []gwapiv1.HTTPRouteMatch{{Path: &gwapiv1.HTTPPathMatch{
				Type: new(gwapiv1.PathMatchPathPrefix), Value: new("/v1/"),
			}}}})
		}},
		{"confirm moved to the unguarded route", checkEGGuardedRoutes, func(m *egManifests) {
			g := route(m, "payments-api-idemgate")
			u := route(m, "payments-api")
			u.Spec.Rules = append(u.Spec.Rules, g.Spec.Rules[1])
			g.Spec.Rules = slices.Delete(g.Spec.Rules, 1, 2)
		}},
		{"near-miss rule removed", checkEGNearMisses, func(m *egManifests) {
			u := route(m, "payments-api")
			u.Spec.Rules = slices.Delete(u.Spec.Rules, 0, 1)
		}},
		{"client subject header kept", checkEGSubjectStripped, func(m *egManifests) {
			m.clientPolicy[0].Spec.Headers.EarlyRequestHeaders.Remove = nil
		}},
		{"subject header removed on the route (after the filters)", checkEGSubjectStripped, func(m *egManifests) {
			m.clientPolicy[0].Spec.Headers.EarlyRequestHeaders = nil
			g := route(m, "payments-api-idemgate")
			for i := range g.Spec.Rules {
				g.Spec.Rules[i].Filters = append(g.Spec.Rules[i].Filters, gwapiv1.HTTPRouteFilter{
					Type:                  gwapiv1.HTTPRouteFilterRequestHeaderModifier,
					RequestHeaderModifier: &gwapiv1.HTTPHeaderFilter{Remove: []string{"x-idemgate-subject"}},
				})
			}
		}},
		{"a route sets the subject header", checkEGSubjectStripped, func(m *egManifests) {
			u := route(m, "payments-api")
			u.Spec.Rules[1].Filters = append(u.Spec.Rules[1].Filters, gwapiv1.HTTPRouteFilter{
				Type:                  gwapiv1.HTTPRouteFilterRequestHeaderModifier,
				RequestHeaderModifier: &gwapiv1.HTTPHeaderFilter{Set: []gwapiv1.HTTPHeader{{Name: "X-Idemgate-Subject", Value: "alice"}}},
			})
		}},
		{"subject from another claim", checkEGJWTSetsSubject, func(m *egManifests) { provider(m).ClaimToHeaders[0].Claim = "email" }},
		{"JWT optional", checkEGJWTSetsSubject, func(m *egManifests) { m.security[0].Spec.JWT.Optional = new(true) }},
		{"JWT fail open", checkEGJWTSetsSubject, func(m *egManifests) { m.security[0].Spec.JWT.FailOpen = new(true) }},
		{"JWKS over http", checkEGJWTSetsSubject, func(m *egManifests) { provider(m).RemoteJWKS.URI = "http://auth.example.com/jwks" }},
		{"no audience", checkEGJWTSetsSubject, func(m *egManifests) { provider(m).Audiences = nil }},
		{"confirm timeout below the message timeout", checkEGTimeouts, func(m *egManifests) {
			route(m, "payments-api-idemgate").Spec.Rules[1].Timeouts.Request = new(gwapiv1.Duration("1s"))
		}},
		{"confirm timeout differs from upstream_timeout", checkEGTimeouts, func(m *egManifests) {
			route(m, "payments-api-idemgate").Spec.Rules[1].Timeouts.Request = new(gwapiv1.Duration("30s"))
		}},
		{"buffer limit above max_body_bytes", checkEGListener, func(m *egManifests) {
			q := m.clientPolicy[0].Spec.Connection.BufferLimit
			q.Add(*q)
		}},
		{"a retry on the confirm route", checkEGNoRetries, func(m *egManifests) {
			route(m, "payments-api-idemgate").Spec.Rules[1].Retry = &gwapiv1.HTTPRouteRetry{Attempts: new(1)}
		}},
		{"slashes not merged", checkEGListener, func(m *egManifests) { m.clientPolicy[0].Spec.Path.DisableMergeSlashes = new(true) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := mustRenderEG(t)
			require.NoError(t, tt.check(m), "the unmutated manifests pass")
			tt.mutate(m)
			err := tt.check(m)
			require.Error(t, err)
			t.Log(err)
		})
	}
}

func TestEnvoyGatewayIdemgate(t *testing.T) {
	m := mustRenderEG(t)
	pod, c, _, err := m.proxyPod()
	require.NoError(t, err)
	raw, err := m.mountedConfig()
	require.NoError(t, err)
	adminPort := port(t, m.cfg.AdminListen)

	t.Run("serves k8s/envoy-gateway/idemgate.yaml, which is base's with gRPC on a unix socket", func(t *testing.T) {
		file, err := os.ReadFile(path.Join(egDir, "idemgate.yaml"))
		require.NoError(t, err)
		require.Equal(t, string(file), string(raw))
		base, err := os.ReadFile(path.Join(baseDir, "idemgate.yaml"))
		require.NoError(t, err)
		var ours, theirs map[string]any
		require.NoError(t, yaml.UnmarshalStrict(file, &ours))
		require.NoError(t, yaml.UnmarshalStrict(base, &theirs))
		_, unix := settings.UnixSocketPath(m.cfg.GRPCListen)
		require.True(t, unix, "ext_proc stays inside the proxy pod")
		require.NotContains(t, ours, "grpc_plaintext_remote")
		delete(ours, "grpc_listen")
		delete(theirs, "grpc_listen")
		require.Equal(t, theirs, ours)
	})
	t.Run("a native sidecar declaring the admin and approvals ports, no gRPC port", func(t *testing.T) {
		require.NotNil(t, c.RestartPolicy)
		require.Equal(t, corev1.ContainerRestartPolicyAlways, *c.RestartPolicy)
		var ports []int32
		for _, p := range c.Ports {
			ports = append(ports, p.ContainerPort)
		}
		require.ElementsMatch(t, []int32{adminPort, approvalListenPort(t, raw)}, ports)
	})
	t.Run("probes hit idemgate's admin endpoints on its admin port; readiness does not follow the stores", func(t *testing.T) {
		for _, tt := range []struct {
			name  string
			probe *corev1.Probe
			path  string
		}{
			// /readyz would take the whole Gateway pod, every route, out
			// of its Service while a store is down; idemgate answers
			// temporarily_unavailable on the guarded routes instead.
			{"readiness", c.ReadinessProbe, "/healthz"},
			{"liveness", c.LivenessProbe, "/healthz"},
			{"startup", c.StartupProbe, "/healthz"},
		} {
			require.NotNil(t, tt.probe, tt.name)
			require.NotNil(t, tt.probe.HTTPGet, tt.name)
			require.Equal(t, tt.path, tt.probe.HTTPGet.Path, tt.name)
			require.Equal(t, adminPort, tt.probe.HTTPGet.Port.IntVal, tt.name)
		}
	})
	t.Run("same image, Secrets and hardening as the base sidecar, plus the socket directory", func(t *testing.T) {
		sidecar := container(t, &deployment(t, render(t, baseDir)).Spec.Template.Spec, "idemgate")
		require.Equal(t, sidecar.Image, c.Image)
		require.Equal(t, sidecar.Env, c.Env)
		require.Subset(t, c.VolumeMounts, sidecar.VolumeMounts)
		require.Len(t, c.VolumeMounts, len(sidecar.VolumeMounts)+1)
		want := sidecar.SecurityContext.DeepCopy()
		want.RunAsGroup = new(int64(65532)) // Envoy Gateway's Envoy runs as 65532:65532: the socket's group
		require.Equal(t, want, c.SecurityContext)
	})
	t.Run("hardened", func(t *testing.T) {
		// The pod fields the EnvoyProxy does not carry: Envoy Gateway writes
		// automountServiceAccountToken: false into its proxy Deployment
		// (v1.9.1 internal/infrastructure/kubernetes/proxy).
		hardened := pod.DeepCopy()
		hardened.AutomountServiceAccountToken = new(false)
		checkPodHardening(t, hardened)
	})
	t.Run("two replicas", func(t *testing.T) {
		r := m.proxy.Spec.Provider.Kubernetes.EnvoyDeployment.Replicas
		require.NotNil(t, r)
		require.Greater(t, *r, int32(1))
	})
	t.Run("the config loader accepts the mounted config", func(t *testing.T) {
		key := make([]byte, 32)
		_, err := rand.Read(key)
		require.NoError(t, err)
		files := podFiles{env: map[string]string{}, files: map[string][]byte{}}
		secrets := exampleSecrets(t)
		for _, e := range c.Env {
			require.NotNil(t, e.ValueFrom.SecretKeyRef, e.Name)
			files.env[e.Name] = secrets[e.ValueFrom.SecretKeyRef.Name].StringData[e.ValueFrom.SecretKeyRef.Key]
		}
		for id, k := range m.cfg.Signing.Keys {
			require.NotEmpty(t, k.File, id)
			files.files[k.File] = []byte(base64.StdEncoding.EncodeToString(key))
		}
		// approval_tls: the sidecar mounts the kubernetes.io/tls Secret where
		// the config reads it.
		const approvalsTLS = "/etc/idemgate/approvals-tls"
		var mounted bool
		for _, vm := range c.VolumeMounts {
			mounted = mounted || vm.MountPath == approvalsTLS
		}
		require.True(t, mounted, "the sidecar mounts %s", approvalsTLS)
		certPEM, keyPEM := selfSignedPEM(t)
		files.files[approvalsTLS+"/tls.crt"], files.files[approvalsTLS+"/tls.key"] = []byte(certPEM), []byte(keyPEM)
		cfg, warnings, err := settings.Parse(egDir+"/idemgate.yaml", raw, "/etc/idemgate/config", files.options())
		require.NoError(t, err)
		require.Empty(t, warnings)
		require.Equal(t, m.cfg.GRPCListen, cfg.GRPCListen)
		require.Nil(t, cfg.GRPCTLS)
		require.False(t, cfg.GRPCPlaintextRemote)
		require.NotNil(t, cfg.ApprovalTLS, "the approvers' listener is on the pod IP: TLS")
		require.False(t, cfg.ApprovalPlaintextRemote)
		require.Equal(t, "tiered", cfg.Store.Backend())
	})
	t.Run("the ConfigMap is in the proxies' namespace", func(t *testing.T) {
		for _, cm := range objectsOf[*corev1.ConfigMap](m.objs) {
			require.Equal(t, "envoy-gateway-system", cm.Namespace, cm.Name)
		}
	})
}

// proxyPeer reports whether a NetworkPolicy peer is exactly Envoy Gateway's
// proxy pods of Gateway gw (in Envoy Gateway's namespace).
func proxyPeer(p networkingv1.NetworkPolicyPeer, gw string) bool {
	return p.IPBlock == nil && p.NamespaceSelector != nil && p.PodSelector != nil &&
		p.NamespaceSelector.MatchLabels["kubernetes.io/metadata.name"] == "envoy-gateway-system" &&
		p.PodSelector.MatchLabels["app.kubernetes.io/component"] == "proxy" &&
		p.PodSelector.MatchLabels["app.kubernetes.io/managed-by"] == "envoy-gateway" &&
		p.PodSelector.MatchLabels["gateway.envoyproxy.io/owning-gateway-name"] == gw
}

func TestEnvoyGatewayNetworkPolicies(t *testing.T) {
	m := mustRenderEG(t)
	require.Len(t, m.gateways, 1)
	gw := m.gateways[0].Name
	adminPort := port(t, m.cfg.AdminListen)
	raw, err := m.mountedConfig()
	require.NoError(t, err)
	approvalsPort := approvalListenPort(t, raw)
	byName := map[string]*networkingv1.NetworkPolicy{}
	for _, np := range m.netpols {
		byName[np.Name] = np
		require.Equal(t, []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}, np.Spec.PolicyTypes, np.Name)
		for _, rule := range np.Spec.Ingress {
			require.NotEmpty(t, rule.Ports, "%s: a rule without ports admits every port", np.Name)
		}
	}

	t.Run("proxy pods: the listener from anywhere, idemgate's admin from monitoring, approvals from the approvers' namespace, nothing else", func(t *testing.T) {
		np := byName["idemgate-proxies"]
		require.NotNil(t, np)
		require.Equal(t, "envoy-gateway-system", np.Namespace)
		require.True(t, proxyPeer(networkingv1.NetworkPolicyPeer{
			NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": np.Namespace}},
			PodSelector:       &np.Spec.PodSelector,
		}, gw), "selects the proxy pods of Gateway %s", gw)
		// Envoy Gateway binds a listener port below 1024 at port + 10000 in the pod.
		listener := int32(m.gateways[0].Spec.Listeners[0].Port)
		if listener < 1024 {
			listener += 10000
		}
		const envoyMetrics = 19001
		admitted := map[int32]bool{}
		for _, rule := range np.Spec.Ingress {
			for _, p := range rule.Ports {
				require.Equal(t, intstr.Int, p.Port.Type)
				port := p.Port.IntVal
				admitted[port] = true
				switch port {
				case listener:
					require.Empty(t, rule.From, "clients come from anywhere")
				case adminPort, envoyMetrics:
					require.Len(t, rule.From, 1)
					require.Nil(t, rule.From[0].PodSelector)
					require.Equal(t, map[string]string{"kubernetes.io/metadata.name": "monitoring"}, rule.From[0].NamespaceSelector.MatchLabels)
				case approvalsPort:
					require.Len(t, rule.From, 1)
					require.Nil(t, rule.From[0].PodSelector)
					require.Equal(t, map[string]string{"kubernetes.io/metadata.name": approversNamespace}, rule.From[0].NamespaceSelector.MatchLabels)
				default:
					t.Errorf("admits port %d", port)
				}
			}
		}
		require.Len(t, admitted, 4)
	})
	t.Run("the app: only from the Gateway's proxies, on the port the routes use", func(t *testing.T) {
		np := byName["payments-api"]
		require.NotNil(t, np)
		require.Equal(t, map[string]string{"app.kubernetes.io/name": "payments-api"}, np.Spec.PodSelector.MatchLabels)
		var routePorts []int32
		for _, r := range m.routes {
			for _, rule := range r.Spec.Rules {
				for _, br := range rule.BackendRefs {
					require.NotNil(t, br.Port)
					routePorts = append(routePorts, int32(*br.Port))
				}
			}
		}
		for _, rule := range np.Spec.Ingress {
			require.NotEmpty(t, rule.From)
			for _, f := range rule.From {
				require.True(t, proxyPeer(f, gw))
			}
			for _, p := range rule.Ports {
				require.Contains(t, routePorts, p.Port.IntVal)
				require.Equal(t, intstr.Int, p.Port.Type)
			}
		}
	})
}

// TestEnvoyGatewayExamples: the local-JWKS example decodes strictly, passes
// the JWT checks and carries the demo's JWKS; no example file is applied and
// the overlay creates no Secret.
func TestEnvoyGatewayExamples(t *testing.T) {
	docs, err := readDocuments(path.Join(egDir, "securitypolicy-local-jwks.example.yaml"))
	require.NoError(t, err)
	require.Len(t, docs, 1)
	obj, err := decodeStrict(docs[0])
	require.NoError(t, err)
	sp, ok := obj.(*egv1a1.SecurityPolicy)
	require.True(t, ok)
	m := mustRenderEG(t)
	require.NoError(t, checkEGJWT(sp.Spec.JWT, m.cfg))
	require.Equal(t, m.security[0].Spec.TargetRefs, sp.Spec.TargetRefs)
	require.Len(t, sp.Spec.JWT.Providers, 1)
	local := sp.Spec.JWT.Providers[0].LocalJWKS
	require.NotNil(t, local)
	require.NotNil(t, local.Type)
	require.Equal(t, egv1a1.LocalJWKSTypeInline, *local.Type)
	demo, err := os.ReadFile("../e2e/demoauth/jwks.json")
	require.NoError(t, err)
	require.JSONEq(t, string(demo), *local.Inline)

	raw, err := os.ReadFile(path.Join(egDir, "kustomization.yaml"))
	require.NoError(t, err)
	var k kustomization
	require.NoError(t, yaml.UnmarshalStrict(raw, &k))
	for _, ref := range k.Resources {
		require.NotContains(t, ref, ".example.")
	}
	require.Empty(t, objectsOf[*corev1.Secret](m.objs), "users create Secrets themselves")
}

// TestEnvoyGatewayDecodingIsStrict: a misspelt field of an Envoy Gateway or
// Gateway API object is an error, not a silently dropped setting (Envoy
// Gateway would then apply its default: failOpen's is false, but
// messageTimeout's is 200 ms and a missing processingMode sends nothing).
func TestEnvoyGatewayDecodingIsStrict(t *testing.T) {
	for _, tt := range []struct{ file, from, to string }{
		{"envoyextensionpolicy.yaml", "failOpen: false", "failopen: false"},
		{"envoyextensionpolicy.yaml", "messageTimeout: 1s", "messageTimout: 1s"},
		{"envoyextensionpolicy.yaml", "request: {body: Buffered}", "request: {body: Buffered, bodyy: Buffered}"},
		{"securitypolicy.yaml", "claimToHeaders:", "claimsToHeaders:"},
		{"clienttrafficpolicy.yaml", "earlyRequestHeaders:", "earlyRequestHeader:"},
		{"httproute.yaml", "timeouts: {request: 10s}", "timeout: {request: 10s}"},
	} {
		t.Run(tt.file+" "+tt.to, func(t *testing.T) {
			raw, err := os.ReadFile(path.Join(egDir, tt.file))
			require.NoError(t, err)
			require.Contains(t, string(raw), tt.from)
			bad := path.Join(t.TempDir(), tt.file)
			require.NoError(t, os.WriteFile(bad, []byte(strings.Replace(string(raw), tt.from, tt.to, 1)), 0o600))
			docs, err := readDocuments(bad)
			require.NoError(t, err)
			var errs []error
			for _, d := range docs {
				if _, err := decodeStrict(d); err != nil {
					errs = append(errs, err)
				}
			}
			require.Len(t, errs, 1)
			t.Log(errs[0])
		})
	}
}
