package mainlib

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/idemgate/idemgate/fingerprint"
	"github.com/idemgate/idemgate/internal/testutil"
	"github.com/idemgate/idemgate/state"
	"github.com/idemgate/idemgate/state/postgres"
)

const testKey = "dGVzdC1rZXktazEtbm90LWEtc2VjcmV0LTMyYnl0ZXM="

func writeConfig(t *testing.T, store string) string {
	t.Helper()
	t.Setenv("IDEMGATE_KEY_K1", testKey)
	path := filepath.Join(t.TempDir(), "idemgate.yaml")
	cfg := `signing: {active_key: k1, keys: {k1: {env: IDEMGATE_KEY_K1}}}
drain: {period: 300ms, timeout: 2s}
` + store + `
operations:
  - name: transfer
    scope: payments.transfer
    preview: {method: POST, path: /v1/transfers/preview}
    confirm: {method: POST, path: /v1/transfers/confirm}
    status:  {method: POST, path: /v1/transfers/status}
    preview_tool: transfer_preview
    status_tool: transfer_status
    params: [amount]
`
	require.NoError(t, os.WriteFile(path, []byte(cfg), 0o600))
	return path
}

func TestCommands(t *testing.T) {
	var out, errOut bytes.Buffer
	require.NoError(t, Main(t.Context(), []string{"keygen"}, &out, &errOut))
	key, err := fingerprint.ParseKey(strings.TrimSpace(out.String()))
	require.NoError(t, err)
	require.Len(t, key, 32)

	out.Reset()
	require.NoError(t, Main(t.Context(), []string{"help"}, &out, &errOut))
	require.Contains(t, out.String(), "idemgate serve --config FILE")

	require.ErrorIs(t, Main(t.Context(), nil, &out, &errOut), ErrUsage)
	require.ErrorIs(t, Main(t.Context(), []string{"frobnicate"}, &out, &errOut), ErrUsage)
	// The demo is its own command (cmd/idemgate-demo), not a subcommand here.
	require.ErrorIs(t, Main(t.Context(), []string{"demo"}, &out, &errOut), ErrUsage)
	require.ErrorIs(t, Main(t.Context(), []string{"serve"}, &out, &errOut), ErrUsage)
	require.ErrorIs(t, Main(t.Context(), []string{"ops", "resolve", "abc", "--dsn", "x", "--done", "--failed", "--status", "200"}, &out, &errOut), ErrUsage)
}

func TestCheckConfig(t *testing.T) {
	path := writeConfig(t, "")
	var out, errOut bytes.Buffer
	require.NoError(t, Main(t.Context(), []string{"check-config", "--config", path}, &out, &errOut))
	require.Contains(t, out.String(), "config OK: "+path)
	require.Contains(t, out.String(), "store:      memory")
	require.Contains(t, out.String(), "keys:       k1 (env IDEMGATE_KEY_K1) active")
	require.NotContains(t, out.String(), testKey)

	out.Reset()
	bad := "../settings/testdata/bad/many_problems.yaml"
	t.Setenv("IDEMGATE_TEST_KEY_K1", testKey)
	err := Main(t.Context(), []string{"check-config", "--config", bad}, &out, &errOut)
	require.EqualError(t, err, bad+": 4 problem(s)")
	lines := strings.Split(strings.TrimSpace(errOut.String()), "\n")
	require.Len(t, lines, 4)
	require.Equal(t, bad+`:1:1: grpc_listn: unknown key "grpc_listn" (known keys: admin_listen, approval_listen, approval_plaintext_remote, approval_tls, attestation, drain, grpc_listen, grpc_plaintext_remote, grpc_tls, limits, log, messages, operations, security, signing, store, subject, tracing, ttl)`, lines[0])
	require.Equal(t, bad+`:7:22: messages.language: unknown language "fr" (known: en, zh)`, lines[3])

	// Warnings are printed and do not fail the check.
	errOut.Reset()
	warn := "../settings/testdata/warn/in_flight_short.yaml"
	require.NoError(t, Main(t.Context(), []string{"check-config", "--config", warn}, &out, &errOut))
	require.Contains(t, errOut.String(), "warning: "+warn+":18:23: operations[0].upstream_timeout: ttl.in_flight (30s) should exceed")
}

