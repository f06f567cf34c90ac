// Package payments is the demo payments upstream that idemgate protects in the
// demo and in the end-to-end tests.
//
// It is an http.Handler with three business endpoints:
//
//	POST /v1/transfers/preview        validate and quote (fee, total); nothing executes
//	POST /v1/transfers/confirm        execute one transfer ("business execution")
//	GET  /v1/transfers/by-key/{key}   the transfer recorded under an Idempotency-Key
//
// and an admin surface for tests and the demo:
//
//	GET  /_admin/stats    counters (executions, executions per key, replays, ...)
//	GET  /_admin/faults   the armed fault injection
//	POST /_admin/faults   arm fault injection (JSON, see FaultsJSON)
//	POST /_admin/mode     {"ignore_idempotency_keys": bool}
//	POST /_admin/reset    forget every transfer, counter and fault
//	POST /_admin/mcp      {"sse": bool}: /mcp answers with SSE streams or JSON
//
// and POST /mcp, the same preview and confirm as MCP tools (see mcp.go).
//
// Idempotency as a payments API should do it: the Idempotency-Key is a
// unique key in the server's own store, reserved in the same step as the
// business execution. A confirm whose key already exists does not fail with a
// duplicate error: it gets the existing record back, with the same status and
// the same bytes. A confirm whose key is still being executed waits for that
// execution, like an INSERT blocked on a unique index held by an open
// transaction, and then gets its record. In honouring mode a confirm without a
// key is refused with 400. With IgnoreIdempotencyKeys the server behaves like a
// downstream that does not honour keys: every confirm executes, and transfers
// cannot be looked up by key.
//
// Fault injection applies only to confirms that are about to execute (replays
// from the store are never affected), either to the next N such confirms or to
// all of them until cleared: a delay before executing (abandoned if the client
// goes away, as a database transaction bound to the request would be), a delay
// after executing and before answering (the money has moved; a client or proxy
// timeout now hides that), a failure with a given status before executing, and
// executing then resetting the connection without an answer.
//
// Answers are deterministic: transfer ids are sequential (tr_000001, ...),
// amounts are normalised decimal strings with two places, created_at comes
// from the injectable clock, and a replay returns the stored bytes.
package payments

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"
)

// IdempotencyKeyHeader is the request header that carries the key.
const IdempotencyKeyHeader = "Idempotency-Key"

// Options configures a Server.
type Options struct {
	// IgnoreIdempotencyKeys makes the server ignore Idempotency-Key: every
	// confirm executes. It can be changed later with SetIgnoreIdempotencyKeys.
	IgnoreIdempotencyKeys bool
	// Now is the clock used for created_at; nil means time.Now.
	Now func() time.Time
	// Logger receives one line per business execution and per injected
	// fault; nil discards.
	Logger *slog.Logger
}

// Faults describes fault injection for confirms that are about to execute.
type Faults struct {
	// DelayBeforeExecute is slept before the business execution. If the
	// client disconnects meanwhile, nothing executes and the key is released.
	DelayBeforeExecute time.Duration
	// DelayAfterExecute is slept after the execution and before answering.
	DelayAfterExecute time.Duration
	// FailStatus, when non-zero, answers with this status (JSON error body)
	// instead of executing.
	FailStatus int
	// ResetAfterExecute executes, then closes the connection with a TCP reset
	// and no HTTP answer.
	ResetAfterExecute bool
	// Times limits the faults to the next Times executing confirms; zero
	// means every executing confirm until the faults are cleared.
	Times int
}

// FaultsJSON is the wire form of Faults used by /_admin/faults.
type FaultsJSON struct {
	DelayBeforeExecuteMS int64 `json:"delay_before_execute_ms"`
	DelayAfterExecuteMS  int64 `json:"delay_after_execute_ms"`
	FailStatus           int   `json:"fail_status"`
	ResetAfterExecute    bool  `json:"reset_after_execute"`
	Times                int   `json:"times"`
}

