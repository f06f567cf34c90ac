package stack

import (
	"bufio"
	"encoding/base64"
	"encoding/json"
	"github.com/idemgate/idemgate/cmd/idemgate/settings"
	"github.com/idemgate/idemgate/envoy/envoytest"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/encoding/protojson"
	"sigs.k8s.io/yaml"

	"github.com/idemgate/idemgate/envoy"
	"github.com/idemgate/idemgate/extproc/config"
)

func decodeYAML(t *testing.T, b []byte) map[string]any {
	t.Helper()
	m := map[string]any{}
	require.NoError(t, yaml.Unmarshal(b, &m))
	return m
}

// TestIdemgateConfigIsTheShippedOne: the derived idemgate.yaml differs from
// envoy/idemgate.yaml only where the stack says it does, and idemgate's own
// config loader accepts it.
func TestIdemgateConfigIsTheShippedOne(t *testing.T) {
	c := idemgateConfig{
		grpcAddr: "127.0.0.1:1001", adminAddr: "127.0.0.1:1002", redisAddr: "127.0.0.1:1003",
		fingerprintTTL: 3 * time.Second, inFlightTTL: 2 * time.Second, ignoreKeys: true, upstreamTimeout: time.Second,
	}
	out, err := c.render()
	require.NoError(t, err)
	got, want := decodeYAML(t, out), decodeYAML(t, envoy.IdemgateYAML())

	// Undo the intended differences; what remains must be equal.
	for _, m := range []map[string]any{got, want} {
		delete(m, "grpc_listen")
		delete(m, "admin_listen")
		delete(m, "log")
		delete(m, "drain")
		store := m["store"].(map[string]any)
		delete(store, "timeout")
		delete(store["redis"].(map[string]any), "addrs")
		delete(store["redis"].(map[string]any), "timeout")
		ttl := m["ttl"].(map[string]any)
		delete(ttl, "fingerprint")
		delete(ttl, "in_flight")
		for i, o := range m["operations"].([]any) {
			op := o.(map[string]any)
			delete(op, "downstream_idempotency_header")
			if i == 0 { // the HTTP operation; the MCP one keeps its own
				delete(op, "upstream_timeout")
			}
		}
	}
	require.Equal(t, want, got)

	key := base64.StdEncoding.EncodeToString(make([]byte, 32))
	cfg, _, err := settings.Parse("derived.yaml", out, t.TempDir(), config.Options{LookupEnv: func(name string) (string, bool) {
		switch name {
		case signingKeyEnv:
			return key, true
		case postgresDSNEnv:
			return "postgres://postgres@127.0.0.1:5432/x?sslmode=disable", true
		}
		return "", false
	}})
	require.NoError(t, err)
	rt := cfg.Runtime
	require.Equal(t, "127.0.0.1:1001", cfg.GRPCListen)
	require.Equal(t, "127.0.0.1:1002", cfg.AdminListen)
	require.Equal(t, []string{"127.0.0.1:1003"}, cfg.Store.Redis.Addrs)
	require.Equal(t, "tiered", cfg.Store.Backend())
	require.Equal(t, storeTimeout, rt.Store.Timeout)
	require.Equal(t, config.TTLSettings{Fingerprint: 3 * time.Second, InFlight: 2 * time.Second, Terminal: 72 * time.Hour}, rt.TTL)
	require.Len(t, rt.Operations, 2, "the HTTP operation and the MCP one")
	require.False(t, rt.Operations[0].HonoursKeys())
	require.False(t, rt.Operations[1].HonoursKeys())
	require.Equal(t, "text", cfg.Log.Format)

	// Without options only addresses, logs, drain and deadlines change.
	out, err = idemgateConfig{grpcAddr: "127.0.0.1:1", adminAddr: "127.0.0.1:2", redisAddr: "127.0.0.1:3"}.render()
	require.NoError(t, err)
	m := decodeYAML(t, out)
	require.Equal(t, decodeYAML(t, envoy.IdemgateYAML())["ttl"], m["ttl"])
	require.Equal(t, "Idempotency-Key", m["operations"].([]any)[0].(map[string]any)["downstream_idempotency_header"])
}

// TestBootstrapEdits: the edited envoy.yaml points the listener, the admin
// port and both clusters at the given addresses, changes only the confirm
// route's timeout and ext_proc's message_timeout, and the pinned Envoy
// accepts it (--mode validate) as it accepts the shipped file.
func TestBootstrapEdits(t *testing.T) {
	out, err := renderBootstrap(bootstrapEdits{
		listenAddr: "127.0.0.1:2001", adminAddr: "127.0.0.1:2002",
		clusters:            map[string]string{"idemgate": "127.0.0.1:2003", "payments": "127.0.0.1:2004"},
		confirmRouteTimeout: 1500 * time.Millisecond,
		messageTimeout:      8 * time.Second,
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
		"transfer_status": 5 * time.Second, "catch_all": 15 * time.Second, "mcp": 30 * time.Second,
	}, timeouts)
	var found bool
	for _, f := range h.GetHttpFilters() {
		if f.GetName() != extProcFilterName {
			continue
		}
		var ep extprocv3.ExternalProcessor
		require.NoError(t, f.GetTypedConfig().UnmarshalTo(&ep))
		require.Equal(t, 8*time.Second, ep.GetMessageTimeout().AsDuration())
		require.False(t, ep.GetFailureModeAllow(), "never fail open")
		found = true
	}
	require.True(t, found)

	// The retry and path edits, for the tests that need them.
	edited, err := renderBootstrap(bootstrapEdits{confirmRetryOn: "connect-failure", rawPaths: true})
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
		if r.GetName() == confirmRouteName {
			require.Equal(t, "connect-failure", r.GetRoute().GetRetryPolicy().GetRetryOn())
		}
	}

	// Envoy itself accepts the edited file (and the unedited one).
	requireEnvoyValidates(t, out)
	out, err = renderBootstrap(bootstrapEdits{})
	require.NoError(t, err)
	requireEnvoyValidates(t, out)

	_, err = renderBootstrap(bootstrapEdits{clusters: map[string]string{"nope": "127.0.0.1:1"}})
	require.ErrorContains(t, err, `no cluster "nope"`)
}

