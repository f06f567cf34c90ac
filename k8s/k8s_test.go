package k8s

import (
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"

	"github.com/idemgate/idemgate/cmd/idemgate/settings"
	"github.com/idemgate/idemgate/envoy/envoytest"
	"github.com/idemgate/idemgate/envoy/pieces"
	"github.com/idemgate/idemgate/extproc/config"
)

// The invariants these tests hold the manifests to: the application is
// reachable only through Envoy (and therefore idemgate), the probes hit
// idemgate's real admin endpoints, the configs mounted are consistent with one
// another and with the pod, and nothing runs as root or can gain privileges.

const (
	baseDir  = "base"
	istioDir = "istio"
	appPod   = "payments-api"
)

func deployment(t *testing.T, objs []object) *appsv1.Deployment {
	t.Helper()
	ds := objectsOf[*appsv1.Deployment](objs)
	require.Len(t, ds, 1)
	require.Equal(t, appPod, ds[0].Name)
	return ds[0]
}

func container(t *testing.T, pod *corev1.PodSpec, name string) *corev1.Container {
	t.Helper()
	for _, list := range [][]corev1.Container{pod.InitContainers, pod.Containers} {
		for i := range list {
			if list[i].Name == name {
				return &list[i]
			}
		}
	}
	t.Fatalf("no container %q", name)
	return nil
}

func envValue(t *testing.T, c *corev1.Container, name string) string {
	t.Helper()
	for _, e := range c.Env {
		if e.Name == name {
			return e.Value
		}
	}
	t.Fatalf("container %s has no env %s", c.Name, name)
	return ""
}

func flagValue(args []string, flag string) string {
	i := slices.Index(args, flag)
	if i < 0 || i+1 >= len(args) {
		return ""
	}
	return args[i+1]
}

// mountedFile resolves a file path inside container c to the volume that
// provides it and the key within that volume.
func mountedFile(t *testing.T, pod *corev1.PodSpec, c *corev1.Container, file string) (*corev1.Volume, string) {
	t.Helper()
	for _, m := range c.VolumeMounts {
		rest, ok := strings.CutPrefix(file, strings.TrimSuffix(m.MountPath, "/")+"/")
		if !ok || strings.Contains(rest, "/") {
			continue
		}
		require.True(t, m.ReadOnly, "mount %s should be read-only", m.MountPath)
		require.Empty(t, m.SubPath)
		for i := range pod.Volumes {
			if pod.Volumes[i].Name == m.Name {
				return &pod.Volumes[i], rest
			}
		}
		t.Fatalf("mount %s names no volume %s", m.MountPath, m.Name)
	}
	t.Fatalf("%s is not mounted in container %s", file, c.Name)
	return nil, ""
}

// configMapFile returns the content of file as container c sees it, which
// must come from a rendered ConfigMap.
func configMapFile(t *testing.T, objs []object, pod *corev1.PodSpec, c *corev1.Container, file string) []byte {
	t.Helper()
	v, key := mountedFile(t, pod, c, file)
	require.NotNil(t, v.ConfigMap, "%s must come from a ConfigMap", file)
	require.Empty(t, v.ConfigMap.Items)
	for _, cm := range objectsOf[*corev1.ConfigMap](objs) {
		if cm.Name == v.ConfigMap.Name {
			data, ok := cm.Data[key]
			require.True(t, ok, "ConfigMap %s has no key %s", cm.Name, key)
			return []byte(data)
		}
	}
	t.Fatalf("no ConfigMap %s", v.ConfigMap.Name)
	return nil
}

// idemgateConfig returns the idemgate config the idemgate container serves.
func idemgateConfig(t *testing.T, objs []object) ([]byte, *envoytest.IdemgateConfig) {
	t.Helper()
	pod := &deployment(t, objs).Spec.Template.Spec
	c := container(t, pod, "idemgate")
	require.Equal(t, "serve", c.Args[0])
	raw := configMapFile(t, objs, pod, c, flagValue(c.Args, "--config"))
	cfg, err := envoytest.ReadIdemgateConfig(raw)
	require.NoError(t, err)
	return raw, cfg
}

