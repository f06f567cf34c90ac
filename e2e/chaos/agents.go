package chaos

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/idemgate/idemgate/e2e/demoauth"
	"github.com/idemgate/idemgate/e2e/internal/stack"
)

// memory is what agents forgot and come back to: fingerprints of transfers
// they already confirmed, which another turn of the same user confirms
// again "minutes later" (compressed to seconds), as an agent does after a
// context compaction.
type memory struct {
	mu    sync.Mutex
	items []remembered
}

type remembered struct {
	user   string
	issued Issued
}

func (m *memory) add(user string, is Issued) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.items) < 512 {
		m.items = append(m.items, remembered{user, is})
	}
}

func (m *memory) pick(r *rand.Rand, user string) (Issued, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var mine []Issued
	for _, it := range m.items {
		if it.user == user {
			mine = append(mine, it.issued)
		}
	}
	if len(mine) == 0 {
		return Issued{}, false
	}
	return mine[r.IntN(len(mine))], true
}

// Agent is one simulated LLM agent: a user, its own seeded choices, and the
// three tools, spread over the pods.
type Agent struct {
	id     int
	user   string
	token  string
	rng    *rand.Rand
	pods   []*Pod
	client *http.Client
	rec    *Recorder
	mem    *memory
	task   int
	// tries bounds the calls of one task, so a run always stops.
	tries int
}

const (
	maxTriesPerTask = 14
	defaultTimeout  = 12 * time.Second
)

var memos = []string{
	"rent for December", "December rent", "rent (Dec)", "pay the landlord",
	"monthly rent, as discussed", "invoice 2231", "for invoice #2231", "utilities",
	"请付房租", "team lunch", "reimbursement: taxi", "taxi reimbursement",
}

// agentSetup is what the agents of a run share.
type agentSetup struct {
	seed   int64 // with the agent's id, seeds its choices
	users  int   // agent id is user id%users
	pods   []*Pod
	client *http.Client
	rec    *Recorder
}

// newAgent returns agent id, remembering its transfers in mem.
func (s agentSetup) newAgent(id int, mem *memory) (*Agent, error) {
	user := fmt.Sprintf("user%d", id%s.users)
	tok, err := demoauth.Mint(user, 24*time.Hour, time.Now())
	if err != nil {
		return nil, err
	}
	return &Agent{
		id: id, user: user, token: tok, pods: s.pods, client: s.client, rec: s.rec, mem: mem,
		rng: rand.New(rand.NewPCG(uint64(s.seed), uint64(id)+1)),
	}, nil
}

// Run works tasks until ctx ends: mostly a new transfer, sometimes an old
// one it forgot.
func (a *Agent) Run(ctx context.Context) {
	for ctx.Err() == nil {
		a.task++
		a.tries = 0
		if is, ok := a.mem.pick(a.rng, a.user); ok && a.rng.IntN(10) == 0 {
			a.confirmLoop(ctx, is, a.memo())
			continue
		}
		a.newTransfer(ctx)
		a.sleep(ctx, time.Duration(a.rng.IntN(300))*time.Millisecond)
	}
}

func (a *Agent) memo() string { return memos[a.rng.IntN(len(memos))] }

func (a *Agent) pod() int { return a.rng.IntN(len(a.pods)) }

func (a *Agent) sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

func (a *Agent) randomParams() Params {
	cur := []string{"EUR", "USD", "GBP"}[a.rng.IntN(3)]
	return Params{
		Amount:   fmt.Sprintf("%d.%02d", 1+a.rng.IntN(900), a.rng.IntN(100)),
		Currency: cur,
		Account:  fmt.Sprintf("acct_%03d", a.rng.IntN(200)),
	}
}

// newTransfer previews a transfer and confirms it.
func (a *Agent) newTransfer(ctx context.Context) {
	is, ok := a.preview(ctx, a.randomParams())
	if !ok {
		return
	}
	a.confirmLoop(ctx, is, a.memo())
}

