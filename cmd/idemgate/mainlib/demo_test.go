package mainlib

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"sigs.k8s.io/yaml"

	"github.com/idemgate/idemgate/envoy"
	"github.com/idemgate/idemgate/extproc/config"
	"github.com/idemgate/idemgate/fingerprint"
	"github.com/idemgate/idemgate/internal/testutil"
)

// runningDemo is `idemgate demo` running in-process.
type runningDemo struct {
	stdout, stderr *testutil.SyncBuffer
	cancel         context.CancelFunc
	done           chan struct{} // closed when Main returned
	err            error
}

// startDemoMain runs Main(demo args...) and waits until it printed its
// output (one write, made once everything serves) or failed.
func startDemoMain(t *testing.T, args ...string) *runningDemo {
	t.Helper()
	d := &runningDemo{stdout: &testutil.SyncBuffer{}, stderr: &testutil.SyncBuffer{}, done: make(chan struct{})}
	ctx, cancel := context.WithCancel(context.Background())
	d.cancel = cancel
	go func() {
		d.err = Main(ctx, append([]string{"demo"}, args...), d.stdout, d.stderr)
		close(d.done)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-d.done:
		case <-time.After(15 * time.Second):
			t.Error("demo did not stop within 15s of its context being cancelled")
		}
	})
	require.Eventually(t, func() bool {
		select {
		case <-d.done:
			return true
		default:
			return d.stdout.String() != ""
		}
	}, 20*time.Second, 10*time.Millisecond, "the demo printed nothing; stderr:\n%s", d.stderr.String())
	select {
	case <-d.done:
		t.Fatalf("demo stopped at start: %v\nstderr:\n%s", d.err, d.stderr.String())
	default:
	}
	return d
}

// stop cancels the demo and returns what Main returned.
func (d *runningDemo) stop(t *testing.T) error {
	t.Helper()
	d.cancel()
	select {
	case <-d.done:
		return d.err
	case <-time.After(15 * time.Second):
		t.Fatalf("demo did not stop within 15s; stderr:\n%s", d.stderr.String())
		return nil
	}
}

// requireCurl skips the test when curl, which the printed commands use, is missing.
func requireCurl(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("curl"); err != nil {
		t.Skip("skipping: curl is not installed, and the demo's printed commands are curl commands")
	}
}

var stepComment = regexp.MustCompile(`^# ([0-9]+[a-z]?)\. `)

// runSteps runs the demo's stdout with sh, as a user pasting it would, and
// returns each step's output (keyed "1", "2", "3a", ...) and the step order.
func runSteps(t *testing.T, script string) (map[string]string, []string) {
	t.Helper()
	const marker = "@@@ step "
	var runner strings.Builder
	var order []string
	for _, line := range strings.Split(script, "\n") {
		if m := stepComment.FindStringSubmatch(line); m != nil {
			order = append(order, m[1])
			fmt.Fprintf(&runner, "echo '%s%s'\n", marker, m[1])
		}
		runner.WriteString(line + "\n")
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "sh", "-s")
	cmd.Stdin = strings.NewReader(runner.String())
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "sh failed:\n%s", out)

	steps := map[string]string{}
	parts := strings.Split(string(out), marker)
	require.Empty(t, strings.TrimSpace(parts[0]), "output before the first step (the preamble must be silent)")
	for _, p := range parts[1:] {
		label, text, _ := strings.Cut(p, "\n")
		steps[label] = text
	}
	return steps, order
}

// curlResponse parses `curl -i` output: the response, and what the step
// printed after its body.
type curlResponse struct {
	status int
	header http.Header
	body   []byte
	rest   string
}

func parseCurl(t *testing.T, step, text string) curlResponse {
	t.Helper()
	r := bufio.NewReader(strings.NewReader(text))
	resp, err := http.ReadResponse(r, nil)
	require.NoError(t, err, "step %s did not print an HTTP response:\n%s", step, text)
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	rest, err := io.ReadAll(r)
	require.NoError(t, err)
	return curlResponse{status: resp.StatusCode, header: resp.Header, body: body, rest: string(rest)}
}

