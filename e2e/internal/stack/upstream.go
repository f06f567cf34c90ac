package stack

import (
	"bufio"
	"bytes"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/idemgate/idemgate/e2e/payments"
)

// confirmPath is the upstream path of confirms in the shipped configs.
const confirmPath = "/v1/transfers/confirm"

// UpstreamConfirm is one confirm request as it reached the upstream's
// confirm handler.
type UpstreamConfirm struct {
	// RequestURI is the request target as Envoy sent it (before Go's
	// ServeMux cleaned it).
	RequestURI string
	// IdempotencyKey is the header as the upstream saw it ("" if absent).
	IdempotencyKey string
	// RequestID and Subject are Envoy's x-request-id and the
	// x-idemgate-subject values Envoy forwarded.
	RequestID string
	Subject   []string
	// Status and Body are what the upstream wrote, whether or not anybody
	// was still listening (a front that timed out, an idemgate that died).
	Status int
	Body   []byte
	// Held says the confirm was answered by a Hold, not by payments.
	Held bool
	At   time.Time
}

// Upstream sits in front of the payments server on the upstream side and
// records every confirm that reaches it: the Idempotency-Key it carried and
// the answer payments wrote (the "ledger" a person reconciles against).
// A test can also hold the next confirm and answer it itself, late.
type Upstream struct {
	Payments *payments.Server

	muxOnce sync.Once
	mux     *http.ServeMux

	mu       sync.Mutex
	requests []UpstreamRequest
	confirms []UpstreamConfirm
	holds    []*Hold // waiting for a confirm
	allHolds []*Hold
	resets   int // confirms still to reset before payments sees them
}

// ResetNextConfirms makes the next n confirms that reach the upstream end in
// a TCP reset before payments is called: nothing executes, and nobody
// downstream can know that.
func (u *Upstream) ResetNextConfirms(n int) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.resets = n
}

// Hold is a confirm the upstream received and keeps waiting until the test
// answers it.
type Hold struct {
	arrived chan struct{}
	answer  chan heldAnswer
	key     string
}

type heldAnswer struct {
	status int
	body   []byte
}

// Arrived is closed when the held confirm reached the upstream.
func (h *Hold) Arrived() <-chan struct{} { return h.arrived }

// Key is the Idempotency-Key of the held confirm (after Arrived).
func (h *Hold) Key() string { return h.key }

// Answer sends status and body as the upstream's late answer. payments is
// not called: nothing executes for a held confirm.
func (h *Hold) Answer(status int, body []byte) { h.answer <- heldAnswer{status, body} }

// HoldNextConfirm makes the next confirm that reaches the upstream wait for
// Answer instead of going to payments.
func (u *Upstream) HoldNextConfirm() *Hold {
	h := &Hold{arrived: make(chan struct{}), answer: make(chan heldAnswer, 1)}
	u.mu.Lock()
	u.holds = append(u.holds, h)
	u.allHolds = append(u.allHolds, h)
	u.mu.Unlock()
	return h
}

// releaseHolds answers every hold a test left unanswered (it failed early),
// so no upstream handler outlives the stack.
func (u *Upstream) releaseHolds() {
	u.mu.Lock()
	defer u.mu.Unlock()
	for _, h := range u.allHolds {
		select {
		case h.answer <- heldAnswer{http.StatusServiceUnavailable, []byte(`{"error":"stack_closed"}`)}:
		default:
		}
	}
}

// Confirms returns the confirms that reached the upstream so far, in order
// of arrival (entries are filled in when the upstream answered).
func (u *Upstream) Confirms() []UpstreamConfirm {
	u.mu.Lock()
	defer u.mu.Unlock()
	out := make([]UpstreamConfirm, len(u.confirms))
	copy(out, u.confirms)
	for i := range out {
		out[i].Body = bytes.Clone(out[i].Body)
	}
	return out
}

