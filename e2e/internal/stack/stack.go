// Package stack brings up one complete idemgate deployment for one
// end-to-end test, all on loopback and all owned by the test:
//
//	agent ─▶ Envoy (the pinned binary, child process)
//	           │ ext_proc gRPC          │ HTTP
//	           ▼                        ▼
//	        idemgate (child process)   Upstream recorder ─▶ payments (in-process)
//	           │            │
//	           ▼            ▼
//	  redis-server      PostgreSQL database (fresh, dropped afterwards;
//	  (test-owned)      optionally behind a TCP proxy the test can cut)
//
// Envoy runs the shipped envoy/envoy.yaml and idemgate a config derived
// from the shipped envoy/idemgate.yaml: only addresses, TTLs, the log format
// and the test's tweaks differ. Logs of idemgate and Envoy are kept and
// printed only when the test fails. A data race reported by a race-built
// idemgate fails the test.
package stack

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	goredis "github.com/redis/go-redis/v9"

	"github.com/idemgate/idemgate/e2e/payments"
	"github.com/idemgate/idemgate/envoy"
	"github.com/idemgate/idemgate/envoy/envoytest"
	"github.com/idemgate/idemgate/fingerprint"
	"github.com/idemgate/idemgate/internal/testutil"
)

// Options are a test's changes to the shipped configuration.
type Options struct {
	// FingerprintTTL is ttl.fingerprint (0: as shipped, 15m).
	FingerprintTTL time.Duration
	// InFlightTTL is ttl.in_flight, the lease (0: as shipped, 2m).
	InFlightTTL time.Duration
	// DownstreamIgnoresKeys makes payments ignore Idempotency-Key and sets
	// the operation's downstream_idempotency_header to "".
	DownstreamIgnoresKeys bool
	// ConfirmRouteTimeout replaces the confirm route's timeout in envoy.yaml
	// (and the operation's upstream_timeout) when > 0.
	ConfirmRouteTimeout time.Duration
	// PostgresThroughProxy puts a TCPProxy between idemgate and PostgreSQL.
	PostgresThroughProxy bool
	// PostgresThroughPgBouncer puts a PgBouncer in transaction mode between
	// idemgate and PostgreSQL (store.postgres.pooler: transaction).
	PostgresThroughPgBouncer bool
	// MessageTimeout replaces ext_proc's message_timeout when > 0 (the
	// stack's default is extProcMessageTimeout).
	MessageTimeout time.Duration
	// WithoutPathNormalisation turns off envoy.yaml's normalize_path,
	// merge_slashes and path_with_escaped_slashes_action: only to show what
	// they prevent.
	WithoutPathNormalisation bool
	// IdemgateConfig adds top-level sections to idemgate.yaml (for
	// example tracing); see applyIdemgateConfig.
	IdemgateConfig map[string]any
	// Approval is set as the approval block of the transfer operations
	// (HTTP and MCP; docs/design.md §10) when not nil.
	Approval map[string]any
	// GRPCUnixSocket: idemgate listens on a unix socket in the test's
	// directory, and Envoy reaches it through a pipe address.
	GRPCUnixSocket bool
	// GRPCTLS: mutual TLS on the ext_proc channel (see channel.go).
	GRPCTLS *GRPCTLS
	// MCPPreviewWithoutResponseHeaders sets the MCP operation's
	// mcp.preview_response_headers: false, and Envoy's ext_proc filter
	// sends response.code (3 messages per MCP preview).
	MCPPreviewWithoutResponseHeaders bool
	// WrapUpstream and EditBootstrap: see attest.go.
	WrapUpstream  func(http.Handler) http.Handler
	EditBootstrap func([]byte) ([]byte, error)
}

// Stack is one running deployment.
type Stack struct {
	t    testing.TB
	opts Options

	Redis    *testutil.RedisServer
	Idemgate *Idemgate
	Upstream *Upstream
	Payments *payments.Server
	// PGProxy is set with Options.PostgresThroughProxy.
	PGProxy *TCPProxy
	// DSN reaches the test database directly (never through PGProxy).
	DSN string
	// Bootstrap is the edited envoy.yaml Envoy runs.
	Bootstrap []byte
	// Envoy is the front.
	Envoy *Envoy

	client       *http.Client
	signingKey   string
	upstreamAddr string

	poolOnce sync.Once
	pool     *pgxpool.Pool
	poolErr  error
}