// envelope decodes a JSON body for assertions.
func (c curlResponse) json(t *testing.T) map[string]any {
	t.Helper()
	var m map[string]any
	require.NoError(t, json.Unmarshal(c.body, &m), "body is not a JSON object: %s", c.body)
	return m
}

func TestDemoPrintedCommandsShowWhatTheySay(t *testing.T) {
	requireCurl(t)
	d := startDemoMain(t, "--listen", "127.0.0.1:0")
	script := d.stdout.String()
	steps, order := runSteps(t, script)
	require.Equal(t, []string{"1", "2", "3a", "3b", "4", "5", "6", "7", "8"}, order, "the steps, in the order the brief of the demo lists them")

	for _, step := range []string{"2", "3a", "3b", "4", "5", "6", "7"} {
		require.Equal(t, "\n", parseCurl(t, step, steps[step]).rest, "step %s prints its response and nothing else", step)
	}

	// Every step's comment says what to expect; each block below checks it.
	var fp, nonce string
	t.Run("1 preview injects the fingerprint", func(t *testing.T) {
		r := parseCurl(t, "1", steps["1"])
		require.Equal(t, http.StatusOK, r.status)
		body := r.json(t)
		require.Equal(t, "quoted", body["status"])
		require.Equal(t, false, body["executed"])
		fp, _ = body["fingerprint"].(string)
		require.NotEmpty(t, fp)
		require.Equal(t, fp, r.header.Get("Idempotency-Fingerprint"))
		exp, err := time.Parse(time.RFC3339, body["fingerprint_expires_at"].(string))
		require.NoError(t, err)
		require.WithinDuration(t, time.Now().Add(15*time.Minute), exp, time.Minute, "ttl.fingerprint of envoy/idemgate.yaml")
		require.Equal(t, "\nFP="+fp+"\n", r.rest, "the sed extraction printed the injected fingerprint")
	})
	require.NotEmpty(t, fp)

	t.Run("2 confirm executes once", func(t *testing.T) {
		r := parseCurl(t, "2", steps["2"])
		require.Equal(t, http.StatusOK, r.status)
		body := r.json(t)
		require.Equal(t, "tr_000001", body["transfer_id"])
		require.Equal(t, "completed", body["status"])
		require.Empty(t, r.header.Get("Idempotent-Replayed"), "the upstream's own answer, not a replay")
	})

	for _, step := range []string{"3a", "3b"} {
		t.Run(step+" retry is replayed", func(t *testing.T) {
			r := parseCurl(t, step, steps[step])
			require.Equal(t, http.StatusOK, r.status)
			body := r.json(t)
			require.Equal(t, "already_completed", body["status"])
			require.Equal(t, "tr_000001", body["result_ref"])
			require.Equal(t, "tr_000001", body["result"].(map[string]any)["transfer_id"])
			require.Equal(t, "true", r.header.Get("Idempotent-Replayed"))
			require.Regexp(t, `^[0-9a-f]{32}$`, r.header.Get("Idempotency-Key"))
			if nonce == "" {
				nonce = r.header.Get("Idempotency-Key")
			}
			require.Equal(t, nonce, r.header.Get("Idempotency-Key"))
		})
	}

	t.Run("4 status is completed with the result", func(t *testing.T) {
		r := parseCurl(t, "4", steps["4"])
		require.Equal(t, http.StatusOK, r.status)
		body := r.json(t)
		require.Equal(t, "completed", body["status"])
		require.Equal(t, "tr_000001", body["result"].(map[string]any)["transfer_id"])
	})

	t.Run("5 drifted amount is params_changed", func(t *testing.T) {
		r := parseCurl(t, "5", steps["5"])
		require.Equal(t, http.StatusUnprocessableEntity, r.status)
		body := r.json(t)
		require.Equal(t, "params_changed", body["status"])
		require.Equal(t, []any{"amount"}, body["changed_fields"])
		require.Contains(t, d.stderr.String(), "event=security_alert reason=params_changed operation=transfer nonce="+nonce)
	})

	t.Run("6 expired fingerprint is fingerprint_expired", func(t *testing.T) {
		r := parseCurl(t, "6", steps["6"])
		require.Equal(t, http.StatusGone, r.status)
		require.Equal(t, "fingerprint_expired", r.json(t)["status"])
	})

	t.Run("7 bob with alice's fingerprint is fingerprint_subject_mismatch", func(t *testing.T) {
		r := parseCurl(t, "7", steps["7"])
		require.Equal(t, http.StatusForbidden, r.status)
		require.Equal(t, "fingerprint_subject_mismatch", r.json(t)["status"])
		require.Contains(t, d.stderr.String(), "event=security_alert reason=fingerprint_subject_mismatch operation=transfer nonce="+nonce)
	})

	t.Run("8 the payments API executed exactly once, under idemgate's key", func(t *testing.T) {
		var stats struct {
			Executions      int            `json:"executions"`
			ExecutionsByKey map[string]int `json:"executions_by_key"`
			Replays         int            `json:"replays"`
		}
		require.NoError(t, json.Unmarshal([]byte(steps["8"]), &stats), steps["8"])
		require.Equal(t, 1, stats.Executions)
		require.Equal(t, map[string]int{nonce: 1}, stats.ExecutionsByKey)
		require.Zero(t, stats.Replays, "idemgate answered the retries; they never reached the upstream")
		require.Equal(t, 1, strings.Count(d.stderr.String(), `msg="payments: executed transfer"`))
	})

	require.NoError(t, d.stop(t))
	require.Contains(t, d.stderr.String(), `msg="demo stopped"`)
}

