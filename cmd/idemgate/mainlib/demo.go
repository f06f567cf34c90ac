package mainlib

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/goccy/go-yaml"

	"github.com/idemgate/idemgate/e2e/demoauth"
	"github.com/idemgate/idemgate/e2e/envoysim"
	"github.com/idemgate/idemgate/e2e/payments"
	"github.com/idemgate/idemgate/envoy"
	"github.com/idemgate/idemgate/extproc/config"
	"github.com/idemgate/idemgate/fingerprint"
)

const (
	// demoFrontListen is where the demo's Envoy front listens by default:
	// the port of envoy/envoy.yaml's listener, on loopback only, because the
	// demo's JWT signing key is public (anyone could mint a token for it).
	demoFrontListen = "127.0.0.1:8080"
	// demoKeyEnv is the variable envoy/idemgate.yaml reads the signing key
	// from; the demo generates a key when it is not set.
	demoKeyEnv = "IDEMGATE_KEY_K1"
	// demoConfigName names the derived config in problems and logs.
	demoConfigName = "envoy/idemgate.yaml (demo: memory store, loopback listeners, text logs)"
	// demoTokenTTL is how long the printed JWTs stay valid.
	demoTokenTTL = 8 * time.Hour
	// demoExpiredBy is how long before the demo's start the printed expired
	// fingerprint expired.
	demoExpiredBy = time.Minute
	// demoShutdownTimeout bounds each HTTP server's shutdown.
	demoShutdownTimeout = 5 * time.Second

	// demoTransfer is the transfer every printed command moves: amount,
	// currency and payee.account_id are the operation's bound params; memo
	// is free text that an agent may reword between calls.
	demoTransfer = `{"amount":"250.00","currency":"EUR","payee":{"account_id":"acc_7731","name":"Carol"},"memo":"rent for May"}`

	// fingerprintSed prints the value of the first "fingerprint" member of
	// the JSON on its input (curl -i output of a preview): POSIX sed, so the
	// demo needs no jq. Base64url and "." never contain a quote.
	fingerprintSed = `sed -n 's/.*"fingerprint" *: *"\([^"]*\)".*/\1/p'`
)

// demo runs `idemgate demo`: idemgate, the demo payments upstream and the
// Envoy-faithful front in this process, or with --upstream-only just the
// payments upstream (what docker-compose runs beside a real Envoy).
func demo(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("demo", stderr)
	listen := fs.String("listen", "", "listen address (default "+demoFrontListen+", or with --upstream-only the payments cluster address of envoy/envoy.yaml)")
	upstreamOnly := fs.Bool("upstream-only", false, "run only the demo payments upstream")
	rest, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if len(rest) > 0 {
		fmt.Fprintf(stderr, "demo: unexpected argument %q\n", rest[0])
		return ErrUsage
	}
	if *upstreamOnly {
		addr := *listen
		if addr == "" {
			if addr, err = paymentsClusterAddress(); err != nil {
				return err
			}
		}
		return demoUpstream(ctx, addr, stdout, stderr)
	}
	addr := *listen
	if addr == "" {
		addr = demoFrontListen
	}
	return demoAll(ctx, addr, stdout, stderr)
}

// paymentsClusterAddress is where envoy/envoy.yaml's payments cluster points
// (127.0.0.1:8081): the upstream-only mode's default address.
func paymentsClusterAddress() (string, error) {
	cfg, err := envoysim.FromBootstrap(envoy.BootstrapYAML(), nil, "")
	if err != nil {
		return "", fmt.Errorf("failed to read envoy/envoy.yaml: %w", err)
	}
	cl, ok := cfg.Clusters["payments"]
	if !ok {
		return "", errors.New("envoy/envoy.yaml has no payments cluster")
	}
	return cl.Address, nil
}

// listenFlag listens on addr, the value of --listen, and explains a taken port.
func listenFlag(addr string) (net.Listener, error) {
	lis, err := net.Listen("tcp", addr)
	if errors.Is(err, syscall.EADDRINUSE) {
		return nil, fmt.Errorf("failed to listen on %s (--listen): the address is already in use; "+
			"stop what holds it (an earlier demo?) or pick another address, e.g. --listen 127.0.0.1:8090", addr)
	}
	if err != nil {
		return nil, fmt.Errorf("failed to listen on %s (--listen): %w", addr, err)
	}
	return lis, nil
}

// demoLogger logs at info in text, whatever the shipped config says: the
// demo is read by a person in a terminal.
func demoLogger(stderr io.Writer) *slog.Logger {
	return newLogger(stderr, config.LogSettings{Level: slog.LevelInfo, Format: "text"})
}