// approvalsPort is the port of approval_listen in the idemgate config the
// Deployment mounts (envoytest.IdemgateConfig does not read that key).
func approvalsPort(t *testing.T, objs []object) int32 {
	t.Helper()
	raw, _ := idemgateConfig(t, objs)
	return approvalListenPort(t, raw)
}

func approvalListenPort(t *testing.T, raw []byte) int32 {
	t.Helper()
	var c struct {
		ApprovalListen string `json:"approval_listen"`
	}
	require.NoError(t, yaml.Unmarshal(raw, &c))
	require.NotEmpty(t, c.ApprovalListen, "the shipped config sets approval_listen")
	return port(t, c.ApprovalListen)
}

func port(t *testing.T, listen string) int32 {
	t.Helper()
	_, p, err := envoytest.HostPort(listen)
	require.NoError(t, err)
	return int32(p)
}

func selects(t *testing.T, sel *metav1.LabelSelector, podLabels map[string]string) bool {
	t.Helper()
	s, err := metav1.LabelSelectorAsSelector(sel)
	require.NoError(t, err)
	return !s.Empty() && s.Matches(labels.Set(podLabels))
}

// resolvePort finds the container port a Service targetPort or NetworkPolicy
// port refers to, by name or number.
func resolvePort(pod *corev1.PodSpec, p intstr.IntOrString) (string, corev1.ContainerPort, bool) {
	for _, list := range [][]corev1.Container{pod.InitContainers, pod.Containers} {
		for _, c := range list {
			for _, cp := range c.Ports {
				if (p.Type == intstr.String && cp.Name == p.StrVal) || (p.Type == intstr.Int && cp.ContainerPort == p.IntVal) {
					return c.Name, cp, true
				}
			}
		}
	}
	return "", corev1.ContainerPort{}, false
}

// exampleSecrets decodes base/secrets.example.yaml strictly.
func exampleSecrets(t *testing.T) map[string]*corev1.Secret {
	t.Helper()
	docs, err := readDocuments(path.Join(baseDir, "secrets.example.yaml"))
	require.NoError(t, err)
	out := map[string]*corev1.Secret{}
	for _, d := range docs {
		obj, err := decodeStrict(d)
		require.NoError(t, err)
		s, ok := obj.(*corev1.Secret)
		require.True(t, ok, "%s is not a Secret", d.id)
		out[s.Name] = s
	}
	return out
}

func TestBaseRendersStrictly(t *testing.T) {
	objs := render(t, baseDir)
	var ids []string
	for _, o := range objs {
		ids = append(ids, o.id.String())
	}
	require.ElementsMatch(t, []string{
		"apps/v1/Deployment/payments-api",
		"v1/Service/payments-api",
		"networking.k8s.io/v1/NetworkPolicy/payments-api",
		"policy/v1/PodDisruptionBudget/payments-api",
		"v1/ConfigMap/envoy-config",
		"v1/ConfigMap/idemgate-config",
	}, ids)
}

// TestBaseEnvoyConfig runs every invariant of envoy/ on the sidecar's Envoy
// config, checked against the idemgate config mounted next to it.
func TestBaseEnvoyConfig(t *testing.T) {
	objs := render(t, baseDir)
	pod := &deployment(t, objs).Spec.Template.Spec
	envoy := container(t, pod, "envoy")
	g, err := envoytest.DecodeBootstrap(configMapFile(t, objs, pod, envoy, flagValue(envoy.Args, "-c")))
	require.NoError(t, err)
	_, cfg := idemgateConfig(t, objs)

	for _, check := range envoytest.BootstrapChecks() {
		t.Run(check.Name, func(t *testing.T) {
			require.NoError(t, check.Run(g, cfg))
		})
	}
	t.Run("it carries the pieces of `idemgate envoy-config` for the config beside it", func(t *testing.T) {
		p := renderPieces(t, objs, envoytest.PaymentsCluster)
		require.NoError(t, envoytest.CheckCarriesPieces(g, p))
	})
	t.Run("the listener is the envoy container's only port", func(t *testing.T) {
		require.Len(t, envoy.Ports, 1)
		require.EqualValues(t, g.ListenerPort(), envoy.Ports[0].ContainerPort)
		require.Equal(t, "0.0.0.0", g.Listener.GetAddress().GetSocketAddress().GetAddress())
	})
	t.Run("tokens are verified against a remote JWKS over TLS", func(t *testing.T) {
		jwt, err := g.JWTAuthn()
		require.NoError(t, err)
		for name, p := range jwt.GetProviders() {
			cluster := p.GetRemoteJwks().GetHttpUri().GetCluster()
			require.NotEmpty(t, cluster, "provider %s", name)
			c, ok := g.Clusters[cluster]
			require.True(t, ok, "provider %s fetches keys from undefined cluster %s", name, cluster)
			require.NotNil(t, c.GetTransportSocket(), "JWKS must be fetched over TLS")
			require.True(t, strings.HasPrefix(p.GetRemoteJwks().GetHttpUri().GetUri(), "https://"))
		}
	})
	t.Run("same Envoy release as docker-compose", func(t *testing.T) {
		var compose struct {
			Services map[string]struct {
				Image string `json:"image"`
			} `json:"services"`
		}
		raw, err := os.ReadFile("../docker-compose.yaml")
		require.NoError(t, err)
		require.NoError(t, yaml.Unmarshal(raw, &compose))
		require.Equal(t, compose.Services["envoy"].Image, envoy.Image)
		pin, err := envoytest.PinnedVersion()
		require.NoError(t, err)
		require.Equal(t, "envoyproxy/envoy:v"+pin, envoy.Image, "the release .envoy-version pins")
	})
}

