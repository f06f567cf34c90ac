package chaos

import (
	"encoding/json"
	"sort"
	"sync"
	"time"
)

// Params are the bound params of a transfer as an agent sent them (the
// operation binds amount, currency and payee.account_id).
type Params struct {
	Amount   string `json:"amount"`
	Currency string `json:"currency"`
	Account  string `json:"account"`
}

// Issued is a fingerprint a preview handed to an agent.
type Issued struct {
	Nonce  string
	Token  string
	Params Params
	At     time.Time
}

// Envelope is the part of an idemgate answer (docs/design.md §5) the checker reads.
type Envelope struct {
	Status       string          `json:"status"`
	Instruction  string          `json:"instruction"`
	Retryable    *bool           `json:"retryable"`
	PollWith     string          `json:"poll_with"`
	PreviewWith  string          `json:"preview_with"`
	RetryAfterMS *int64          `json:"retry_after_ms"`
	Result       json.RawMessage `json:"result"`
	// ApprovalID is set on approval_pending.
	ApprovalID string `json:"approval_id"`
}

// Call kinds.
const (
	KindPreview = "preview"
	KindConfirm = "confirm"
	KindStatus  = "status"
)

// Call is one request an agent sent and what it got back.
type Call struct {
	ID    int
	Agent int
	Task  int
	Kind  string
	Pod   int
	// Nonce and Token are the fingerprint sent (confirm, status) or issued
	// (a successful preview).
	Nonce, Token string
	// Params were sent in the body; Drifted says the agent changed a bound
	// param on purpose after the preview (params_changed is then expected).
	Params  Params
	Drifted bool
	// Concurrent says another confirm of the same fingerprint was sent at
	// the same time on purpose (a double click).
	Concurrent bool
	Start, End time.Time
	// Err is a transport failure (connection refused or reset, the agent's
	// own timeout); HTTP is 0 then.
	Err     string
	Timeout bool
	HTTP    int
	// Replayed is Idempotent-Replayed: true.
	Replayed bool
	Body     []byte
	// Envelope is set when the body is an idemgate envelope.
	Envelope *Envelope
}

// Fault kinds. Ambiguous ones can leave the outcome of a confirm unknown to
// idemgate; they are what an UNKNOWN record must trace back to.
const (
	FaultKillReplica    = "kill_replica"
	FaultRestartReplica = "restart_replica"
	FaultKillRedis      = "kill_redis_master"
	FaultRestartRedis   = "restart_redis"
	FaultFlushAll       = "flushall"
	FaultFailover       = "sentinel_failover"
	FaultPGCut          = "postgres_cut"
	FaultPGRestore      = "postgres_restore"
	FaultPGRestart      = "postgres_restart"
	FaultUpstreamSlow   = "upstream_latency"
	FaultUpstreamReset  = "upstream_reset_after_execute"
	FaultUpstream5xx    = "upstream_503"
	FaultEnvoyRestart   = "envoy_restart"
	// FaultClientTimeout is an agent giving up on a confirm: Envoy cancels
	// the stream, an ambiguous end for a confirm that was acquired.
	FaultClientTimeout = "client_timeout"
)

// Fault is one injected fault, as logged when it happened.
type Fault struct {
	Kind string
	At   time.Time
	// Until ends the fault's window (a cut restored, a replica back); At
	// when it is instantaneous.
	Until time.Time
	// Pod is the replica (idemgate + its Envoy) hit, -1 for a shared part.
	Pod int
	// Nonce is set for faults that hit one confirm (upstream faults, a
	// client timeout).
	Nonce  string
	Detail string
}

// Ambiguous says whether the fault can leave a confirm's outcome unknown.
func (f Fault) Ambiguous() bool {
	switch f.Kind {
	case FaultKillReplica, FaultPGCut, FaultPGRestart, FaultUpstreamSlow, FaultUpstreamReset,
		FaultUpstream5xx, FaultEnvoyRestart, FaultClientTimeout:
		return true
	}
	return false
}

