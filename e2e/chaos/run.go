package chaos

import (
	"context"
	"math/rand/v2"
	"net/http"
	"testing"
	"time"

	"github.com/idemgate/idemgate/e2e/internal/stack"
)

// Options shape one run.
type Options struct {
	Seed     int64
	Duration time.Duration
	// HonoursKeys: payments deduplicates by Idempotency-Key (and idemgate
	// sends it); otherwise payments executes every call it gets.
	HonoursKeys bool
	Pods        int
	Agents      int
	Users       int
	// InFlightTTL is ttl.in_flight, short so that leases expire during the
	// run; ConfirmRouteTimeout is above it, so an upstream slower than the
	// lease is still waited for (and its lease taken over meanwhile).
	InFlightTTL         time.Duration
	ConfirmRouteTimeout time.Duration
	// ConfirmRetryOn replaces the confirm route's retry_on (empty: as
	// shipped, "reset,connect-failure"). With a key-ignoring payments the
	// run uses "connect-failure,reset-before-request": Envoy's retry after a
	// reset re-sends a confirm the upstream may have executed, a second
	// payment idemgate cannot see (TestShippedRetryOnResetDoublePays).
	ConfirmRetryOn string
	// FaultGap is the mean pause between two faults of one lane.
	FaultGap time.Duration
	// FaultKinds limits the kinds injected (nil: all).
	FaultKinds []string
	// OwnPostgres runs a PostgreSQL instance of the run's own, which the
	// injector may crash and restart; otherwise a fresh database on the
	// shared server (never restarted).
	OwnPostgres bool
	// Approvers is how many people decide approvals during the load.
	Approvers int
	// Rerun is the command the report prints to run this again.
	Rerun string
	// FingerprintTTL, TerminalTTL, ReplayCacheTTL and ApprovalTTL replace
	// the shipped ttl.fingerprint, ttl.terminal, ttl.replay_cache and the
	// transfer's approval.ttl when set: a soak shortens them so that Redis's
	// working set levels off within the run.
	FingerprintTTL, TerminalTTL, ReplayCacheTTL, ApprovalTTL time.Duration
}

func (o *Options) defaults() {
	if o.Pods == 0 {
		o.Pods = 3
	}
	if o.Agents == 0 {
		o.Agents = 6
	}
	if o.Users == 0 {
		o.Users = 3
	}
	if o.InFlightTTL == 0 {
		o.InFlightTTL = 3 * time.Second
	}
	if o.ConfirmRouteTimeout == 0 {
		o.ConfirmRouteTimeout = 8 * time.Second
	}
	if o.ConfirmRetryOn == "" && !o.HonoursKeys {
		o.ConfirmRetryOn = SafeRetryOn
	}
	if o.FaultGap == 0 {
		o.FaultGap = 2 * time.Second
	}
	if o.Approvers == 0 {
		o.Approvers = 3
	}
}

// SafeRetryOn retries only what never reached the upstream.
const SafeRetryOn = "connect-failure,reset-before-request"

// Result is a finished run: its history, the violations and the report.
type Result struct {
	History    History
	Violations []Violation
	Report     string
}

// Run brings up a topology, lets the agents work under faults for
// opts.Duration, waits for the leases to expire, has every undecided
// fingerprint confirmed once more, reads PostgreSQL and checks the history.
func Run(t testing.TB, env stack.Env, opts Options) Result {
	t.Helper()
	opts.defaults()
	started := time.Now()
	l := runLoad(t, env, opts, nil)
	defer l.client.CloseIdleConnections()
	rec, ledger, client, approvers, tp, faultsEnd := l.rec, l.ledger, l.client, l.approvers, l.tp, l.faultsEnd
	if l.injErr != nil {
		t.Fatalf("the fault injector could not restore the topology: %v", l.injErr)
	}
	for _, p := range tp.Pods {
		if err := p.Idemgate.WaitReady(60 * time.Second); err != nil {
			t.Fatalf("idemgate %d not ready after the faults: %v", p.Index, err)
		}
	}

	// Leases expire; then every fingerprint whose agent did not get a
	// decision is confirmed again until it does (bounded).
	if wait := time.Until(faultsEnd.Add(opts.InFlightTTL + 500*time.Millisecond)); wait > 0 {
		time.Sleep(wait)
	}
	// Approvals the load left pending are decided, so that every gated
	// fingerprint can end decided; the sweep settles those it creates.
	approvers.SettlePending(opts.Seed)
	sweep(rec, tp.Pods, client, opts, approvers)

	rowsAt := time.Now()
	rctx, rcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer rcancel()
	rows, err := tp.Rows(rctx)
	if err != nil {
		t.Fatal(err)
	}
	approvals, err := tp.Approvals(rctx)
	if err != nil {
		t.Fatal(err)
	}
	calls, faults, issued := rec.Snapshot()
	st := tp.Payments.Stats()
	h := History{
		Seed: opts.Seed, HonoursKeys: opts.HonoursKeys, Issued: issued, Calls: calls, Faults: faults,
		Upstream: ledger.Calls(), ExecutionsByKey: st.ExecutionsByKey, TotalExecutions: st.Executions,
		StoredResult: map[string][]byte{}, Rows: rows, FaultsEnd: faultsEnd, RowsAt: rowsAt,
		InFlightTTL:     opts.InFlightTTL,
		ApprovalAtLeast: ApprovalAtLeast, ApprovalRequired: ApprovalRequired,
		Approvals: approvals, Decisions: rec.Decisions(),
	}
	if opts.HonoursKeys {
		for k := range st.ExecutionsByKey {
			if r, ok := tp.Payments.RecordForKey(k); ok {
				h.StoredResult[k] = r.Body
			}
		}
	}
	vs := Check(h)
	res := Result{History: h, Violations: vs, Report: Report(h, vs, opts, time.Since(started))}
	if len(vs) > 0 {
		seen := map[string]bool{}
		for _, v := range vs {
			if v.Nonce != "" && !seen[v.Nonce] && len(seen) < 8 {
				seen[v.Nonce] = true
				t.Logf("%s", Timeline(h, v.Nonce))
			}
		}
		for _, p := range tp.Pods {
			g, e := p.Logs()
			t.Logf("---- idemgate %d log (tail) ----\n%s", p.Index, tail(g, 12000))
			t.Logf("---- envoy %d log (tail) ----\n%s", p.Index, tail(e, 4000))
		}
	}
	return res
}

