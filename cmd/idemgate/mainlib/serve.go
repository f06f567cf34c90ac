package mainlib

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/idemgate/idemgate/cmd/idemgate/census"
	"github.com/idemgate/idemgate/cmd/idemgate/listen"
	"github.com/idemgate/idemgate/cmd/idemgate/settings"
	"github.com/idemgate/idemgate/extproc"
	"github.com/idemgate/idemgate/extproc/approvalapi"
	"github.com/idemgate/idemgate/extproc/approvalnotify"
	"github.com/idemgate/idemgate/extproc/config"
	"github.com/idemgate/idemgate/extproc/security"
	"github.com/idemgate/idemgate/state"
)

// serve runs the ext_proc server until ctx is cancelled, then drains:
// NOT_SERVING (and /readyz failing) for drain.period while streams are still
// accepted, then GracefulStop bounded by drain.timeout, then Stop.
func serve(ctx context.Context, args []string, stderr io.Writer) error {
	fs := newFlagSet("serve", stderr)
	path := fs.String("config", "", "config file")
	grpcListen := fs.String("grpc-listen", "", "override grpc_listen (e.g. 127.0.0.1:0)")
	adminListen := fs.String("admin-listen", "", "override admin_listen (e.g. 127.0.0.1:0)")
	withPprof := fs.Bool("pprof", false, "also serve Go's profiler (net/http/pprof) under /debug/pprof/ on the admin listener; "+
		"for profiling sessions only: it exposes process internals, keep the admin port private")
	if _, err := parseFlags(fs, args); err != nil {
		return err
	}
	if *path == "" {
		fmt.Fprintln(stderr, "serve: --config is required")
		return ErrUsage
	}
	cfg, warns, err := settings.Load(*path, config.Options{})
	if err != nil {
		var p *config.Problem
		if errors.As(err, &p) {
			return problemsError(*path, err)
		}
		return err
	}
	if *grpcListen != "" {
		// The override obeys the file's rule (docs/design.md §12): a flag
		// must not open the ext_proc listener to the network unnoticed.
		if err := settings.ListenRule(settings.GRPC, *grpcListen, cfg.GRPCTLS != nil, cfg.GRPCPlaintextRemote); err != nil {
			return fmt.Errorf("serve: --grpc-listen: %w", err)
		}
		cfg.GRPCListen = *grpcListen
	}
	if *adminListen != "" {
		cfg.AdminListen = *adminListen
	}
	if *withPprof && !settings.IsLoopback(cfg.AdminListen) {
		return fmt.Errorf("serve: --pprof needs a loopback admin_listen (127.0.0.1:port), not %q: the profiler exposes process internals, "+
			"the rest of the admin listener only public data", cfg.AdminListen)
	}
	logger := newLogger(stderr, cfg.Log)
	for _, w := range warns {
		logger.Warn("config warning", "problem", w.Error())
	}
	if *withPprof {
		logger.Warn("profiler enabled: /debug/pprof/ is served on the admin listener", "admin", cfg.AdminListen)
	}
	return run(ctx, cfg, logger, stderr, adminOptions{pprof: *withPprof})
}

// adminOptions are what the admin server serves besides /metrics, /healthz
// and /readyz.
type adminOptions struct {
	// pprof serves net/http/pprof under /debug/pprof/ (serve --pprof). It is
	// a command-line switch rather than a config key on purpose: profiling
	// is something an operator turns on for a session, not a property of a
	// deployment's config.
	pprof bool
}

// run serves a compiled config on the addresses it names.
func run(ctx context.Context, cfg *settings.Settings, logger *slog.Logger, stderr io.Writer, admin adminOptions) error {
	grpcLis, err := listen.Open(cfg.GRPCListen)
	if err != nil {
		return fmt.Errorf("failed to listen on grpc_listen %s: %w", cfg.GRPCListen, err)
	}
	adminLis, err := net.Listen("tcp", cfg.AdminListen)
	if err != nil {
		grpcLis.Close()
		return fmt.Errorf("failed to listen on admin_listen %s: %w", cfg.AdminListen, err)
	}
	return runOn(ctx, cfg, logger, serving{
		grpc: grpcLis, admin: adminLis, adminOpts: admin,
		// One plain line, whatever the log format, for harnesses to wait on.
		onReady: func() { fmt.Fprintln(stderr, "ready") },
	})
}

// serving is what runOn serves a config on, besides the config itself.
type serving struct {
	// grpc and admin are the listeners, already open; runOn closes them.
	grpc, admin net.Listener
	// adminOpts is what the admin server serves besides the usual endpoints.
	adminOpts adminOptions
	// onReady is called once both listeners are being served.
	onReady func()
}

