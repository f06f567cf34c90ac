package main

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
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
	"sigs.k8s.io/yaml"

	"github.com/idemgate/idemgate/cmd/idemgate/settings"
	"github.com/idemgate/idemgate/envoy"
	"github.com/idemgate/idemgate/envoy/envoytest"
	"github.com/idemgate/idemgate/extproc/config"
	"github.com/idemgate/idemgate/fingerprint"
	"github.com/idemgate/idemgate/internal/testutil"
)

// testKey is a signing key for tests (base64 of 32 bytes, not a secret).
const testKey = "dGVzdC1rZXktazEtbm90LWEtc2VjcmV0LTMyYnl0ZXM="

// idemgateBin is cmd/idemgate built once for this test binary: the demo
// runs the product binary as a child, as `make demo` does. demoBin is this
// command, for the test of what a terminal's Ctrl-C does.
var idemgateBin, demoBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "idemgate-demo-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = "/usr/local/go/bin/go"
	}
	idemgateBin, demoBin = filepath.Join(dir, "idemgate"), filepath.Join(dir, "idemgate-demo")
	if out, err := exec.Command(goBin, "build", "-o", dir+"/", "github.com/idemgate/idemgate/cmd/idemgate", ".").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "failed to build cmd/idemgate and the demo: %v\n%s", err, out)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// runningDemo is the demo command running in-process (its Envoy and
// idemgate are child processes).
type runningDemo struct {
	stdout, stderr *testutil.SyncBuffer
	cancel         context.CancelFunc
	done           chan struct{} // closed when run returned
	err            error
}

// startDemo runs the demo with args and waits until it printed its output
// (one write, made once everything serves) or failed.
func startDemo(t *testing.T, args ...string) *runningDemo {
	t.Helper()
	d := &runningDemo{stdout: &testutil.SyncBuffer{}, stderr: &testutil.SyncBuffer{}, done: make(chan struct{})}
	ctx, cancel := context.WithCancel(context.Background())
	d.cancel = cancel
	go func() {
		d.err = run(ctx, args, d.stdout, d.stderr)
		close(d.done)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-d.done:
		case <-time.After(30 * time.Second):
			t.Error("demo did not stop within 30s of its context being cancelled")
		}
		if t.Failed() {
			t.Logf("demo stderr:\n%s", d.stderr.String())
		}
	})
	require.Eventually(t, func() bool {
		select {
		case <-d.done:
			return true
		default:
			return d.stdout.String() != ""
		}
	}, 90*time.Second, 20*time.Millisecond, "the demo printed nothing; stderr:\n%s", d.stderr.String())
	select {
	case <-d.done:
		t.Fatalf("demo stopped at start: %v\nstderr:\n%s", d.err, d.stderr.String())
	default:
	}
	return d
}

// startFullDemo runs the whole demo on a free front port with the pinned
// Envoy and the idemgate built by TestMain.
func startFullDemo(t *testing.T, listen string) *runningDemo {
	t.Helper()
	return startDemo(t, "--listen", listen, "--envoy", envoytest.RequireEnvoy(t), "--idemgate", idemgateBin)
}

// stop cancels the demo and returns what run returned.
func (d *runningDemo) stop(t *testing.T) error {
	t.Helper()
	d.cancel()
	select {
	case <-d.done:
		return d.err
	case <-time.After(30 * time.Second):
		t.Fatalf("demo did not stop within 30s; stderr:\n%s", d.stderr.String())
		return nil
	}
}