// demoUpstream serves the payments upstream alone until ctx ends.
func demoUpstream(ctx context.Context, addr string, stdout, stderr io.Writer) error {
	logger := demoLogger(stderr)
	lis, err := listenFlag(addr)
	if err != nil {
		return err
	}
	srv := newDemoHTTPServer(payments.New(payments.Options{Logger: logger}), logger)
	errs := make(chan error, 1)
	go func() { errs <- srv.Serve(lis) }()
	fmt.Fprintf(stdout, "demo payments API listening on http://%s (counters: GET /_admin/stats)\n", lis.Addr())

	var serveErr error
	select {
	case <-ctx.Done():
	case serveErr = <-errs:
	}
	if err := shutdownHTTP(srv); err != nil {
		logger.Warn("failed to stop the payments API cleanly", "error", err)
	}
	logger.Info("demo payments API stopped")
	if serveErr != nil && !errors.Is(serveErr, http.ErrServerClosed) {
		return fmt.Errorf("payments API stopped: %w", serveErr)
	}
	return nil
}

func newDemoHTTPServer(h http.Handler, logger *slog.Logger) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelDebug),
	}
}

func shutdownHTTP(srv *http.Server) error {
	ctx, cancel := context.WithTimeout(context.Background(), demoShutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(ctx); err != nil {
		return errors.Join(err, srv.Close())
	}
	return nil
}

// demoConfigYAML derives the demo's idemgate config from the shipped
// envoy/idemgate.yaml: the same operations, subject, TTLs and limits, with
// the store section removed (the embedded memory store), text logs at info,
// and no drain wait (no Envoy health-checks the demo; its front stops first).
func demoConfigYAML() ([]byte, error) {
	var shipped yaml.MapSlice
	if err := yaml.UnmarshalWithOptions(envoy.IdemgateYAML(), &shipped, yaml.UseOrderedMap()); err != nil {
		return nil, fmt.Errorf("failed to read envoy/idemgate.yaml: %w", err)
	}
	derived := make(yaml.MapSlice, 0, len(shipped)+2)
	for _, item := range shipped {
		switch item.Key {
		case "store", "log", "drain":
			continue
		}
		derived = append(derived, item)
	}
	derived = append(derived,
		yaml.MapItem{Key: "log", Value: yaml.MapSlice{{Key: "level", Value: "info"}, {Key: "format", Value: "text"}}},
		yaml.MapItem{Key: "drain", Value: yaml.MapSlice{{Key: "period", Value: "0s"}, {Key: "timeout", Value: "5s"}}},
	)
	out, err := yaml.Marshal(derived)
	if err != nil {
		return nil, fmt.Errorf("failed to write the demo config: %w", err)
	}
	return out, nil
}

// demoConfig compiles the derived config. The signing key comes from
// IDEMGATE_KEY_K1 when it is set, else it is generated for this run.
func demoConfig(lookupEnv func(string) (string, bool)) (rt *config.Runtime, warns []*config.Problem, keySource string, err error) {
	data, err := demoConfigYAML()
	if err != nil {
		return nil, nil, "", err
	}
	keySource = "from " + demoKeyEnv
	lookup := lookupEnv
	if _, set := lookupEnv(demoKeyEnv); !set {
		key, err := fingerprint.GenerateKey()
		if err != nil {
			return nil, nil, "", err
		}
		keySource = "generated for this run (set " + demoKeyEnv + " to choose it)"
		lookup = func(name string) (string, bool) {
			if name == demoKeyEnv {
				return key, true
			}
			return lookupEnv(name)
		}
	}
	rt, warns, err = config.Parse(demoConfigName, data, ".", config.Options{LookupEnv: lookup})
	if err != nil {
		return nil, warns, "", problemsError(demoConfigName, err)
	}
	return rt, warns, keySource, nil
}

// demoStack is the running demo: its listeners, servers and what the
// printed commands need.
type demoStack struct {
	rt       *config.Runtime
	front    *http.Server
	proxy    *envoysim.Proxy
	payments *http.Server
	stopIdem context.CancelFunc
	idemDone chan error
	errs     chan error

	frontURL, paymentsURL, grpcAddr, adminAddr string
}

// demoAll runs the whole demo until ctx ends.
func demoAll(ctx context.Context, listen string, stdout, stderr io.Writer) error {
	// The front's port is the one a user may find taken: try it first, so
	// that failing costs nothing else.
	frontLis, err := listenFlag(listen)
	if err != nil {
		return err
	}
	rt, warns, keySource, err := demoConfig(os.LookupEnv)
	if err != nil {
		frontLis.Close()
		return err
	}
	logger := newLogger(stderr, rt.Log)
	for _, w := range warns {
		logger.Warn("config warning", "problem", w.Error())
	}
	st, err := startDemo(ctx, rt, logger, frontLis)
	if err != nil {
		return err
	}
	script, err := demoScript(st, keySource, time.Now())
	if err != nil {
		st.stop()
		return err
	}
	// One write, so a reader never sees half of it.
	if _, err := io.WriteString(stdout, script); err != nil {
		st.stop()
		return fmt.Errorf("failed to print the demo commands: %w", err)
	}

	var runErr error
	select {
	case <-ctx.Done():
	case runErr = <-st.errs:
	}
	logger.Info("demo stopping")
	if err := st.stop(); err != nil && runErr == nil {
		runErr = err
	}
	logger.Info("demo stopped")
	return runErr
}

// startDemo opens loopback ports for idemgate and the payments upstream,
// builds the front from envoy/envoy.yaml with its idemgate and payments
// clusters pointed at them, and serves all three. It owns frontLis.
func startDemo(ctx context.Context, rt *config.Runtime, logger *slog.Logger, frontLis net.Listener) (*demoStack, error) {
	var opened []net.Listener
	fail := func(err error) (*demoStack, error) {
		for _, l := range opened {
			l.Close()
		}
		return nil, err
	}
	opened = append(opened, frontLis)
	loopback := func(what string) (net.Listener, error) {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("failed to listen on a loopback port for %s: %w", what, err)
		}
		opened = append(opened, l)
		return l, nil
	}
	paymentsLis, err := loopback("the payments API")
	if err != nil {
		return fail(err)
	}
	grpcLis, err := loopback("idemgate's gRPC")
	if err != nil {
		return fail(err)
	}
	adminLis, err := loopback("idemgate's admin")
	if err != nil {
		return fail(err)
	}
	rt.GRPCListen, rt.AdminListen = grpcLis.Addr().String(), adminLis.Addr().String()

	cfg, err := envoysim.FromBootstrap(envoy.BootstrapYAML(), map[string]string{
		"idemgate": rt.GRPCListen,
		"payments": paymentsLis.Addr().String(),
	}, frontLis.Addr().String())
	if err != nil {
		return fail(fmt.Errorf("failed to build the front from envoy/envoy.yaml: %w", err))
	}
	proxy, err := envoysim.New(cfg, envoysim.WithLogger(logger), envoysim.WithHooks(envoysim.Hooks{
		// envoy.yaml writes an access log to stdout; the demo's stdout is
		// the printed commands, so these lines join the log on stderr.
		OnRequestDone: func(a envoysim.AccessLog) {
			logger.Info("envoy access", "method", a.Method, "path", a.Path, "status", a.ResponseCode,
				"details", a.ResponseCodeDetails, "request_id", a.RequestID, "duration", a.Duration.Round(time.Microsecond))
		},
	}))
	if err != nil {
		return fail(fmt.Errorf("failed to build the front: %w", err))
	}

	st := &demoStack{
		rt:          rt,
		proxy:       proxy,
		front:       newDemoHTTPServer(proxy, logger),
		payments:    newDemoHTTPServer(payments.New(payments.Options{Logger: logger}), logger),
		idemDone:    make(chan error, 1),
		errs:        make(chan error, 3),
		frontURL:    "http://" + dialable(frontLis.Addr()),
		paymentsURL: "http://" + paymentsLis.Addr().String(),
		grpcAddr:    rt.GRPCListen,
		adminAddr:   rt.AdminListen,
	}
	go func() {
		if err := st.payments.Serve(paymentsLis); !errors.Is(err, http.ErrServerClosed) {
			st.errs <- fmt.Errorf("payments API stopped: %w", err)
		}
	}()

	// idemgate stops when the demo says so, after the front has stopped
	// sending it streams, not when ctx ends.
	idemCtx, stopIdem := context.WithCancel(context.WithoutCancel(ctx))
	st.stopIdem = stopIdem
	ready := make(chan struct{})
	go func() {
		err := runOn(idemCtx, rt, logger, grpcLis, adminLis, func() { close(ready) })
		st.idemDone <- err
		if err != nil {
			st.errs <- fmt.Errorf("idemgate stopped: %w", err)
		}
	}()
	select {
	case <-ready:
	case err := <-st.idemDone:
		st.idemDone <- err // for stop
		st.stop()
		frontLis.Close() // never served
		return nil, fmt.Errorf("failed to start idemgate: %w", err)
	}

	go func() {
		if err := st.front.Serve(frontLis); !errors.Is(err, http.ErrServerClosed) {
			st.errs <- fmt.Errorf("front stopped: %w", err)
		}
	}()
	return st, nil
}

