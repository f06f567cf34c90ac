package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/idemgate/idemgate/e2e/demoauth"
)

// The run's approval rule (docs/design.md §10): a transfer of at least
// ApprovalAtLeast waits for ApprovalRequired distinct approvers; its
// requester counts as one only with step-up (§13: a token with acr
// StepUpACR and an auth_time within StepUpMaxAge). Agents' amounts run up
// to 900.99 (and drifted ones, previewed again, above 1000), so a fair
// share of transfers is gated.
const (
	ApprovalAtLeast  = "750.00"
	ApprovalRequired = 2
	StepUpACR        = "urn:idemgate:chaos:sca"
	StepUpMaxAge     = 10 * time.Minute
	approverIssuer   = "https://approvers.chaos.idemgate.invalid"
	approverAudience = "idemgate-approvals"
)

// Decision kinds.
const (
	DecideApprove = "approve"
	DecideDeny    = "deny"
)

// Decision is one call of an approver on the approvers' API.
type Decision struct {
	At         time.Time
	Approver   string
	ApprovalID string
	Kind       string // DecideApprove or DecideDeny
	// Self says the approver is the approval's requester: an approve that
	// must be refused (401 insufficient_user_authentication) unless StepUp,
	// the requester's token carrying the step-up (acr, fresh auth_time).
	Self   bool
	StepUp bool
	Pod    int
	HTTP   int
	Err    string
	// Error is the API's "error" member of a refusal.
	Error string
}

// Approvers are the people of the run: identities that decide pending
// approvals on the pods' approvers' APIs, concurrently with the agents
// and the faults. Now and then one of them is the requester itself, which
// idemgate must refuse.
type Approvers struct {
	key    *demoauth.ApproverKey
	client *http.Client
	pods   []*Pod
	rec    *Recorder

	mu     sync.Mutex
	tokens map[string]string
}

// NewApprovers returns the run's approvers with a fresh signing key.
func NewApprovers(client *http.Client, rec *Recorder) (*Approvers, error) {
	key, err := demoauth.NewApproverKey("chaos")
	if err != nil {
		return nil, err
	}
	return &Approvers{key: key, client: client, rec: rec, tokens: map[string]string{}}, nil
}

// JWKS is the public key set the replicas' approvers.jwt verifies with.
func (a *Approvers) JWKS() []byte { return a.key.JWKS() }

// ApprovalBlock is the approval block of the run's transfer operation.
func (a *Approvers) ApprovalBlock(jwksFile string) map[string]any {
	return map[string]any{
		"rules": []any{map[string]any{"param": "amount", "at_least": ApprovalAtLeast}},
		"approvers": map[string]any{
			"jwt":                     map[string]any{"issuer": approverIssuer, "audience": approverAudience, "jwks_file": jwksFile},
			"required":                ApprovalRequired,
			"distinct_from_requester": true,
			"requester_step_up":       map[string]any{"acr": []any{StepUpACR}, "max_auth_age": StepUpMaxAge.String()},
		},
		"ttl": "10m",
	}
}

// token is sub's bearer token (minted once, valid for the run).
func (a *Approvers) token(sub string) string {
	a.mu.Lock()
	defer a.mu.Unlock()
	if t, ok := a.tokens[sub]; ok {
		return t
	}
	// Strings and an integer: encoding the claims cannot fail.
	t, _ := a.key.Mint(map[string]any{"iss": approverIssuer, "aud": approverAudience, "sub": sub, "exp": time.Now().Add(24 * time.Hour).Unix()})
	a.tokens[sub] = t
	return t
}

// stepUpToken is sub's token right after a strong authentication: acr
// StepUpACR, auth_time now (minted for each decision, so it stays fresh).
func (a *Approvers) stepUpToken(sub string) string {
	now := time.Now()
	t, _ := a.key.Mint(map[string]any{"iss": approverIssuer, "aud": approverAudience, "sub": sub,
		"exp": now.Add(time.Hour).Unix(), "acr": StepUpACR, "auth_time": now.Unix()})
	return t
}

// pendingView is what the approvers read of a pending approval.
type pendingView struct {
	ID        string `json:"approval_id"`
	Requester string `json:"requester"`
}