// requireCurl needs curl, which the printed commands use: missing, the test
// fails under IDEMGATE_REQUIRE_SERVICES (make test, CI) and skips otherwise.
func requireCurl(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("curl"); err != nil {
		if os.Getenv("IDEMGATE_REQUIRE_SERVICES") != "" {
			t.Fatal("curl is required (the demo's printed commands are curl commands): apt-get install -y curl")
		}
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
	d := startFullDemo(t, "127.0.0.1:0")
	script := d.stdout.String()
	require.Contains(t, script, "# idemgate demo: a real Envoy "+pinnedVersion(t)+" in front of idemgate")
	steps, order := runSteps(t, script)
	require.Equal(t, []string{"1", "2", "3a", "3b", "4", "5", "6", "7", "7b", "8", "9", "10", "11", "12", "13",
		"14", "15", "16", "17", "18", "19", "20", "21", "22", "23", "24", "25", "26", "27", "28"}, order, "the steps, in the order the brief of the demo lists them")

	for _, step := range []string{"2", "3a", "3b", "4", "5", "6", "7", "16", "17", "18", "19", "20", "21", "25", "26"} {
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

	t.Run("7b the payments API refuses a confirm that went around idemgate", func(t *testing.T) {
		var refused map[string]any
		require.NoError(t, json.Unmarshal([]byte(steps["7b"]), &refused), steps["7b"])
		require.Equal(t, "attestation_missing", refused["error"])
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
	})

	// Steps 9-13: the same operation as MCP tools through the same Envoy.
	var mfp string
	t.Run("9 tools/list shows the fingerprint argument and the status tool", func(t *testing.T) {
		res := rpcResult(t, steps["9"], 1)
		tools := map[string]map[string]any{}
		for _, tl := range res["tools"].([]any) {
			tool := tl.(map[string]any)
			tools[tool["name"].(string)] = tool
		}
		require.Contains(t, tools, "transfer_status")
		schema := tools["transfer_confirm"]["inputSchema"].(map[string]any)
		require.Contains(t, schema["properties"], "fingerprint")
		require.Contains(t, schema["required"], "fingerprint")
	})
	t.Run("10 the MCP preview carries a fingerprint", func(t *testing.T) {
		body, rest, _ := strings.Cut(steps["10"], "\nMFP=")
		res := rpcResult(t, body, 2)
		mfp, _ = res["structuredContent"].(map[string]any)["fingerprint"].(string)
		require.NotEmpty(t, mfp)
		require.Equal(t, mfp+"\n", rest, "the sed extraction printed the injected fingerprint")
	})
	var transferID string
	t.Run("11 the MCP confirm executes", func(t *testing.T) {
		res := rpcResult(t, steps["11"], 3)
		require.NotEqual(t, true, res["isError"])
		transferID, _ = res["structuredContent"].(map[string]any)["transfer_id"].(string)
		require.NotEmpty(t, transferID)
	})
	t.Run("12 a retry with a new id is replayed under that id", func(t *testing.T) {
		res := rpcResult(t, steps["12"], 4)
		require.Equal(t, map[string]any{"io.idemgate/replayed": true}, res["_meta"])
		env := res["structuredContent"].(map[string]any)
		require.Equal(t, "already_completed", env["status"])
		require.Equal(t, transferID, env["result_ref"])
	})
	t.Run("13 the status tool says completed", func(t *testing.T) {
		env := rpcResult(t, steps["13"], 5)["structuredContent"].(map[string]any)
		require.Equal(t, "completed", env["status"])
		require.Equal(t, transferID, env["result_ref"])
	})

	// Steps 14-22: a transfer that needs a person's approval.
	var afp, approvalID, bigNonce string
	t.Run("14 the preview of a transfer above the threshold says approval_required", func(t *testing.T) {
		r := parseCurl(t, "14", steps["14"])
		require.Equal(t, http.StatusOK, r.status)
		body := r.json(t)
		require.Equal(t, true, body["approval_required"])
		afp, _ = body["fingerprint"].(string)
		require.NotEmpty(t, afp)
		exp, err := time.Parse(time.RFC3339, body["fingerprint_expires_at"].(string))
		require.NoError(t, err)
		require.WithinDuration(t, time.Now().Add(demoApprovalTTL), exp, time.Minute, "a gated fingerprint lives approval.ttl")
		require.Equal(t, "\nAFP="+afp+"\n", r.rest)
	})
	require.NotEmpty(t, afp)
	t.Run("15 its confirm is approval_pending and runs nothing", func(t *testing.T) {
		r := parseCurl(t, "15", steps["15"])
		require.Equal(t, http.StatusAccepted, r.status)
		require.NotEmpty(t, r.header.Get("Retry-After"))
		body := r.json(t)
		require.Equal(t, "approval_pending", body["status"])
		require.Equal(t, true, body["retryable"])
		approvalID, _ = body["approval_id"].(string)
		require.NotEmpty(t, approvalID)
		require.Equal(t, "\nAPPROVAL_ID="+approvalID+"\n", r.rest, "the sed extraction printed the approval id")
	})
	require.NotEmpty(t, approvalID)
	t.Run("16 bob reads the approval with the bound params", func(t *testing.T) {
		r := parseCurl(t, "16", steps["16"])
		require.Equal(t, http.StatusOK, r.status)
		body := r.json(t)
		require.Equal(t, approvalID, body["approval_id"])
		require.Equal(t, "pending", body["state"])
		require.Equal(t, "transfer", body["operation"])
		require.Equal(t, "alice", body["requester"])
		require.Equal(t, map[string]any{"amount": "1500", "currency": "EUR", "payee": map[string]any{"account_id": "acc_7731"}}, body["params"], "the canonical bound params only (the decimal without trailing zeros): no memo, no payee name")
		require.Len(t, body["rules"], 1)
		require.Contains(t, body["rules"].([]any)[0], demoApprovalThreshold)
	})
	t.Run("17 alice cannot approve her own transfer", func(t *testing.T) {
		r := parseCurl(t, "17", steps["17"])
		require.Equal(t, http.StatusForbidden, r.status)
		require.Equal(t, "approval_forbidden", r.json(t)["error"])
		require.Contains(t, d.stderr.String(), "event=security_alert reason=self_approval operation=transfer")
	})
	t.Run("18 bob approves", func(t *testing.T) {
		r := parseCurl(t, "18", steps["18"])
		require.Equal(t, http.StatusOK, r.status)
		body := r.json(t)
		require.Equal(t, "approved", body["state"])
		decisions := body["decisions"].([]any)
		require.Len(t, decisions, 1, "alice's refused attempt is not a decision")
		require.Equal(t, "bob", decisions[0].(map[string]any)["approver"])
		require.Equal(t, "payee verified by phone", decisions[0].(map[string]any)["reason"])
	})
	t.Run("19 the status tool says approval_granted", func(t *testing.T) {
		r := parseCurl(t, "19", steps["19"])
		require.Equal(t, http.StatusOK, r.status)
		require.Equal(t, "approval_granted", r.json(t)["status"])
	})
	var bigTransferID string
	t.Run("20 the approved confirm executes", func(t *testing.T) {
		r := parseCurl(t, "20", steps["20"])
		require.Equal(t, http.StatusOK, r.status)
		body := r.json(t)
		require.Equal(t, "completed", body["status"])
		require.Equal(t, "1500.00", body["amount"])
		bigTransferID, _ = body["transfer_id"].(string)
		require.NotEmpty(t, bigTransferID)
		require.Empty(t, r.header.Get("Idempotent-Replayed"))
	})
	t.Run("21 a repeated confirm replays", func(t *testing.T) {
		r := parseCurl(t, "21", steps["21"])
		require.Equal(t, http.StatusOK, r.status)
		body := r.json(t)
		require.Equal(t, "already_completed", body["status"])
		require.Equal(t, bigTransferID, body["result_ref"])
		require.Equal(t, "true", r.header.Get("Idempotent-Replayed"))
		bigNonce = r.header.Get("Idempotency-Key")
		require.Regexp(t, `^[0-9a-f]{32}$`, bigNonce)
		require.NotEqual(t, nonce, bigNonce)
	})
	t.Run("22 the metrics count each approval transition once", func(t *testing.T) {
		got := map[string]bool{}
		for _, l := range strings.Split(strings.TrimSpace(steps["22"]), "\n") {
			got[l] = true
		}
		for _, transition := range []string{"requested", "approved", "consumed"} {
			require.Contains(t, got, `idemgate_approval_transitions_total{operation="transfer",transition="`+transition+`"} 1`, steps["22"])
		}
	})

	// Steps 23-28: the MCP transfer, approved by its requester with step-up.
	var mafp, mApprovalID, mTransferID string
	t.Run("23 the MCP preview above the threshold says approval_required", func(t *testing.T) {
		body, rest, _ := strings.Cut(steps["23"], "\nMAFP=")
		sc := rpcResult(t, body, 6)["structuredContent"].(map[string]any)
		require.Equal(t, true, sc["approval_required"])
		mafp, _ = sc["fingerprint"].(string)
		require.NotEmpty(t, mafp)
		require.Equal(t, mafp+"\n", rest)
	})
	t.Run("24 the MCP confirm is approval_pending with the page's URL", func(t *testing.T) {
		body, rest, _ := strings.Cut(steps["24"], "\nAPPROVAL_ID=")
		res := rpcResult(t, body, 7)
		require.Equal(t, true, res["isError"])
		sc := res["structuredContent"].(map[string]any)
		require.Equal(t, "approval_pending", sc["status"])
		mApprovalID, _ = sc["approval_id"].(string)
		require.NotEmpty(t, mApprovalID)
		require.Equal(t, mApprovalID+"\n", rest)
		require.Equal(t, approvalsURL(t, script)+"/approvals/"+mApprovalID, sc["approval_url"])
	})
	t.Run("25 alice's everyday token is asked to step up", func(t *testing.T) {
		r := parseCurl(t, "25", steps["25"])
		require.Equal(t, http.StatusUnauthorized, r.status)
		require.Equal(t, `Bearer error="insufficient_user_authentication", error_description="approving your own operation needs a stronger or more recent authentication", acr_values="`+demoStepUpACR+`", max_age=3600`, r.header.Get("WWW-Authenticate"))
		require.Equal(t, "insufficient_user_authentication", r.json(t)["error"])
	})
	t.Run("26 alice approves with the stepped-up token", func(t *testing.T) {
		r := parseCurl(t, "26", steps["26"])
		require.Equal(t, http.StatusOK, r.status, string(r.body))
		body := r.json(t)
		require.Equal(t, "approved", body["state"])
		require.Equal(t, "transfer_mcp", body["operation"])
		dec := body["decisions"].([]any)[0].(map[string]any)
		require.Equal(t, "alice", dec["approver"])
		require.Equal(t, demoStepUpACR, dec["acr"])
		require.NotEmpty(t, dec["auth_time"])
	})
	t.Run("27 the MCP confirm executes once", func(t *testing.T) {
		res := rpcResult(t, steps["27"], 8)
		require.NotEqual(t, true, res["isError"])
		mTransferID, _ = res["structuredContent"].(map[string]any)["transfer_id"].(string)
		require.NotEmpty(t, mTransferID)
	})
	t.Run("28 and replays", func(t *testing.T) {
		res := rpcResult(t, steps["28"], 9)
		require.Equal(t, map[string]any{"io.idemgate/replayed": true}, res["_meta"])
		require.Equal(t, mTransferID, res["structuredContent"].(map[string]any)["result_ref"])
	})

	t.Run("one execution over HTTP, one over MCP, one approved of each", func(t *testing.T) {
		require.NotEmpty(t, mfp)
		require.Equal(t, 4, strings.Count(d.stderr.String(), `msg="payments: executed transfer"`))
		require.Eventually(t, func() bool { return strings.Count(d.stderr.String(), `"POST /mcp HTTP/1.1" 200`) == 9 },
			10*time.Second, 50*time.Millisecond, "steps 9-13, 23, 24, 27 and 28 went through Envoy (its access log is flushed every few seconds)")
	})

	t.Run("the printed Python SDK agent works", func(t *testing.T) {
		py := mcpPython(t)
		var src []string
		_, after, found := strings.Cut(script, "as agent.py and run")
		require.True(t, found)
		for _, l := range strings.Split(after, "\n")[1:] {
			rest, ok := strings.CutPrefix(l, "#   ")
			if !ok {
				break
			}
			src = append(src, rest)
		}
		require.Equal(t, pythonAgent, src, "the script prints the agent as it is")
		file := filepath.Join(t.TempDir(), "agent.py")
		require.NoError(t, os.WriteFile(file, []byte(strings.Join(src, "\n")+"\n"), 0o600))
		cmd := exec.CommandContext(t.Context(), py, file)
		cmd.Env = append(os.Environ(), "GW="+scriptVar(t, script, "GW"), "ALICE="+scriptVar(t, script, "ALICE"))
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "%s", out)
		require.Contains(t, string(out), "'transfer_status'")
		require.Contains(t, string(out), "'transfer_confirm'")
	})

	t.Run("every request went through Envoy", func(t *testing.T) {
		// Envoy's access log (the shipped stdout logger), on the demo's stderr.
		count := func(route string) int {
			return strings.Count(d.stderr.String(), `"POST /v1/transfers/`+route+` HTTP/1.1" `)
		}
		require.Eventually(t, func() bool { return count("confirm") == 9 }, 10*time.Second, 50*time.Millisecond,
			"steps 2, 3a, 3b, 5, 6, 7, 15, 20 and 21 confirm; log:\n%s", d.stderr.String())
		require.Equal(t, 2, count("preview"))
		require.Equal(t, 2, count("status"))
	})

	require.NoError(t, d.stop(t))
	require.Contains(t, d.stderr.String(), `msg="demo stopped"`)
}

// rpcResult decodes a step's JSON-RPC response with the wanted id and
// returns its result.
// scriptVar is the value the printed script assigns to name.
func scriptVar(t *testing.T, script, name string) string {
	t.Helper()
	for _, l := range strings.Split(script, "\n") {
		if v, ok := strings.CutPrefix(l, name+"="); ok {
			return v
		}
	}
	t.Fatalf("the script sets no %s", name)
	return ""
}

func approvalsURL(t *testing.T, script string) string { return scriptVar(t, script, "APPROVALS") }

// mcpPython is the interpreter of .ci/mcp-python.sh (the official MCP
// Python SDK, installed into the git-ignored .mcp-python/ when missing);
// without it the test is skipped, unless IDEMGATE_REQUIRE_SERVICES=1.
func mcpPython(t *testing.T) string {
	t.Helper()
	script, err := filepath.Abs(filepath.Join("..", "..", ".ci", "mcp-python.sh"))
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, script).Output()
	if err != nil {
		if os.Getenv("IDEMGATE_REQUIRE_SERVICES") == "1" {
			t.Fatalf("the MCP Python SDK is not available (%s): %v", script, err)
		}
		t.Skipf("the MCP Python SDK is not available (%s): %v", script, err)
	}
	return strings.TrimSpace(string(out))
}

