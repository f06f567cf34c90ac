package extproc

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/idemgate/idemgate/extproc/config"
	"github.com/idemgate/idemgate/extproc/security"
	"github.com/idemgate/idemgate/internal/testutil"
	"github.com/idemgate/idemgate/state"
	"github.com/idemgate/idemgate/state/memory"
	"github.com/idemgate/idemgate/state/postgres"
)

// approvalStore keeps records and approvals (memory, postgres).
type approvalStore interface {
	state.Store
	state.Approvals
}

// withApproval gates the transfer operation of yaml (its first
// "result_ref: transfer_id") at 1000.00 or more behind one approver.
func withApproval(yaml string) string {
	return strings.Replace(yaml, "    result_ref: transfer_id\n", `    result_ref: transfer_id
    approval:
      rules: [{param: amount, at_least: "1000.00"}]
      approvers:
        jwt: {issuer: https://idp.example, audience: idemgate-approvals, jwks_file: /approvers.jwks}
      ttl: 24h
`, 1)
}

// newApprovalEnv is newEnv on withApproval(testConfigYAML) with backend's
// approvals (approvals nil: a store that keeps none, as Redis alone).
func newApprovalEnv(t *testing.T, backend state.Store, approvals state.Approvals, clk *clock) *env {
	return newApprovalEnvYAML(t, withApproval(testConfigYAML), backend, approvals, clk)
}

func newApprovalEnvYAML(t *testing.T, yaml string, backend state.Store, approvals state.Approvals, clk *clock) *env {
	t.Helper()
	e := newEnv(t, backend, clk)
	rt, _, err := config.Parse("test.yaml", []byte(yaml), "", config.Options{
		LookupEnv: func(k string) (string, bool) { v, ok := testKeys[k]; return v, ok },
		ReadFile: func(name string) ([]byte, error) {
			if name == "/approvers.jwks" {
				return []byte(`{"keys":[{"kty":"OKP","crv":"Ed25519","x":"11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo"}]}`), nil
			}
			return nil, fs.ErrNotExist
		},
	})
	require.NoError(t, err)
	e.cfg = rt
	e.store = newCountingStore(backend)
	srv, err := NewServer(Options{
		Config: e.cfg, Store: e.store, Approvals: approvals, Logger: e.logger, Metrics: e.metrics,
		Security: security.New(e.logger, e.metrics.SecurityCounters(), security.WebhookOptions{}),
		Now:      e.clock.Now,
	})
	require.NoError(t, err)
	e.srv = srv
	return e
}

func TestApprovalMemory(t *testing.T) {
	clk := newClock()
	m := memory.New(memory.Options{Now: clk.Now})
	runApprovalSuite(t, newApprovalEnv(t, m, m, clk), m, true)
}

func TestApprovalPostgres(t *testing.T) {
	if testing.Short() {
		t.Skip("needs PostgreSQL")
	}
	dsn := testutil.CreateDatabase(t)
	require.NoError(t, postgres.Migrate(t.Context(), dsn))
	pg, err := postgres.New(t.Context(), postgres.Options{DSN: dsn})
	require.NoError(t, err)
	t.Cleanup(func() { _ = pg.Close() })
	// The server's clock runs in 2030 (fingerprints expire then); the
	// database judges approvals by its own clock, so lapsing is tested on
	// the memory store only.
	runApprovalSuite(t, newApprovalEnv(t, pg, pg, nil), pg, false)
}