// Every idemgate config shipped in the repository passes check-config
// --offline, where the secrets it names (key files, DSN and password
// variables) do not exist.
func TestCheckConfigOfflineAcceptsTheShippedConfigs(t *testing.T) {
	t.Setenv("IDEMGATE_KEY_K1", "") // whatever the developer's shell holds
	t.Setenv("IDEMGATE_POSTGRES_DSN", "")
	for _, path := range []string{"../../../envoy/idemgate.yaml", "../../../k8s/base/idemgate.yaml"} {
		var out, errOut bytes.Buffer
		require.Error(t, Main(t.Context(), []string{"check-config", "--config", path}, &out, &errOut), path+" needs its secrets without --offline")
		out.Reset()
		errOut.Reset()
		require.NoError(t, Main(t.Context(), []string{"check-config", "--offline", "--config", path}, &out, &errOut), errOut.String())
		require.Contains(t, out.String(), "config OK: "+path)
		require.Contains(t, out.String(), "(not read: offline check)")
		require.Empty(t, errOut.String(), "no warnings")
	}
}

func TestServeRefusesABadConfigListingEveryProblem(t *testing.T) {
	var errOut bytes.Buffer
	t.Setenv("IDEMGATE_TEST_KEY_K1", testKey)
	bad := "../settings/testdata/bad/many_problems.yaml"
	err := Main(t.Context(), []string{"serve", "--config", bad}, io.Discard, &errOut)
	require.Error(t, err)
	require.Equal(t, 5, strings.Count(err.Error(), "\n")+1, err.Error()) // header line + 4 problems
	require.NotContains(t, errOut.String(), "ready")
}

// serveRun is idemgate serve running in-process, started by goServe.
type serveRun struct {
	stderr *testutil.SyncBuffer
	done   chan struct{} // closed when Main returned
	err    error         // Main's result, once done is closed
}

// goServe runs idemgate serve with args until ctx is cancelled.
func goServe(ctx context.Context, args ...string) *serveRun {
	r := &serveRun{stderr: &testutil.SyncBuffer{}, done: make(chan struct{})}
	go func() {
		r.err = runServe(ctx, r.stderr, args...)
		close(r.done)
	}()
	return r
}

// wait returns Main's result once it has returned.
func (r *serveRun) wait() error {
	<-r.done
	return r.err
}

// servingLine is serve's log line naming the addresses it listens on.
var servingLine = regexp.MustCompile(`msg="idemgate serving" .*\bgrpc=(\S+) admin=(\S+)`)

// awaitReady waits for serve's ready line and returns the gRPC and admin
// addresses it serves: given port 0, serve picks them itself, so no other
// process can take a port between choosing and binding it (the test
// packages run in parallel). If serve returns first, the test fails with
// its error and output.
func (r *serveRun) awaitReady(t *testing.T) (grpcAddr, adminAddr string) {
	t.Helper()
	deadline := time.After(30 * time.Second)
	for !strings.Contains(r.stderr.String(), "\nready\n") {
		select {
		case <-r.done:
			t.Fatalf("serve returned before it was ready: %v; stderr:\n%s", r.err, r.stderr.String())
		case <-deadline:
			t.Fatalf("serve printed no ready line in 30 s; stderr:\n%s", r.stderr.String())
		case <-time.After(10 * time.Millisecond):
		}
	}
	m := servingLine.FindStringSubmatch(r.stderr.String())
	require.NotNil(t, m, "no serving line: %s", r.stderr.String())
	return m[1], m[2]
}

// server is idemgate serve running in-process on loopback ports of its
// choosing, stopped when the test ends.
type server struct {
	*serveRun
	grpcAddr, adminAddr string
	cancel              context.CancelFunc
}

func startServe(t *testing.T, path string) *server {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	s := &server{serveRun: goServe(ctx, "--config", path, "--grpc-listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"), cancel: cancel}
	t.Cleanup(func() {
		cancel()
		select {
		case <-s.done:
		case <-time.After(10 * time.Second):
		}
	})
	s.grpcAddr, s.adminAddr = s.awaitReady(t)
	return s
}

