package stack

import (
	"bufio"
	"encoding/base64"
	"encoding/json"
	"io"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"sigs.k8s.io/yaml"

	"github.com/idemgate/idemgate/cmd/idemgate/settings"
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
	require.Equal(t, config.TTLSettings{Fingerprint: 3 * time.Second, InFlight: 2 * time.Second, Terminal: 72 * time.Hour, ReplayCache: time.Hour}, rt.TTL)
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