func rpcResult(t *testing.T, text string, id int) map[string]any {
	t.Helper()
	var msg struct {
		ID     int            `json:"id"`
		Result map[string]any `json:"result"`
	}
	require.NoError(t, json.Unmarshal([]byte(strings.TrimSpace(text)), &msg), "not a JSON-RPC response:\n%s", text)
	require.Equal(t, id, msg.ID, "the response carries the request's id")
	require.NotNil(t, msg.Result, "a result, not a JSON-RPC error:\n%s", text)
	return msg.Result
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
	shippedSettings, _, err := settings.Parse("envoy/idemgate.yaml", envoy.IdemgateYAML(), ".", config.Options{LookupEnv: lookup})
	require.NoError(t, err)
	shipped := shippedSettings.Runtime
	jwks := filepath.Join(t.TempDir(), "approvers.jwks")
	approvers, err := newApproverKey()
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(jwks, approvers.jwks(), 0o600))
	_, demoSettings, _, key, keySource, err := demoConfig(lookup, jwks)
	require.NoError(t, err)
	demoRT := demoSettings.Runtime
	require.Equal(t, "from "+demoKeyEnv, keySource)
	require.Equal(t, testKey, key, "the key idemgate is started with")

	require.Equal(t, "tiered", shippedSettings.Store.Backend())
	require.Equal(t, "memory", demoSettings.Store.Backend())
	require.Equal(t, settings.LogSettings{Level: slog.LevelInfo, Format: "text"}, demoSettings.Log)
	require.Zero(t, demoSettings.Drain.Period)
	require.Equal(t, shipped.Subject, demoRT.Subject)
	require.Equal(t, shipped.TTL, demoRT.TTL)
	require.Equal(t, shipped.Limits, demoRT.Limits)
	require.Equal(t, shipped.Language, demoRT.Language)
	require.Len(t, demoRT.Operations, len(shipped.Operations))
	require.Regexp(t, `^127\.0\.0\.1:[0-9]+$`, demoSettings.ApprovalListen, "the approvers' API on a free loopback port")
	for i, want := range shipped.Operations {
		got := demoRT.Operations[i]
		// The one addition: the transfer operations (HTTP and MCP) need a
		// person's approval from the threshold up, for steps 14-28; the
		// MCP one lets the requester approve with step-up.
		require.Nil(t, want.Approval, "the shipped config has no approvers; the demo brings its own")
		if stepUp, gated := demoApprovedOperations[got.Name]; gated {
			require.NotNil(t, got.Approval)
			require.Equal(t, 1, got.Approval.Required)
			require.True(t, got.Approval.DistinctFromRequester)
			require.Equal(t, demoApprovalTTL, got.Approval.TTL)
			require.Equal(t, jwks, got.Approval.JWKSFile)
			require.Equal(t, "http://"+demoSettings.ApprovalListen, got.Approval.PublicURL)
			require.Equal(t, got.Approval.Rules[0].Text, "amount >= "+demoApprovalThreshold, "the same rule on both")
			if stepUp {
				require.Equal(t, &config.StepUpSettings{ACR: []string{demoStepUpACR}, MaxAuthAge: demoMaxAuthAge}, got.Approval.StepUp)
			} else {
				require.Nil(t, got.Approval.StepUp)
			}
		} else {
			require.Nil(t, got.Approval, "operation %s", got.Name)
		}
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
	_, generatedSettings, _, key, keySource, err := demoConfig(lookup, jwks)
	generated := generatedSettings.Runtime
	require.NoError(t, err)
	require.Contains(t, keySource, "generated for this run")
	_, err = fingerprint.ParseKey(key)
	require.NoError(t, err, "a key idemgate accepts")
	token, err = expiredFingerprint(generated, "alice", exp)
	require.NoError(t, err)
	_, err = shipped.Keys.Verify(token, fingerprint.Expect{Subject: "alice", Scope: op.Scope, AllowExpired: true}, time.Now())
	reason, _ = fingerprint.ReasonOf(err)
	require.Equal(t, fingerprint.ReasonBadMAC, reason, "a fresh key, not the one in the environment of the other run")
}