func runApprovalSuite(t *testing.T, e *env, approvals approvalStore, movableClock bool) {
	const alice, bob = "user-alice", "user-bob"
	d := fakeDialer{srv: e.srv}
	ctx := t.Context()
	confirm := func(subject, amount, fp string) httpRequest {
		return post("/v1/transfers/confirm", subject, transferBody(amount, "EUR", "DE89", fp))
	}
	status := func(subject, fp string) httpRequest {
		return post("/v1/transfers/status", subject, []byte(fmt.Sprintf(`{"fingerprint":%q}`, fp)))
	}
	previewBody := func(amount string) map[string]any {
		res := do(t, d, post("/v1/transfers/preview", alice, transferBody(amount, "EUR", "DE89", "")), previewOK)
		require.Nil(t, res.immediate)
		return res.json(t)
	}
	pending := func(t *testing.T, fp, amount string) string {
		t.Helper()
		res := do(t, d, confirm(alice, amount, fp), neverCalled(t))
		body := requireEnvelope(t, res, 202, "approval_pending", true)
		require.Equal(t, "transfer_status", body["poll_with"])
		require.NotEmpty(t, res.headers["retry-after"])
		id := body["approval_id"].(string)
		require.True(t, strings.HasPrefix(id, "apr_"), id)
		return id
	}
	decide := func(t *testing.T, id, who string, approve bool) {
		t.Helper()
		out, _, err := approvals.DecideApproval(ctx, state.Decision{ID: id, Approver: who, Approve: approve, Reason: "called the payee"})
		require.NoError(t, err)
		require.Equal(t, state.DecisionRecorded, out)
	}
	approval := func(t *testing.T, id string) state.Approval {
		t.Helper()
		a, found, err := approvals.GetApproval(ctx, id)
		require.NoError(t, err)
		require.True(t, found)
		return a
	}

	t.Run("preview above the threshold says approval_required and lives approval.ttl", func(t *testing.T) {
		body := previewBody(`"1000"`)
		require.Equal(t, true, body["approval_required"])
		require.Equal(t, e.clock.Now().Add(24*time.Hour).Format(time.RFC3339), body["fingerprint_expires_at"])
		body = previewBody(`"999.99"`)
		require.NotContains(t, body, "approval_required")
		require.Equal(t, e.clock.Now().Add(15*time.Minute).Format(time.RFC3339), body["fingerprint_expires_at"])
	})

	t.Run("below the threshold executes without approval", func(t *testing.T) {
		p := newPayments()
		fp := preview(t, d, alice, `"999.99"`)
		res := do(t, d, confirm(alice, `"999.99"`, fp), p.handle)
		require.Nil(t, res.immediate)
		require.Equal(t, 201, res.status)
		_, found, err := approvals.ApprovalByKey(ctx, e.claimsOf(t, fp, alice, "payments.transfer").Nonce)
		require.NoError(t, err)
		require.False(t, found)
	})

	t.Run("pending, approved by another person, executed once, replayed", func(t *testing.T) {
		p := newPayments()
		fp := preview(t, d, alice, `"1500.00"`)
		nonce := e.claimsOf(t, fp, alice, "payments.transfer").Nonce
		id := pending(t, fp, `"1500.00"`)
		require.Equal(t, id, pending(t, fp, `"1500.00"`), "every retry before a decision gets the same approval")
		_, found := e.record(t, nonce)
		require.False(t, found, "nothing but the approval is written")
		a := approval(t, id)
		require.Equal(t, alice, a.Requester)
		require.Equal(t, nonce, a.Key)
		require.JSONEq(t, `{"amount":1500.00,"currency":"EUR","payee.account_id":"DE89"}`, string(a.Params))
		require.Equal(t, []string{"amount >= 1000.00"}, a.Rules)
		require.Equal(t, e.claimsOf(t, fp, alice, "payments.transfer").ExpiresAt(), a.ExpiresAt.UTC(), "an approval never outlives its fingerprint")

		st := requireEnvelope(t, do(t, d, status(alice, fp), neverCalled(t)), 200, "approval_pending", true)
		require.Equal(t, id, st["approval_id"])

		decide(t, id, bob, true)
		st = requireEnvelope(t, do(t, d, status(alice, fp), neverCalled(t)), 200, "approval_granted", false)
		require.Equal(t, id, st["approval_id"])

		res := do(t, d, confirm(alice, `"1500.00"`, fp), p.handle)
		require.Nil(t, res.immediate, string(res.body))
		require.Equal(t, 201, res.status)
		require.Equal(t, nonce, res.upstreamHdrs["idempotency-key"])
		require.Equal(t, state.ApprovalConsumed, approval(t, id).State)
		rec, found := e.record(t, nonce)
		require.True(t, found)
		require.Equal(t, state.Done, rec.State)

		res = do(t, d, confirm(alice, `"1500.00"`, fp), neverCalled(t))
		requireEnvelope(t, res, 201, "already_completed", false)
		requireEnvelope(t, do(t, d, status(alice, fp), neverCalled(t)), 200, "completed", false)
		require.Equal(t, 1, p.Executions())
	})

	t.Run("an approval is for its nonce only: a new preview of the same params needs its own", func(t *testing.T) {
		fp1 := preview(t, d, alice, `"2000.00"`)
		id1 := pending(t, fp1, `"2000.00"`)
		decide(t, id1, bob, true)
		fp2 := preview(t, d, alice, `"2000.00"`)
		id2 := pending(t, fp2, `"2000.00"`)
		require.NotEqual(t, id1, id2)
		require.Equal(t, state.ApprovalApproved, approval(t, id1).State, "the other nonce's approval is untouched")
	})

	t.Run("a params change fails verification and consumes nothing", func(t *testing.T) {
		fp := preview(t, d, alice, `"3000.00"`)
		id := pending(t, fp, `"3000.00"`)
		decide(t, id, bob, true)
		res := do(t, d, confirm(alice, `"3000.01"`, fp), neverCalled(t))
		requireEnvelope(t, res, 422, "params_changed", false)
		require.Equal(t, state.ApprovalApproved, approval(t, id).State)
		_, found := e.record(t, e.claimsOf(t, fp, alice, "payments.transfer").Nonce)
		require.False(t, found)
	})

	t.Run("a denied approval never executes", func(t *testing.T) {
		fp := preview(t, d, alice, `"4000.00"`)
		id := pending(t, fp, `"4000.00"`)
		decide(t, id, bob, false)
		for range 2 {
			body := requireEnvelope(t, do(t, d, confirm(alice, `"4000.00"`, fp), neverCalled(t)), 403, "approval_denied", false)
			require.Equal(t, id, body["approval_id"])
		}
		st := requireEnvelope(t, do(t, d, status(alice, fp), neverCalled(t)), 200, "approval_denied", false)
		require.Equal(t, id, st["approval_id"])
		_, found := e.record(t, e.claimsOf(t, fp, alice, "payments.transfer").Nonce)
		require.False(t, found)
	})

	t.Run("a consumed approval whose claim was given back unsent runs its one execution", func(t *testing.T) {
		p := newPayments()
		fp := preview(t, d, alice, `"7000.00"`)
		c := e.claimsOf(t, fp, alice, "payments.transfer")
		id := pending(t, fp, `"7000.00"`)
		decide(t, id, bob, true)
		// Another gateway consumed it and never sent the request.
		ans, err := approvals.AcquireApproved(ctx, state.AcquireRequest{Key: c.Nonce, Scope: "payments.transfer", SubjectTag: c.SubjectTag,
			ParamHash: c.ParamHash, Owner: "other-gateway", Lease: time.Minute, Retention: 72 * time.Hour}, id)
		require.NoError(t, err)
		require.Equal(t, state.OutcomeAcquired, ans.Answer.Outcome)
		gone, err := approvals.AbandonUnsent(ctx, state.Claim{Key: c.Nonce, Owner: "other-gateway", Fence: 1})
		require.NoError(t, err)
		require.Equal(t, state.OutcomeOK, gone.Outcome)

		res := do(t, d, confirm(alice, `"7000.00"`, fp), p.handle)
		require.Nil(t, res.immediate, string(res.body))
		requireEnvelope(t, do(t, d, confirm(alice, `"7000.00"`, fp), neverCalled(t)), 201, "already_completed", false)
		require.Equal(t, 1, p.Executions())
		require.Equal(t, state.ApprovalConsumed, approval(t, id).State)
	})

	t.Run("an approval store failure is temporarily_unavailable", func(t *testing.T) {
		fp := preview(t, d, alice, `"5000.00"`)
		srv, err := NewServer(Options{Config: e.cfg, Store: e.store, Approvals: failingApprovals{approvals}, Logger: e.logger, Metrics: NewMetrics(prometheus.NewRegistry()), Now: e.clock.Now})
		require.NoError(t, err)
		res := do(t, fakeDialer{srv: srv}, confirm(alice, `"5000.00"`, fp), neverCalled(t))
		requireEnvelope(t, res, 503, "temporarily_unavailable", true)
	})

	if !movableClock {
		return
	}
	t.Run("a lapsed approval is approval_expired, also after the fingerprint expired", func(t *testing.T) {
		fp := preview(t, d, alice, `"6000.00"`)
		id := pending(t, fp, `"6000.00"`)
		decide(t, id, bob, true)
		e.clock.Advance(24*time.Hour + time.Second)
		body := requireEnvelope(t, do(t, d, confirm(alice, `"6000.00"`, fp), neverCalled(t)), 410, "approval_expired", false)
		require.Equal(t, id, body["approval_id"])
		require.Equal(t, "transfer_preview", body["preview_with"])
		require.Equal(t, state.ApprovalExpired, approval(t, id).State)
		requireEnvelope(t, do(t, d, status(alice, fp), neverCalled(t)), 200, "approval_expired", false)
	})
}