// requireEnvoyValidates runs `envoy --mode validate` on bootstrap. No Envoy
// is a failure (FindEnvoy says how to install it), never a skip.
func requireEnvoyValidates(t *testing.T, bootstrap []byte) {
	t.Helper()
	bin, err := envoytest.FindEnvoy()
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), "envoy.yaml")
	require.NoError(t, os.WriteFile(path, bootstrap, 0o600))
	out, err := exec.Command(bin, "--mode", "validate", "-c", path, "--disable-hot-restart", "--log-level", "warning").CombinedOutput()
	require.NoError(t, err, "envoy --mode validate refused the bootstrap:\n%s", out)
}

// TestAccessLogRequestID reads x-request-id from a line in Envoy's default
// access log format.
func TestAccessLogRequestID(t *testing.T) {
	line := `[2026-01-02T03:04:05.678Z] "POST /v1/transfers/confirm HTTP/1.1" 409 - 120 380 3 - "127.0.0.1" "idemgate-e2e/17" "5c1f0a7e-8d2b-4a8e-9a57-3b0c1f1e2d3c" "127.0.0.1:8080" "-"` + "\n" +
		`[2026-01-02T03:04:05.679Z] "POST /v1/transfers/confirm HTTP/1.1" 200 - 120 380 3 2 "127.0.0.1" "idemgate-e2e/171" "00000000-0000-0000-0000-000000000171" "127.0.0.1:8080" "127.0.0.1:8081"` + "\n"
	m := accessLogRequestID("idemgate-e2e/17").FindStringSubmatch(line)
	require.NotNil(t, m)
	require.Equal(t, "5c1f0a7e-8d2b-4a8e-9a57-3b0c1f1e2d3c", m[1])
	m = accessLogRequestID("idemgate-e2e/171").FindStringSubmatch(line)
	require.Equal(t, "00000000-0000-0000-0000-000000000171", m[1])
}

// TestTCPProxyCutAndRestore: the proxy forwards, a cut resets open
// connections and refuses new ones, a restore forwards again.
func TestTCPProxyCutAndRestore(t *testing.T) {
	echo, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer echo.Close()
	go func() {
		for {
			c, err := echo.Accept()
			if err != nil {
				return
			}
			go func() { _, _ = io.Copy(c, c); c.Close() }()
		}
	}()
	p, err := StartTCPProxy(echo.Addr().String())
	require.NoError(t, err)
	defer p.Close()

	roundTrip := func(c net.Conn) error {
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Write([]byte("ping\n")); err != nil {
			return err
		}
		line, err := bufio.NewReader(c).ReadString('\n')
		if err == nil && line != "ping\n" {
			t.Fatalf("echo answered %q", line)
		}
		return err
	}
	open, err := net.Dial("tcp", p.Addr())
	require.NoError(t, err)
	defer open.Close()
	require.NoError(t, roundTrip(open))

	p.Cut()
	require.Error(t, roundTrip(open), "an open connection is reset by the cut")
	c, err := net.Dial("tcp", p.Addr())
	if err == nil {
		require.Error(t, roundTrip(c), "a new connection is closed at once while cut")
		c.Close()
	}

	p.Restore()
	c, err = net.Dial("tcp", p.Addr())
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, roundTrip(c))
}

// TestProxiedDSN rewrites only the host and port.
func TestProxiedDSN(t *testing.T) {
	var target string
	out, err := proxiedDSN("postgres://postgres@127.0.0.1:5432/idemgate_test_1?sslmode=disable", func(t string) (string, error) {
		target = t
		return "127.0.0.1:6000", nil
	})
	require.NoError(t, err)
	require.Equal(t, "127.0.0.1:5432", target)
	require.Equal(t, "postgres://postgres@127.0.0.1:6000/idemgate_test_1?sslmode=disable", out)
}

// TestDecodeFingerprint reads the payload of a token without its MAC.
func TestDecodeFingerprint(t *testing.T) {
	payload, err := json.Marshal(map[string]any{"v": 1, "k": "k1", "n": "0123456789abcdef0123456789abcdef", "exp": 1753500000, "s": "payments.transfer"})
	require.NoError(t, err)
	fp := base64.RawURLEncoding.EncodeToString(payload) + ".c2ln"
	p, err := DecodeFingerprint(fp)
	require.NoError(t, err)
	require.Equal(t, FingerprintPayload{Version: 1, KeyID: "k1", Nonce: "0123456789abcdef0123456789abcdef", Exp: 1753500000, Scope: "payments.transfer"}, p)

	_, err = DecodeFingerprint("no-dot")
	require.Error(t, err)
	_, err = DecodeFingerprint("!!!.x")
	require.Error(t, err)
}