// composePayments is the payments service of docker-compose.yaml.
func composePayments(t *testing.T) (target string, command []string) {
	t.Helper()
	data, err := os.ReadFile("../../docker-compose.yaml")
	require.NoError(t, err)
	var compose struct {
		Services map[string]struct {
			Build struct {
				Target string `json:"target"`
			} `json:"build"`
			Command []string `json:"command"`
		} `json:"services"`
	}
	require.NoError(t, yaml.Unmarshal(data, &compose))
	svc := compose.Services["payments"]
	require.NotEmpty(t, svc.Command, "docker-compose.yaml has no payments command")
	return svc.Build.Target, svc.Command
}

func TestDemoUpstreamOnly(t *testing.T) {
	// docker-compose runs this exact command (the Dockerfile's demo target,
	// whose entrypoint is this program) beside its Envoy, whose payments
	// cluster (envoy/envoy.yaml) must be where it listens.
	target, cmd := composePayments(t)
	require.Equal(t, "demo", target)
	g, err := envoytest.DecodeBootstrap(envoy.BootstrapYAML())
	require.NoError(t, err)
	clusterAddr, err := clusterAddress(g.Bootstrap, envoytest.PaymentsCluster)
	require.NoError(t, err)
	require.Equal(t, "127.0.0.1:8081", clusterAddr)
	require.Equal(t, []string{"--upstream-only", "--listen", clusterAddr}, cmd)

	// The same arguments, with a later --listen on port 0 (the last flag
	// wins), so the test does not depend on 8081 being free.
	d := startDemo(t, append(cmd, "--listen", "127.0.0.1:0")...)
	m := regexp.MustCompile(`^demo payments API listening on http://(127\.0\.0\.1:[0-9]+) \(counters: GET /_admin/stats\)\n$`).FindStringSubmatch(d.stdout.String())
	require.NotNil(t, m, d.stdout.String())
	addr := m[1]

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
		{"demo", []string{"--listen", addr, "--envoy", "/nonexistent/envoy", "--idemgate", "/nonexistent/idemgate"}},
		{"upstream only", []string{"--upstream-only", "--listen", addr}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr testutil.SyncBuffer
			err := run(t.Context(), tc.args, &stdout, &stderr)
			require.EqualError(t, err, "failed to listen on "+addr+" (--listen): the address is already in use; "+
				"stop what holds it (an earlier demo?) or pick another address, e.g. --listen 127.0.0.1:8090")
			require.Empty(t, stdout.String(), "nothing printed, nothing started")
		})
	}
}

