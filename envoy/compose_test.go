package envoy

import (
	"bufio"
	"bytes"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"sigs.k8s.io/yaml"

	"github.com/idemgate/idemgate/envoy/envoytest"
)

// No Docker engine runs here, so these tests check what docker-compose.yaml and
// the Dockerfile reference: files, ports, paths and variables must agree with
// envoy.yaml and idemgate.yaml.

// compose is the part of the Compose file format we use. Unknown keys are
// rejected so that a typo cannot silently drop a setting these tests rely on.
type compose struct {
	Name     string                    `json:"name"`
	Services map[string]composeService `json:"services"`
	Volumes  map[string]any            `json:"volumes"`
}

type composeService struct {
	Image string `json:"image"`
	Build *struct {
		Context    string `json:"context"`
		Dockerfile string `json:"dockerfile"`
		Target     string `json:"target"`
	} `json:"build"`
	Command     []string                  `json:"command"`
	Environment map[string]string         `json:"environment"`
	Volumes     []string                  `json:"volumes"`
	Ports       []string                  `json:"ports"`
	NetworkMode string                    `json:"network_mode"`
	DependsOn   map[string]map[string]any `json:"depends_on"`
	Restart     string                    `json:"restart"`
	Healthcheck map[string]any            `json:"healthcheck"`
}

func loadCompose(t *testing.T) compose {
	t.Helper()
	var c compose
	require.NoError(t, yaml.UnmarshalStrict(readFile(t, "../docker-compose.yaml"), &c))
	return c
}

// mountSource returns the host path mounted at target, if any.
func mountSource(s composeService, target string) (string, bool) {
	for _, v := range s.Volumes {
		parts := strings.Split(v, ":")
		if len(parts) >= 2 && parts[1] == target {
			return parts[0], true
		}
	}
	return "", false
}

// flagValue returns the argument after flag in args.
func flagValue(args []string, flag string) string {
	i := slices.Index(args, flag)
	if i < 0 || i+1 >= len(args) {
		return ""
	}
	return args[i+1]
}

func TestComposeEnvoy(t *testing.T) {
	c := loadCompose(t)
	g, ic := loadDemo(t)
	envoy, ok := c.Services["envoy"]
	require.True(t, ok)

	pin, err := envoytest.PinnedVersion()
	require.NoError(t, err)
	require.Equal(t, "envoyproxy/envoy:v"+pin, envoy.Image, "the release .envoy-version pins, which the tests validate with")
	cfg := flagValue(envoy.Command, "-c")
	src, ok := mountSource(envoy, cfg)
	require.True(t, ok, "the -c path %s is not mounted", cfg)
	require.Equal(t, "./envoy/envoy.yaml", src)
	require.FileExists(t, filepath.Join("..", src))

	_, adminPort, err := envoytest.HostPort(ic.AdminListen)
	require.NoError(t, err)
	require.ElementsMatch(t, []string{
		publish("", g.ListenerPort()),
		publish("127.0.0.1", adminPort), // idemgate admin lives in Envoy's namespace
	}, envoy.Ports, "publish Envoy's listener and idemgate's admin port (host loopback), nothing else")
}

// publish is a Compose port mapping of port to the same port on the host.
func publish(hostIP string, port uint32) string {
	p := strconv.FormatUint(uint64(port), 10)
	if hostIP != "" {
		return hostIP + ":" + p + ":" + p
	}
	return p + ":" + p
}

func TestComposeIdemgate(t *testing.T) {
	c := loadCompose(t)
	g, ic := loadDemo(t)
	svc, ok := c.Services["idemgate"]
	require.True(t, ok)

	t.Run("built from the repository Dockerfile", func(t *testing.T) {
		require.NotNil(t, svc.Build)
		require.FileExists(t, filepath.Join("..", svc.Build.Context, svc.Build.Dockerfile))
	})
	t.Run("serves envoy/idemgate.yaml", func(t *testing.T) {
		require.Equal(t, "serve", svc.Command[0])
		cfg := flagValue(svc.Command, "--config")
		src, ok := mountSource(svc, cfg)
		require.True(t, ok, "--config %s is not mounted", cfg)
		require.Equal(t, "./envoy/idemgate.yaml", src)
	})
	t.Run("shares Envoy's network namespace, where envoy.yaml looks for it", func(t *testing.T) {
		host, _, err := g.ClusterAddress("idemgate")
		require.NoError(t, err)
		require.Equal(t, "127.0.0.1", host)
		require.Equal(t, "service:envoy", svc.NetworkMode)
		grpcHost, _, err := envoytest.HostPort(ic.GRPCListen)
		require.NoError(t, err)
		require.Equal(t, "127.0.0.1", grpcHost, "gRPC stays on loopback")
	})
	t.Run("every variable idemgate.yaml reads is set", func(t *testing.T) {
		for _, name := range secretEnvNames(ic) {
			require.Contains(t, svc.Environment, name)
			require.NotEmpty(t, svc.Environment[name])
		}
	})
	t.Run("stores are compose services, up before idemgate", func(t *testing.T) {
		require.NotNil(t, ic.Store.Redis)
		for _, addr := range ic.Store.Redis.Addrs {
			host, port, err := envoytest.HostPort(addr)
			require.NoError(t, err)
			require.Contains(t, c.Services, host)
			require.EqualValues(t, 6379, port)
			require.Equal(t, "service_healthy", svc.DependsOn[host]["condition"])
		}
		require.NotNil(t, ic.Store.Postgres)
		dsn, err := url.Parse(svc.Environment[ic.Store.Postgres.DSNEnv])
		require.NoError(t, err)
		pg, ok := c.Services[dsn.Hostname()]
		require.True(t, ok, "DSN host %s is not a service", dsn.Hostname())
		require.Equal(t, "5432", dsn.Port())
		pass, _ := dsn.User.Password()
		require.Equal(t, pg.Environment["POSTGRES_USER"], dsn.User.Username())
		require.Equal(t, pg.Environment["POSTGRES_PASSWORD"], pass)
		require.Equal(t, "/"+pg.Environment["POSTGRES_DB"], dsn.Path)
		require.Equal(t, "service_healthy", svc.DependsOn[dsn.Hostname()]["condition"])
	})
}