// UpstreamRequest is any request that reached the upstream, as Envoy sent it.
type UpstreamRequest struct {
	Method, RequestURI string
	// Confirm says Go's ServeMux routed it to the confirm handler.
	Confirm bool
}

// Requests returns every request that reached the upstream so far.
func (u *Upstream) Requests() []UpstreamRequest {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]UpstreamRequest(nil), u.requests...)
}

// ServeHTTP routes with a ServeMux that has payments' confirm pattern, so a
// request counts as a confirm exactly when Go's ServeMux (payments' router)
// would run the confirm handler for it: after its own path cleaning and
// unescaping, whatever spelling Envoy forwarded.
func (u *Upstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	u.muxOnce.Do(func() {
		u.mux = http.NewServeMux()
		u.mux.HandleFunc("POST "+confirmPath, u.serveConfirm)
		u.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
			u.mu.Lock()
			u.requests = append(u.requests, UpstreamRequest{Method: r.Method, RequestURI: r.RequestURI})
			u.mu.Unlock()
			u.Payments.ServeHTTP(w, r)
		})
	})
	u.mux.ServeHTTP(w, r)
}

func (u *Upstream) serveConfirm(w http.ResponseWriter, r *http.Request) {
	u.mu.Lock()
	idx := len(u.confirms)
	u.requests = append(u.requests, UpstreamRequest{Method: r.Method, RequestURI: r.RequestURI, Confirm: true})
	u.confirms = append(u.confirms, UpstreamConfirm{
		RequestURI:     r.RequestURI,
		IdempotencyKey: r.Header.Get(payments.IdempotencyKeyHeader),
		RequestID:      r.Header.Get("X-Request-Id"),
		Subject:        r.Header.Values("X-Idemgate-Subject"),
		At:             time.Now(),
	})
	var hold *Hold
	if len(u.holds) > 0 {
		hold, u.holds = u.holds[0], u.holds[1:]
	}
	reset := u.resets > 0
	if reset {
		u.resets--
	}
	u.mu.Unlock()

	if reset {
		if c, _, err := http.NewResponseController(w).Hijack(); err == nil {
			if tcp, ok := c.(*net.TCPConn); ok {
				_ = tcp.SetLinger(0) // RST, not FIN
			}
			_ = c.Close()
		}
		return
	}

	if hold != nil {
		hold.key = r.Header.Get(payments.IdempotencyKeyHeader)
		close(hold.arrived)
		a := <-hold.answer
		u.record(idx, a.status, a.body, byHold)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", strconv.Itoa(len(a.body)))
		w.WriteHeader(a.status)
		_, _ = w.Write(a.body)
		return
	}
	rec := &recordingWriter{ResponseWriter: w, status: http.StatusOK}
	defer func() { u.record(idx, rec.status, rec.body.Bytes(), byPayments) }()
	u.Payments.ServeHTTP(rec, r)
}

// answerer is who answered a confirm at the upstream.
type answerer bool

const (
	byPayments answerer = false
	byHold     answerer = true // UpstreamConfirm.Held
)

// record keeps what confirm idx was answered, and by whom.
func (u *Upstream) record(idx, status int, body []byte, by answerer) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.confirms[idx].Status = status
	u.confirms[idx].Body = bytes.Clone(body)
	u.confirms[idx].Held = by == byHold
}

// recordingWriter keeps a copy of what payments writes, and lets payments
// hijack the connection for its injected resets.
type recordingWriter struct {
	http.ResponseWriter
	status int
	body   bytes.Buffer
}

func (w *recordingWriter) WriteHeader(code int) {
	w.status = code
	w.ResponseWriter.WriteHeader(code)
}

func (w *recordingWriter) Write(p []byte) (int, error) {
	w.body.Write(p)
	return w.ResponseWriter.Write(p)
}

func (w *recordingWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	return http.NewResponseController(w.ResponseWriter).Hijack()
}

func (w *recordingWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