// preview calls the preview tool until it answers (bounded).
func (a *Agent) preview(ctx context.Context, p Params) (Issued, bool) {
	for a.tries < maxTriesPerTask {
		a.tries++
		c := a.call(ctx, KindPreview, a.pod(), body(p, "", a.memo()), defaultTimeout)
		c.Params = p
		if c.Err == "" && c.HTTP == http.StatusOK {
			var q struct {
				Fingerprint string `json:"fingerprint"`
			}
			if json.Unmarshal(c.Body, &q) == nil && q.Fingerprint != "" {
				if fp, err := stack.DecodeFingerprint(q.Fingerprint); err == nil {
					c.Nonce, c.Token = fp.Nonce, q.Fingerprint
					a.rec.Call(c)
					return Issued{Nonce: fp.Nonce, Token: q.Fingerprint, Params: p}, true
				}
			}
		}
		a.rec.Call(c)
		a.sleep(ctx, 200*time.Millisecond)
	}
	return Issued{}, false
}

// confirmLoop confirms is until the agent has a decision, behaving the ways
// agents do between attempts. It ends within maxTriesPerTask calls.
func (a *Agent) confirmLoop(ctx context.Context, is Issued, memo string) {
	for a.tries < maxTriesPerTask {
		a.tries++
		// An occasional drifted amount: the model regenerated the call.
		if a.rng.IntN(25) == 0 {
			drift := is.Params
			drift.Amount = fmt.Sprintf("%d.00", 1000+a.rng.IntN(9000))
			c := a.confirm(ctx, is, drift, memo, a.pod(), defaultTimeout)
			c.Drifted = true
			a.rec.Call(c)
			if c.Envelope != nil && c.Envelope.Status == "params_changed" {
				// Re-plan: preview what it now wants, confirm that.
				if n, ok := a.preview(ctx, drift); ok {
					is = n
				}
				continue
			}
		}
		timeout := defaultTimeout
		if a.rng.IntN(6) == 0 {
			timeout = time.Duration(500+a.rng.IntN(2500)) * time.Millisecond
		}
		var c Call
		if a.rng.IntN(20) == 0 && len(a.pods) > 1 {
			c = a.doubleClick(ctx, is, memo, timeout)
		} else {
			c = a.confirm(ctx, is, is.Params, memo, a.pod(), timeout)
			if c.Timeout {
				a.rec.Fault(Fault{Kind: FaultClientTimeout, At: c.End, Pod: c.Pod, Nonce: is.Nonce, Detail: "the agent gave up after " + timeout.String()})
			}
			a.rec.Call(c)
		}
		// Reworded free text on every retry: not a bound field.
		memo = a.memo()
		switch classify(c) {
		case ClassResult, ClassReplay:
			a.mem.add(a.user, is)
			if a.rng.IntN(4) == 0 {
				a.sleep(ctx, time.Duration(500+a.rng.IntN(3000))*time.Millisecond)
				a.rec.Call(a.confirm(ctx, is, is.Params, a.memo(), a.pod(), defaultTimeout))
			}
			if a.rng.IntN(5) == 0 {
				a.status(ctx, is)
			}
			return
		case ClassReconcile:
			a.status(ctx, is)
			return
		case ClassApprovalPending:
			// As approval_pending instructs: wait, ask the status tool
			// now and then, then confirm again, same fingerprint.
			a.sleep(ctx, time.Duration(300+a.rng.IntN(900))*time.Millisecond)
			if a.rng.IntN(3) == 0 {
				a.tries++
				if st := a.status(ctx, is); st.Envelope != nil && st.Envelope.Status == "approval_denied" {
					return
				}
			}
		case ClassInProgress:
			if done := a.poll(ctx, is, c.Envelope); done {
				return
			}
		case ClassUnavailable:
			wait := time.Second
			if e := c.Envelope; e.RetryAfterMS != nil && time.Duration(*e.RetryAfterMS)*time.Millisecond < wait {
				wait = time.Duration(*e.RetryAfterMS) * time.Millisecond
			}
			a.sleep(ctx, wait)
		case ClassInfra:
			// Re-plan after an error it could not read: try again, maybe
			// elsewhere, after a moment.
			a.sleep(ctx, time.Duration(200+a.rng.IntN(800))*time.Millisecond)
		default:
			return // told to preview again or to stop
		}
	}
}