func TestDemoFingerprintExtraction(t *testing.T) {
	const tok = "eyJ2IjoxfQ.AbC-_09"
	for _, tc := range []struct {
		name, input, want string
	}{
		{"compact body after curl -i headers",
			"HTTP/1.1 200 OK\r\nIdempotency-Fingerprint: " + tok + "\r\n\r\n" + `{"quote_id":"q_1","fingerprint":"` + tok + `","fingerprint_expires_at":"2026-01-01T00:00:00Z"}`, tok},
		{"expiry first", `{"fingerprint_expires_at":"2026-01-01T00:00:00Z","fingerprint":"` + tok + `"}`, tok},
		{"spaces around the colon", `{"a": 1, "fingerprint" : "` + tok + `", "b": "x"}`, tok},
		{"only the header carries it (non-JSON body)", "HTTP/1.1 200 OK\r\nIdempotency-Fingerprint: " + tok + "\r\n\r\nnot json", ""},
		{"no fingerprint", `{"status":"invalid_request"}`, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.CommandContext(t.Context(), "sh", "-c", `printf '%s\n' "$IN" | `+fingerprintSed)
			cmd.Env = append(os.Environ(), "IN="+tc.input)
			out, err := cmd.Output()
			require.NoError(t, err)
			require.Equal(t, tc.want, strings.TrimSuffix(string(out), "\n"))
		})
	}
}