func TestBaseAppIsReachableOnlyThroughEnvoy(t *testing.T) {
	objs := render(t, baseDir)
	d := deployment(t, objs)
	pod := &d.Spec.Template.Spec
	envoy := container(t, pod, "envoy")
	g, err := envoytest.DecodeBootstrap(configMapFile(t, objs, pod, envoy, flagValue(envoy.Args, "-c")))
	require.NoError(t, err)
	_, cfg := idemgateConfig(t, objs)
	listenerPort := int32(g.ListenerPort())
	adminPort := port(t, cfg.AdminListen)

	t.Run("the app binds loopback only, where Envoy's upstream points", func(t *testing.T) {
		app := container(t, pod, "app")
		require.Empty(t, app.Ports, "the app declares no containerPort")
		host, appPort, err := envoytest.HostPort(envValue(t, app, "LISTEN_ADDR"))
		require.NoError(t, err)
		require.Equal(t, "127.0.0.1", host)
		clusterHost, clusterPort, err := g.ClusterAddress("payments")
		require.NoError(t, err)
		require.Equal(t, host, clusterHost)
		require.Equal(t, appPort, clusterPort)
		require.False(t, pod.HostNetwork)
	})
	t.Run("idemgate's gRPC is loopback only and not declared", func(t *testing.T) {
		host, grpcPort, err := envoytest.HostPort(cfg.GRPCListen)
		require.NoError(t, err)
		require.Equal(t, "127.0.0.1", host)
		_, _, declared := resolvePort(pod, intstr.FromInt32(int32(grpcPort)))
		require.False(t, declared)
	})
	t.Run("the Service targets Envoy's port only", func(t *testing.T) {
		svcs := objectsOf[*corev1.Service](objs)
		require.Len(t, svcs, 1)
		require.True(t, selects(t, &metav1.LabelSelector{MatchLabels: svcs[0].Spec.Selector}, d.Spec.Template.Labels))
		require.NotEmpty(t, svcs[0].Spec.Ports)
		for _, p := range svcs[0].Spec.Ports {
			name, cp, ok := resolvePort(pod, p.TargetPort)
			require.True(t, ok, "targetPort %s resolves to no container port", p.TargetPort.String())
			require.Equal(t, "envoy", name)
			require.Equal(t, listenerPort, cp.ContainerPort)
		}
	})
	t.Run("the NetworkPolicy admits Envoy's port, the admin port from monitoring only, the approvers' API from the approvers' namespace only", func(t *testing.T) {
		checkNetworkPolicy(t, objs, d, listenerPort, adminPort, approvalsPort(t, objs))
	})
}

// approversNamespace is where the manifests expect the approvers' SSO
// proxy, the only caller of approval_listen.
const approversNamespace = "idemgate-approvals"