// Start brings up a stack for t and tears it down at cleanup.
func Start(t testing.TB, env Env, opts Options) *Stack {
	t.Helper()
	s := &Stack{t: t, opts: opts}
	// Registered first so it runs last, when every process has stopped and
	// its log is complete.
	t.Cleanup(s.dumpLogsOnFailure)

	s.Redis = testutil.StartRedis(t)
	dsn := testutil.CreateDatabase(t)
	s.DSN = dsn
	idemgateDSN := dsn
	if opts.PostgresThroughProxy {
		u, err := proxiedDSN(dsn, func(target string) (string, error) {
			p, err := StartTCPProxy(target)
			if err != nil {
				return "", err
			}
			s.PGProxy = p
			t.Cleanup(p.Close)
			return p.Addr(), nil
		})
		if err != nil {
			t.Fatalf("failed to put a proxy in front of PostgreSQL: %v", err)
		}
		idemgateDSN = u
	}
	if opts.PostgresThroughPgBouncer {
		if opts.PostgresThroughProxy {
			t.Fatal("PostgresThroughProxy and PostgresThroughPgBouncer are exclusive")
		}
		idemgateDSN = testutil.StartPgBouncer(t, testutil.PgBouncerOptions{PoolSize: 2}).DSN(t, dsn)
	}

	s.Payments = payments.New(payments.Options{IgnoreIdempotencyKeys: opts.DownstreamIgnoresKeys})
	s.Upstream = &Upstream{Payments: s.Payments}
	paymentsAddr := s.serveUpstream()
	s.upstreamAddr = paymentsAddr

	key, err := newSigningKey()
	if err != nil {
		t.Fatal(err)
	}
	s.signingKey = key
	dir := t.TempDir()
	g := &Idemgate{
		bin:        env.IdemgateBin,
		configPath: filepath.Join(dir, "idemgate.yaml"),
		env:        childEnv(key, idemgateDSN),
		GRPCAddr:   freeAddr(t),
		AdminAddr:  freeAddr(t),
		log:        &LogBuffer{},
	}
	if opts.GRPCUnixSocket {
		g.GRPCAddr = unixSocketListen(dir)
	}
	extra := opts.IdemgateConfig
	if opts.GRPCTLS != nil {
		extra = maps.Clone(opts.IdemgateConfig)
		if extra == nil {
			extra = map[string]any{}
		}
		extra["grpc_tls"] = opts.GRPCTLS.grpcTLSConfig()
	}
	cfg, err := idemgateConfig{
		grpcAddr: g.GRPCAddr, adminAddr: g.AdminAddr, redisAddr: s.Redis.Addr,
		fingerprintTTL: opts.FingerprintTTL, inFlightTTL: opts.InFlightTTL,
		ignoreKeys: opts.DownstreamIgnoresKeys, upstreamTimeout: opts.ConfirmRouteTimeout,
		extra: extra, transactionPooler: opts.PostgresThroughPgBouncer,
		approval: opts.Approval, mcpPreviewWithoutHeaders: opts.MCPPreviewWithoutResponseHeaders,
	}.render()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(g.configPath, cfg, 0o600); err != nil {
		t.Fatalf("failed to write the idemgate config: %v", err)
	}
	s.Idemgate = g
	t.Cleanup(func() {
		g.Stop()
		if strings.Contains(g.Log(), "WARNING: DATA RACE") {
			t.Errorf("the race detector reported a data race in idemgate (log below)")
		}
	})
	if err := g.Start(); err != nil {
		t.Fatalf("idemgate did not start: %v\n%s", err, g.Log())
	}

	s.Bootstrap, err = envoytest.RenderBootstrap(envoy.BootstrapYAML(), envoytest.Edits{
		// Port 0: the kernel picks, nothing can take the port between the
		// choice and the bind (startEnvoy reads the bound ports back).
		Listen: "127.0.0.1:0", Admin: "127.0.0.1:0",
		// A unix:// grpc_listen becomes a pipe address.
		Clusters:            map[string]string{envoytest.IdemgateCluster: g.GRPCAddr, envoytest.PaymentsCluster: paymentsAddr},
		ClusterTLS:          opts.GRPCTLS.clusterTLS(),
		ConfirmRouteTimeout: opts.ConfirmRouteTimeout,
		MessageTimeout:      cmp.Or(opts.MessageTimeout, extProcMessageTimeout),
		ConfirmRetryOn:      confirmRetryOn(opts),
		RawPaths:            opts.WithoutPathNormalisation,
		ResponseCode:        opts.MCPPreviewWithoutResponseHeaders,
	})
	if err == nil && opts.EditBootstrap != nil {
		s.Bootstrap, err = opts.EditBootstrap(s.Bootstrap)
	}
	if err != nil {
		t.Fatal(err)
	}
	s.Envoy, err = startEnvoy(t, env.EnvoyBin, s.Bootstrap)
	if err != nil {
		t.Fatalf("envoy did not start: %v", err)
	}
	t.Cleanup(s.Envoy.Close)

	s.client = &http.Client{
		Timeout: 60 * time.Second,
		Transport: &http.Transport{
			MaxIdleConns: 512, MaxIdleConnsPerHost: 512, IdleConnTimeout: 30 * time.Second,
			DialContext: (&net.Dialer{Timeout: 5 * time.Second}).DialContext,
		},
	}
	t.Cleanup(s.client.CloseIdleConnections)
	return s
}