func TestDemoConfigIsTheShippedOneWithTheMemoryStore(t *testing.T) {
	env := map[string]string{demoKeyEnv: testKey, "IDEMGATE_POSTGRES_DSN": "postgres://unused@127.0.0.1:1/x"}
	lookup := func(name string) (string, bool) { v, ok := env[name]; return v, ok }
	shipped, _, err := config.Parse("envoy/idemgate.yaml", envoy.IdemgateYAML(), ".", config.Options{LookupEnv: lookup})
	require.NoError(t, err)
	demoRT, _, keySource, err := demoConfig(lookup)
	require.NoError(t, err)
	require.Equal(t, "from "+demoKeyEnv, keySource)

	require.Equal(t, "tiered", shipped.Store.Backend())
	require.Equal(t, "memory", demoRT.Store.Backend())
	require.Equal(t, config.LogSettings{Level: slog.LevelInfo, Format: "text"}, demoRT.Log)
	require.Zero(t, demoRT.Drain.Period)
	require.Equal(t, shipped.Subject, demoRT.Subject)
	require.Equal(t, shipped.TTL, demoRT.TTL)
	require.Equal(t, shipped.Limits, demoRT.Limits)
	require.Equal(t, shipped.Language, demoRT.Language)
	require.Len(t, demoRT.Operations, len(shipped.Operations))
	for i, want := range shipped.Operations {
		got := demoRT.Operations[i]
		require.Equal(t, want.Name, got.Name)
		require.Equal(t, want.Scope, got.Scope)
		require.Equal(t, want.Preview, got.Preview)
		require.Equal(t, want.Confirm, got.Confirm)
		require.Equal(t, want.Status, got.Status)
		require.Equal(t, want.PreviewTool, got.PreviewTool)
		require.Equal(t, want.StatusTool, got.StatusTool)
		require.Equal(t, want.Params, got.Params)
		require.Equal(t, want.FingerprintField, got.FingerprintField)
		require.Equal(t, want.ResultRefPath, got.ResultRefPath)
		require.Equal(t, want.DownstreamHeader, got.DownstreamHeader)
		require.Equal(t, want.Replay, got.Replay)
		require.Equal(t, want.UpstreamTimeout, got.UpstreamTimeout)
		require.Equal(t, want.UpstreamRetries, got.UpstreamRetries)
		require.Equal(t, want.PollAfter, got.PollAfter)
	}

	// With IDEMGATE_KEY_K1 set, the demo signs with that key: the expired
	// fingerprint it prints verifies with the shipped config's ring.
	exp := time.Now().Add(-time.Minute)
	token, err := expiredFingerprint(demoRT, "alice", exp)
	require.NoError(t, err)
	op := shipped.Operations[0]
	claims, err := shipped.Keys.Verify(token, fingerprint.Expect{Subject: "alice", Scope: op.Scope, AllowExpired: true}, time.Now())
	require.NoError(t, err)
	require.Equal(t, exp.Unix(), claims.Expiry)
	_, err = shipped.Keys.Verify(token, fingerprint.Expect{Subject: "alice", Scope: op.Scope}, time.Now())
	reason, _ := fingerprint.ReasonOf(err)
	require.Equal(t, fingerprint.ReasonExpired, reason)

	// Without it, a key is generated for the run.
	delete(env, demoKeyEnv)
	generated, _, keySource, err := demoConfig(lookup)
	require.NoError(t, err)
	require.Contains(t, keySource, "generated for this run")
	token, err = expiredFingerprint(generated, "alice", exp)
	require.NoError(t, err)
	_, err = shipped.Keys.Verify(token, fingerprint.Expect{Subject: "alice", Scope: op.Scope, AllowExpired: true}, time.Now())
	reason, _ = fingerprint.ReasonOf(err)
	require.Equal(t, fingerprint.ReasonBadMAC, reason, "a fresh key, not the one in the environment of the other run")
}

// composePaymentsCommand is the payments service's command in docker-compose.yaml.
func composePaymentsCommand(t *testing.T) []string {
	t.Helper()
	data, err := os.ReadFile("../../../docker-compose.yaml")
	require.NoError(t, err)
	var compose struct {
		Services map[string]struct {
			Command []string `json:"command"`
		} `json:"services"`
	}
	require.NoError(t, yaml.Unmarshal(data, &compose))
	cmd := compose.Services["payments"].Command
	require.NotEmpty(t, cmd, "docker-compose.yaml has no payments command")
	return cmd
}