// checkNetworkPolicy: every ingress rule names its ports (a rule without
// ports admits all of them); only the API port is open to all callers, the
// admin port only to the monitoring namespace, the approvers' API only to
// the approvers' namespace.
func checkNetworkPolicy(t *testing.T, objs []object, d *appsv1.Deployment, apiPort, adminPort, approvalsPort int32) {
	t.Helper()
	nps := objectsOf[*networkingv1.NetworkPolicy](objs)
	require.Len(t, nps, 1)
	np := nps[0]
	require.True(t, selects(t, &np.Spec.PodSelector, d.Spec.Template.Labels))
	require.Contains(t, np.Spec.PolicyTypes, networkingv1.PolicyTypeIngress)
	var admitted []int32
	for _, rule := range np.Spec.Ingress {
		require.NotEmpty(t, rule.Ports, "an ingress rule without ports admits every port")
		for _, p := range rule.Ports {
			require.NotNil(t, p.Port)
			_, cp, ok := resolvePort(&d.Spec.Template.Spec, *p.Port)
			require.True(t, ok, "NetworkPolicy port %s is no container port", p.Port.String())
			admitted = append(admitted, cp.ContainerPort)
			switch cp.ContainerPort {
			case apiPort:
			case adminPort:
				require.Len(t, rule.From, 1)
				require.Nil(t, rule.From[0].PodSelector)
				require.Nil(t, rule.From[0].IPBlock)
				require.Equal(t, map[string]string{"kubernetes.io/metadata.name": "monitoring"},
					rule.From[0].NamespaceSelector.MatchLabels)
			case approvalsPort:
				require.Len(t, rule.From, 1)
				require.Nil(t, rule.From[0].PodSelector)
				require.Nil(t, rule.From[0].IPBlock)
				require.Equal(t, map[string]string{"kubernetes.io/metadata.name": approversNamespace},
					rule.From[0].NamespaceSelector.MatchLabels)
			default:
				t.Errorf("NetworkPolicy admits port %d, which is neither the API, the admin nor the approvals port", cp.ContainerPort)
			}
		}
	}
	require.ElementsMatch(t, []int32{apiPort, adminPort, approvalsPort}, admitted)
}

func TestBaseIdemgateSidecar(t *testing.T) {
	objs := render(t, baseDir)
	d := deployment(t, objs)
	pod := &d.Spec.Template.Spec
	c := container(t, pod, "idemgate")
	raw, cfg := idemgateConfig(t, objs)
	adminPort := port(t, cfg.AdminListen)

	t.Run("native sidecar: an init container that keeps running", func(t *testing.T) {
		require.Len(t, pod.InitContainers, 1)
		require.Equal(t, "idemgate", pod.InitContainers[0].Name)
		require.NotNil(t, c.RestartPolicy)
		require.Equal(t, corev1.ContainerRestartPolicyAlways, *c.RestartPolicy)
		require.NotNil(t, c.StartupProbe, "envoy and the app start once idemgate answers")
	})
	t.Run("serves k8s/base/idemgate.yaml", func(t *testing.T) {
		file, err := os.ReadFile(path.Join(baseDir, "idemgate.yaml"))
		require.NoError(t, err)
		require.Equal(t, string(file), string(raw))
	})
	t.Run("declares the admin port and approval_listen's", func(t *testing.T) {
		var ports []int32
		for _, p := range c.Ports {
			ports = append(ports, p.ContainerPort)
		}
		require.Equal(t, []int32{adminPort, approvalsPort(t, objs)}, ports)
	})
	t.Run("probes hit idemgate's admin endpoints on its admin port", func(t *testing.T) {
		require.Equal(t, adminPort, c.Ports[0].ContainerPort)
		for _, tt := range []struct {
			name  string
			probe *corev1.Probe
			path  string
		}{
			{"readiness", c.ReadinessProbe, "/readyz"},
			{"liveness", c.LivenessProbe, "/healthz"},
			{"startup", c.StartupProbe, "/healthz"},
		} {
			require.NotNil(t, tt.probe, tt.name)
			require.NotNil(t, tt.probe.HTTPGet, tt.name)
			require.Equal(t, tt.path, tt.probe.HTTPGet.Path, tt.name)
			_, cp, ok := resolvePort(&corev1.PodSpec{Containers: []corev1.Container{*c}}, tt.probe.HTTPGet.Port)
			require.True(t, ok, tt.name)
			require.Equal(t, adminPort, cp.ContainerPort, tt.name)
		}
		require.Equal(t, strconv.Itoa(int(adminPort)), d.Spec.Template.Annotations["prometheus.io/port"])
	})
	t.Run("signing keys are files from a Secret", func(t *testing.T) {
		secrets := exampleSecrets(t)
		require.NotEmpty(t, cfg.Signing.Keys)
		require.Contains(t, cfg.Signing.Keys, cfg.Signing.ActiveKey)
		for id, k := range cfg.Signing.Keys {
			require.Empty(t, k.Env, "key %s: Kubernetes mounts keys as files", id)
			v, key := mountedFile(t, pod, c, k.File)
			require.NotNil(t, v.Secret, "key %s must come from a Secret", id)
			require.Empty(t, v.Secret.Items)
			ex, ok := secrets[v.Secret.SecretName]
			require.True(t, ok, "secrets.example.yaml lacks Secret %s", v.Secret.SecretName)
			require.Contains(t, ex.StringData, key)
		}
	})
	t.Run("store credentials come from a Secret through the variables the config names", func(t *testing.T) {
		secrets := exampleSecrets(t)
		var names []string
		if r := cfg.Store.Redis; r != nil && r.PasswordEnv != "" {
			names = append(names, r.PasswordEnv)
		}
		require.NotNil(t, cfg.Store.Postgres)
		require.Empty(t, cfg.Store.Postgres.DSN, "no DSN (with its password) in a ConfigMap")
		require.NotEmpty(t, cfg.Store.Postgres.DSNEnv)
		names = append(names, cfg.Store.Postgres.DSNEnv)
		for _, name := range names {
			i := slices.IndexFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == name })
			require.GreaterOrEqual(t, i, 0, "idemgate has no env %s", name)
			ref := c.Env[i].ValueFrom.SecretKeyRef
			require.NotNil(t, ref, "%s must come from a Secret", name)
			require.Contains(t, secrets[ref.Name].StringData, ref.Key)
		}
	})
}