// stop shuts the demo down front first: no new request reaches idemgate or
// the upstream once it begins, and requests in flight finish.
func (st *demoStack) stop() error {
	var errs []error
	if err := shutdownHTTP(st.front); err != nil {
		errs = append(errs, fmt.Errorf("failed to stop the front: %w", err))
	}
	if err := st.proxy.Close(); err != nil {
		errs = append(errs, fmt.Errorf("failed to close the front's connections: %w", err))
	}
	st.stopIdem()
	if err := <-st.idemDone; err != nil {
		errs = append(errs, fmt.Errorf("idemgate stopped: %w", err))
	}
	if err := shutdownHTTP(st.payments); err != nil {
		errs = append(errs, fmt.Errorf("failed to stop the payments API: %w", err))
	}
	return errors.Join(errs...)
}

// dialable turns a listener address into one a client on this machine can
// dial: an unspecified host (":8080", "[::]:8080") becomes 127.0.0.1.
func dialable(addr net.Addr) string {
	host, port, err := net.SplitHostPort(addr.String())
	if err != nil {
		return addr.String()
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		host = "127.0.0.1"
	}
	return net.JoinHostPort(host, port)
}

// demoScript is what the demo prints: a banner and the commands, all of it
// a POSIX sh script (the banner is comments) that needs only curl.
func demoScript(st *demoStack, keySource string, now time.Time) (string, error) {
	alice, err := demoauth.Mint("alice", demoTokenTTL, now)
	if err != nil {
		return "", err
	}
	bob, err := demoauth.Mint("bob", demoTokenTTL, now)
	if err != nil {
		return "", err
	}
	expired, err := expiredFingerprint(st.rt, "alice", now.Add(-demoExpiredBy))
	if err != nil {
		return "", err
	}
	fpTTL := shortDuration(st.rt.TTL.Fingerprint)

	var b strings.Builder
	line := func(format string, args ...any) { fmt.Fprintf(&b, format+"\n", args...) }
	line("# idemgate demo: idemgate, a demo payments API and an Envoy-faithful front, all in this one process.")
	line("#   front (envoy/envoy.yaml: jwt_authn, ext_proc, router)  %s   <- send requests here", st.frontURL)
	line("#   idemgate ext_proc gRPC, memory store                   %s (admin: http://%s/metrics)", st.grpcAddr, st.adminAddr)
	line("#   demo payments API (the upstream)                       %s", st.paymentsURL)
	line("#   fingerprint signing key: %s", keySource)
	line("# Logs (idemgate's event=security_alert lines included) go to stderr. Ctrl-C or SIGTERM stops the demo.")
	line("#")
	line("# Paste what follows into another shell: POSIX sh and curl, no jq. Run the steps in order.")
	line("")
	line("GW=%s", st.frontURL)
	line("# JWTs for the demo users alice and bob (ES256, demo-only key of e2e/demoauth), valid until %s.", now.Add(demoTokenTTL).UTC().Format(time.RFC3339))
	line("ALICE=%s", alice)
	line("BOB=%s", bob)
	line("# For step 6: a fingerprint for alice and this same transfer, signed by the demo with this run's key but expired %s before it started,", shortDuration(demoExpiredBy))
	line("# i.e. a preview older than ttl.fingerprint (%s); the demo mints it so that step 6 needs no %s wait.", fpTTL, fpTTL)
	line("EXPIRED_FP=%s", expired)
	line("")
	line("# 1. Preview as alice: the payments API quotes; idemgate adds \"fingerprint\" and \"fingerprint_expires_at\" (now + %s) to the body and an Idempotency-Fingerprint header. Expect 200; nothing stored, nothing executed.", fpTTL)
	line(`PREVIEW=$(%s); printf '%%s\n' "$PREVIEW"`, demoCurl("preview", "$ALICE", "", "'"+demoTransfer+"'"))
	line("# Keep the fingerprint for the next steps (plain sed); expect FP= followed by the token.")
	line(`FP=$(printf '%%s\n' "$PREVIEW" | %s); echo "FP=$FP"`, fingerprintSed)
	line("")
	line("# 2. Confirm as alice with the fingerprint and the same params: idemgate acquires the fingerprint's nonce and sends it to the payments API as Idempotency-Key (3a and 8 show it). Expect 200 \"status\":\"completed\" and a transfer_id (tr_000001 on the first pass): executed once.")
	line("%s", demoCurl("confirm", "$ALICE", "", withFingerprint(demoTransfer)))
	line("")
	line("# 3a. Retry the same confirm (an agent that lost the answer): expect 200 \"status\":\"already_completed\" with the original result, Idempotent-Replayed: true and the Idempotency-Key idemgate used; the payments API is not called.")
	line("%s", demoCurl("confirm", "$ALICE", "", withFingerprint(demoTransfer)))
	line("# 3b. Retry with the free-text memo reworded (memo is not a bound param): expect the same already_completed replay, still no second execution.")
	line("%s", demoCurl("confirm", "$ALICE", "", withFingerprint(strings.Replace(demoTransfer, `"rent for May"`, `"May rent, as agreed with Carol"`, 1))))
	line("")
	line("# 4. Ask the status tool (here the fingerprint travels in the Idempotency-Fingerprint header instead of the body): expect 200 \"status\":\"completed\" with the stored result.")
	line("%s", demoCurl("status", "$ALICE", "$FP", "'{}'"))
	line("")
	line("# 5. Confirm with a drifted amount (2500.00 instead of 250.00): expect 422 \"status\":\"params_changed\", \"changed_fields\":[\"amount\"], and an event=security_alert line in the demo's log.")
	line("%s", demoCurl("confirm", "$ALICE", "", withFingerprint(strings.Replace(demoTransfer, `"250.00"`, `"2500.00"`, 1))))
	line("")
	line("# 6. Confirm with the expired fingerprint (EXPIRED_FP above): expect 410 \"status\":\"fingerprint_expired\" (preview again, ask the user again).")
	line("%s", demoCurl("confirm", "$ALICE", "", `'{"fingerprint":"'"$EXPIRED_FP"'",`+demoTransfer[1:]+`'`))
	line("")
	line("# 7. bob presents alice's fingerprint: expect 403 \"status\":\"fingerprint_subject_mismatch\" and another event=security_alert line.")
	line("%s", demoCurl("confirm", "$BOB", "", withFingerprint(demoTransfer)))
	line("")
	line("# 8. The payments API's counters (through the front's catch-all route, which skips idemgate): expect \"executions\":1 under the one Idempotency-Key idemgate set (each new pass from step 1 previews, and so moves, one more transfer).")
	line(`curl -sS -w '\n' "$GW/_admin/stats"`)
	return b.String(), nil
}

