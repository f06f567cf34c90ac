package e2e

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/e2e/demoauth"
	"github.com/idemgate/idemgate/e2e/internal/stack"
	"github.com/idemgate/idemgate/internal/testutil"
)

// usedMetricsFile lists every metric name a rule or a dashboard query in
// deploy/monitoring reads, one a line; deploy/monitoring/check (the PromQL
// parser's side) keeps it equal to what the files use.
const usedMetricsFile = "../deploy/monitoring/metrics-used.txt"

// TestMonitoringMetricsAreExported (deploy/monitoring): a real idemgate
// (tiered store, census, approvals, security webhook, mTLS from Envoy) behind the
// pinned Envoy runs a short workload — preview, confirm, replay, a
// params_changed, an approval, a forged approver token, a Redis outage —
// and every metric name the alerting rules and the dashboard use must be
// in idemgate's /metrics or Envoy's /stats/prometheus. A metric renamed in
// the code (or in Envoy) fails here.
func TestMonitoringMetricsAreExported(t *testing.T) {
	raw, err := os.ReadFile(usedMetricsFile)
	require.NoError(t, err)
	var used []string
	for _, l := range strings.Split(string(raw), "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
			used = append(used, l)
		}
	}
	require.NotEmpty(t, used)

	var webhooks atomic.Int32
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		webhooks.Add(1)
		_, _ = io.Copy(io.Discard, r.Body)
	}))
	t.Cleanup(hook.Close)
	key, err := demoauth.NewApproverKey("")
	require.NoError(t, err)
	jwks := filepath.Join(t.TempDir(), "approvers.jwks")
	require.NoError(t, os.WriteFile(jwks, key.JWKS(), 0o600))
	approvalAddr := fmt.Sprintf("127.0.0.1:%d", testutil.FreePort(t))
	opts := stackOptionsForMonitoring(jwks, approvalAddr, hook.URL)
	// mTLS on the ext_proc channel, as in production: the certificate
	// expiry gauges exist only with TLS.
	opts.GRPCTLS = newMeshPKI(t).opts
	s := startStack(t, opts)
	alice := s.Agent("alice")

	// preview, confirm, replay
	p := preview(t, alice, transfer("12.00", "acct_bob", "lunch"))
	first := confirm(t, alice, p.ConfirmBody())
	requireExecuted(t, first)
	requireReplay(t, s, confirm(t, alice, p.ConfirmBody()), p.Nonce, first.Body)
	status(t, alice, p.Fingerprint)
	// params_changed: the same fingerprint for another amount
	p2 := preview(t, alice, transfer("13.00", "acct_bob", "lunch"))
	changed := p2.ConfirmBody()
	changed["amount"] = "14.00"
	requireEnvelope(t, s, confirm(t, alice, changed), http.StatusUnprocessableEntity, "params_changed", notRetryable)
	// an approval: pending, a forged token refused, approved by bob, executed
	p3 := preview(t, alice, transfer("1500.00", "acct_carol", "rent"))
	r := confirm(t, alice, p3.ConfirmBody())
	requireEnvelope(t, s, r, http.StatusAccepted, "approval_pending", retryable)
	var pending struct {
		ApprovalID string `json:"approval_id"`
	}
	require.NoError(t, json.Unmarshal(r.Body, &pending))
	id := pending.ApprovalID
	require.NotEmpty(t, id)
	approve := approverClient(t, approvalAddr)
	require.Equal(t, http.StatusUnauthorized, approve(id, "forged.token.value"))
	bob, err := key.Mint(map[string]any{"iss": "https://idp.example", "aud": "idemgate-approvals", "sub": "bob", "exp": time.Now().Add(time.Minute).Unix()})
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, approve(id, bob))
	requireExecuted(t, confirm(t, alice, p3.ConfirmBody()))
	// Redis gone: the tiered store answers from PostgreSQL (a fallback).
	s.Redis.Kill()
	p4 := preview(t, alice, transfer("15.00", "acct_dave", "books"))
	requireExecuted(t, confirm(t, alice, p4.ConfirmBody()))
	s.Redis.Restart()
	require.Eventually(t, func() bool { return webhooks.Load() >= 2 }, 10*time.Second, 20*time.Millisecond, "security webhook deliveries")

	exported := map[string]bool{}
	for _, name := range scrapeNames(t, "http://"+s.Idemgate.AdminAddr+"/metrics") {
		exported[name] = true
	}
	code, body, err := s.Envoy.Admin("/stats/prometheus")
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, code)
	for _, name := range sampleNames(body) {
		exported[name] = true
	}
	var missing []string
	for _, name := range used {
		if !exported[name] {
			missing = append(missing, name)
		}
	}
	if len(missing) > 0 {
		all := make([]string, 0, len(exported))
		for n := range exported {
			if strings.HasPrefix(n, "idemgate_") || strings.Contains(n, "ext_proc") || strings.Contains(n, "cluster_upstream_rq") {
				all = append(all, n)
			}
		}
		sort.Strings(all)
		t.Fatalf("the rules or dashboards use metrics nobody exports: %v\nexported (idemgate_*, ext_proc, upstream_rq):\n%s", missing, strings.Join(all, "\n"))
	}
}

// approverClient returns a function deciding approval id with token as
// bearer on the approvers' API, answering the HTTP status.
func approverClient(t *testing.T, addr string) func(id, token string) int {
	return func(id, token string) int {
		req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, "http://"+addr+"/v1/approvals/"+id+"/approve",
			strings.NewReader(`{"reason":"payee verified by phone"}`))
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+token)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		return resp.StatusCode
	}
}

func scrapeNames(t *testing.T, url string) []string {
	t.Helper()
	resp, err := http.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return sampleNames(string(b))
}

// sampleNames returns the names of the samples in a Prometheus text
// exposition (a histogram's _bucket, _sum and _count each).
func sampleNames(text string) []string {
	var names []string
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if i := strings.IndexAny(line, "{ "); i > 0 {
			names = append(names, line[:i])
		}
	}
	return names
}

// stackOptionsForMonitoring: transfers of 1000.00 or more need an approver
// on approvalAddr, and security events go to the webhook at hookURL.
func stackOptionsForMonitoring(jwks, approvalAddr, hookURL string) stack.Options {
	return stack.Options{
		Approval: map[string]any{
			"rules":     []any{map[string]any{"param": "amount", "at_least": "1000.00"}},
			"approvers": map[string]any{"jwt": map[string]any{"issuer": "https://idp.example", "audience": "idemgate-approvals", "jwks_file": jwks}},
		},
		IdemgateConfig: map[string]any{
			"approval_listen": approvalAddr,
			"security":        map[string]any{"webhook": map[string]any{"url": hookURL, "timeout": "2s", "queue_size": 100}},
		},
	}
}