// confirmRetryOn is the confirm route's retry_on for the deployment. The
// shipped envoy.yaml retries a reset confirm, which is safe only because
// the retry carries the same Idempotency-Key and the downstream
// deduplicates it; a downstream that ignores keys would execute the retry
// a second time (the contract tests saw it pay twice), so that deployment
// retries connection failures only, as envoy.yaml's comment says.
func confirmRetryOn(opts Options) string {
	if opts.DownstreamIgnoresKeys {
		return "connect-failure"
	}
	return ""
}

// serveUpstream serves the Upstream recorder on a loopback port.
func (s *Stack) serveUpstream() string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		s.t.Fatalf("failed to listen for payments: %v", err)
	}
	var h http.Handler = s.Upstream
	if s.opts.WrapUpstream != nil {
		h = s.opts.WrapUpstream(h)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	s.t.Cleanup(func() {
		s.Upstream.releaseHolds()
		_ = srv.Close()
	})
	return ln.Addr().String()
}

// freeAddr is a loopback host:port that was free a moment ago; idemgate
// keeps it across restarts.
func freeAddr(t testing.TB) string {
	return fmt.Sprintf("127.0.0.1:%d", testutil.FreePort(t))
}

// proxiedDSN rewrites dsn's host:port to the address start returns for the
// original host:port.
func proxiedDSN(dsn string, start func(target string) (string, error)) (string, error) {
	const prefix = "postgres://"
	rest, ok := strings.CutPrefix(dsn, prefix)
	if !ok {
		return "", fmt.Errorf("unexpected DSN form %q", dsn)
	}
	userinfo, hostAndPath, ok := strings.Cut(rest, "@")
	if !ok {
		return "", fmt.Errorf("unexpected DSN form %q", dsn)
	}
	hostport, path, _ := strings.Cut(hostAndPath, "/")
	addr, err := start(hostport)
	if err != nil {
		return "", err
	}
	return prefix + userinfo + "@" + addr + "/" + path, nil
}

// URL is Envoy's base URL.
func (s *Stack) URL() string { return "http://" + s.Envoy.ListenAddr }

// Agent returns an agent client for user.
// NewAgent is an agent of user (a JWT of the demo issuer) sending to base
// (http://host:port), for a test that runs its own front.
func NewAgent(user, base string) (*Agent, error) {
	return newAgent(user, base, &http.Client{Timeout: 30 * time.Second})
}

func (s *Stack) Agent(user string) *Agent {
	s.t.Helper()
	a, err := newAgent(user, s.URL(), s.client)
	if err != nil {
		s.t.Fatal(err)
	}
	return a
}

// AnonymousAgent is a client without a JWT.
func (s *Stack) AnonymousAgent() *Agent {
	return &Agent{User: "", base: s.URL(), client: s.client}
}