// Stats are the server's counters.
type Stats struct {
	// Executions counts business executions (transfers created).
	Executions int `json:"executions"`
	// ExecutionsByKey counts executions per Idempotency-Key value (also in
	// ignoring mode, so tests can see duplicates); confirms without a key
	// are not listed.
	ExecutionsByKey map[string]int `json:"executions_by_key"`
	// Confirms counts confirm requests that passed validation.
	Confirms int `json:"confirms"`
	// Replays counts confirms answered from the unique-key store.
	Replays int `json:"replays"`
	// Previews counts valid previews.
	Previews int `json:"previews"`
	// InjectedFailures, InjectedResets and AbandonedBeforeExecute count
	// confirms affected by fault injection.
	InjectedFailures       int `json:"injected_failures"`
	InjectedResets         int `json:"injected_resets"`
	AbandonedBeforeExecute int `json:"abandoned_before_execute"`
	// IgnoreIdempotencyKeys reports the current mode.
	IgnoreIdempotencyKeys bool `json:"ignore_idempotency_keys"`
}

// Record is one executed transfer as stored and replayed.
type Record struct {
	TransferID     string
	IdempotencyKey string
	Status         int
	Body           []byte
}

// keyEntry is a row of the unique-key store. done is closed when the owning
// execution finished (rec set) or gave up (entry removed).
type keyEntry struct {
	done chan struct{}
	rec  *Record
}

// Server is the demo payments upstream. It is safe for concurrent use.
type Server struct {
	now    func() time.Time
	logger *slog.Logger
	mux    *http.ServeMux

	mu         sync.Mutex
	ignoreKeys bool
	keys       map[string]*keyEntry
	seq        int
	stats      Stats
	faults     Faults
	armed      bool

	// mcp serves POST /mcp (see mcp.go).
	mcp *mcpFace
}

var _ http.Handler = (*Server)(nil)

// New returns a Server with an empty store.
func New(opts Options) *Server {
	s := &Server{
		now:        opts.Now,
		logger:     opts.Logger,
		ignoreKeys: opts.IgnoreIdempotencyKeys,
		keys:       map[string]*keyEntry{},
	}
	if s.now == nil {
		s.now = time.Now
	}
	if s.logger == nil {
		s.logger = slog.New(slog.DiscardHandler)
	}
	s.stats.ExecutionsByKey = map[string]int{}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/transfers/preview", s.handlePreview)
	mux.HandleFunc("POST /v1/transfers/confirm", s.handleConfirm)
	mux.HandleFunc("GET /v1/transfers/by-key/{key}", s.handleByKey)
	mux.HandleFunc("GET /_admin/stats", s.handleStats)
	mux.HandleFunc("GET /_admin/faults", s.handleGetFaults)
	mux.HandleFunc("POST /_admin/faults", s.handleSetFaults)
	mux.HandleFunc("POST /_admin/mode", switchHandler("ignore_idempotency_keys", s.SetIgnoreIdempotencyKeys))
	mux.HandleFunc("POST /_admin/reset", s.handleReset)
	s.mcp = s.newMCP()
	mux.Handle(MCPPath, s.mcp)
	mux.HandleFunc("POST /_admin/mcp", switchHandler("sse", s.SetMCPStreaming))
	s.mux = mux
	return s
}

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.mux.ServeHTTP(w, r) }

// Stats returns a snapshot of the counters.
func (s *Server) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.stats
	st.ExecutionsByKey = make(map[string]int, len(s.stats.ExecutionsByKey))
	for k, v := range s.stats.ExecutionsByKey {
		st.ExecutionsByKey[k] = v
	}
	st.IgnoreIdempotencyKeys = s.ignoreKeys
	return st
}

// Executions returns the number of business executions so far.
func (s *Server) Executions() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stats.Executions
}

// ExecutionsForKey returns how many executions carried this Idempotency-Key.
func (s *Server) ExecutionsForKey(key string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stats.ExecutionsByKey[key]
}