// effectiveSecurity merges pod-level defaults into a container's context.
func effectiveSecurity(pod *corev1.PodSpec, c *corev1.Container) (runAsNonRoot bool, runAsUser int64) {
	if ps := pod.SecurityContext; ps != nil {
		if ps.RunAsNonRoot != nil {
			runAsNonRoot = *ps.RunAsNonRoot
		}
		if ps.RunAsUser != nil {
			runAsUser = *ps.RunAsUser
		}
	}
	if sc := c.SecurityContext; sc != nil {
		if sc.RunAsNonRoot != nil {
			runAsNonRoot = *sc.RunAsNonRoot
		}
		if sc.RunAsUser != nil {
			runAsUser = *sc.RunAsUser
		}
	}
	return runAsNonRoot, runAsUser
}

func checkPodHardening(t *testing.T, pod *corev1.PodSpec) {
	t.Helper()
	require.NotNil(t, pod.SecurityContext)
	require.NotNil(t, pod.SecurityContext.SeccompProfile)
	require.Equal(t, corev1.SeccompProfileTypeRuntimeDefault, pod.SecurityContext.SeccompProfile.Type)
	require.NotNil(t, pod.AutomountServiceAccountToken)
	require.False(t, *pod.AutomountServiceAccountToken, "the pod needs no Kubernetes API token")
	require.False(t, pod.HostNetwork || pod.HostPID || pod.HostIPC)
	for _, c := range append(slices.Clone(pod.InitContainers), pod.Containers...) {
		t.Run(c.Name, func(t *testing.T) {
			sc := c.SecurityContext
			require.NotNil(t, sc)
			require.NotNil(t, sc.AllowPrivilegeEscalation)
			require.False(t, *sc.AllowPrivilegeEscalation)
			require.True(t, sc.Privileged == nil || !*sc.Privileged)
			require.NotNil(t, sc.ReadOnlyRootFilesystem)
			require.True(t, *sc.ReadOnlyRootFilesystem)
			require.NotNil(t, sc.Capabilities)
			require.Equal(t, []corev1.Capability{"ALL"}, sc.Capabilities.Drop)
			require.Empty(t, sc.Capabilities.Add)
			nonRoot, uid := effectiveSecurity(pod, &c)
			require.True(t, nonRoot)
			require.EqualValues(t, 65532, uid)
			for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
				require.Contains(t, c.Resources.Requests, r)
				require.Contains(t, c.Resources.Limits, r)
			}
		})
	}
}