// RequestID is the x-request-id Envoy gave the request that got resp.
func (s *Stack) RequestID(resp *Response) (string, error) { return s.Envoy.RequestID(resp) }

// SubjectTag is the keyed tag idemgate computes for subject (the "u" claim,
// the subject_tag of security events) under the stack's signing key k1.
func (s *Stack) SubjectTag(subject string) (string, error) {
	raw, err := fingerprint.ParseKey(s.signingKey)
	if err != nil {
		return "", err
	}
	ring, err := fingerprint.NewKeyRing(signingKeyID, map[string][]byte{signingKeyID: raw})
	if err != nil {
		return "", err
	}
	return ring.SubjectTag(signingKeyID, subject)
}

// RedisClient returns a client of the test-owned Redis, closed at cleanup.
func (s *Stack) RedisClient() *goredis.Client {
	c := goredis.NewClient(&goredis.Options{Addr: s.Redis.Addr})
	s.t.Cleanup(func() { _ = c.Close() })
	return c
}

// Row is one idempotency_record row as PostgreSQL holds it.
type Row struct {
	Key          string
	State        string
	Owner        string
	Fence        int64
	LeaseUntil   time.Time
	ResultStatus *int
	ResultBody   []byte
}

func (s *Stack) db() (*pgxpool.Pool, error) {
	s.poolOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		s.pool, s.poolErr = pgxpool.New(ctx, s.DSN)
		if s.poolErr == nil {
			// Cleanups run last-in first-out: this one before the
			// database is dropped.
			s.t.Cleanup(s.pool.Close)
		}
	})
	return s.pool, s.poolErr
}

// ErrNoRow is returned by Row for a nonce PostgreSQL has no record of.
var ErrNoRow = errors.New("no idempotency_record row")

// Row reads the record of nonce.
func (s *Stack) Row(nonce string) (Row, error) {
	pool, err := s.db()
	if err != nil {
		return Row{}, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var r Row
	err = pool.QueryRow(ctx, `SELECT idem_key, state, owner, fence, lease_until, result_status, result_body
		FROM idempotency_record WHERE idem_key = $1::char(32)`, nonce).
		Scan(&r.Key, &r.State, &r.Owner, &r.Fence, &r.LeaseUntil, &r.ResultStatus, &r.ResultBody)
	if err != nil {
		if errors.Is(err, pgx.ErrNoRows) {
			return Row{}, fmt.Errorf("%w for %s", ErrNoRow, nonce)
		}
		return Row{}, fmt.Errorf("failed to read the record of %s: %w", nonce, err)
	}
	return r, nil
}

// RowCounts counts idempotency_record rows by state.
func (s *Stack) RowCounts() (map[string]int, error) {
	pool, err := s.db()
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rows, err := pool.Query(ctx, `SELECT state, count(*) FROM idempotency_record GROUP BY state`)
	if err != nil {
		return nil, fmt.Errorf("failed to count records: %w", err)
	}
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var st string
		var n int
		if err := rows.Scan(&st, &n); err != nil {
			return nil, err
		}
		out[st] = n
	}
	return out, rows.Err()
}

// RowsOf counts rows for nonce (0 or 1: idem_key is the primary key).
func (s *Stack) RowsOf(nonce string) (int, error) {
	pool, err := s.db()
	if err != nil {
		return 0, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var n int
	err = pool.QueryRow(ctx, `SELECT count(*) FROM idempotency_record WHERE idem_key = $1::char(32)`, nonce).Scan(&n)
	return n, err
}

// dumpLogsOnFailure prints the logs of idemgate and Envoy when the test
// failed, and nothing otherwise.
func (s *Stack) dumpLogsOnFailure() {
	if !s.t.Failed() {
		return
	}
	if s.Idemgate != nil {
		s.t.Logf("---- idemgate log ----\n%s", s.Idemgate.Log())
	}
	if s.Envoy != nil {
		s.t.Logf("---- Envoy log ----\n%s", s.Envoy.Log())
	}
	if s.Payments != nil {
		st := s.Payments.Stats()
		s.t.Logf("---- payments ---- executions=%d confirms=%d replays=%d by key=%v", st.Executions, st.Confirms, st.Replays, st.ExecutionsByKey)
	}
}