// sweep confirms again, through the pods in turn, every fingerprint whose
// last answer left it undecided, until it is decided (a few tries each).
// Then it asks the status of every other confirmed fingerprint and confirms
// again those the status does not call decided, as an agent or the on-call
// engineer following the status answer would: a replica killed while it
// was still writing an executed confirm's result (its store had just been
// cut) leaves the record IN_FLIGHT although the agent got its answer, and
// the status then says to confirm again (the key makes that safe).
func sweep(rec *Recorder, pods []*Pod, client *http.Client, opts Options, approvers *Approvers) {
	calls, _, _ := rec.Snapshot()
	byNonce := map[string][]Call{}
	agentOf := map[string]int{}
	for _, c := range calls {
		if c.Kind != KindPreview && c.Nonce != "" {
			byNonce[c.Nonce] = append(byNonce[c.Nonce], c)
			agentOf[c.Nonce] = c.Agent
		}
	}
	_, _, issued := rec.Snapshot()
	setup := agentSetup{seed: opts.Seed, users: opts.Users, pods: pods, client: client, rec: rec}
	agents := map[int]*Agent{}
	agentFor := func(n string) *Agent {
		id := agentOf[n]
		a := agents[id]
		if a == nil {
			var err error
			if a, err = setup.newAgent(id, &memory{}); err != nil {
				return nil
			}
			a.rng = rand.New(rand.NewPCG(uint64(opts.Seed), 0x5eed))
			agents[id] = a
		}
		a.task = -1
		return a
	}
	settle := func(a *Agent, n string) {
		for try := range 8 {
			c := a.confirm(context.Background(), issued[n], issued[n].Params, "final check", try%len(pods), defaultTimeout)
			a.rec.Call(c)
			if decided(c) {
				return
			}
			if classify(c) == ClassApprovalPending && c.Envelope.ApprovalID != "" {
				approvers.Settle(c.Envelope.ApprovalID, a.user, false)
				continue
			}
			time.Sleep(500 * time.Millisecond)
		}
	}
	var rest []string
	for _, n := range sortedKeys(byNonce) {
		last, ok := lastDecisive(byNonce[n])
		if ok && decided(last) {
			rest = append(rest, n)
			continue
		}
		if !ok {
			continue
		}
		if a := agentFor(n); a != nil {
			settle(a, n)
		}
	}
	for _, n := range rest {
		a := agentFor(n)
		if a == nil {
			continue
		}
		for range 3 {
			st := a.status(context.Background(), issued[n])
			if st.Envelope == nil || st.Envelope.Status == "temporarily_unavailable" {
				time.Sleep(500 * time.Millisecond)
				continue
			}
			switch st.Envelope.Status {
			case "not_started", "in_progress":
				settle(a, n)
			}
			break
		}
	}
}

// decided says an answer settles the fingerprint for good.
func decided(c Call) bool {
	if c.Kind == KindStatus {
		return c.Envelope != nil && isTerminalStatus(c.Envelope.Status)
	}
	switch classify(c) {
	case ClassResult, ClassReplay, ClassReconcile, ClassDenied:
		return true
	}
	return false
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "…" + s[len(s)-n:]
}

// String names the mode in reports.
func mode(honours bool) string {
	if honours {
		return "payments honours Idempotency-Key"
	}
	return "payments ignores Idempotency-Key"
}