func TestBasePodIsHardened(t *testing.T) {
	objs := render(t, baseDir)
	checkPodHardening(t, &deployment(t, objs).Spec.Template.Spec)
}

// TestBaseShutdownFitsTheGracePeriod: regular containers run their preStop
// first; the idemgate sidecar gets SIGTERM only after they exit and then
// drains for drain.period + drain.timeout. All of it must fit before SIGKILL.
func TestBaseShutdownFitsTheGracePeriod(t *testing.T) {
	objs := render(t, baseDir)
	pod := &deployment(t, objs).Spec.Template.Spec
	_, cfg := idemgateConfig(t, objs)
	var preStop time.Duration
	for _, c := range pod.Containers {
		if c.Lifecycle != nil && c.Lifecycle.PreStop != nil && c.Lifecycle.PreStop.Sleep != nil {
			preStop = max(preStop, time.Duration(c.Lifecycle.PreStop.Sleep.Seconds)*time.Second)
		}
	}
	need := preStop + time.Duration(cfg.Drain.Period) + time.Duration(cfg.Drain.Timeout)
	require.NotNil(t, pod.TerminationGracePeriodSeconds)
	grace := time.Duration(*pod.TerminationGracePeriodSeconds) * time.Second
	require.Greater(t, grace, need, "terminationGracePeriodSeconds must exceed preStop %v + drain %v + %v",
		preStop, time.Duration(cfg.Drain.Period), time.Duration(cfg.Drain.Timeout))
}

func TestBaseDisruptionBudget(t *testing.T) {
	objs := render(t, baseDir)
	d := deployment(t, objs)
	pdbs := objectsOf[*policyv1.PodDisruptionBudget](objs)
	require.Len(t, pdbs, 1)
	require.True(t, selects(t, pdbs[0].Spec.Selector, d.Spec.Template.Labels))
	require.NotNil(t, d.Spec.Replicas)
	require.Greater(t, *d.Spec.Replicas, int32(1), "a PDB over one replica blocks every drain")
	require.NotNil(t, pdbs[0].Spec.MaxUnavailable)
	require.Less(t, pdbs[0].Spec.MaxUnavailable.IntValue(), int(*d.Spec.Replicas))
}

func TestSecretExamplesAreExamplesOnly(t *testing.T) {
	for _, s := range exampleSecrets(t) {
		for k, v := range s.StringData {
			require.Contains(t, v, "EXAMPLE", "%s/%s must be obviously fake", s.Name, k)
		}
		require.Empty(t, s.Data, "use stringData so the fake values stay readable")
	}
	for _, dir := range []string{baseDir, istioDir} {
		raw, err := os.ReadFile(path.Join(dir, "kustomization.yaml"))
		require.NoError(t, err)
		var k kustomization
		require.NoError(t, yaml.UnmarshalStrict(raw, &k))
		refs := slices.Clone(k.Resources)
		for _, p := range k.Patches {
			refs = append(refs, p.Path)
		}
		for _, g := range k.ConfigMapGenerator {
			refs = append(refs, g.Files...)
		}
		for _, ref := range refs {
			require.NotContains(t, ref, ".example.", "%s must not apply the example Secrets", dir)
		}
	}
	for _, s := range objectsOf[*corev1.Secret](append(render(t, baseDir), render(t, istioDir)...)) {
		t.Errorf("the manifests create Secret %s; users create Secrets themselves", s.Name)
	}
}

