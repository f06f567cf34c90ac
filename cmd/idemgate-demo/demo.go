package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"github.com/idemgate/idemgate/envoy/envoytest"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/idemgate/idemgate/attest/verify"
	"github.com/idemgate/idemgate/e2e/payments"
	"github.com/idemgate/idemgate/envoy"
	"github.com/idemgate/idemgate/extproc/config"
)

const (
	// defaultListen is where the demo's Envoy listens by default: the port
	// of envoy/envoy.yaml's listener, on loopback only, because the demo's
	// JWT signing key is public (anyone could mint a token for it).
	defaultListen = "127.0.0.1:8080"
	// shutdownTimeout bounds each part's stop.
	shutdownTimeout = 10 * time.Second
)

// errUsage marks a command-line mistake; the usage has been printed.
var errUsage = errors.New("usage error")

const usage = `idemgate-demo — the idemgate demo (run it with ` + "`make demo`" + `).

Usage:
  idemgate-demo [--listen 127.0.0.1:8080] [--envoy PATH] [--idemgate PATH]
      Envoy (the pinned version) as the front on --listen, configured from
      envoy/envoy.yaml, in front of ` + "`idemgate serve`" + ` (memory store) and the
      demo payments API. Prints a sh script of curl commands.
  idemgate-demo --upstream-only [--listen 127.0.0.1:8081]
      Only the demo payments API (docker-compose runs it beside its Envoy).

Flags:
`

// run is the command: flags, then the whole demo or the upstream alone.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("idemgate-demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, usage)
		fs.PrintDefaults()
	}
	listen := fs.String("listen", "", "listen address (default "+defaultListen+", or with --upstream-only the payments cluster address of envoy/envoy.yaml)")
	envoyBin := fs.String("envoy", os.Getenv("ENVOY_BIN"), "the Envoy binary (default $ENVOY_BIN; `make demo` installs the pinned one and sets it)")
	idemgateBin := fs.String("idemgate", siblingBinary("idemgate"), "the idemgate binary (default: idemgate next to this program, as `make demo` builds it)")
	upstreamOnly := fs.Bool("upstream-only", false, "run only the demo payments API")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return errUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "idemgate-demo: unexpected argument %q\n", fs.Arg(0))
		return errUsage
	}
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))

	if *upstreamOnly {
		addr := *listen
		if addr == "" {
			g, err := envoytest.DecodeBootstrap(envoy.BootstrapYAML())
			if err != nil {
				return err
			}
			if addr, err = clusterAddress(g.Bootstrap, envoytest.PaymentsCluster); err != nil {
				return err
			}
		}
		return runUpstream(ctx, addr, stdout, logger)
	}
	addr := *listen
	if addr == "" {
		addr = defaultListen
	}
	if *envoyBin == "" {
		return errors.New("no Envoy: run `make demo` (it installs the pinned Envoy), or pass --envoy PATH or set ENVOY_BIN")
	}
	if *idemgateBin == "" {
		return errors.New("no idemgate binary: run `make demo` (it builds bin/idemgate), or pass --idemgate PATH")
	}
	return runDemo(ctx, demoOptions{listen: addr, envoyBin: *envoyBin, idemgateBin: *idemgateBin}, stdout, stderr, logger)
}

// siblingBinary is name in this program's directory, if it exists there.
func siblingBinary(name string) string {
	self, err := os.Executable()
	if err != nil {
		return ""
	}
	p := filepath.Join(filepath.Dir(self), name)
	if _, err := os.Stat(p); err != nil {
		return ""
	}
	return p
}

// checkListen fails early, with advice, when addr is taken: Envoy would
// only log a bind error after everything else had started.
func checkListen(addr string) error {
	lis, err := net.Listen("tcp", addr)
	if errors.Is(err, syscall.EADDRINUSE) {
		return fmt.Errorf("failed to listen on %s (--listen): the address is already in use; "+
			"stop what holds it (an earlier demo?) or pick another address, e.g. --listen 127.0.0.1:8090", addr)
	}
	if err != nil {
		return fmt.Errorf("failed to listen on %s (--listen): %w", addr, err)
	}
	return lis.Close()
}

// paymentsAPI serves the demo payments upstream on lis until stop.
type paymentsAPI struct {
	srv  *http.Server
	errs chan error
	url  string
}

// servePayments serves the payments API; with attestation keys (the demo
// with idemgate in front) its confirms need idemgate's attestation.
func servePayments(lis net.Listener, logger *slog.Logger, attestation *config.AttestationSettings) (*paymentsAPI, error) {
	var h http.Handler = payments.New(payments.Options{Logger: logger})
	if attestation != nil {
		keys, err := verify.ParseJWKS(attestation.Signer.JWKS())
		if err != nil {
			return nil, err
		}
		if h, err = payments.Attested(h, keys, logger); err != nil {
			return nil, err
		}
	}
	p := &paymentsAPI{
		srv: &http.Server{
			Handler:           h,
			ReadHeaderTimeout: 10 * time.Second,
			ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelDebug),
		},
		errs: make(chan error, 1),
		url:  "http://" + lis.Addr().String(),
	}
	go func() {
		if err := p.srv.Serve(lis); !errors.Is(err, http.ErrServerClosed) {
			p.errs <- fmt.Errorf("payments API stopped: %w", err)
		}
	}()
	return p, nil
}