func TestDemoUsage(t *testing.T) {
	var stdout, stderr testutil.SyncBuffer
	require.ErrorIs(t, run(t.Context(), []string{"extra"}, &stdout, &stderr), errUsage)
	require.Contains(t, stderr.String(), `idemgate-demo: unexpected argument "extra"`)
	require.ErrorIs(t, run(t.Context(), []string{"--frobnicate"}, &stdout, &stderr), errUsage)
	stderr = testutil.SyncBuffer{}
	require.NoError(t, run(t.Context(), []string{"-h"}, &stdout, &stderr))
	require.Contains(t, stderr.String(), "idemgate-demo --upstream-only [--listen 127.0.0.1:8081]")
	require.Contains(t, stderr.String(), "-envoy")

	t.Setenv("ENVOY_BIN", "")
	err := run(t.Context(), []string{"--listen", "127.0.0.1:0", "--idemgate", idemgateBin}, &stdout, &stderr)
	require.ErrorContains(t, err, "no Envoy: run `make demo`")
	err = run(t.Context(), []string{"--listen", "127.0.0.1:0", "--idemgate", idemgateBin, "--envoy", "/bin/true"}, &stdout, &stderr)
	require.ErrorContains(t, err, "/bin/true --version printed no version")
	require.Empty(t, stdout.String())
}