// failingApprovals fails every approval call.
type failingApprovals struct{ state.Approvals }

func (failingApprovals) ApprovalByKey(_ context.Context, _ string) (state.Approval, bool, error) {
	return state.Approval{}, false, state.Unavailable("read approval", errors.New("injected outage"))
}

// TestApprovalWithoutApprovalStore: Redis alone keeps no approvals; a
// confirm that needs one is refused, one that does not runs.
func TestApprovalWithoutApprovalStore(t *testing.T) {
	clk := newClock()
	e := newApprovalEnv(t, memory.New(memory.Options{Now: clk.Now}), nil, clk)
	d := fakeDialer{srv: e.srv}
	const alice = "user-alice"
	fp := preview(t, d, alice, `"1000.00"`)
	res := do(t, d, post("/v1/transfers/confirm", alice, transferBody(`"1000.00"`, "EUR", "DE89", fp)), neverCalled(t))
	requireEnvelope(t, res, 503, "temporarily_unavailable", true)
	fp = preview(t, d, alice, `"10.00"`)
	res = do(t, d, post("/v1/transfers/confirm", alice, transferBody(`"10.00"`, "EUR", "DE89", fp)), newPayments().handle)
	require.Nil(t, res.immediate)
	require.Equal(t, 201, res.status)
}