// RecordForKey returns the transfer stored under key (honouring mode only).
func (s *Server) RecordForKey(key string) (Record, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.keys[key]
	if !ok || e.rec == nil {
		return Record{}, false
	}
	rec := *e.rec
	rec.Body = append([]byte(nil), e.rec.Body...)
	return rec, true
}

// SetFaults arms fault injection, replacing whatever was armed.
func (s *Server) SetFaults(f Faults) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.faults = f
	s.armed = f != (Faults{})
}

// ClearFaults disarms fault injection.
func (s *Server) ClearFaults() { s.SetFaults(Faults{}) }

// CurrentFaults returns the armed faults (Times counts down as they fire).
func (s *Server) CurrentFaults() Faults {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.faults
}

// SetIgnoreIdempotencyKeys switches between honouring and ignoring keys.
func (s *Server) SetIgnoreIdempotencyKeys(ignore bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ignoreKeys = ignore
}

// Reset forgets every transfer, counter and fault; the mode is kept.
func (s *Server) Reset() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.keys = map[string]*keyEntry{}
	s.seq = 0
	s.stats = Stats{ExecutionsByKey: map[string]int{}}
	s.faults = Faults{}
	s.armed = false
}

// takeFaults consumes one use of the armed faults for an executing confirm.
func (s *Server) takeFaults() Faults {
	if !s.armed {
		return Faults{}
	}
	f := s.faults
	if s.faults.Times > 0 {
		s.faults.Times--
		if s.faults.Times == 0 {
			s.faults = Faults{}
			s.armed = false
		}
	}
	return f
}

// transferRequest is the body of preview and confirm.
type transferRequest struct {
	Amount   json.RawMessage `json:"amount"`
	Currency string          `json:"currency"`
	Payee    *struct {
		AccountID string `json:"account_id"`
		Name      string `json:"name,omitempty"`
	} `json:"payee"`
}

// transfer is a validated request: amounts in minor units.
type transfer struct {
	amountCents int64
	currency    string
	accountID   string
	payeeName   string
}

var (
	decimalPattern  = regexp.MustCompile(`^(0|[1-9][0-9]{0,12})(\.[0-9]{1,2})?$`)
	currencyPattern = regexp.MustCompile(`^[A-Z]{3}$`)
)

const maxBody = 64 << 10

func parseTransfer(r *http.Request) (transfer, error) {
	raw, err := readBody(r)
	if err != nil {
		return transfer{}, err
	}
	var req transferRequest
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	if err := dec.Decode(&req); err != nil {
		return transfer{}, fmt.Errorf("body is not a JSON object: %w", err)
	}
	cents, err := parseAmount(req.Amount)
	if err != nil {
		return transfer{}, err
	}
	if !currencyPattern.MatchString(req.Currency) {
		return transfer{}, errors.New("currency must be a three-letter upper-case ISO 4217 code")
	}
	if req.Payee == nil || strings.TrimSpace(req.Payee.AccountID) == "" {
		return transfer{}, errors.New("payee.account_id is required")
	}
	return transfer{amountCents: cents, currency: req.Currency, accountID: req.Payee.AccountID, payeeName: req.Payee.Name}, nil
}

func readBody(r *http.Request) ([]byte, error) {
	var buf bytes.Buffer
	n, err := buf.ReadFrom(http.MaxBytesReader(nil, r.Body, maxBody))
	if err != nil {
		return nil, fmt.Errorf("failed to read the body after %d bytes: %w", n, err)
	}
	return buf.Bytes(), nil
}

