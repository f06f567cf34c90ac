// Package approvalpage drives the approval page in a real headless browser
// (Debian's chromium, over the DevTools protocol): a person loads the page
// through an SSO proxy that sets their bearer token, reads the params,
// approves with a reason and sees the state change.
package approvalpage

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/e2e/demoauth"
	"github.com/idemgate/idemgate/extproc/approvalapi"
	"github.com/idemgate/idemgate/extproc/config"
	"github.com/idemgate/idemgate/extproc/security"
	"github.com/idemgate/idemgate/state"
	"github.com/idemgate/idemgate/state/memory"
)

type noEvents struct{}

func (noEvents) Report(context.Context, security.Event) {}

func TestApprovalPageInBrowser(t *testing.T) {
	if testing.Short() {
		t.Skip("drives chromium; skipped with -short")
	}
	browser, err := exec.LookPath("chromium")
	require.NoError(t, err, "the approval page test needs Debian's chromium")

	// The approvers' listener, on the memory store.
	key, err := demoauth.NewApproverKey("")
	require.NoError(t, err)
	rt, _, err := config.Parse("test.yaml", []byte(`
signing: {active_key: k1, keys: {k1: {env: K1}}}
operations:
  - name: transfer
    scope: payments.transfer
    preview: {method: POST, path: /p}
    confirm: {method: POST, path: /c}
    status: {method: POST, path: /s}
    preview_tool: p
    status_tool: s
    params: [{path: amount, type: decimal}, currency, payee.account_id]
    approval:
      rules: [{param: amount, at_least: "1000.00"}]
      approvers: {jwt: {issuer: https://idp.example, audience: idemgate-approvals, jwks_file: /a.jwks}}
`), "", config.Options{
		LookupEnv: func(k string) (string, bool) { return "dGVzdC1rZXktazEtbm90LWEtc2VjcmV0LTMyYnl0ZXM=", k == "K1" },
		ReadFile: func(name string) ([]byte, error) {
			if name == "/a.jwks" {
				return key.JWKS(), nil
			}
			return nil, fs.ErrNotExist
		},
	})
	require.NoError(t, err)
	store := memory.New(memory.Options{})
	a, _, err := store.RequestApproval(t.Context(), state.ApprovalRequest{
		ID: state.NewApprovalID(), Key: "0123456789abcdef0123456789abcdef", Operation: "transfer", Scope: "payments.transfer",
		SubjectTag: "tag", Requester: "user-alice", ParamHash: "ph",
		Params: []byte(`{"amount":1500.00,"currency":"EUR","payee.account_id":"DE89370400440532013000"}`),
		Rules:  []string{"amount >= 1000.00"}, Required: 1, DistinctFromRequester: true, ExpiresAt: time.Now().Add(time.Hour),
	})
	require.NoError(t, err)
	h, err := approvalapi.New(approvalapi.Options{Config: rt, Approvals: store, Security: noEvents{}})
	require.NoError(t, err)
	approvals := httptest.NewServer(h)
	defer approvals.Close()

	// The SSO proxy: it authenticated bob and sets his bearer token.
	bobToken, err := key.Mint(map[string]any{"iss": "https://idp.example", "aud": "idemgate-approvals", "sub": "bob", "exp": time.Now().Add(time.Hour).Unix()})
	require.NoError(t, err)
	target, _ := url.Parse(approvals.URL)
	proxy := &httputil.ReverseProxy{Rewrite: func(r *httputil.ProxyRequest) {
		r.SetURL(target)
		r.Out.Host = r.In.Host
		r.Out.Header.Set("Authorization", "Bearer "+bobToken)
	}}
	sso := httptest.NewServer(proxy)
	defer sso.Close()

	cdp := startBrowser(t, browser)
	cdp.navigate(t, sso.URL+"/approvals/"+a.ID)
	require.Eventually(t, func() bool { return cdp.text(t, "state") == "pending" }, 10*time.Second, 50*time.Millisecond)
	params := cdp.text(t, "params")
	require.Contains(t, params, "amount\t1500.00")
	require.Contains(t, params, "payee.account_id\tDE89370400440532013000")
	require.Equal(t, "user-alice", cdp.text(t, "requester"))
	require.Equal(t, "bob", cdp.text(t, "approver"))
	require.Equal(t, "amount >= 1000.00", cdp.text(t, "rules"), "the rules that fired")
	require.Equal(t, a.ExpiresAt.UTC().Format(time.RFC3339), cdp.text(t, "expires"), "when it lapses")

	cdp.eval(t, `document.getElementById('reason').value = 'called the payee, amount confirmed'; document.getElementById('approve').click(); true`)
	require.Eventually(t, func() bool { return cdp.text(t, "state") == "approved" }, 10*time.Second, 50*time.Millisecond)
	require.Contains(t, cdp.text(t, "decisions"), "bob: approve — called the payee, amount confirmed")
	require.Contains(t, cdp.text(t, "return"), "Return to your agent", "after the decision the page sends the person back")

	got, _, err := store.GetApproval(t.Context(), a.ID)
	require.NoError(t, err)
	require.Equal(t, state.ApprovalApproved, got.State)
	require.Equal(t, []string{"bob"}, got.Approvers())
}