func TestDemoUpstreamOnly(t *testing.T) {
	// docker-compose runs this exact command beside a real Envoy, whose
	// payments cluster (envoy/envoy.yaml) must be where it listens.
	cmd := composePaymentsCommand(t)
	clusterAddr, err := paymentsClusterAddress()
	require.NoError(t, err)
	require.Equal(t, "127.0.0.1:8081", clusterAddr)
	require.Equal(t, []string{"demo", "--upstream-only", "--listen", clusterAddr}, cmd)

	// The same arguments, with a later --listen on a free port (the last
	// flag wins), so the test does not depend on 8081 being free.
	addr := fmt.Sprintf("127.0.0.1:%d", testutil.FreePort(t))
	d := startDemoMain(t, append(cmd[1:], "--listen", addr)...)
	require.Equal(t, "demo payments API listening on http://"+addr+" (counters: GET /_admin/stats)\n", d.stdout.String())

	post := func(path, body string) (int, map[string]any) {
		resp, err := http.Post("http://"+addr+path, "application/json", strings.NewReader(body))
		require.NoError(t, err)
		defer resp.Body.Close()
		var m map[string]any
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&m))
		return resp.StatusCode, m
	}
	status, quote := post("/v1/transfers/preview", demoTransfer)
	require.Equal(t, http.StatusOK, status)
	require.Equal(t, "quoted", quote["status"])
	require.NotContains(t, quote, "fingerprint", "no idemgate in front")
	status, refused := post("/v1/transfers/confirm", demoTransfer)
	require.Equal(t, http.StatusBadRequest, status)
	require.Equal(t, "idempotency_key_required", refused["error"], "the upstream honours keys, as envoy/idemgate.yaml expects")

	resp, err := http.Get("http://" + addr + "/_admin/stats")
	require.NoError(t, err)
	var stats struct{ Previews, Executions int }
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&stats))
	resp.Body.Close()
	require.Equal(t, 1, stats.Previews)
	require.Zero(t, stats.Executions)

	require.NoError(t, d.stop(t))
	require.Contains(t, d.stderr.String(), `msg="demo payments API stopped"`)
	l, err := net.Listen("tcp", addr)
	require.NoError(t, err, "the port is released")
	l.Close()
}

func TestDemoRefusesATakenPort(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer taken.Close()
	addr := taken.Addr().String()

	for _, tc := range []struct {
		name string
		args []string
	}{
		{"demo", []string{"demo", "--listen", addr}},
		{"upstream only", []string{"demo", "--upstream-only", "--listen", addr}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr testutil.SyncBuffer
			err := Main(t.Context(), tc.args, &stdout, &stderr)
			require.EqualError(t, err, "failed to listen on "+addr+" (--listen): the address is already in use; "+
				"stop what holds it (an earlier demo?) or pick another address, e.g. --listen 127.0.0.1:8090")
			require.Empty(t, stdout.String(), "nothing printed, nothing started")
		})
	}
}

func TestDemoUsage(t *testing.T) {
	var stdout, stderr testutil.SyncBuffer
	require.ErrorIs(t, Main(t.Context(), []string{"demo", "extra"}, &stdout, &stderr), ErrUsage)
	require.Contains(t, stderr.String(), `demo: unexpected argument "extra"`)
	require.ErrorIs(t, Main(t.Context(), []string{"demo", "--frobnicate"}, &stdout, &stderr), ErrUsage)
	require.NoError(t, Main(t.Context(), []string{"help"}, &stdout, &stderr))
	require.Contains(t, stdout.String(), "idemgate demo --upstream-only [--listen 127.0.0.1:8081]")
}

var bannerGRPC = regexp.MustCompile(`idemgate ext_proc gRPC, memory store +(127\.0\.0\.1:[0-9]+) \(admin: http://(127\.0\.0\.1:[0-9]+)/metrics\)`)

func TestDemoStopsCleanlyOnCancel(t *testing.T) {
	front := fmt.Sprintf("127.0.0.1:%d", testutil.FreePort(t))
	d := startDemoMain(t, "--listen", front)
	out := d.stdout.String()
	require.Contains(t, out, "GW=http://"+front+"\n")
	m := bannerGRPC.FindStringSubmatch(out)
	require.NotNil(t, m, "banner names idemgate's loopback ports:\n%s", out)
	grpcAddr, adminAddr := m[1], m[2]

	// While running, idemgate's admin answers and the front routes.
	resp, err := http.Get("http://" + adminAddr + "/readyz")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	resp, err = http.Get("http://" + front + "/healthz")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)

	require.NoError(t, d.stop(t))
	logs := d.stderr.String()
	for _, want := range []string{`msg="demo stopping"`, `msg=stopped`, `msg="demo stopped"`} {
		require.Contains(t, logs, want)
	}
	require.Less(t, strings.Index(logs, `msg="demo stopping"`), strings.Index(logs, `msg="demo stopped"`))
	for _, addr := range []string{front, grpcAddr, adminAddr} {
		l, err := net.Listen("tcp", addr)
		require.NoError(t, err, "%s is released", addr)
		l.Close()
	}
}