// secretEnvNames lists the environment variables an idemgate config reads.
func secretEnvNames(c *envoytest.IdemgateConfig) []string {
	var out []string
	for _, k := range c.Signing.Keys {
		if k.Env != "" {
			out = append(out, k.Env)
		}
	}
	if r := c.Store.Redis; r != nil && r.PasswordEnv != "" {
		out = append(out, r.PasswordEnv)
	}
	if p := c.Store.Postgres; p != nil && p.DSNEnv != "" {
		out = append(out, p.DSNEnv)
	}
	return out
}

func TestComposePayments(t *testing.T) {
	c := loadCompose(t)
	g, _ := loadDemo(t)
	svc, ok := c.Services["payments"]
	require.True(t, ok)
	host, _, err := g.ClusterAddress("payments")
	require.NoError(t, err)
	require.Equal(t, "127.0.0.1", host)
	require.Equal(t, "service:envoy", svc.NetworkMode, "envoy.yaml reaches payments on loopback")
	// The demo upstream is the demo command, built from the Dockerfile's demo
	// stage: not the idemgate image, which carries no demo code.
	require.NotNil(t, svc.Build)
	require.Equal(t, "demo", svc.Build.Target)
	require.NotEqual(t, c.Services["idemgate"].Image, svc.Image)
	require.Empty(t, c.Services["idemgate"].Build.Target, "idemgate is the Dockerfile's default (last) stage")
	require.NotEmpty(t, svc.Command)
}

// dockerfile is a Dockerfile split into instructions (continuations joined).
func dockerfile(t *testing.T) []string {
	t.Helper()
	var out []string
	var cur strings.Builder
	sc := bufio.NewScanner(bytes.NewReader(readFile(t, "../Dockerfile")))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if cont, ok := strings.CutSuffix(line, `\`); ok {
			cur.WriteString(cont + " ")
			continue
		}
		cur.WriteString(line)
		out = append(out, cur.String())
		cur.Reset()
	}
	require.NoError(t, sc.Err())
	return out
}

func TestDockerfile(t *testing.T) {
	ins := dockerfile(t)
	var froms []string
	for _, in := range ins {
		if strings.HasPrefix(in, "FROM ") {
			froms = append(froms, in)
		}
	}
	require.Len(t, froms, 4, "multi-stage: build, the demo's build and image, then idemgate's image")
	require.Regexp(t, `^FROM (--platform=\S+ )?golang:1\.26\S* AS build$`, froms[0])
	require.Equal(t, "FROM build AS build-demo", froms[1])
	require.Equal(t, "FROM gcr.io/distroless/static-debian12:nonroot AS demo", froms[2])
	// The last stage is what `docker build` without --target produces.
	require.Equal(t, "FROM gcr.io/distroless/static-debian12:nonroot", froms[3])

	build := slices.IndexFunc(ins, func(s string) bool { return strings.Contains(s, "go build") })
	require.GreaterOrEqual(t, build, 0)
	require.Contains(t, ins[build], "CGO_ENABLED=0")
	require.Regexp(t, `\./cmd/idemgate$`, ins[build])
	require.DirExists(t, "../cmd/idemgate")

	last := ins[slices.Index(ins, froms[3]):]
	require.NotContains(t, strings.Join(last, "\n"), "demo", "the idemgate image carries no demo code")
	require.Contains(t, last, "USER 65532:65532")
	require.Contains(t, last, `ENTRYPOINT ["/usr/local/bin/idemgate"]`)
	require.Contains(t, last, `COPY --from=build /out/idemgate /usr/local/bin/idemgate`)
	require.Contains(t, last, `CMD ["serve", "--config", "/etc/idemgate/idemgate.yaml"]`)

	demoBuild := slices.IndexFunc(ins, func(s string) bool { return strings.Contains(s, "go build") && strings.Contains(s, "idemgate-demo") })
	require.Greater(t, demoBuild, slices.Index(ins, froms[1]))
	require.Less(t, demoBuild, slices.Index(ins, froms[2]))
	require.Regexp(t, `\./cmd/idemgate-demo$`, ins[demoBuild])
	demo := ins[slices.Index(ins, froms[2]):slices.Index(ins, froms[3])]
	require.Contains(t, demo, "USER 65532:65532")
	require.Contains(t, demo, `ENTRYPOINT ["/usr/local/bin/idemgate-demo"]`)

	// The default config path is where docker-compose mounts envoy/idemgate.yaml.
	svc := loadCompose(t).Services["idemgate"]
	_, ok := mountSource(svc, "/etc/idemgate/idemgate.yaml")
	require.True(t, ok)
}

func TestDockerignoreKeepsTheBuildInputs(t *testing.T) {
	f, err := os.ReadFile("../.dockerignore")
	require.NoError(t, err)
	needed := regexp.MustCompile(`^(go\.mod|go\.sum|cmd|extproc|fingerprint|state|internal|e2e|envoy)(/.*)?$|^\*+$|^\*\*?/\*\.go$`)
	for _, line := range strings.Split(string(f), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		require.NotRegexp(t, needed, line, ".dockerignore must not exclude what go build ./cmd/idemgate needs")
	}
}