// --- a minimal DevTools protocol client --------------------------------------

type browser struct {
	ws   *wsConn
	next int
}

var devtoolsRE = regexp.MustCompile(`DevTools listening on (ws://\S+)`)

func startBrowser(t *testing.T, bin string) *browser {
	t.Helper()
	dir := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, bin, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
		"--no-first-run", "--no-default-browser-check", "--remote-debugging-port=0", "--remote-debugging-address=127.0.0.1",
		"--user-data-dir="+dir, "about:blank")
	// Its own process group: chromium's renderer, utility and crash
	// handler processes outlive a killed parent and keep writing into the
	// user data dir while the test's cleanup removes it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	stderr, err := cmd.StderrPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		cancel()
		_ = cmd.Wait()
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			if !groupRunning(cmd.Process.Pid) {
				return
			}
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		}
		t.Errorf("chromium's processes (group %d) did not exit", cmd.Process.Pid)
	})
	found := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			if m := devtoolsRE.FindStringSubmatch(sc.Text()); m != nil {
				select {
				case found <- m[1]:
				default:
				}
			}
		}
	}()
	var wsURL string
	select {
	case wsURL = <-found:
	case <-time.After(30 * time.Second):
		t.Fatal("chromium did not start its DevTools endpoint")
	}
	u, err := url.Parse(wsURL)
	require.NoError(t, err)
	// Attach to the page target (about:blank).
	var pageWS string
	require.Eventually(t, func() bool {
		resp, err := http.Get("http://" + u.Host + "/json/list")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		var targets []struct{ Type, WebSocketDebuggerURL string }
		if json.NewDecoder(resp.Body).Decode(&targets) != nil {
			return false
		}
		for _, tg := range targets {
			if tg.Type == "page" {
				pageWS = tg.WebSocketDebuggerURL
				return true
			}
		}
		return false
	}, 10*time.Second, 50*time.Millisecond)
	ws, err := dialWS(pageWS)
	require.NoError(t, err)
	t.Cleanup(func() { ws.Close() })
	return &browser{ws: ws}
}

func (b *browser) call(t *testing.T, method string, params any) json.RawMessage {
	t.Helper()
	b.next++
	id := b.next
	msg, _ := json.Marshal(map[string]any{"id": id, "method": method, "params": params})
	require.NoError(t, b.ws.WriteText(msg))
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		data, err := b.ws.ReadMessage(deadline)
		require.NoError(t, err)
		var resp struct {
			ID     int             `json:"id"`
			Result json.RawMessage `json:"result"`
			Error  json.RawMessage `json:"error"`
		}
		if json.Unmarshal(data, &resp) != nil || resp.ID != id {
			continue // an event
		}
		require.Empty(t, resp.Error, "%s failed", method)
		return resp.Result
	}
	t.Fatalf("%s: no answer", method)
	return nil
}

func (b *browser) navigate(t *testing.T, u string) {
	b.call(t, "Page.navigate", map[string]any{"url": u})
}

func (b *browser) eval(t *testing.T, expr string) json.RawMessage {
	t.Helper()
	res := b.call(t, "Runtime.evaluate", map[string]any{"expression": expr, "returnByValue": true})
	var out struct {
		Result struct {
			Value json.RawMessage `json:"value"`
		} `json:"result"`
	}
	require.NoError(t, json.Unmarshal(res, &out))
	return out.Result.Value
}

// text is the innerText of the element with id ("" when absent).
func (b *browser) text(t *testing.T, id string) string {
	t.Helper()
	v := b.eval(t, `(function(){var e=document.getElementById(`+strconvQuote(id)+`);return e?e.innerText:"";})()`)
	var s string
	_ = json.Unmarshal(v, &s)
	return strings.TrimSpace(s)
}

func strconvQuote(s string) string { b, _ := json.Marshal(s); return string(b) }

// groupRunning reports whether a process of group pgid still runs, read
// from /proc: a zombie writes nothing, and one reparented to a PID 1 that
// does not reap would be counted forever by kill(-pgid, 0).
func groupRunning(pgid int) bool {
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, path := range stats {
		b, err := os.ReadFile(path)
		if err != nil {
			continue
		}
		// pid (comm) state ppid pgrp ...; comm may hold spaces.
		i := bytes.LastIndexByte(b, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(b[i+1:]))
		if len(f) > 2 && f[0] != "Z" && f[2] == strconv.Itoa(pgid) {
			return true
		}
	}
	return false
}
