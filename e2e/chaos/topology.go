package chaos

import (
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

	"github.com/jackc/pgx/v5/pgxpool"
	goredis "github.com/redis/go-redis/v9"
	"sigs.k8s.io/yaml"

	"github.com/idemgate/idemgate/e2e/internal/stack"
	"github.com/idemgate/idemgate/e2e/payments"
	"github.com/idemgate/idemgate/internal/testutil"
)

// Topology is one deployment of several pods on loopback, all owned by the
// run:
//
//	agents ─▶ pod i: Envoy i ──ext_proc──▶ idemgate i ─┬─▶ Redis master/replica (Sentinel pair)
//	               │ HTTP                              └─▶ TCP proxy ─▶ PostgreSQL (fresh database)
//	               ▼
//	          Ledger ─▶ payments (honours or ignores Idempotency-Key)
//
// Each Envoy runs the shipped envoy.yaml and talks only to its own
// idemgate, as a sidecar does; the idemgates share one signing key and the
// stores, as replicas of one deployment do.
type Topology struct {
	t    testing.TB
	opts Options

	// Redis holds both servers; which one is master changes with failovers.
	Redis      []*testutil.RedisServer
	Sentinels  []string
	MasterName string
	// DSN reaches the database directly; the replicas go through PGProxy.
	DSN     string
	PGProxy *stack.TCPProxy
	// PG is the run's own PostgreSQL (nil: a database on the shared one).
	PG *PGInstance

	Payments *payments.Server
	Ledger   *Ledger
	Pods     []*Pod

	envoyBin     string
	paymentsAddr string
	sentinel     *goredis.SentinelClient
	pool         *pgxpool.Pool
}

// Pod is one replica: an idemgate and the Envoy in front of it.
type Pod struct {
	Index    int
	Idemgate *stack.Idemgate
	// ApprovalAddr is the replica's approval_listen (fixed across its
	// restarts, like its other listeners).
	ApprovalAddr string

	mu        sync.Mutex
	envoy     *stack.Envoy
	bootstrap []byte
	t         testing.TB
	envoyBin  string
	retired   []*stack.Envoy
}

// URL is the pod's Envoy listener (it changes when Envoy restarts).
func (p *Pod) URL() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return "http://" + p.envoy.ListenAddr
}

// Logs returns the pod's idemgate log and the logs of every Envoy it ran.
func (p *Pod) Logs() (idemgate, envoy string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var b strings.Builder
	for _, e := range append(append([]*stack.Envoy(nil), p.retired...), p.envoy) {
		b.WriteString(e.Log())
	}
	return p.Idemgate.Log(), b.String()
}

// RestartEnvoy kills the pod's Envoy (SIGKILL) and starts a new one from
// the same bootstrap; the listener port changes.
func (p *Pod) RestartEnvoy() error {
	p.mu.Lock()
	old := p.envoy
	p.mu.Unlock()
	old.Kill()
	e, err := stack.StartEnvoy(p.t, p.envoyBin, p.bootstrap)
	if err != nil {
		return err
	}
	p.mu.Lock()
	p.retired = append(p.retired, old)
	p.envoy = e
	p.mu.Unlock()
	p.t.Cleanup(e.Close)
	return nil
}

// sentinelDownAfter is how long Sentinel waits before it fails over a
// master it cannot reach.
const sentinelDownAfter = time.Second