// TestApprovalMCP: over MCP the approval answers are tool results with
// isError true, and the approved confirm runs once.
func TestApprovalMCP(t *testing.T) {
	clk := newClock()
	m := memory.New(memory.Options{Now: clk.Now})
	e := newApprovalEnvYAML(t, withApproval(mcpConfigYAML), m, m, clk)
	d := fakeDialer{srv: e.srv}
	up := newMCPServer(false)
	const alice = "user-alice"

	res := do(t, d, mcpPost(alice, rpc(`1`, "tools/call", callParams("transfer_preview", transferArgs(`"1500.00"`, "")))), up.handle)
	sc := finalMessage(t, res.body)["result"].(map[string]any)["structuredContent"].(map[string]any)
	require.Equal(t, true, sc["approval_required"], string(res.body))
	fp := sc["fingerprint"].(string)

	confirm := rpc(`2`, "tools/call", callParams("transfer_confirm", transferArgs(`"1500.00"`, fp)))
	r := toolResult(t, do(t, d, mcpPost(alice, confirm), neverCalled(t)), `2`, "approval_pending", true)
	id := r["structuredContent"].(map[string]any)["approval_id"].(string)
	status := rpc(`3`, "tools/call", callParams("transfer_status", `{"fingerprint":"`+fp+`"}`))
	toolResult(t, do(t, d, mcpPost(alice, status), neverCalled(t)), `3`, "approval_pending", false)

	out, _, err := m.DecideApproval(t.Context(), state.Decision{ID: id, Approver: "user-bob", Approve: true, Reason: "ok"})
	require.NoError(t, err)
	require.Equal(t, state.DecisionRecorded, out)
	toolResult(t, do(t, d, mcpPost(alice, status), neverCalled(t)), `3`, "approval_granted", false)

	res = do(t, d, mcpPost(alice, confirm), up.handle)
	require.Nil(t, res.immediate, string(res.body))
	require.Equal(t, 1, up.Executions())
	toolResult(t, do(t, d, mcpPost(alice, confirm), neverCalled(t)), `2`, "already_completed", false)
	require.Equal(t, 1, up.Executions())

	// A denied one is a refusal.
	res = do(t, d, mcpPost(alice, rpc(`4`, "tools/call", callParams("transfer_preview", transferArgs(`"2500.00"`, "")))), up.handle)
	fp = finalMessage(t, res.body)["result"].(map[string]any)["structuredContent"].(map[string]any)["fingerprint"].(string)
	confirm = rpc(`5`, "tools/call", callParams("transfer_confirm", transferArgs(`"2500.00"`, fp)))
	r = toolResult(t, do(t, d, mcpPost(alice, confirm), neverCalled(t)), `5`, "approval_pending", true)
	id = r["structuredContent"].(map[string]any)["approval_id"].(string)
	_, _, err = m.DecideApproval(t.Context(), state.Decision{ID: id, Approver: "user-bob", Approve: false, Reason: "unknown payee"})
	require.NoError(t, err)
	toolResult(t, do(t, d, mcpPost(alice, confirm), neverCalled(t)), `5`, "approval_denied", true)
	require.Equal(t, 1, up.Executions())
}