// parseAmount accepts a positive decimal as a JSON string ("12.50") or a JSON
// number (12.5) with at most two decimal places and no exponent.
func parseAmount(raw json.RawMessage) (int64, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return 0, errors.New("amount is required")
	}
	text := string(raw)
	if raw[0] == '"' {
		if err := json.Unmarshal(raw, &text); err != nil {
			return 0, fmt.Errorf("amount is not a string: %w", err)
		}
	}
	if !decimalPattern.MatchString(text) {
		return 0, fmt.Errorf("amount %q is not a positive decimal with at most two decimal places", text)
	}
	whole, frac, _ := strings.Cut(text, ".")
	for len(frac) < 2 {
		frac += "0"
	}
	cents, err := strconv.ParseInt(whole+frac, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("amount %q is out of range: %w", text, err)
	}
	if cents <= 0 {
		return 0, errors.New("amount must be greater than zero")
	}
	return cents, nil
}

func formatCents(c int64) string { return fmt.Sprintf("%d.%02d", c/100, c%100) }

// feeCents is 1% rounded half up, at least 0.50.
func feeCents(amount int64) int64 { return max(50, (amount+50)/100) }

type payeeJSON struct {
	AccountID string `json:"account_id"`
	Name      string `json:"name,omitempty"`
}

type quoteJSON struct {
	QuoteID  string    `json:"quote_id"`
	Status   string    `json:"status"`
	Amount   string    `json:"amount"`
	Currency string    `json:"currency"`
	Payee    payeeJSON `json:"payee"`
	Fee      string    `json:"fee"`
	Total    string    `json:"total"`
	Executed bool      `json:"executed"`
}

type transferJSON struct {
	TransferID string    `json:"transfer_id"`
	Status     string    `json:"status"`
	Amount     string    `json:"amount"`
	Currency   string    `json:"currency"`
	Payee      payeeJSON `json:"payee"`
	Fee        string    `json:"fee"`
	CreatedAt  string    `json:"created_at"`
}

type errorJSON struct {
	Error   string `json:"error"`
	Message string `json:"message,omitempty"`
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		http.Error(w, "failed to encode the answer", http.StatusInternalServerError)
		return
	}
	writeRaw(w, status, body)
}