// shortDuration prints 15m rather than 15m0s.
func shortDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// demoCurl is one POST to an operation route of the front.
func demoCurl(route, token, headerFingerprint, body string) string {
	c := `curl -sS -i -w '\n' "$GW/v1/transfers/` + route + `" -H "Authorization: Bearer ` + token + `"`
	if headerFingerprint != "" {
		c += ` -H "Idempotency-Fingerprint: ` + headerFingerprint + `"`
	}
	return c + ` -H 'Content-Type: application/json' -d ` + body
}

// withFingerprint quotes a transfer for sh with "fingerprint":"$FP" first.
func withFingerprint(transfer string) string {
	return `'{"fingerprint":"'"$FP"'",` + transfer[1:] + `'`
}

// expiredFingerprint signs demoTransfer for subject with the demo's key and
// an expiry in the past, as a preview would have signed it back then.
func expiredFingerprint(rt *config.Runtime, subject string, exp time.Time) (string, error) {
	target, _, ok := rt.Routes.Match(http.MethodPost, "/v1/transfers/preview")
	if !ok {
		return "", errors.New("envoy/idemgate.yaml has no operation previewed at POST /v1/transfers/preview")
	}
	op := target.Op
	doc, err := fingerprint.ParseJSON([]byte(demoTransfer), rt.Limits.MaxJSONDepth)
	if err != nil {
		return "", fmt.Errorf("failed to parse the demo transfer: %w", err)
	}
	params, err := op.Selector.Select(doc, nil)
	if err != nil {
		return "", fmt.Errorf("failed to select the demo transfer's params: %w", err)
	}
	nonce, err := fingerprint.NewNonce()
	if err != nil {
		return "", err
	}
	token, _, err := rt.Keys.Sign(fingerprint.SignRequest{Subject: subject, Scope: op.Scope, Params: params, Nonce: nonce, Expiry: exp})
	if err != nil {
		return "", fmt.Errorf("failed to sign the expired fingerprint: %w", err)
	}
	return token, nil
}