// notices records what the server asks to be notified of.
type notices struct {
	mu  sync.Mutex
	ids []string
}

func (n *notices) Requested(a state.Approval, op *config.Operation) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.ids = append(n.ids, op.Name+" "+a.ID)
}

// TestApprovalNotifiedOnce: the notifier hears of an approval when it is
// created, not on the retries that find it.
func TestApprovalNotifiedOnce(t *testing.T) {
	clk := newClock()
	m := memory.New(memory.Options{Now: clk.Now})
	e := newApprovalEnv(t, m, m, clk)
	n := &notices{}
	srv, err := NewServer(Options{Config: e.cfg, Store: e.store, Approvals: m, Notifier: n, Logger: e.logger, Metrics: NewMetrics(prometheus.NewRegistry()), Now: e.clock.Now})
	require.NoError(t, err)
	d := fakeDialer{srv: srv}
	fp := preview(t, d, "user-alice", `"1500.00"`)
	var id string
	for range 3 {
		res := do(t, d, post("/v1/transfers/confirm", "user-alice", transferBody(`"1500.00"`, "EUR", "DE89", fp)), neverCalled(t))
		id = requireEnvelope(t, res, 202, "approval_pending", true)["approval_id"].(string)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	require.Equal(t, []string{"transfer " + id}, n.ids)
}

// TestApprovalTransitionsAreSpanEvents: the stream that creates an
// approval and the one that consumes it say so on their spans.
func TestApprovalTransitionsAreSpanEvents(t *testing.T) {
	clk := newClock()
	m := memory.New(memory.Options{Now: clk.Now})
	e := newApprovalEnv(t, m, m, clk)
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(t.Context()) })
	srv, err := NewServer(Options{Config: e.cfg, Store: e.store, Approvals: m, Logger: e.logger, Metrics: NewMetrics(prometheus.NewRegistry()),
		Now: e.clock.Now, Tracer: tp.Tracer(TracerName)})
	require.NoError(t, err)
	d := fakeDialer{srv: srv}
	fp := preview(t, d, "user-alice", `"1500.00"`)
	confirm := post("/v1/transfers/confirm", "user-alice", transferBody(`"1500.00"`, "EUR", "DE89", fp))
	exp.Reset()
	id := requireEnvelope(t, do(t, d, confirm, neverCalled(t)), 202, "approval_pending", true)["approval_id"].(string)
	eventOf := func(name string) map[string]string {
		root, _ := streamSpans(t, exp, "idemgate.confirm")
		for _, ev := range root.Events {
			if ev.Name == name {
				m := map[string]string{}
				for _, kv := range ev.Attributes {
					m[string(kv.Key)] = kv.Value.String()
				}
				return m
			}
		}
		return nil
	}
	require.Equal(t, map[string]string{"idemgate.approval_id": id}, eventOf("approval.requested"))
	_, _, err = m.DecideApproval(t.Context(), state.Decision{ID: id, Approver: "user-bob", Approve: true, Reason: "ok"})
	require.NoError(t, err)
	exp.Reset()
	res := do(t, d, confirm, newPayments().handle)
	require.Nil(t, res.immediate)
	require.Equal(t, map[string]string{"idemgate.approval_id": id}, eventOf("approval.consumed"))
}

// dailyYAML gates transfers once a subject's EUR (or USD …) transfers of
// the UTC day would exceed 5000.00.
var dailyYAML = strings.Replace(testConfigYAML, "    result_ref: transfer_id\n", `    result_ref: transfer_id
    approval:
      rules: [{daily_total: {param: amount, over: "5000.00", per: [currency]}}]
      approvers:
        jwt: {issuer: https://idp.example, audience: idemgate-approvals, jwks_file: /approvers.jwks}
`, 1)

func TestApprovalDailyTotalMemory(t *testing.T) {
	clk := newClock()
	m := memory.New(memory.Options{Now: clk.Now})
	runDailyTotal(t, newApprovalEnvYAML(t, dailyYAML, m, m, clk), m)
}

