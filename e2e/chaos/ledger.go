package chaos

import (
	"bytes"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/idemgate/idemgate/e2e/internal/stack"
	"github.com/idemgate/idemgate/e2e/payments"
)

// upstreamFault is a fault armed for the next confirm that reaches the
// upstream.
type upstreamFault struct {
	kind  string
	delay time.Duration
}

// Ledger sits in front of payments and writes down every confirm that
// reaches it — the upstream's execution log the checker compares
// everything against — and applies the upstream faults the injector arms.
//
// With a key-ignoring payments idemgate sends no Idempotency-Key; the
// ledger then sets it to the nonce of the body's fingerprint before
// payments sees the call, only so that payments counts executions per
// nonce (an ignoring payments does not deduplicate on it). A confirm with
// no fingerprint in its body stays without a key and counts as an
// unattributed execution.
type Ledger struct {
	rec      *Recorder
	payments *payments.Server
	honours  bool

	mu    sync.Mutex
	calls []UpstreamCall
	armed []upstreamFault
	// slowUntil is when the last delayed answer will have been written.
	slowUntil time.Time
}

// NewLedger returns a ledger that logs applied faults to rec.
func NewLedger(rec *Recorder) *Ledger { return &Ledger{rec: rec} }

// Arm applies f to the next confirm that reaches the upstream.
func (l *Ledger) Arm(kind string, delay time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.armed = append(l.armed, upstreamFault{kind: kind, delay: delay})
}

// Disarm drops the faults no confirm has taken and returns when the last
// delayed answer is due.
func (l *Ledger) Disarm() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.armed = nil
	return l.slowUntil
}

// Calls returns the confirms recorded so far.
func (l *Ledger) Calls() []UpstreamCall {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]UpstreamCall, len(l.calls))
	copy(out, l.calls)
	return out
}

const confirmPath = "/v1/transfers/confirm"

func (l *Ledger) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.URL.Path != confirmPath {
		l.payments.ServeHTTP(w, r)
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if err != nil {
		http.Error(w, "read failed", http.StatusBadRequest)
		return
	}
	call := UpstreamCall{At: time.Now(), Key: r.Header.Get(payments.IdempotencyKeyHeader)}
	call.Token, call.Params = bodyFingerprint(body)
	if p, err := stack.DecodeFingerprint(call.Token); err == nil {
		call.Nonce = p.Nonce
	}
	if !l.honours {
		r.Header.Del(payments.IdempotencyKeyHeader)
		if call.Nonce != "" {
			r.Header.Set(payments.IdempotencyKeyHeader, call.Nonce)
		}
	}
	r.Body = io.NopCloser(bytes.NewReader(body))

	l.mu.Lock()
	var f upstreamFault
	if len(l.armed) > 0 {
		f, l.armed = l.armed[0], l.armed[1:]
	}
	if f.kind == FaultUpstreamSlow {
		if due := time.Now().Add(f.delay); due.After(l.slowUntil) {
			l.slowUntil = due
		}
	}
	call.Fault = f.kind
	idx := len(l.calls)
	l.calls = append(l.calls, call)
	l.mu.Unlock()
	if f.kind != "" {
		l.rec.Fault(Fault{Kind: f.kind, At: call.At, Until: call.At.Add(f.delay), Pod: -1, Nonce: call.Nonce,
			Detail: "applied to the confirm of this nonce at the upstream" + delayText(f.delay)})
	}

	buf := &bufferedWriter{header: http.Header{}, status: http.StatusOK}
	if f.kind == FaultUpstream5xx {
		// Nothing executes; to idemgate a 503 is ambiguous all the same.
		buf.Header().Set("Content-Type", "application/json")
		buf.WriteHeader(http.StatusServiceUnavailable)
		_, _ = buf.Write([]byte(`{"error":"unavailable","message":"fault injection: nothing was executed"}`))
	} else {
		l.payments.ServeHTTP(buf, r)
	}
	if f.kind == FaultUpstreamSlow {
		// The money has moved; the answer is late, past the lease.
		time.Sleep(f.delay)
	}
	if f.kind == FaultUpstreamReset {
		l.record(idx, 0, nil)
		if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
			if tcp, ok := conn.(*net.TCPConn); ok {
				_ = tcp.SetLinger(0)
			}
			_ = conn.Close()
			return
		}
		panic(http.ErrAbortHandler)
	}
	l.record(idx, buf.status, buf.body.Bytes())
	for k, vs := range buf.header {
		w.Header()[k] = vs
	}
	w.Header().Set("Content-Length", strconv.Itoa(buf.body.Len()))
	w.WriteHeader(buf.status)
	_, _ = w.Write(buf.body.Bytes())
}

func (l *Ledger) record(idx, status int, body []byte) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.calls[idx].End = time.Now()
	l.calls[idx].Status = status
	l.calls[idx].Body = bytes.Clone(body)
}

func delayText(d time.Duration) string {
	if d == 0 {
		return ""
	}
	return " (answer delayed " + d.String() + ")"
}

// bodyFingerprint reads the fingerprint and the bound params from a
// confirm body.
func bodyFingerprint(body []byte) (string, Params) {
	var b struct {
		Fingerprint string          `json:"fingerprint"`
		Amount      json.RawMessage `json:"amount"`
		Currency    string          `json:"currency"`
		Payee       struct {
			AccountID string `json:"account_id"`
		} `json:"payee"`
	}
	if json.Unmarshal(body, &b) != nil {
		return "", Params{}
	}
	amount := string(b.Amount)
	var s string
	if json.Unmarshal(b.Amount, &s) == nil {
		amount = s
	}
	return b.Fingerprint, Params{Amount: amount, Currency: b.Currency, Account: b.Payee.AccountID}
}

// bufferedWriter holds payments' answer until the ledger decides how (and
// whether) the caller gets it.
type bufferedWriter struct {
	header http.Header
	status int
	wrote  bool
	body   bytes.Buffer
}

func (b *bufferedWriter) Header() http.Header { return b.header }

func (b *bufferedWriter) WriteHeader(code int) {
	if !b.wrote {
		b.status, b.wrote = code, true
	}
}

func (b *bufferedWriter) Write(p []byte) (int, error) {
	b.wrote = true
	return b.body.Write(p)
}