// doubleClick sends the same confirm through two pods at once.
func (a *Agent) doubleClick(ctx context.Context, is Issued, memo string, timeout time.Duration) Call {
	p1 := a.pod()
	p2 := (p1 + 1 + a.rng.IntN(len(a.pods)-1)) % len(a.pods)
	var wg sync.WaitGroup
	var c2 Call
	wg.Go(func() { c2 = a.confirm(ctx, is, is.Params, memo+" ", p2, timeout) })
	c1 := a.confirm(ctx, is, is.Params, memo, p1, timeout)
	wg.Wait()
	c1.Concurrent, c2.Concurrent = true, true
	for _, c := range []Call{c1, c2} {
		if c.Timeout {
			a.rec.Fault(Fault{Kind: FaultClientTimeout, At: c.End, Pod: c.Pod, Nonce: is.Nonce, Detail: "the agent gave up after " + timeout.String()})
		}
		a.rec.Call(c)
	}
	// The agent reads whichever answer is decided.
	if classify(c1) == ClassInfra || classify(c1) == ClassInProgress {
		return c2
	}
	return c1
}

// poll polls the status tool after an in_progress answer. It reports true
// when the record is decided, false when the agent should confirm again.
func (a *Agent) poll(ctx context.Context, is Issued, e *Envelope) bool {
	for a.tries < maxTriesPerTask {
		a.sleep(ctx, time.Duration(300+a.rng.IntN(700))*time.Millisecond)
		a.tries++
		c := a.status(ctx, is)
		if c.Envelope == nil {
			continue
		}
		switch c.Envelope.Status {
		case "completed", "failed", "needs_reconciliation", "approval_denied":
			if c.Envelope.Status == "completed" {
				a.mem.add(a.user, is)
			}
			return true
		case "not_started", "approval_granted":
			return false
		}
	}
	return true
}

func (a *Agent) confirm(ctx context.Context, is Issued, p Params, memo string, pod int, timeout time.Duration) Call {
	c := a.call(ctx, KindConfirm, pod, body(p, is.Token, memo), timeout)
	c.Nonce, c.Token, c.Params = is.Nonce, is.Token, p
	return c
}

func (a *Agent) status(ctx context.Context, is Issued) Call {
	c := a.call(ctx, KindStatus, a.pod(), map[string]any{"fingerprint": is.Token}, defaultTimeout)
	c.Nonce, c.Token = is.Nonce, is.Token
	a.rec.Call(c)
	return c
}

func body(p Params, fingerprint, memo string) map[string]any {
	b := map[string]any{
		"amount": p.Amount, "currency": p.Currency,
		"payee": map[string]any{"account_id": p.Account, "name": "Payee " + p.Account},
		"memo":  memo,
	}
	if fingerprint != "" {
		b["fingerprint"] = fingerprint
	}
	return b
}

var toolPaths = map[string]string{
	KindPreview: "/v1/transfers/preview",
	KindConfirm: "/v1/transfers/confirm",
	KindStatus:  "/v1/transfers/status",
}

// call sends one tool call and returns it as recorded (not yet logged).
func (a *Agent) call(ctx context.Context, kind string, pod int, b map[string]any, timeout time.Duration) Call {
	c := Call{Agent: a.id, Task: a.task, Kind: kind, Pod: pod, Start: time.Now()}
	raw, _ := json.Marshal(b)
	// Calls in flight when the run ends still finish: the history must
	// hold their answers, and each is bounded by its own timeout.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(rctx, http.MethodPost, a.pods[pod].URL()+toolPaths[kind], bytes.NewReader(raw))
	if err != nil {
		c.Err, c.End = err.Error(), time.Now()
		return c
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+a.token)
	resp, err := a.client.Do(req)
	if err == nil {
		c.Body, err = io.ReadAll(resp.Body)
		resp.Body.Close()
		c.HTTP = resp.StatusCode
		c.Replayed = resp.Header.Get("Idempotent-Replayed") == "true"
		if err == nil && strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
			c.Envelope = decodeEnvelope(c.Body)
		}
	}
	c.End = time.Now()
	if err != nil {
		c.Err = err.Error()
		c.HTTP = 0
		c.Timeout = errors.Is(err, context.DeadlineExceeded) || errors.Is(rctx.Err(), context.DeadlineExceeded)
	}
	return c
}

// decodeEnvelope reads an idemgate envelope (an object with status and
// instruction); the upstream's own answers have no instruction.
func decodeEnvelope(b []byte) *Envelope {
	var probe map[string]json.RawMessage
	if json.Unmarshal(b, &probe) != nil || probe["status"] == nil || probe["instruction"] == nil {
		return nil
	}
	var e Envelope
	if json.Unmarshal(b, &e) != nil {
		return nil
	}
	return &e
}