func (s *server) get(t *testing.T, path string) (int, string) {
	t.Helper()
	resp, err := http.Get("http://" + s.adminAddr + path)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func (s *server) conn(t *testing.T) *grpc.ClientConn {
	t.Helper()
	c, err := grpc.NewClient(s.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	return c
}

func headers(kv ...string) *corev3.HeaderMap {
	hm := &corev3.HeaderMap{}
	for i := 0; i < len(kv); i += 2 {
		hm.Headers = append(hm.Headers, &corev3.HeaderValue{Key: kv[i], RawValue: []byte(kv[i+1])})
	}
	return hm
}

// stream sends msgs one at a time like Envoy and returns the replies,
// stopping at an ImmediateResponse.
func stream(t *testing.T, conn *grpc.ClientConn, msgs ...*extprocv3.ProcessingRequest) []*extprocv3.ProcessingResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	st, err := extprocv3.NewExternalProcessorClient(conn).Process(ctx)
	require.NoError(t, err)
	var out []*extprocv3.ProcessingResponse
	for _, m := range msgs {
		require.NoError(t, st.Send(m))
		resp, err := st.Recv()
		require.NoError(t, err)
		out = append(out, resp)
		if resp.GetImmediateResponse() != nil {
			break
		}
	}
	_ = st.CloseSend()
	return out
}

func reqHeaders(path string) *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
		Headers: headers(":method", "POST", ":path", path, "x-idemgate-subject", "alice", "x-request-id", "t-1"),
	}}}
}

func reqBody(b string) *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: []byte(b), EndOfStream: true}}}
}

func respHeaders(status string) *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{
		Headers: headers(":status", status, "content-type", "application/json"),
	}}}
}

func respBody(b string) *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{Body: []byte(b), EndOfStream: true}}}
}

func previewFingerprint(t *testing.T, conn *grpc.ClientConn) string {
	t.Helper()
	replies := stream(t, conn, reqHeaders("/v1/transfers/preview"), reqBody(`{"amount":1}`), respHeaders("200"), respBody(`{"quote":1}`))
	require.Len(t, replies, 4)
	var m map[string]any
	require.NoError(t, json.Unmarshal(replies[3].GetResponseBody().GetResponse().GetBodyMutation().GetBody(), &m))
	return m["fingerprint"].(string)
}

// confirm returns the reply to the confirm body: an ImmediateResponse or
// the reply that lets the request through.
func confirm(t *testing.T, conn *grpc.ClientConn, fp string) *extprocv3.ProcessingResponse {
	t.Helper()
	replies := stream(t, conn, reqHeaders("/v1/transfers/confirm"), reqBody(fmt.Sprintf(`{"amount":1,"fingerprint":%q}`, fp)))
	require.Len(t, replies, 2)
	return replies[1]
}

func healthStatus(t *testing.T, conn *grpc.ClientConn) healthpb.HealthCheckResponse_ServingStatus {
	t.Helper()
	resp, err := healthpb.NewHealthClient(conn).Check(t.Context(), &healthpb.HealthCheckRequest{Service: "envoy.service.ext_proc.v3.ExternalProcessor"})
	require.NoError(t, err)
	return resp.GetStatus()
}

func TestServeMemoryStoreAndDrain(t *testing.T) {
	s := startServe(t, writeConfig(t, ""))
	require.Contains(t, s.stderr.String(), "RUNNING ON THE EMBEDDED MEMORY STORE")
	code, _ := s.get(t, "/healthz")
	require.Equal(t, 200, code)
	require.Eventually(t, func() bool { code, _ := s.get(t, "/readyz"); return code == 200 }, 5*time.Second, 20*time.Millisecond)
	conn := s.conn(t)
	require.Equal(t, healthpb.HealthCheckResponse_SERVING, healthStatus(t, conn))

	fp := previewFingerprint(t, conn)
	reply := confirm(t, conn, fp)
	require.Nil(t, reply.GetImmediateResponse())
	set := reply.GetRequestBody().GetResponse().GetHeaderMutation().GetSetHeaders()
	require.Len(t, set, 1)
	require.Equal(t, "idempotency-key", set[0].GetHeader().GetKey())

	_, metrics := s.get(t, "/metrics")
	require.Contains(t, metrics, `idemgate_decisions_total{operation="transfer",outcome="acquired",route="confirm"} 1`)
	require.Contains(t, metrics, `idemgate_store_call_duration_seconds_count{backend="memory",op="acquire",result="ok"} 1`)
	require.Contains(t, metrics, "idemgate_open_streams")
	require.Contains(t, metrics, "go_goroutines")

	// SIGTERM: NOT_SERVING and not ready during the drain period, still
	// answering streams; then Main returns.
	s.cancel()
	require.Eventually(t, func() bool { return healthStatus(t, conn) == healthpb.HealthCheckResponse_NOT_SERVING }, 2*time.Second, 10*time.Millisecond)
	code, body := s.get(t, "/readyz")
	require.Equal(t, 503, code)
	require.Contains(t, body, "draining")
	require.NotEmpty(t, previewFingerprint(t, conn), "streams are still served while draining")
	select {
	case <-s.done:
		require.NoError(t, s.err)
	case <-time.After(10 * time.Second):
		t.Fatal("serve did not stop")
	}
	require.Contains(t, s.stderr.String(), "msg=stopped")
}