func TestIstioOverlayPod(t *testing.T) {
	base := render(t, baseDir)
	objs := render(t, istioDir)
	d := deployment(t, objs)
	pod := &d.Spec.Template.Spec
	_, cfg := idemgateConfig(t, objs)
	adminPort := port(t, cfg.AdminListen)

	t.Run("no Envoy of our own: Istio injects one", func(t *testing.T) {
		for _, c := range append(slices.Clone(pod.InitContainers), pod.Containers...) {
			require.NotEqual(t, "envoy", c.Name)
		}
		for _, cm := range objectsOf[*corev1.ConfigMap](objs) {
			require.NotEqual(t, "envoy-config", cm.Name)
		}
		for _, v := range pod.Volumes {
			require.True(t, v.ConfigMap == nil || v.ConfigMap.Name != "envoy-config", "volume %s still mounts envoy-config", v.Name)
		}
		require.Equal(t, "true", d.Spec.Template.Labels["sidecar.istio.io/inject"])
	})
	t.Run("the idemgate sidecar is the base's", func(t *testing.T) {
		want := container(t, &deployment(t, base).Spec.Template.Spec, "idemgate")
		require.Equal(t, want, container(t, pod, "idemgate"))
	})
	t.Run("only idemgate's admin port bypasses the Istio proxy", func(t *testing.T) {
		ann := d.Spec.Template.Annotations
		require.Equal(t, strconv.Itoa(int(adminPort)), ann["traffic.sidecar.istio.io/excludeInboundPorts"])
		require.NotContains(t, ann, "traffic.sidecar.istio.io/includeInboundPorts")
	})
	t.Run("the app listens where Istio delivers, on the port the EnvoyFilter matches", func(t *testing.T) {
		app := container(t, pod, "app")
		host, appPort, err := envoytest.HostPort(envValue(t, app, "LISTEN_ADDR"))
		require.NoError(t, err)
		require.Equal(t, "0.0.0.0", host)
		require.Len(t, app.Ports, 1)
		require.EqualValues(t, appPort, app.Ports[0].ContainerPort)
		for _, p := range envoyFilter(t, objs).GetConfigPatches() {
			if pn := patchPort(p); pn != 0 {
				require.EqualValues(t, appPort, pn)
			}
		}
		svcs := objectsOf[*corev1.Service](objs)
		require.Len(t, svcs, 1)
		for _, p := range svcs[0].Spec.Ports {
			name, cp, ok := resolvePort(pod, p.TargetPort)
			require.True(t, ok)
			require.Equal(t, "app", name)
			require.EqualValues(t, appPort, cp.ContainerPort)
		}
		checkNetworkPolicy(t, objs, d, int32(appPort), adminPort, approvalsPort(t, objs))
	})
	t.Run("hardened", func(t *testing.T) {
		checkPodHardening(t, pod)
	})
}

// renderPieces is `idemgate envoy-config` for the idemgate.yaml mounted in
// objs, with the operation routes sent to upstreamCluster.
func renderPieces(t *testing.T, objs []object, upstreamCluster string) *envoytest.Pieces {
	t.Helper()
	raw, _ := idemgateConfig(t, objs)
	return renderPiecesOf(t, raw, upstreamCluster)
}

// renderPiecesOf is `idemgate envoy-config` for the idemgate.yaml raw.
func renderPiecesOf(t *testing.T, raw []byte, upstreamCluster string) *envoytest.Pieces {
	t.Helper()
	path := filepath.Join(t.TempDir(), "idemgate.yaml")
	require.NoError(t, os.WriteFile(path, raw, 0o600))
	s, _, err := settings.Load(path, config.Options{Offline: true})
	require.NoError(t, err)
	out, err := pieces.Render(s.Runtime, pieces.Options{ConfigPath: "k8s/base/idemgate.yaml", IdemgateAddress: "127.0.0.1:50051", UpstreamCluster: upstreamCluster})
	require.NoError(t, err)
	p, err := envoytest.DecodePieces(out)
	require.NoError(t, err)
	return p
}

// withBodyOnlyPreviews is the idemgate.yaml raw with every preview's
// fingerprint_header: false (docs/configuration.md): the config whose
// pieces ask Envoy for the response.code attribute.
func withBodyOnlyPreviews(t *testing.T, raw []byte) []byte {
	t.Helper()
	var cfg map[string]any
	require.NoError(t, yaml.Unmarshal(raw, &cfg))
	ops, _ := cfg["operations"].([]any)
	n := 0
	for _, op := range ops {
		if p, ok := op.(map[string]any)["preview"].(map[string]any); ok {
			p["fingerprint_header"] = false
			n++
		}
	}
	require.NotZero(t, n, "the config has no preview route")
	out, err := yaml.Marshal(cfg)
	require.NoError(t, err)
	return out
}