func TestApprovalDailyTotalPostgres(t *testing.T) {
	if testing.Short() {
		t.Skip("needs PostgreSQL")
	}
	dsn := testutil.CreateDatabase(t)
	require.NoError(t, postgres.Migrate(t.Context(), dsn))
	pg, err := postgres.New(t.Context(), postgres.Options{DSN: dsn})
	require.NoError(t, err)
	t.Cleanup(func() { _ = pg.Close() })
	runDailyTotal(t, newApprovalEnvYAML(t, dailyYAML, pg, pg, nil), pg)
}

func runDailyTotal(t *testing.T, e *env, approvals approvalStore) {
	d := fakeDialer{srv: e.srv}
	p := newPayments()
	body := func(amount, currency, fp string) []byte { return transferBody(amount, currency, "DE89", fp) }
	previewOf := func(subject, amount, currency string) string {
		t.Helper()
		res := do(t, d, post("/v1/transfers/preview", subject, body(amount, currency, "")), previewOK)
		b := res.json(t)
		require.NotContains(t, b, "approval_required", "a daily total is only known at confirm")
		return b["fingerprint"].(string)
	}
	confirm := func(subject, amount, currency, fp string, up upstreamFunc) result {
		t.Helper()
		return do(t, d, post("/v1/transfers/confirm", subject, body(amount, currency, fp)), up)
	}

	fp1 := previewOf("user-alice", `"3000.00"`, "EUR")
	res := confirm("user-alice", `"3000.00"`, "EUR", fp1, p.handle)
	require.Nil(t, res.immediate, string(res.body))

	fp2 := previewOf("user-alice", `"2000.01"`, "EUR")
	res = confirm("user-alice", `"2000.01"`, "EUR", fp2, neverCalled(t))
	pending := requireEnvelope(t, res, 202, "approval_pending", true)
	id := pending["approval_id"].(string)
	a, _, err := approvals.GetApproval(t.Context(), id)
	require.NoError(t, err)
	require.Equal(t, []string{"daily total of amount per currency > 5000.00"}, a.Rules)

	// Exactly the limit passes; other currencies and other people have
	// their own budgets. (The pending 2000.01 counts too.)
	fp3 := previewOf("user-alice", `"1"`, "USD")
	require.Nil(t, confirm("user-alice", `"1"`, "USD", fp3, p.handle).immediate)
	fp4 := previewOf("user-bob", `"5000"`, "EUR")
	require.Nil(t, confirm("user-bob", `"5000"`, "EUR", fp4, p.handle).immediate)
	fp5 := previewOf("user-alice", `"0.01"`, "EUR")
	requireEnvelope(t, confirm("user-alice", `"0.01"`, "EUR", fp5, neverCalled(t)), 202, "approval_pending", true)

	// A retry of an executed confirm replays whatever the budget says now.
	requireEnvelope(t, confirm("user-alice", `"3000.00"`, "EUR", fp1, neverCalled(t)), 201, "already_completed", false)

	// Approved, the confirm over the budget runs once.
	out, _, err := approvals.DecideApproval(t.Context(), state.Decision{ID: id, Approver: "user-bob", Approve: true, Reason: "month end"})
	require.NoError(t, err)
	require.Equal(t, state.DecisionRecorded, out)
	require.Nil(t, confirm("user-alice", `"2000.01"`, "EUR", fp2, p.handle).immediate)
	require.Equal(t, 4, p.Executions())
}

// TestApprovalDailyTotalExponentAmount: an amount the canonical form writes
// with an exponent (here a tiny one, 1e-30) is never expanded for summing;
// its rule needs approval.
func TestApprovalDailyTotalExponentAmount(t *testing.T) {
	clk := newClock()
	m := memory.New(memory.Options{Now: clk.Now})
	e := newApprovalEnvYAML(t, dailyYAML, m, m, clk)
	d := fakeDialer{srv: e.srv}
	res := do(t, d, post("/v1/transfers/preview", "user-alice", transferBody(`1e-30`, "EUR", "DE89", "")), previewOK)
	fp, _ := res.json(t)["fingerprint"].(string)
	require.NotEmpty(t, fp, string(res.body))
	res = do(t, d, post("/v1/transfers/confirm", "user-alice", transferBody(`1e-30`, "EUR", "DE89", fp)), neverCalled(t))
	id := requireEnvelope(t, res, 202, "approval_pending", true)["approval_id"].(string)
	a, _, err := m.GetApproval(t.Context(), id)
	require.NoError(t, err)
	require.Equal(t, []string{"daily total of amount per currency > 5000.00"}, a.Rules)
}