// forwarder relays TCP connections on addr to target once started: a
// PostgreSQL that is down at idemgate's start and comes up later.
func forwarder(t *testing.T, addr, target string) {
	t.Helper()
	lis, err := net.Listen("tcp", addr)
	require.NoError(t, err)
	t.Cleanup(func() { lis.Close() })
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				u, err := net.Dial("tcp", target)
				if err != nil {
					return
				}
				defer u.Close()
				go func() { _, _ = io.Copy(u, c) }()
				_, _ = io.Copy(c, u)
			}()
		}
	}()
}

func TestServeStartsWithPostgresDownAndBecomesReady(t *testing.T) {
	dsn := testutil.CreateDatabase(t)
	pc, err := pgx.ParseConfig(dsn)
	require.NoError(t, err)
	proxy := fmt.Sprintf("127.0.0.1:%d", testutil.FreePort(t))
	proxied := strings.Replace(dsn, fmt.Sprintf("%s:%d", pc.Host, pc.Port), proxy, 1) + "&connect_timeout=1"
	path := writeConfig(t, fmt.Sprintf("store: {postgres: {dsn: %q}}", proxied))

	s := startServe(t, path)
	conn := s.conn(t)
	code, body := s.get(t, "/readyz")
	require.Equal(t, 503, code)
	require.Contains(t, body, "postgres migrations not applied")
	require.NotContains(t, body, "postgres@", "no DSN in the readiness answer")
	require.Equal(t, healthpb.HealthCheckResponse_SERVING, healthStatus(t, conn), "Envoy keeps sending streams; idemgate answers itself")

	fp := previewFingerprint(t, conn)
	im := confirm(t, conn, fp).GetImmediateResponse()
	require.NotNil(t, im, "never fail open")
	require.Equal(t, 503, int(im.GetStatus().GetCode()))
	require.Contains(t, string(im.GetBody()), `"status":"temporarily_unavailable"`)

	forwarder(t, proxy, fmt.Sprintf("%s:%d", pc.Host, pc.Port))
	require.Eventually(t, func() bool { code, _ := s.get(t, "/readyz"); return code == 200 }, 20*time.Second, 100*time.Millisecond)
	require.Contains(t, s.stderr.String(), "store ready")
	reply := confirm(t, conn, fp)
	require.Nil(t, reply.GetImmediateResponse(), "acquired once PostgreSQL answers")
	require.NotNil(t, reply.GetRequestBody())
}

// The tiered store over a Redis that speaks only TLS and asks for a client
// certificate: serve becomes ready and a confirm takes its fast path.
func TestServeTieredOverRedisTLS(t *testing.T) {
	redisSrv, files := testutil.StartRedisTLS(t, testutil.RequireClientCerts)
	dsn := testutil.CreateDatabase(t)
	path := writeConfig(t, fmt.Sprintf(`store:
  redis:
    addrs: [%q]
    tls: {ca_file: %q, cert_file: %q, key_file: %q}
  postgres: {dsn: %q}`, redisSrv.Addr, files.CAFile, files.ClientCertFile, files.ClientKeyFile, dsn))

	s := startServe(t, path)
	require.Eventually(t, func() bool { code, _ := s.get(t, "/readyz"); return code == 200 }, 20*time.Second, 50*time.Millisecond)
	conn := s.conn(t)
	reply := confirm(t, conn, previewFingerprint(t, conn))
	require.Nil(t, reply.GetImmediateResponse())
	require.NotNil(t, reply.GetRequestBody())
	_, metrics := s.get(t, "/metrics")
	for _, line := range strings.Split(metrics, "\n") {
		require.False(t, strings.HasPrefix(line, "idemgate_store_fallbacks_total{"), "Redis answered over TLS, so no fallback to PostgreSQL only: %s", line)
	}
	require.Contains(t, metrics, `idemgate_decisions_total{operation="transfer",outcome="acquired",route="confirm"} 1`)
}