// StartTopology brings up everything for t; cleanups stop it.
func StartTopology(t testing.TB, env stack.Env, opts Options, ledger *Ledger, approvers *Approvers) *Topology {
	t.Helper()
	tp := &Topology{t: t, opts: opts, envoyBin: env.EnvoyBin, MasterName: "idemchaos", Ledger: ledger}

	// Redis: a master, its replica, and two Sentinels watching them.
	master := testutil.StartRedis(t)
	host, port, err := net.SplitHostPort(master.Addr)
	if err != nil {
		t.Fatal(err)
	}
	replica := testutil.StartRedis(t, "--replicaof", host, port)
	tp.Redis = []*testutil.RedisServer{master, replica}
	for range 2 {
		tp.Sentinels = append(tp.Sentinels, testutil.StartRedisSentinelDownAfter(t, tp.MasterName, master.Addr, sentinelDownAfter))
	}
	tp.sentinel = goredis.NewSentinelClient(&goredis.Options{Addr: tp.Sentinels[0]})
	t.Cleanup(func() { _ = tp.sentinel.Close() })
	if err := tp.waitReplicas(1, 30*time.Second); err != nil {
		t.Fatal(err)
	}

	// PostgreSQL: an instance of the run's own (so it can crash and
	// restart) or a fresh database on the shared server, reached by the
	// replicas through a proxy the run can cut.
	if opts.OwnPostgres {
		inst, err := StartPGInstance(t)
		if err != nil {
			t.Fatalf("own PostgreSQL: %v", err)
		}
		tp.PG = inst
		tp.DSN = inst.DSN()
	} else {
		tp.DSN = testutil.CreateDatabase(t)
	}
	proxied, err := proxyDSN(tp.DSN, func(target string) (string, error) {
		p, err := stack.StartTCPProxy(target)
		if err != nil {
			return "", err
		}
		tp.PGProxy = p
		t.Cleanup(p.Close)
		return p.Addr(), nil
	})
	if err != nil {
		t.Fatal(err)
	}

	// The payments upstream, behind the ledger that records every confirm.
	tp.Payments = payments.New(payments.Options{IgnoreIdempotencyKeys: !opts.HonoursKeys})
	ledger.payments = tp.Payments
	ledger.honours = opts.HonoursKeys
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: ledger, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	tp.paymentsAddr = ln.Addr().String()

	key, err := stack.NewSigningKey()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	jwks := filepath.Join(dir, "approvers.jwks")
	if err := os.WriteFile(jwks, approvers.JWKS(), 0o600); err != nil {
		t.Fatal(err)
	}
	for i := range opts.Pods {
		grpcAddr := fmt.Sprintf("127.0.0.1:%d", testutil.FreePort(t))
		adminAddr := fmt.Sprintf("127.0.0.1:%d", testutil.FreePort(t))
		approvalAddr := fmt.Sprintf("127.0.0.1:%d", testutil.FreePort(t))
		cfg, err := tp.replicaConfig(grpcAddr, adminAddr, approvalAddr, approvers.ApprovalBlock(jwks))
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(dir, fmt.Sprintf("idemgate-%d.yaml", i))
		if err := os.WriteFile(path, cfg, 0o600); err != nil {
			t.Fatal(err)
		}
		g := stack.NewIdemgate(stack.IdemgateSpec{
			Bin: env.IdemgateBin, ConfigPath: path, SigningKey: key, DSN: proxied,
			GRPCAddr: grpcAddr, AdminAddr: adminAddr,
		})
		t.Cleanup(g.Stop)
		if err := g.Start(); err != nil {
			t.Fatalf("idemgate %d did not start: %v\n%s", i, err, g.Log())
		}
		bs, err := stack.RenderBootstrap(grpcAddr, tp.paymentsAddr, stack.BootstrapOptions{
			ConfirmRouteTimeout: opts.ConfirmRouteTimeout, ConfirmRetryOn: opts.ConfirmRetryOn,
		})
		if err != nil {
			t.Fatal(err)
		}
		e, err := stack.StartEnvoy(t, env.EnvoyBin, bs)
		if err != nil {
			t.Fatalf("envoy %d did not start: %v", i, err)
		}
		t.Cleanup(e.Close)
		tp.Pods = append(tp.Pods, &Pod{Index: i, Idemgate: g, ApprovalAddr: approvalAddr, envoy: e, bootstrap: bs, t: t, envoyBin: env.EnvoyBin})
	}

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	tp.pool, err = pgxpool.New(ctx, tp.DSN)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(tp.pool.Close)
	return tp
}

// replicaConfig is the shipped idemgate.yaml for one replica: Redis through
// the Sentinels, the run's TTLs and upstream timeout, and the transfer
// operation gated by approval (the approvers' API on approvalAddr).
func (tp *Topology) replicaConfig(grpcAddr, adminAddr, approvalAddr string, approval map[string]any) ([]byte, error) {
	raw, err := stack.RenderIdemgateConfig(stack.ReplicaConfig{
		GRPCAddr: grpcAddr, AdminAddr: adminAddr, RedisAddr: tp.Sentinels[0],
		InFlightTTL: tp.opts.InFlightTTL, IgnoreKeys: !tp.opts.HonoursKeys,
		UpstreamTimeout: tp.opts.ConfirmRouteTimeout, FingerprintTTL: tp.opts.FingerprintTTL,
	})
	if err != nil {
		return nil, err
	}
	doc := map[string]any{}
	if err := yaml.Unmarshal(raw, &doc); err != nil {
		return nil, err
	}
	ttl := doc["ttl"].(map[string]any)
	if tp.opts.TerminalTTL > 0 {
		ttl["terminal"] = tp.opts.TerminalTTL.String()
	}
	if tp.opts.ReplayCacheTTL > 0 {
		ttl["replay_cache"] = tp.opts.ReplayCacheTTL.String()
	}
	redis := doc["store"].(map[string]any)["redis"].(map[string]any)
	redis["mode"] = "sentinel"
	redis["master_name"] = tp.MasterName
	addrs := make([]any, len(tp.Sentinels))
	for i, s := range tp.Sentinels {
		addrs[i] = s
	}
	redis["addrs"] = addrs
	doc["approval_listen"] = approvalAddr
	if tp.opts.ApprovalTTL > 0 {
		approval = maps.Clone(approval)
		approval["ttl"] = tp.opts.ApprovalTTL.String()
	}
	gated := false
	for _, o := range doc["operations"].([]any) {
		if op := o.(map[string]any); op["name"] == "transfer" {
			op["approval"] = approval
			gated = true
		}
	}
	if !gated {
		return nil, errors.New("the shipped config has no transfer operation to gate")
	}
	return yaml.Marshal(doc)
}