// UpstreamCall is one confirm as it reached the payments upstream.
type UpstreamCall struct {
	At, End time.Time
	// Key is the Idempotency-Key header idemgate sent ("" when none).
	Key string
	// Token is the fingerprint field of the body; Nonce its payload's n.
	Token, Nonce string
	Params       Params
	// Status and Body are what payments wrote (0 and nil after a reset).
	Status int
	Body   []byte
	// Fault names the upstream fault applied to this call, if any.
	Fault string
}

// Row is an idempotency_record row as PostgreSQL holds it at the end.
type Row struct {
	Key          string
	State        string
	LeaseUntil   time.Time
	ResultStatus *int
	ResultBody   []byte
}

// ApprovalRow is an approval as PostgreSQL holds it at the end, with its
// events in order.
type ApprovalRow struct {
	ID, Key, Operation, Requester, State string
	Required                             int
	Events                               []ApprovalEvent
}

// ApprovalEvent is an approval_event row.
type ApprovalEvent struct {
	Kind, Actor string
	At          time.Time
	// ACR and AuthTime are how the deciding person authenticated (nil
	// AuthTime: the token did not say).
	ACR      string
	AuthTime *time.Time
}

// History is everything one run recorded, the checker's only input.
type History struct {
	Seed int64
	// HonoursKeys says the payments upstream deduplicated by Idempotency-Key.
	HonoursKeys bool
	Issued      map[string]Issued
	Calls       []Call
	Faults      []Fault
	Upstream    []UpstreamCall
	// ExecutionsByKey counts business executions per nonce as payments
	// counted them; TotalExecutions counts all, attributed or not.
	ExecutionsByKey map[string]int
	TotalExecutions int
	// StoredResult is what a key-honouring payments stored per key: the
	// answer every later call with that key gets.
	StoredResult map[string][]byte
	Rows         map[string]Row
	// FaultsEnd is when the last fault ended; RowsAt when Rows were read.
	FaultsEnd, RowsAt time.Time
	InFlightTTL       time.Duration

	// ApprovalAtLeast gates a fingerprint whose amount is at least it
	// ("" when the run has no approval rule); ApprovalRequired is the
	// configured number of distinct approvers.
	ApprovalAtLeast  string
	ApprovalRequired int
	// Approvals are PostgreSQL's approval rows at the end; Decisions what
	// the approvers sent.
	Approvals []ApprovalRow
	Decisions []Decision
}

// Recorder collects a run's history from many goroutines.
type Recorder struct {
	mu        sync.Mutex
	calls     []Call
	faults    []Fault
	issued    map[string]Issued
	decisions []Decision
}

// Decision records an approver's call.
func (r *Recorder) Decision(d Decision) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.decisions = append(r.decisions, d)
}

// Decisions returns a copy of the approvers' calls.
func (r *Recorder) Decisions() []Decision {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Decision(nil), r.decisions...)
}

// NewRecorder returns an empty recorder.
func NewRecorder() *Recorder { return &Recorder{issued: map[string]Issued{}} }

// Call records c and returns its id.
func (r *Recorder) Call(c Call) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	c.ID = len(r.calls) + 1
	r.calls = append(r.calls, c)
	if c.Kind == KindPreview && c.Nonce != "" {
		r.issued[c.Nonce] = Issued{Nonce: c.Nonce, Token: c.Token, Params: c.Params, At: c.End}
	}
	return c.ID
}

// Fault logs f.
func (r *Recorder) Fault(f Fault) {
	if f.Until.IsZero() {
		f.Until = f.At
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.faults = append(r.faults, f)
}

// Snapshot returns copies of the calls (by id), faults (by time) and issued
// fingerprints.
func (r *Recorder) Snapshot() ([]Call, []Fault, map[string]Issued) {
	r.mu.Lock()
	defer r.mu.Unlock()
	calls := append([]Call(nil), r.calls...)
	faults := append([]Fault(nil), r.faults...)
	sort.SliceStable(faults, func(i, j int) bool { return faults[i].At.Before(faults[j].At) })
	issued := make(map[string]Issued, len(r.issued))
	for k, v := range r.issued {
		issued[k] = v
	}
	return calls, faults, issued
}