// runOn serves a compiled config on on's listeners until ctx is cancelled,
// then drains.
func runOn(ctx context.Context, cfg *settings.Settings, logger *slog.Logger, on serving) error {
	grpcLis, adminLis := on.grpc, on.admin
	// Serve and Shutdown close them too; this covers the early returns.
	defer grpcLis.Close()
	defer adminLis.Close()

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	metrics := extproc.NewMetrics(reg)
	listenMetrics := listen.NewMetrics(reg)
	warnPlaintextRemote(cfg, listenMetrics, logger)

	rt := cfg.Runtime
	if cfg.Store.Backend() == "memory" {
		logger.Warn("RUNNING ON THE EMBEDDED MEMORY STORE: idempotency records live in this process only and are lost on restart; " +
			"several replicas do not share them. Configure store.redis and store.postgres for production.")
	}
	bg, stopBackground := context.WithCancel(context.WithoutCancel(ctx))
	defer stopBackground()
	tracer, stopTracing, err := startTracing(bg, cfg.Tracing)
	if err != nil {
		return err
	}
	defer flushTraces(stopTracing, logger)
	ss, err := openStore(bg, cfg.Store, approvalLapsed(metrics, tracer), metrics, logger)
	if err != nil {
		return err
	}
	defer ss.store.Close()

	reporter := security.New(logger, metrics.SecurityCounters(), security.WebhookOptions{
		URL: rt.Webhook.URL, Timeout: rt.Webhook.Timeout, QueueSize: rt.Webhook.QueueSize,
	})
	defer reporter.Close()
	store := ss.store
	if tracer != nil {
		store = state.Trace(store, ss.backend, tracer)
	}
	var notifier extproc.ApprovalNotifier
	if ss.approvals != nil && notifies(rt) {
		n := approvalnotify.New(approvalnotify.Options{Approvals: ss.approvals, Logger: logger})
		defer n.Close()
		notifier = n
	}
	srv, err := extproc.NewServer(extproc.Options{Config: rt, Store: store, Approvals: ss.approvals, Notifier: notifier, Logger: logger, Metrics: metrics, Security: reporter, Tracer: tracer})
	if err != nil {
		return err
	}
	grpcCreds, err := grpcCredentials(bg, cfg, reporter, listenMetrics, logger)
	if err != nil {
		return err
	}
	hs := health.NewServer()
	extproc.SetServing(hs, true)
	gs := extproc.NewGRPCServer(srv, hs, grpcCreds...)

	ready := &readiness{}
	ready.set(false, "starting")
	go ready.watch(bg, ss, metrics, logger)
	go sweep(bg, ss.store, logger)
	if ss.pg != nil {
		go census.Run(bg, ss.pg.Census, census.NewMetrics(reg), census.Every, logger)
	}

	admin := &http.Server{Handler: withJWKS(adminHandler(reg, hs, ready, ss.backend, on.adminOpts), rt.Attestation), ReadHeaderTimeout: 5 * time.Second}
	errs := make(chan error, 3)
	go func() {
		if err := gs.Serve(grpcLis); err != nil {
			errs <- fmt.Errorf("grpc server stopped: %w", err)
		}
	}()
	go func() {
		if err := admin.Serve(adminLis); err != nil && !errors.Is(err, http.ErrServerClosed) {
			errs <- fmt.Errorf("admin server stopped: %w", err)
		}
	}()
	approvalSrv, err := serveApprovals(bg, cfg, rt, ss, reporter, metrics, listenMetrics, tracer, logger, errs)
	if err != nil {
		return err
	}
	logger.Info("idemgate serving", "version", Version, "grpc", grpcLis.Addr().String(), "admin", adminLis.Addr().String(),
		"store", ss.backend, "operations", len(rt.Operations))
	on.onReady()

	var serveErr error
	select {
	case <-ctx.Done():
	case serveErr = <-errs:
	}

	// Drain: tell Envoy (gRPC health) and Kubernetes (/readyz) first, keep
	// serving for the drain period, then stop taking streams and let open
	// ones finish (their records are settled before Process returns).
	logger.Info("draining", "period", cfg.Drain.Period, "timeout", cfg.Drain.Timeout)
	extproc.SetServing(hs, false)
	ready.draining.Store(true)
	metrics.SetReady(false)
	if serveErr == nil {
		select {
		case <-time.After(cfg.Drain.Period):
		case serveErr = <-errs:
		}
	}
	stopped := make(chan struct{})
	go func() {
		gs.GracefulStop()
		close(stopped)
	}()
	select {
	case <-stopped:
	case <-time.After(cfg.Drain.Timeout):
		logger.Warn("drain timeout reached; closing the remaining streams")
		gs.Stop()
		<-stopped
	}
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := admin.Shutdown(shutdownCtx); err != nil {
		logger.Warn("failed to stop the admin server cleanly", "error", err)
	}
	if approvalSrv != nil {
		if err := approvalSrv.Shutdown(shutdownCtx); err != nil {
			logger.Warn("failed to stop the approvers' API cleanly", "error", err)
		}
	}
	stopBackground() // before the store closes
	logger.Info("stopped")
	return serveErr
}