func pinnedVersion(t *testing.T) string {
	t.Helper()
	v, err := envoytest.PinnedVersion()
	require.NoError(t, err)
	return v
}

var (
	bannerEnvoy    = regexp.MustCompile(`(?m)^#   Envoy \(envoy/envoy\.yaml: jwt_authn, ext_proc, router\) +http://(127\.0\.0\.1:[0-9]+) +<- send requests here \(admin: http://(127\.0\.0\.1:[0-9]+)\)$`)
	bannerIdemgate = regexp.MustCompile(`(?m)^#   idemgate serve, memory store \(ext_proc gRPC\) +(127\.0\.0\.1:[0-9]+) \(admin: http://(127\.0\.0\.1:[0-9]+)/metrics\)$`)
	bannerPayments = regexp.MustCompile(`(?m)^#   demo payments API \(the upstream\) +http://(127\.0\.0\.1:[0-9]+)$`)
	startedPID     = regexp.MustCompile(`msg="(envoy|idemgate) started" pid=([0-9]+)`)
)

// alive reports whether pid is a running process (a reaped child is not).
func alive(pid int) bool { return syscall.Kill(pid, 0) == nil }

func TestDemoRunsTheRealEnvoyAndStopsEverythingOnCancel(t *testing.T) {
	// Port 0: Envoy binds a free port itself and the demo reads it back from
	// Envoy's admin, so nothing can take it in between.
	d := startFullDemo(t, "127.0.0.1:0")
	out := d.stdout.String()
	envoyM, idemM, payM := bannerEnvoy.FindStringSubmatch(out), bannerIdemgate.FindStringSubmatch(out), bannerPayments.FindStringSubmatch(out)
	require.NotNil(t, envoyM, "banner names Envoy's addresses:\n%s", out)
	require.NotNil(t, idemM, "banner names idemgate's addresses:\n%s", out)
	require.NotNil(t, payM, "banner names the payments API:\n%s", out)
	front := envoyM[1]
	require.NotEqual(t, "127.0.0.1:0", front)
	require.Contains(t, out, "GW=http://"+front+"\n")
	envoyAdmin, grpcAddr, idemAdmin, paymentsAddr := envoyM[2], idemM[1], idemM[2], payM[1]

	pids := map[string]int{}
	for _, m := range startedPID.FindAllStringSubmatch(d.stderr.String(), -1) {
		pid, err := strconv.Atoi(m[2])
		require.NoError(t, err)
		pids[m[1]] = pid
	}
	require.Len(t, pids, 2, "the demo logs both children's pids:\n%s", d.stderr.String())
	for name, pid := range pids {
		require.True(t, alive(pid), "%s (pid %d) runs", name, pid)
		require.NotEqual(t, os.Getpid(), pid)
	}

	// The front is Envoy itself: its admin answers with the pinned version
	// and the shipped listener, and it serves the shipped /healthz route.
	resp, err := http.Get("http://" + envoyAdmin + "/server_info")
	require.NoError(t, err)
	var info struct {
		Version string `json:"version"`
		State   string `json:"state"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&info))
	resp.Body.Close()
	require.Contains(t, info.Version, "/"+pinnedVersion(t)+"/")
	require.Equal(t, "LIVE", info.State)
	resp, err = http.Get("http://" + front + "/healthz")
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, "ok\n", string(body), "envoy.yaml's direct_response")
	// idemgate is up, and the operation routes reach it: no token is
	// jwt_authn's 401, before idemgate.
	resp, err = http.Get("http://" + idemAdmin + "/readyz")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	resp, err = http.Post("http://"+front+"/v1/transfers/preview", "application/json", strings.NewReader(demoTransfer))
	require.NoError(t, err)
	body, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusUnauthorized, resp.StatusCode)
	require.Contains(t, string(body), "Jwt is missing", "Envoy's jwt_authn answered")

	require.NoError(t, d.stop(t))
	logs := d.stderr.String()
	for _, want := range []string{`msg="demo stopping"`, "envoy: ", "caught ENVOY_SIGTERM", `idemgate: `, `msg=stopped`, `msg="demo stopped"`} {
		require.Contains(t, logs, want)
	}
	// Front first: Envoy stopped before idemgate began to drain.
	require.Less(t, strings.Index(logs, `msg="demo stopping"`), strings.Index(logs, "caught ENVOY_SIGTERM"))
	require.Less(t, strings.Index(logs, "caught ENVOY_SIGTERM"), strings.Index(logs, "msg=draining"))
	for name, pid := range pids {
		require.False(t, alive(pid), "%s (pid %d) has exited", name, pid)
	}
	for _, addr := range []string{front, envoyAdmin, grpcAddr, idemAdmin, paymentsAddr} {
		l, err := net.Listen("tcp", addr)
		require.NoError(t, err, "%s is released", addr)
		l.Close()
	}
}

func TestDemoStopsWhenAChildDies(t *testing.T) {
	d := startFullDemo(t, "127.0.0.1:0")
	m := regexp.MustCompile(`msg="envoy started" pid=([0-9]+)`).FindStringSubmatch(d.stderr.String())
	require.NotNil(t, m)
	pid, err := strconv.Atoi(m[1])
	require.NoError(t, err)
	require.NoError(t, syscall.Kill(pid, syscall.SIGKILL))
	select {
	case <-d.done:
	case <-time.After(30 * time.Second):
		t.Fatal("the demo kept running without its front")
	}
	require.ErrorContains(t, d.err, "the front stopped: envoy exited (signal: killed)")
	require.Contains(t, d.stderr.String(), `msg="demo stopped"`)
	m = regexp.MustCompile(`msg="idemgate started" pid=([0-9]+)`).FindStringSubmatch(d.stderr.String())
	require.NotNil(t, m)
	idemPID, err := strconv.Atoi(m[1])
	require.NoError(t, err)
	require.False(t, alive(idemPID), "idemgate was stopped with the demo")
}

// TestDemoBootstrapIsTheShippedOne: the demo changes envoy/envoy.yaml in
// addresses only, and the pinned Envoy accepts the result.
func TestDemoBootstrapIsTheShippedOne(t *testing.T) {
	addrs := frontAddrs{listen: "127.0.0.1:18080", admin: "127.0.0.1:0", idemgate: "127.0.0.1:40001", payments: "127.0.0.1:40002"}
	rendered, err := renderBootstrap(envoy.BootstrapYAML(), addrs)
	require.NoError(t, err)
	_, err = envoytest.ValidateConfig(envoytest.RequireEnvoy(t), rendered, t.TempDir())
	require.NoError(t, err)

	got, err := envoytest.DecodeBootstrap(rendered)
	require.NoError(t, err)
	require.Equal(t, "127.0.0.1", got.Listener.GetAddress().GetSocketAddress().GetAddress())
	require.EqualValues(t, 18080, got.ListenerPort())
	for name, want := range map[string]string{envoytest.IdemgateCluster: addrs.idemgate, envoytest.PaymentsCluster: addrs.payments} {
		addr, err := clusterAddress(got.Bootstrap, name)
		require.NoError(t, err)
		require.Equal(t, want, addr)
	}

	// Put the shipped addresses back: what is left must be the shipped
	// bootstrap, field for field.
	shipped, err := envoytest.DecodeBootstrap(envoy.BootstrapYAML())
	require.NoError(t, err)
	restore := func(dst, src *corev3.SocketAddress) { dst.Address, dst.PortSpecifier = src.Address, src.PortSpecifier }
	restore(got.Listener.GetAddress().GetSocketAddress(), shipped.Listener.GetAddress().GetSocketAddress())
	restore(got.Bootstrap.GetAdmin().GetAddress().GetSocketAddress(), shipped.Bootstrap.GetAdmin().GetAddress().GetSocketAddress())
	for _, name := range []string{envoytest.IdemgateCluster, envoytest.PaymentsCluster} {
		dst, err := envoytest.ClusterEndpoint(got.Bootstrap, name)
		require.NoError(t, err)
		src, err := envoytest.ClusterEndpoint(shipped.Bootstrap, name)
		require.NoError(t, err)
		restore(dst, src)
	}
	require.True(t, proto.Equal(shipped.Bootstrap, got.Bootstrap), "the demo changed more than addresses")

	t.Run("a JWKS other than demoauth's is refused", func(t *testing.T) {
		other := strings.Replace(string(envoy.BootstrapYAML()), `"kid": "demo-es256"`, `"kid": "another"`, 1)
		require.NotEqual(t, string(envoy.BootstrapYAML()), other)
		_, err := renderBootstrap([]byte(other), addrs)
		require.ErrorContains(t, err, "the demo's tokens would be refused")
	})
}

// TestCtrlCStopsAllThree runs the built demo the way a terminal does: in a
// process group of its own, which Ctrl-C signals as a whole. Envoy and
// idemgate are in groups of their own, so only the demo gets the SIGINT and
// stops them in order; it exits 0 and leaves no process behind.
func TestCtrlCStopsAllThree(t *testing.T) {
	cmd := exec.Command(demoBin, "--listen", "127.0.0.1:0", "--envoy", envoytest.RequireEnvoy(t), "--idemgate", idemgateBin)
	var stdout, stderr testutil.SyncBuffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	require.NoError(t, cmd.Start())
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() { _ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) })
	require.Eventually(t, func() bool { return strings.Contains(stdout.String(), "\nGW=") }, 90*time.Second, 20*time.Millisecond,
		"the demo printed no script; stderr:\n%s", stderr.String())

	pids := map[string]int{}
	for _, m := range startedPID.FindAllStringSubmatch(stderr.String(), -1) {
		pid, err := strconv.Atoi(m[2])
		require.NoError(t, err)
		pids[m[1]] = pid
	}
	require.Len(t, pids, 2)
	for name, pid := range pids {
		pgid, err := syscall.Getpgid(pid)
		require.NoError(t, err)
		require.NotEqual(t, cmd.Process.Pid, pgid, "%s must not be in the group a Ctrl-C signals", name)
	}

	require.NoError(t, syscall.Kill(-cmd.Process.Pid, syscall.SIGINT))
	select {
	case err := <-exited:
		require.NoError(t, err, "exit status after Ctrl-C; stderr:\n%s", stderr.String())
	case <-time.After(30 * time.Second):
		t.Fatalf("the demo did not exit within 30s of Ctrl-C; stderr:\n%s", stderr.String())
	}
	logs := stderr.String()
	require.Contains(t, logs, "caught ENVOY_SIGTERM", "Envoy was stopped by the demo")
	require.Contains(t, logs, "idemgate: ", "idemgate's log")
	require.Contains(t, logs, `msg="demo stopped"`)
	require.NotContains(t, logs, "killed")
	for name, pid := range pids {
		require.False(t, alive(pid), "%s (pid %d) has exited", name, pid)
	}
}
