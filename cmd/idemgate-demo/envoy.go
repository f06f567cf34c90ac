package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	jwtauthnv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/jwt_authn/v3"

	"github.com/idemgate/idemgate/e2e/demoauth"
	"github.com/idemgate/idemgate/envoy/envoytest"
)

// clusterAddress is the single endpoint of a cluster of bs, as host:port.
func clusterAddress(bs *bootstrapv3.Bootstrap, name string) (string, error) {
	sa, err := envoytest.ClusterEndpoint(bs, name)
	if err != nil {
		return "", err
	}
	return net.JoinHostPort(sa.GetAddress(), strconv.FormatUint(uint64(sa.GetPortValue()), 10)), nil
}

// frontAddrs is what the demo substitutes in envoy/envoy.yaml: where
// Envoy's listener and admin listen and where the two clusters point.
type frontAddrs struct {
	listen, admin      string
	idemgate, payments string
}

// renderBootstrap returns the shipped envoy/envoy.yaml with only the
// listener's and the admin's addresses and the idemgate and payments
// endpoints replaced (envoytest.RenderBootstrap). It also checks that the
// shipped jwt_authn provider trusts the demo's token key, without which
// every printed command would get a 401.
func renderBootstrap(shipped []byte, a frontAddrs) ([]byte, error) {
	g, err := envoytest.DecodeBootstrap(shipped)
	if err != nil {
		return nil, fmt.Errorf("failed to decode envoy/envoy.yaml: %w", err)
	}
	if err := checkDemoJWKS(g); err != nil {
		return nil, err
	}
	return envoytest.RenderBootstrap(shipped, envoytest.Edits{
		Listen: a.listen, Admin: a.admin,
		Clusters: map[string]string{envoytest.IdemgateCluster: a.idemgate, envoytest.PaymentsCluster: a.payments},
	})
}

// checkDemoJWKS makes sure a jwt_authn provider of g verifies demoauth's
// tokens with demoauth's public key (envoy.yaml inlines it as local_jwks).
func checkDemoJWKS(g *envoytest.Gateway) error {
	want, err := canonicalJSON(demoauth.JWKS())
	if err != nil {
		return err
	}
	for _, f := range g.Filters {
		jwt, ok := f.Config.(*jwtauthnv3.JwtAuthentication)
		if !ok {
			continue
		}
		for _, p := range jwt.GetProviders() {
			got, err := canonicalJSON([]byte(p.GetLocalJwks().GetInlineString()))
			if err == nil && p.GetIssuer() == demoauth.Issuer && bytes.Equal(got, want) {
				return nil
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

// envoyFront is the running Envoy, stopped and watched like the demo's
// other children.
type envoyFront struct {
	*envoytest.Envoy
	out  *lineWriter
	done chan struct{} // closed once Envoy exited and its output was copied
}

// envoyReadyTimeout bounds Envoy's start: process up, clusters initialised
// (the idemgate cluster's first health check), listener bound.
const envoyReadyTimeout = 60 * time.Second

// startEnvoy runs bin on the rendered bootstrap in w.dir and waits until its
// admin says LIVE and the listener is bound (envoytest.Start, which reads
// the listener's bound address back: it may have been asked for port 0).
// The access log (stdout) and Envoy's warnings join the demo's log on
// stderr (w.log), each line prefixed "envoy: "; the access log is flushed
// every 500 ms instead of Envoy's 10 s, so that a person sees each
// request's line as it happens.
func (w workspace) startEnvoy(ctx context.Context, bin string, bootstrap []byte) (*envoyFront, error) {
	out := &lineWriter{emit: func(line string) { w.log.writeLine("envoy: " + line) }}
	e, err := envoytest.Start(ctx, envoytest.Options{
		Bin: bin, Bootstrap: bootstrap, Dir: w.dir,
		Concurrency: 2, FlushInterval: 500 * time.Millisecond,
		Stdout: out, Stderr: out, Env: os.Environ(),
		ReadyTimeout: envoyReadyTimeout,
	})
	if err != nil {
		out.flush()
		return nil, fmt.Errorf("envoy failed to start: %w", err)
	}
	f := &envoyFront{Envoy: e, out: out, done: make(chan struct{})}
	go func() {
		<-e.Done()
		out.flush()
		close(f.done)
	}()
	return f, nil
}

func (f *envoyFront) pid() int { return f.Pid() }

// exited reports, once Envoy has exited, why, with its last lines.
func (f *envoyFront) exited() error {
	return fmt.Errorf("envoy exited (%v); its last lines:\n  %s", f.Err(), strings.ReplaceAll(f.Tail(), "\n", "\n  "))
}

// stop sends SIGTERM and waits up to grace, then kills Envoy. It returns an
// error when Envoy did not exit cleanly.
func (f *envoyFront) stop(grace time.Duration) error {
	err := f.Stop(grace)
	<-f.done
	var ee *exec.ExitError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &ee):
		return f.exited()
	}
	return fmt.Errorf("envoy: %w", err)
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