// adminHandler serves /metrics (private registry), /healthz (the same gRPC
// health Envoy checks), /readyz (the required store answers and the
// process is not draining) and, with opts.pprof, /debug/pprof/.
func adminHandler(reg *prometheus.Registry, hs *health.Server, ready *readiness, backend string, opts adminOptions) http.Handler {
	mux := http.NewServeMux()
	if opts.pprof {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		resp, err := hs.Check(r.Context(), &healthpb.HealthCheckRequest{Service: extproc.ServiceName})
		if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			http.Error(w, "not serving", http.StatusServiceUnavailable)
			return
		}
		_, _ = io.WriteString(w, "ok\n")
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, r *http.Request) {
		ok, reason := ready.Ready()
		w.Header().Set("Content-Type", "application/json")
		body := map[string]any{"ready": ok, "store": backend}
		if !ok {
			body["reason"] = reason
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		_ = json.NewEncoder(w).Encode(body)
	})
	return mux
}

// serveApprovals starts the approvers' API on approval_listen (docs/design.md
// §10), when it is set and the store keeps approvals.
func serveApprovals(bg context.Context, cfg *settings.Settings, rt *config.Runtime, ss *storeSet, reporter approvalapi.Reporter, metrics *extproc.Metrics, listenMetrics *listen.Metrics, tracer trace.Tracer, logger *slog.Logger, errs chan<- error) (*http.Server, error) {
	if cfg.ApprovalListen == "" {
		return nil, nil
	}
	if ss.approvals == nil {
		logger.Warn("approval_listen is set but the store keeps no approvals (Redis alone): the approvers' API is not served")
		return nil, nil
	}
	h, err := approvalapi.New(approvalapi.Options{Config: rt, Approvals: ss.approvals, Security: reporter, Logger: logger, Transition: metrics.ApprovalTransition, Tracer: tracer})
	if err != nil {
		return nil, err
	}
	var tlsFiles *listen.Files
	if cfg.ApprovalTLS != nil {
		tlsFiles, err = listen.LoadFiles(listen.Approval, *cfg.ApprovalTLS, listenMetrics, logger)
		if err != nil {
			return nil, fmt.Errorf("approval_tls: %w", err)
		}
	}
	lis, err := listen.Open(cfg.ApprovalListen)
	if err != nil {
		return nil, fmt.Errorf("failed to listen on approval_listen %s: %w", cfg.ApprovalListen, err)
	}
	if tlsFiles != nil {
		go tlsFiles.Watch(bg, tlsPollInterval)
		lis = tls.NewListener(lis, tlsFiles.ServerConfig())
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := srv.Serve(lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
			errs <- fmt.Errorf("approvers' API stopped: %w", err)
		}
	}()
	logger.Info("approvers' API serving", "listen", lis.Addr().String())
	return srv, nil
}

// notifies reports whether some operation has an approval webhook.
func notifies(rt *config.Runtime) bool {
	for _, op := range rt.Operations {
		if op.Approval != nil && op.Approval.Notify != nil {
			return true
		}
	}
	return false
}

// tlsPollInterval is how often the listeners' TLS files are checked for a
// change.
const tlsPollInterval = listen.DefaultPollInterval

// grpcCredentials are the ext_proc server's transport credentials with
// grpc_tls: the certificate and client CA re-read as they change, every
// peer checked in the handshake (cmd/idemgate/listen). Without grpc_tls
// the listener is plaintext (loopback, a unix socket, or the switch).
func grpcCredentials(bg context.Context, cfg *settings.Settings, reporter listen.Reporter, m *listen.Metrics, logger *slog.Logger) ([]grpc.ServerOption, error) {
	if cfg.GRPCTLS == nil {
		return nil, nil
	}
	files, err := listen.LoadFiles(listen.GRPC, *cfg.GRPCTLS, m, logger)
	if err != nil {
		return nil, fmt.Errorf("grpc_tls: %w", err)
	}
	go files.Watch(bg, tlsPollInterval)
	peers := listen.NewPeers(files, cfg.GRPCTLS.ClientSANs, reporter, m, logger)
	return []grpc.ServerOption{grpc.Creds(peers.Credentials())}, nil
}

// warnPlaintextRemote sets idemgate_listener_plaintext_remote and, for a
// listener serving plaintext on a routable address by the explicit switch,
// warns at every start (docs/design.md §12): the switch must stay visible.
func warnPlaintextRemote(cfg *settings.Settings, m *listen.Metrics, logger *slog.Logger) {
	for _, l := range []struct {
		name, key, addr string
		on              bool
	}{
		{listen.GRPC, "grpc_plaintext_remote", cfg.GRPCListen, settings.PlaintextRemote(cfg.GRPCListen, cfg.GRPCTLS, cfg.GRPCPlaintextRemote)},
		{listen.Approval, "approval_plaintext_remote", cfg.ApprovalListen, settings.PlaintextRemote(cfg.ApprovalListen, cfg.ApprovalTLS, cfg.ApprovalPlaintextRemote)},
	} {
		m.SetPlaintextRemote(l.name, l.on)
		if l.on {
			logger.Warn("PLAINTEXT ON A ROUTABLE ADDRESS: "+l.key+" is true, so anyone who reaches this listener is trusted; "+
				"use a loopback address, a unix socket or TLS (docs/design.md §12)", "listener", l.name, "listen", l.addr)
		}
	}
}