func (p *paymentsAPI) stop() error {
	ctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
	defer cancel()
	if err := p.srv.Shutdown(ctx); err != nil {
		return errors.Join(fmt.Errorf("failed to stop the payments API: %w", err), p.srv.Close())
	}
	return nil
}

// runUpstream serves the payments API alone until ctx ends.
func runUpstream(ctx context.Context, addr string, stdout io.Writer, logger *slog.Logger) error {
	if err := checkListen(addr); err != nil {
		return err
	}
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("failed to listen on %s (--listen): %w", addr, err)
	}
	p, err := servePayments(lis, logger, nil)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "demo payments API listening on %s (counters: GET /_admin/stats)\n", p.url)
	var runErr error
	select {
	case <-ctx.Done():
	case runErr = <-p.errs:
	}
	if err := p.stop(); err != nil && runErr == nil {
		runErr = err
	}
	logger.Info("demo payments API stopped")
	return runErr
}

type demoOptions struct {
	listen, envoyBin, idemgateBin string
}

// runDemo starts the payments API (in this process), idemgate and Envoy
// (child processes), in that order, each one's address known before the
// next needs it; prints the script; and on ctx's end stops them front
// first, so that no request reaches idemgate or the upstream once stopping
// begins.
func runDemo(ctx context.Context, o demoOptions, stdout, stderr io.Writer, logger *slog.Logger) (err error) {
	if err := checkListen(o.listen); err != nil {
		return err
	}
	version, err := envoytest.EnvoyVersion(o.envoyBin)
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "idemgate-demo-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	ws := workspace{dir: dir, log: &lockedWriter{w: stderr}}
	approvers, err := newApproverKey()
	if err != nil {
		return err
	}
	approversJWKS := filepath.Join(dir, "approvers.jwks")
	if err := os.WriteFile(approversJWKS, approvers.jwks(), 0o600); err != nil {
		return err
	}
	cfg, demoSettings, warns, key, keySource, err := demoConfig(os.LookupEnv, approversJWKS)
	if err != nil {
		return err
	}
	for _, w := range warns {
		logger.Warn("config warning", "problem", w.Error())
	}

	// Everything started is stopped on the way out, in reverse: the front,
	// then idemgate, then the upstream.
	var stops []func() error
	defer func() {
		logger.Info("demo stopping")
		for i := len(stops) - 1; i >= 0; i-- {
			if e := stops[i](); e != nil && err == nil {
				err = e
			}
		}
		logger.Info("demo stopped")
	}()

	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return fmt.Errorf("failed to listen on a loopback port for the payments API: %w", err)
	}
	pay, err := servePayments(lis, logger, demoSettings.Runtime.Attestation)
	if err != nil {
		return err
	}
	stops = append(stops, pay.stop)

	idem, err := ws.startIdemgate(ctx, o.idemgateBin, cfg, key)
	if err != nil {
		return err
	}
	stops = append(stops, func() error { return idem.stop(shutdownTimeout) })
	logger.Info("idemgate started", "pid", idem.pid(), "grpc", idem.grpcAddr, "admin", idem.adminAddr, "approvals", idem.approvalAddr)

	bootstrap, err := renderBootstrap(envoy.BootstrapYAML(), frontAddrs{
		listen: o.listen, admin: "127.0.0.1:0", idemgate: idem.grpcAddr, payments: lis.Addr().String(),
	})
	if err != nil {
		return err
	}
	front, err := ws.startEnvoy(ctx, o.envoyBin, bootstrap)
	if err != nil {
		return err
	}
	stops = append(stops, func() error { return front.stop(shutdownTimeout) })
	logger.Info("envoy started", "pid", front.pid(), "version", version, "listener", front.ListenAddr, "admin", front.AdminAddr)

	script, err := demoScript(scriptInfo{
		rt: demoSettings.Runtime, keySource: keySource,
		envoyVersion: version, envoyBin: o.envoyBin,
		frontURL: "http://" + loopbackDialable(front.ListenAddr), envoyAdminURL: "http://" + front.AdminAddr,
		grpcAddr: idem.grpcAddr, idemgateAdmin: idem.adminAddr,
		paymentsURL: pay.url, approvalsURL: "http://" + idem.approvalAddr, approvers: approvers,
	}, time.Now())
	if err != nil {
		return err
	}
	// One write, so a reader never sees half of it.
	if _, err := io.WriteString(stdout, script); err != nil {
		return fmt.Errorf("failed to print the demo commands: %w", err)
	}
	logger.Info("demo ready: paste the commands printed on stdout into another shell", "front", "http://"+loopbackDialable(front.ListenAddr))

	select {
	case <-ctx.Done():
		return nil
	case <-front.done:
		return fmt.Errorf("the front stopped: %w", front.exited())
	case <-idem.done:
		return fmt.Errorf("idemgate stopped: %w", idem.exited())
	case err := <-pay.errs:
		return err
	}
}