func writeRaw(w http.ResponseWriter, status int, body []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

func (s *Server) handlePreview(w http.ResponseWriter, r *http.Request) {
	t, err := parseTransfer(r)
	if err != nil {
		writeJSON(w, http.StatusBadRequest, errorJSON{Error: "invalid_request", Message: err.Error()})
		return
	}
	writeJSON(w, http.StatusOK, s.quote(t))
}

// quote counts a valid preview and prices it (the HTTP route and the MCP
// tool answer the same quote).
func (s *Server) quote(t transfer) quoteJSON {
	s.mu.Lock()
	s.stats.Previews++
	s.mu.Unlock()
	sum := sha256.Sum256([]byte(fmt.Sprintf("%d|%s|%s", t.amountCents, t.currency, t.accountID)))
	fee := feeCents(t.amountCents)
	return quoteJSON{
		QuoteID:  "q_" + hex.EncodeToString(sum[:8]),
		Status:   "quoted",
		Amount:   formatCents(t.amountCents),
		Currency: t.currency,
		Payee:    payeeJSON{AccountID: t.accountID, Name: t.payeeName},
		Fee:      formatCents(fee),
		Total:    formatCents(t.amountCents + fee),
		Executed: false,
	}
}

func (s *Server) handleConfirm(w http.ResponseWriter, r *http.Request) {
	t, err := parseTransfer(r)
	if err != nil {
		writeJSON(w, http.StatusBadRequest, errorJSON{Error: "invalid_request", Message: err.Error()})
		return
	}
	key := r.Header.Get(IdempotencyKeyHeader)

	s.mu.Lock()
	s.stats.Confirms++
	ignore := s.ignoreKeys
	s.mu.Unlock()
	if !ignore && key == "" {
		writeJSON(w, http.StatusBadRequest, errorJSON{Error: "idempotency_key_required", Message: "send an Idempotency-Key header"})
		return
	}

	var entry *keyEntry
	if !ignore {
		var replay *Record
		entry, replay = s.reserve(r.Context(), key)
		if replay != nil {
			writeRaw(w, replay.Status, replay.Body)
			return
		}
		if entry == nil { // the client went away while waiting for the owner
			return
		}
	}

	s.mu.Lock()
	f := s.takeFaults()
	s.mu.Unlock()

	if f.FailStatus != 0 {
		s.release(key, entry)
		s.mu.Lock()
		s.stats.InjectedFailures++
		s.mu.Unlock()
		s.logger.Info("payments: injected failure before execution", "status", f.FailStatus)
		writeJSON(w, f.FailStatus, errorJSON{Error: "injected_failure", Message: "fault injection: nothing was executed"})
		return
	}
	if f.DelayBeforeExecute > 0 && !sleepCtx(r.Context(), f.DelayBeforeExecute) {
		s.release(key, entry)
		s.mu.Lock()
		s.stats.AbandonedBeforeExecute++
		s.mu.Unlock()
		return
	}

	rec := s.execute(t, key, entry)

	if f.DelayAfterExecute > 0 {
		// The money has moved; the client may give up now, we still finish.
		time.Sleep(f.DelayAfterExecute)
	}
	if f.ResetAfterExecute {
		s.mu.Lock()
		s.stats.InjectedResets++
		s.mu.Unlock()
		s.logger.Info("payments: injected connection reset after execution", "transfer_id", rec.TransferID)
		resetConnection(w)
		return
	}
	writeRaw(w, rec.Status, rec.Body)
}

// reserve inserts key into the unique-key store. It returns the new entry to
// execute under, or the stored record when the key already completed, waiting
// for an execution in progress to finish first. Both are nil when ctx ended
// while waiting.
func (s *Server) reserve(ctx context.Context, key string) (*keyEntry, *Record) {
	for {
		s.mu.Lock()
		e, ok := s.keys[key]
		if !ok {
			e = &keyEntry{done: make(chan struct{})}
			s.keys[key] = e
			s.mu.Unlock()
			return e, nil
		}
		if e.rec != nil {
			s.stats.Replays++
			rec := *e.rec
			s.mu.Unlock()
			return nil, &rec
		}
		s.mu.Unlock()
		select {
		case <-e.done:
		case <-ctx.Done():
			return nil, nil
		}
	}
}

// release removes a reservation whose execution never happened.
func (s *Server) release(key string, e *keyEntry) {
	if e == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.keys[key] == e {
		delete(s.keys, key)
	}
	close(e.done)
}

// execute is the business execution: it creates the transfer and, in
// honouring mode, commits it under its key in the same critical section.
func (s *Server) execute(t transfer, key string, e *keyEntry) Record {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.seq++
	s.stats.Executions++
	if key != "" {
		s.stats.ExecutionsByKey[key]++
	}
	id := fmt.Sprintf("tr_%06d", s.seq)
	body, err := json.Marshal(transferJSON{
		TransferID: id,
		Status:     "completed",
		Amount:     formatCents(t.amountCents),
		Currency:   t.currency,
		Payee:      payeeJSON{AccountID: t.accountID, Name: t.payeeName},
		Fee:        formatCents(feeCents(t.amountCents)),
		CreatedAt:  s.now().UTC().Truncate(time.Second).Format(time.RFC3339),
	})
	if err != nil {
		// Marshalling fixed string fields cannot fail; keep the record usable anyway.
		body = []byte(`{"transfer_id":"` + id + `","status":"completed"}`)
	}
	rec := Record{TransferID: id, IdempotencyKey: key, Status: http.StatusOK, Body: body}
	if e != nil {
		e.rec = &rec
		close(e.done)
	}
	s.logger.Info("payments: executed transfer", "transfer_id", id, "amount", formatCents(t.amountCents), "currency", t.currency)
	return rec
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// resetConnection drops the client connection without an HTTP answer, with a
// TCP RST where the connection allows it.
func resetConnection(w http.ResponseWriter) {
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		// Not hijackable (HTTP/2 or a recorder): abort the response instead.
		panic(http.ErrAbortHandler)
	}
	if tcp, ok := conn.(*net.TCPConn); ok {
		_ = tcp.SetLinger(0)
	}
	_ = conn.Close()
}

func (s *Server) handleByKey(w http.ResponseWriter, r *http.Request) {
	key := r.PathValue("key")
	s.mu.Lock()
	ignore := s.ignoreKeys
	e, ok := s.keys[key]
	var rec *Record
	if ok {
		rec = e.rec
	}
	s.mu.Unlock()
	switch {
	case ignore:
		writeJSON(w, http.StatusNotFound, errorJSON{Error: "not_found", Message: "this server does not record idempotency keys"})
	case !ok:
		writeJSON(w, http.StatusNotFound, errorJSON{Error: "not_found"})
	case rec == nil:
		writeJSON(w, http.StatusOK, map[string]string{"status": "processing", "idempotency_key": key})
	default:
		writeRaw(w, rec.Status, rec.Body)
	}
}

func (s *Server) handleStats(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, s.Stats())
}