// MasterAddr asks Sentinel which server is the master now.
func (tp *Topology) MasterAddr(ctx context.Context) (string, error) {
	addr, err := tp.sentinel.GetMasterAddrByName(ctx, tp.MasterName).Result()
	if err != nil {
		return "", err
	}
	return net.JoinHostPort(addr[0], addr[1]), nil
}

// server returns the RedisServer listening on addr.
func (tp *Topology) server(addr string) *testutil.RedisServer {
	for _, r := range tp.Redis {
		if r.Addr == addr {
			return r
		}
	}
	return nil
}

// waitReplicas waits until Sentinel lists at least n replicas of the master
// that are connected and in sync (a failover needs one).
func (tp *Topology) waitReplicas(n int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		reps, err := tp.sentinel.Replicas(ctx, tp.MasterName).Result()
		cancel()
		ok := 0
		if err == nil {
			for _, r := range reps {
				if r["master-link-status"] == "ok" && !strings.Contains(r["flags"], "down") && !strings.Contains(r["flags"], "disconnected") {
					ok++
				}
			}
		}
		if ok >= n {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("sentinel saw %d healthy replicas, want %d (err %v)", ok, n, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Rows reads every idempotency_record row directly (not through the proxy).
func (tp *Topology) Rows(ctx context.Context) (map[string]Row, error) {
	rows, err := tp.pool.Query(ctx, `SELECT idem_key, state, lease_until, result_status, result_body FROM idempotency_record`)
	if err != nil {
		return nil, fmt.Errorf("failed to read the records: %w", err)
	}
	defer rows.Close()
	out := map[string]Row{}
	for rows.Next() {
		var r Row
		if err := rows.Scan(&r.Key, &r.State, &r.LeaseUntil, &r.ResultStatus, &r.ResultBody); err != nil {
			return nil, err
		}
		r.Key = strings.TrimSpace(r.Key)
		out[r.Key] = r
	}
	return out, rows.Err()
}

// Approvals reads every approval and its events directly from PostgreSQL.
func (tp *Topology) Approvals(ctx context.Context) ([]ApprovalRow, error) {
	rows, err := tp.pool.Query(ctx, `SELECT approval_id, idem_key, operation, requester, state, required FROM approval ORDER BY created_at, approval_id`)
	if err != nil {
		return nil, fmt.Errorf("failed to read the approvals: %w", err)
	}
	var out []ApprovalRow
	index := map[string]int{}
	for rows.Next() {
		var a ApprovalRow
		if err := rows.Scan(&a.ID, &a.Key, &a.Operation, &a.Requester, &a.State, &a.Required); err != nil {
			rows.Close()
			return nil, err
		}
		a.Key = strings.TrimSpace(a.Key)
		index[a.ID] = len(out)
		out = append(out, a)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	ev, err := tp.pool.Query(ctx, `SELECT approval_id, kind, coalesce(actor, ''), at, acr, auth_time FROM approval_event ORDER BY event_id`)
	if err != nil {
		return nil, fmt.Errorf("failed to read the approval events: %w", err)
	}
	defer ev.Close()
	for ev.Next() {
		var id string
		var e ApprovalEvent
		if err := ev.Scan(&id, &e.Kind, &e.Actor, &e.At, &e.ACR, &e.AuthTime); err != nil {
			return nil, err
		}
		if i, ok := index[id]; ok {
			out[i].Events = append(out[i].Events, e)
		}
	}
	return out, ev.Err()
}

// proxyDSN rewrites dsn's host:port to what start returns for it.
func proxyDSN(dsn string, start func(target string) (string, error)) (string, error) {
	rest, ok := strings.CutPrefix(dsn, "postgres://")
	if !ok {
		return "", fmt.Errorf("unexpected DSN form %q", dsn)
	}
	userinfo, hostAndPath, ok := strings.Cut(rest, "@")
	if !ok {
		return "", errors.New("DSN has no user")
	}
	hostport, path, _ := strings.Cut(hostAndPath, "/")
	addr, err := start(hostport)
	if err != nil {
		return "", err
	}
	return "postgres://" + userinfo + "@" + addr + "/" + path, nil
}