// pending lists the pending approvals through pod as sub.
func (a *Approvers) pending(ctx context.Context, pod int, sub string) ([]pendingView, error) {
	rctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(rctx, http.MethodGet, "http://"+a.pods[pod].ApprovalAddr+"/v1/approvals?state=pending", nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+a.token(sub))
	resp, err := a.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("list: %d", resp.StatusCode)
	}
	var out struct {
		Approvals []pendingView `json:"approvals"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return nil, err
	}
	return out.Approvals, nil
}

// decide sends one decision through pod and records it.
func (a *Approvers) decide(ctx context.Context, pod int, sub string, v pendingView, kind string) Decision {
	return a.decideAs(ctx, pod, sub, v, kind, false)
}

// decideAs is decide with a stepped-up token when stepUp.
func (a *Approvers) decideAs(ctx context.Context, pod int, sub string, v pendingView, kind string, stepUp bool) Decision {
	d := Decision{At: time.Now(), Approver: sub, ApprovalID: v.ID, Kind: kind, Self: sub == v.Requester, StepUp: stepUp, Pod: pod}
	token := a.token(sub)
	if stepUp {
		token = a.stepUpToken(sub)
	}
	rctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	body := `{"reason":"chaos: ` + kind + ` by ` + sub + `"}`
	req, err := http.NewRequestWithContext(rctx, http.MethodPost, "http://"+a.pods[pod].ApprovalAddr+"/v1/approvals/"+v.ID+"/"+kind, strings.NewReader(body))
	if err == nil {
		req.Header.Set("Authorization", "Bearer "+token)
		req.Header.Set("Content-Type", "application/json")
		var resp *http.Response
		if resp, err = a.client.Do(req); err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			d.HTTP = resp.StatusCode
			var e struct {
				Error string `json:"error"`
			}
			if json.Unmarshal(b, &e) == nil {
				d.Error = e.Error
			}
		}
	}
	if err != nil {
		d.Err = err.Error()
	}
	a.rec.Decision(d)
	return d
}

// Run has n approvers (approver0..) decide what is pending until ctx ends:
// each looks every few hundred milliseconds through a random pod and
// mostly approves, sometimes denies, and sometimes acts as the requester,
// with or without step-up.
func (a *Approvers) Run(ctx context.Context, seed int64, n int) {
	var wg sync.WaitGroup
	for i := range n {
		rng := mrand.New(mrand.NewPCG(uint64(seed), 0xa9950000+uint64(i)))
		sub := fmt.Sprintf("approver%d", i)
		wg.Go(func() {
			for ctx.Err() == nil {
				sleepCtx(ctx, time.Duration(150+rng.IntN(350))*time.Millisecond)
				pod := rng.IntN(len(a.pods))
				list, err := a.pending(ctx, pod, sub)
				if err != nil {
					continue
				}
				for _, v := range list {
					if ctx.Err() != nil || rng.IntN(3) == 0 {
						continue // not looked at this time
					}
					switch r := rng.IntN(100); {
					case r < 5:
						a.decide(ctx, pod, v.Requester, v, DecideApprove) // self-approval without step-up: refused
					case r < 9:
						a.decideAs(ctx, pod, v.Requester, v, DecideApprove, true) // the requester, stepped up: counts
					case r < 14:
						a.decide(ctx, pod, sub, v, DecideDeny)
					default:
						a.decide(ctx, pod, sub, v, DecideApprove)
					}
				}
			}
		})
	}
	wg.Wait()
}

// Settle decides id for good through the pods in turn (the final pass
// before the sweep): ApprovalRequired approvers approve it, or one denies
// it when deny. Errors are retried a few times; what stays pending, the
// checker sees as undecided.
func (a *Approvers) Settle(id, requester string, deny bool) {
	v := pendingView{ID: id, Requester: requester}
	subs := []string{"approver0", "approver1"}
	kind := DecideApprove
	if deny {
		subs, kind = subs[:1], DecideDeny
	}
	for _, sub := range subs {
		for try := range 6 {
			d := a.decide(context.Background(), try%len(a.pods), sub, v, kind)
			if d.Err == "" && d.HTTP != http.StatusServiceUnavailable {
				break
			}
			time.Sleep(300 * time.Millisecond)
		}
	}
}

// SettlePending settles every approval still pending after the load, so
// that each gated fingerprint can end decided; a seeded few are denied.
func (a *Approvers) SettlePending(seed int64) {
	rng := mrand.New(mrand.NewPCG(uint64(seed), 0x5e771e))
	for range 5 {
		var list []pendingView
		var err error
		for pod := range a.pods {
			if list, err = a.pending(context.Background(), pod, "approver0"); err == nil {
				break
			}
		}
		if err != nil || len(list) == 0 {
			return
		}
		for _, v := range list {
			a.Settle(v.ID, v.Requester, rng.IntN(10) == 0)
		}
	}
}

func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}
