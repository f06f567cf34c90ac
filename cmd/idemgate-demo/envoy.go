package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"time"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/access_loggers/stream/v3" // typed_config types of envoy.yaml
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/header_mutation/v3"
	jwtauthnv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/jwt_authn/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"sigs.k8s.io/yaml"

	"github.com/idemgate/idemgate/e2e/demoauth"
)

// The clusters of envoy/envoy.yaml the demo points at its own processes.
const (
	idemgateCluster = "idemgate"
	paymentsCluster = "payments"
)

// decodeBootstrap decodes envoy/envoy.yaml into the v3 types. Unknown fields
// are errors, so a field this decoder does not know cannot silently vanish
// from what the demo hands Envoy.
func decodeBootstrap(data []byte) (*bootstrapv3.Bootstrap, error) {
	js, err := yaml.YAMLToJSON(data)
	if err != nil {
		return nil, fmt.Errorf("failed to read envoy/envoy.yaml: %w", err)
	}
	var bs bootstrapv3.Bootstrap
	if err := protojson.Unmarshal(js, &bs); err != nil {
		return nil, fmt.Errorf("failed to decode envoy/envoy.yaml: %w", err)
	}
	return &bs, nil
}

// clusterAddress is the single endpoint of a cluster of bs, as host:port.
func clusterAddress(bs *bootstrapv3.Bootstrap, name string) (string, error) {
	sa, err := clusterEndpoint(bs, name)
	if err != nil {
		return "", err
	}
	return net.JoinHostPort(sa.GetAddress(), strconv.FormatUint(uint64(sa.GetPortValue()), 10)), nil
}

func clusterEndpoint(bs *bootstrapv3.Bootstrap, name string) (*corev3.SocketAddress, error) {
	for _, c := range bs.GetStaticResources().GetClusters() {
		if c.GetName() != name {
			continue
		}
		eps := c.GetLoadAssignment().GetEndpoints()
		if len(eps) != 1 || len(eps[0].GetLbEndpoints()) != 1 {
			return nil, fmt.Errorf("cluster %s of envoy/envoy.yaml should have exactly one endpoint", name)
		}
		sa := eps[0].GetLbEndpoints()[0].GetEndpoint().GetAddress().GetSocketAddress()
		if sa == nil {
			return nil, fmt.Errorf("cluster %s of envoy/envoy.yaml has no socket address", name)
		}
		return sa, nil
	}
	return nil, fmt.Errorf("envoy/envoy.yaml has no cluster %s", name)
}

// setSocketAddress points sa at hostport.
func setSocketAddress(sa *corev3.SocketAddress, hostport string) error {
	host, port, err := net.SplitHostPort(hostport)
	if err != nil {
		return fmt.Errorf("bad address %q: %w", hostport, err)
	}
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil {
		return fmt.Errorf("bad port in %q: %w", hostport, err)
	}
	sa.Address = host
	sa.PortSpecifier = &corev3.SocketAddress_PortValue{PortValue: uint32(p)}
	return nil
}

// frontAddrs is what the demo substitutes in envoy/envoy.yaml: where
// Envoy's listener and admin listen and where the two clusters point.
type frontAddrs struct {
	listen, admin      string
	idemgate, payments string
}

// renderBootstrap returns the shipped envoy/envoy.yaml with only the
// listener's and the admin's addresses and the idemgate and payments
// endpoints replaced, as JSON (which Envoy reads as YAML). It also checks
// that the shipped jwt_authn provider trusts the demo's token key, without
// which every printed command would get a 401.
func renderBootstrap(shipped []byte, a frontAddrs) ([]byte, error) {
	bs, err := decodeBootstrap(shipped)
	if err != nil {
		return nil, err
	}
	listeners := bs.GetStaticResources().GetListeners()
	if len(listeners) != 1 {
		return nil, fmt.Errorf("envoy/envoy.yaml should have one listener, has %d", len(listeners))
	}
	if err := setSocketAddress(listeners[0].GetAddress().GetSocketAddress(), a.listen); err != nil {
		return nil, fmt.Errorf("listener: %w", err)
	}
	if err := setSocketAddress(bs.GetAdmin().GetAddress().GetSocketAddress(), a.admin); err != nil {
		return nil, fmt.Errorf("admin: %w", err)
	}
	for name, addr := range map[string]string{idemgateCluster: a.idemgate, paymentsCluster: a.payments} {
		sa, err := clusterEndpoint(bs, name)
		if err != nil {
			return nil, err
		}
		if err := setSocketAddress(sa, addr); err != nil {
			return nil, fmt.Errorf("cluster %s: %w", name, err)
		}
	}
	if err := checkDemoJWKS(bs); err != nil {
		return nil, err
	}
	return protojson.Marshal(bs)
}