func toFaultsJSON(f Faults) FaultsJSON {
	return FaultsJSON{
		DelayBeforeExecuteMS: f.DelayBeforeExecute.Milliseconds(),
		DelayAfterExecuteMS:  f.DelayAfterExecute.Milliseconds(),
		FailStatus:           f.FailStatus,
		ResetAfterExecute:    f.ResetAfterExecute,
		Times:                f.Times,
	}
}

func (s *Server) handleGetFaults(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, toFaultsJSON(s.CurrentFaults()))
}

func (s *Server) handleSetFaults(w http.ResponseWriter, r *http.Request) {
	raw, err := readBody(r)
	if err != nil {
		writeJSON(w, http.StatusBadRequest, errorJSON{Error: "invalid_request", Message: err.Error()})
		return
	}
	var fj FaultsJSON
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&fj); err != nil {
		writeJSON(w, http.StatusBadRequest, errorJSON{Error: "invalid_request", Message: err.Error()})
		return
	}
	if fj.DelayBeforeExecuteMS < 0 || fj.DelayAfterExecuteMS < 0 || fj.Times < 0 ||
		(fj.FailStatus != 0 && (fj.FailStatus < 400 || fj.FailStatus > 599)) {
		writeJSON(w, http.StatusBadRequest, errorJSON{Error: "invalid_request", Message: "delays and times must be >= 0, fail_status 0 or 400..599"})
		return
	}
	f := Faults{
		DelayBeforeExecute: time.Duration(fj.DelayBeforeExecuteMS) * time.Millisecond,
		DelayAfterExecute:  time.Duration(fj.DelayAfterExecuteMS) * time.Millisecond,
		FailStatus:         fj.FailStatus,
		ResetAfterExecute:  fj.ResetAfterExecute,
		Times:              fj.Times,
	}
	s.SetFaults(f)
	writeJSON(w, http.StatusOK, toFaultsJSON(f))
}

// switchHandler serves an admin switch: a body of exactly {"<name>": bool}
// sets it with set and echoes it.
func switchHandler(name string, set func(bool)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var body map[string]*bool
		raw, err := readBody(r)
		if err == nil {
			err = json.Unmarshal(raw, &body)
		}
		v, ok := body[name]
		if err == nil && (len(body) != 1 || !ok || v == nil) {
			err = fmt.Errorf("want exactly {%q: true|false}", name)
		}
		if err != nil {
			writeJSON(w, http.StatusBadRequest, errorJSON{Error: "invalid_request", Message: err.Error()})
			return
		}
		set(*v)
		writeJSON(w, http.StatusOK, map[string]bool{name: *v})
	}
}

func (s *Server) handleReset(w http.ResponseWriter, _ *http.Request) {
	s.Reset()
	writeJSON(w, http.StatusOK, map[string]bool{"reset": true})
}