func TestMigrateAndOps(t *testing.T) {
	dsn := testutil.CreateDatabase(t)
	var out, errOut bytes.Buffer
	require.NoError(t, Main(t.Context(), []string{"migrate", "--dsn", dsn}, &out, &errOut))
	require.Equal(t, "migrations applied\n", out.String())

	// One confirm whose upstream outcome nobody knows.
	pg, err := postgres.New(t.Context(), postgres.Options{DSN: dsn})
	require.NoError(t, err)
	defer pg.Close()
	nonce, err := fingerprint.NewNonce()
	require.NoError(t, err)
	ans, err := pg.Acquire(t.Context(), state.AcquireRequest{Key: nonce, Scope: "payments.transfer", SubjectTag: "tag", ParamHash: "hash",
		Owner: "gw-1", Lease: time.Minute, Retention: time.Hour})
	require.NoError(t, err)
	_, err = pg.MarkUnknown(t.Context(), state.Claim{Key: nonce, Owner: "gw-1", Fence: ans.Record.Fence})
	require.NoError(t, err)

	out.Reset()
	require.NoError(t, Main(t.Context(), []string{"ops", "list", "--state", "UNKNOWN", "--older-than", "0s", "--dsn", dsn}, &out, &errOut))
	require.Contains(t, out.String(), "NONCE")
	require.Contains(t, out.String(), nonce+"  UNKNOWN  payments.transfer")

	out.Reset()
	require.NoError(t, Main(t.Context(), []string{"ops", "list", "--state", "IN_FLIGHT", "--dsn", dsn}, &out, &errOut))
	require.NotContains(t, out.String(), nonce)

	out.Reset()
	require.NoError(t, Main(t.Context(), []string{"ops", "show", nonce, "--dsn", dsn}, &out, &errOut))
	require.Contains(t, out.String(), "state        UNKNOWN")

	bodyFile := filepath.Join(t.TempDir(), "result.json")
	require.NoError(t, os.WriteFile(bodyFile, []byte(`{"transfer_id":"tr_checked_by_hand"}`), 0o600))
	out.Reset()
	require.ErrorIs(t, Main(t.Context(), []string{"ops", "resolve", nonce, "--done", "--status", "201", "--body", "@" + bodyFile, "--dsn", dsn}, &out, &errOut), ErrUsage,
		"--as and --reason are required")
	require.NoError(t, Main(t.Context(), []string{"ops", "resolve", nonce, "--done", "--status", "201", "--body", "@" + bodyFile,
		"--as", "ops-carol", "--reason", "bank statement shows tr_checked_by_hand", "--dsn", dsn}, &out, &errOut))
	require.Equal(t, "resolved "+nonce+" as DONE (201)\n", out.String())

	rec, found, err := pg.Get(t.Context(), nonce)
	require.NoError(t, err)
	require.True(t, found)
	require.Equal(t, state.Done, rec.State)
	require.Equal(t, `{"transfer_id":"tr_checked_by_hand"}`, string(rec.Result.Body))
	require.Equal(t, "application/json", rec.Result.ContentType())

	out.Reset()
	require.NoError(t, Main(t.Context(), []string{"ops", "show", nonce, "--dsn", dsn}, &out, &errOut))
	require.Regexp(t, `resolved +\S+ as DONE \(201\) by ops-carol: bank statement shows tr_checked_by_hand`, out.String())

	err = Main(t.Context(), []string{"ops", "resolve", nonce, "--failed", "--status", "422", "--body", "{}", "--as", "ops-carol", "--reason", "again", "--dsn", dsn}, &out, &errOut)
	require.EqualError(t, err, "record "+nonce+" is already DONE; left unchanged")
	missing, _ := fingerprint.NewNonce()
	err = Main(t.Context(), []string{"ops", "show", missing, "--dsn", dsn}, &out, &errOut)
	require.EqualError(t, err, "no record "+missing)
}