// checkDemoJWKS makes sure a jwt_authn provider of bs verifies demoauth's
// tokens with demoauth's public key (envoy.yaml inlines it as local_jwks).
func checkDemoJWKS(bs *bootstrapv3.Bootstrap) error {
	want, err := canonicalJSON(demoauth.JWKS())
	if err != nil {
		return err
	}
	for _, l := range bs.GetStaticResources().GetListeners() {
		for _, fc := range l.GetFilterChains() {
			for _, f := range fc.GetFilters() {
				var hcm hcmv3.HttpConnectionManager
				if !f.GetTypedConfig().MessageIs(&hcm) {
					continue
				}
				if err := f.GetTypedConfig().UnmarshalTo(&hcm); err != nil {
					return err
				}
				for _, hf := range hcm.GetHttpFilters() {
					var jwt jwtauthnv3.JwtAuthentication
					if !hf.GetTypedConfig().MessageIs(&jwt) {
						continue
					}
					if err := hf.GetTypedConfig().UnmarshalTo(&jwt); err != nil {
						return err
					}
					for _, p := range jwt.GetProviders() {
						got, err := canonicalJSON([]byte(p.GetLocalJwks().GetInlineString()))
						if err == nil && p.GetIssuer() == demoauth.Issuer && bytes.Equal(got, want) {
							return nil
						}
					}
				}
			}
		}
	}
	return fmt.Errorf("no jwt_authn provider of envoy/envoy.yaml has issuer %s with e2e/demoauth/jwks.json as local_jwks: the demo's tokens would be refused", demoauth.Issuer)
}

func canonicalJSON(b []byte) ([]byte, error) {
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		return nil, err
	}
	return json.Marshal(v)
}

// envoyFront is the running Envoy.
type envoyFront struct {
	*child
	version   string
	adminAddr string
	listen    string // the listener's address, as bound
}

// envoyReadyTimeout bounds Envoy's start: process up, clusters initialised
// (the idemgate cluster's first health check), listener bound.
const envoyReadyTimeout = 60 * time.Second

// startEnvoy runs bin on the rendered bootstrap in dir and waits until its
// admin says LIVE, then reads the listener's bound address from the admin
// (the listener may have been asked for port 0).
func startEnvoy(ctx context.Context, bin, version, dir string, bootstrap []byte, log *lockedWriter) (*envoyFront, error) {
	cfg := filepath.Join(dir, "envoy.yaml")
	if err := os.WriteFile(cfg, bootstrap, 0o600); err != nil {
		return nil, err
	}
	adminPath := filepath.Join(dir, "envoy-admin-address")
	// --disable-hot-restart: no shared memory or domain socket (keyed by
	// --base-id) that another Envoy on this machine could hold. The access
	// log (stdout) and Envoy's warnings join the demo's log on stderr; the
	// access log is flushed every 500 ms instead of Envoy's 10 s, so that a
	// person sees each request's line as it happens.
	c, err := startChild("envoy", bin, []string{
		"-c", cfg, "--disable-hot-restart", "--concurrency", "2", "--log-level", "warning",
		"--file-flush-interval-msec", "500", "--admin-address-path", adminPath,
	}, os.Environ(), log, nil)
	if err != nil {
		return nil, err
	}
	f := &envoyFront{child: c, version: version}
	if err := f.waitReady(ctx, adminPath); err != nil {
		_ = c.stop(5 * time.Second)
		return nil, err
	}
	return f, nil
}

var adminClient = &http.Client{Timeout: 2 * time.Second}

func (f *envoyFront) waitReady(ctx context.Context, adminPath string) error {
	deadline := time.Now().Add(envoyReadyTimeout)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-f.done:
			return fmt.Errorf("envoy failed to start: %w", f.exited())
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("envoy was not ready within %s", envoyReadyTimeout)
		}
		if f.adminAddr == "" {
			b, err := os.ReadFile(adminPath)
			if err != nil || len(bytes.TrimSpace(b)) == 0 {
				continue
			}
			f.adminAddr = string(bytes.TrimSpace(b))
		}
		resp, err := adminClient.Get("http://" + f.adminAddr + "/ready")
		if err != nil {
			continue
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			continue
		}
		addr, err := f.listenerAddress()
		if err != nil {
			return err
		}
		f.listen = addr
		return nil
	}
}

// listenerAddress asks the admin where the one listener is bound.
func (f *envoyFront) listenerAddress() (string, error) {
	resp, err := adminClient.Get("http://" + f.adminAddr + "/listeners?format=json")
	if err != nil {
		return "", fmt.Errorf("failed to read envoy's listeners: %w", err)
	}
	defer resp.Body.Close()
	var ls struct {
		ListenerStatuses []struct {
			Name         string `json:"name"`
			LocalAddress struct {
				SocketAddress struct {
					Address   string `json:"address"`
					PortValue uint32 `json:"port_value"`
				} `json:"socket_address"`
			} `json:"local_address"`
		} `json:"listener_statuses"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&ls); err != nil {
		return "", fmt.Errorf("failed to decode envoy's listeners: %w", err)
	}
	if len(ls.ListenerStatuses) != 1 {
		return "", fmt.Errorf("envoy reports %d listeners, want 1", len(ls.ListenerStatuses))
	}
	sa := ls.ListenerStatuses[0].LocalAddress.SocketAddress
	if sa.PortValue == 0 {
		return "", errors.New("envoy reports its listener on port 0")
	}
	return net.JoinHostPort(sa.Address, strconv.FormatUint(uint64(sa.PortValue), 10)), nil
}

// loopbackDialable turns a bound address into one a client on this machine
// can dial: an unspecified host (0.0.0.0, ::) becomes 127.0.0.1.
func loopbackDialable(addr string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return addr
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		host = "127.0.0.1"
	}
	return net.JoinHostPort(host, port)
}
