// Package approvalapi is the approvers' JSON API of docs/design.md §10,
// served on approval_listen (plain HTTP behind the SSO proxy that sets the
// bearer token):
//
//	GET  /v1/approvals?state=pending     {"approvals": [<approval>...]}
//	GET  /v1/approvals/{id}              <approval>
//	POST /v1/approvals/{id}/approve      {"reason": "..."} → <approval>
//	POST /v1/approvals/{id}/deny         {"reason": "..."} → <approval>
//
// Every call carries Authorization: Bearer <approver JWT>, verified against
// the approvers.jwt of the approval's operation; the approver is the
// token's sub and nothing else: no field an agent wrote names anyone.
// Answers: 401 without a valid token, 401 insufficient_user_authentication
// with the RFC 9470 challenge when the requester approves under
// requester_step_up with a token not strong or fresh enough (stepup.go),
// 403 approval_forbidden for a self-approval under distinct_from_requester
// without step-up (the requester may deny),
// 404 for an unknown id (or one of an operation the token is not for),
// 409 when the approval is not pending, 400 for an empty reason; an
// approver who already approved gets 200 and counts once. A store failure
// is 503 and decides nothing.
package approvalapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"sort"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemgate/idemgate/extproc/approver"
	"github.com/idemgate/idemgate/extproc/config"
	"github.com/idemgate/idemgate/extproc/security"
	"github.com/idemgate/idemgate/state"
)

// Security event reasons of the approvers' surfaces.
const (
	ReasonApproverToken   = "approver_token_invalid"
	ReasonSelfApproval    = "self_approval"
	ReasonUnknownApproval = "approval_unknown"
	ReasonLapsedApproval  = "approval_lapsed"
	// ReasonForgedForm: a page form post without the token of the page
	// the approver loaded, or a decision posted to the JSON API as
	// anything but application/json (cross-site request forgery).
	ReasonForgedForm = "approval_form_forged"
)

// Reporter receives security events (extproc's reporter).
type Reporter interface {
	Report(ctx context.Context, e security.Event)
}

// Options configure the handler.
type Options struct {
	Config    *config.Runtime
	Approvals state.Approvals
	Security  Reporter
	Logger    *slog.Logger
	// Timeout bounds each store call (store.timeout when zero).
	Timeout time.Duration
	// Transition, if set, is told of each state change a decision made
	// here causes (transition "approved" or "denied"), once: serve counts
	// them in idemgate_approval_transitions_total, which the confirm
	// stream feeds with requested and consumed.
	Transition func(operation, transition string)
	// Tracer, if set, records each recorded decision as a span
	// (idemgate.approval.decide, continuing the request's traceparent)
	// with the event approval.approved or approval.denied when the decision
	// moved the approval, approval.decision when it awaits more approvers.
	// Like the confirm stream's spans it carries ids and states, never the
	// approver, the requester or a parameter value.
	Tracer trace.Tracer
	// Now is the clock of step-up's max_auth_age (time.Now when nil).
	Now func() time.Time
}

// Handler serves the API.
type Handler struct {
	opts Options
	// ops are the operations with approval, by name.
	ops map[string]*config.Operation
}

// New returns the handler.
func New(opts Options) (*Handler, error) {
	if opts.Config == nil || opts.Approvals == nil || opts.Security == nil {
		return nil, errors.New("approvalapi: config, approvals and a security reporter are required")
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Timeout <= 0 {
		opts.Timeout = opts.Config.Store.Timeout
	}
	h := &Handler{opts: opts, ops: map[string]*config.Operation{}}
	for _, op := range opts.Config.Operations {
		if op.Approval != nil {
			h.ops[op.Name] = op
		}
	}
	return h, nil
}

// maxBody bounds a decision's body.
const maxBody = 16 << 10

func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	rest, api := strings.CutPrefix(r.URL.Path, "/v1/approvals")
	pageID, page := strings.CutPrefix(r.URL.Path, "/approvals/")
	if !api && !page {
		writeError(w, http.StatusNotFound, "not_found", "no such endpoint")
		return
	}
	// Verify first: without a valid token nothing is said, not even 404.
	who, ops, keysDown := h.authenticate(r)
	if len(ops) == 0 {
		if keysDown {
			w.Header().Set("Retry-After", "5")
			writeError(w, http.StatusServiceUnavailable, "keys_unavailable", "the approvers' signing keys cannot be fetched right now; nothing was decided, retry")
			return
		}
		writeError(w, http.StatusUnauthorized, "unauthorized", "a valid approver bearer token is required")
		return
	}
	if page {
		if pageID == "" || strings.Contains(pageID, "/") {
			writeError(w, http.StatusNotFound, "not_found", "no such endpoint")
			return
		}
		h.page(w, r, pageID, who, ops)
		return
	}
	switch parts := strings.Split(strings.Trim(rest, "/"), "/"); {
	case rest == "" || rest == "/":
		if r.Method != http.MethodGet {
			writeError(w, http.StatusMethodNotAllowed, "method_not_allowed", "use GET")
			return
		}
		h.list(w, r, ops)
	case len(parts) == 1:
		if r.Method != http.MethodGet {
			writeError(w, http.StatusMethodNotAllowed, "method_not_allowed", "use GET")
			return
		}
		h.show(w, r, parts[0], ops)
	case len(parts) == 2 && (parts[1] == "approve" || parts[1] == "deny"):
		if r.Method != http.MethodPost {
			writeError(w, http.StatusMethodNotAllowed, "method_not_allowed", "use POST")
			return
		}
		h.decide(w, r, parts[0], parts[1] == "approve", who, ops)
	default:
		writeError(w, http.StatusNotFound, "not_found", "no such endpoint")
	}
}

// authenticate verifies the bearer token against every gated operation's
// approvers.jwt and returns the approver's claims (Subject is the approver)
// and the operations it may decide.
// keysDown: no verifier accepted it and some could not fetch their keys
// (a remote JWKS that is down and not cached), which is no verdict on the
// token.
func (h *Handler) authenticate(r *http.Request) (who approver.Claims, ops map[string]bool, keysDown bool) {
	auth := r.Header.Get("Authorization")
	scheme, token, found := strings.Cut(auth, " ")
	if !found || !strings.EqualFold(scheme, "bearer") || strings.TrimSpace(token) == "" {
		h.report(r, security.Event{Reason: ReasonApproverToken, Request: "no bearer token"})
		return who, nil, false
	}
	token = strings.TrimSpace(token)
	ops = map[string]bool{}
	var lastErr error
	for name, op := range h.ops {
		v := op.Approval.Verifier
		if v == nil || (v.Keys == nil && v.Remote == nil) {
			continue
		}
		c, err := v.Verify(token)
		if errors.Is(err, approver.ErrKeysUnavailable) {
			keysDown = true
			h.opts.Logger.Warn("approver keys unavailable", "operation", name, "error", err)
			continue
		}
		if err != nil {
			lastErr = err
			continue
		}
		if who.Subject != "" && c.Subject != who.Subject {
			continue
		}
		if who.Subject == "" {
			who = c
		}
		ops[name] = true
	}
	if len(ops) == 0 && lastErr != nil {
		h.report(r, security.Event{Reason: ReasonApproverToken, Request: quoteCut(lastErr.Error())})
		keysDown = false
	}
	return who, ops, keysDown
}

func (h *Handler) report(r *http.Request, e security.Event) {
	e.TraceID = r.Header.Get("x-request-id")
	h.opts.Security.Report(r.Context(), e)
}

func (h *Handler) ctx(r *http.Request) (context.Context, context.CancelFunc) {
	return context.WithTimeout(r.Context(), h.opts.Timeout)
}

func (h *Handler) list(w http.ResponseWriter, r *http.Request, ops map[string]bool) {
	f := state.ApprovalFilter{}
	if s := r.URL.Query().Get("state"); s != "" {
		st, ok := ParseState(s)
		if !ok {
			writeError(w, http.StatusBadRequest, "invalid_state", "state must be pending, approved, denied, expired or consumed")
			return
		}
		f.State = st
	}
	ctx, cancel := h.ctx(r)
	defer cancel()
	all, err := h.opts.Approvals.ListApprovals(ctx, f)
	if err != nil {
		h.storeFailed(w, "list approvals", err)
		return
	}
	out := []View{}
	for i := range all {
		if ops[all[i].Operation] {
			out = append(out, ViewOf(&all[i]))
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{"approvals": out})
}

// get reads an approval the caller may see (404 otherwise).
func (h *Handler) get(w http.ResponseWriter, r *http.Request, id string, ops map[string]bool) (state.Approval, bool) {
	ctx, cancel := h.ctx(r)
	defer cancel()
	a, found, err := h.opts.Approvals.GetApproval(ctx, id)
	if err != nil {
		h.storeFailed(w, "read approval", err)
		return a, false
	}
	if !found || !ops[a.Operation] {
		writeError(w, http.StatusNotFound, "not_found", "no such approval")
		return a, false
	}
	return a, true
}

func (h *Handler) show(w http.ResponseWriter, r *http.Request, id string, ops map[string]bool) {
	if a, ok := h.get(w, r, id, ops); ok {
		writeJSON(w, http.StatusOK, ViewOf(&a))
	}
}

func (h *Handler) decide(w http.ResponseWriter, r *http.Request, id string, approve bool, who approver.Claims, ops map[string]bool) {
	// Only application/json: a form on another site can post text/plain
	// that parses as JSON through the approver's SSO session, but cannot
	// send application/json without a CORS preflight, which is never
	// granted.
	if mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); mt != "application/json" {
		h.report(r, security.Event{Reason: ReasonForgedForm, Request: "POST " + quoteCut(r.URL.Path) + " as " + quoteCut(r.Header.Get("Content-Type"))})
		writeError(w, http.StatusUnsupportedMediaType, "json_required", "send the decision as Content-Type: application/json")
		return
	}
	var body struct {
		Reason string `json:"reason"`
	}
	data, err := io.ReadAll(io.LimitReader(r.Body, maxBody+1))
	if err != nil || len(data) > maxBody {
		writeError(w, http.StatusBadRequest, "invalid_body", "the body must be a JSON object {\"reason\": \"...\"} of at most 16 KiB")
		return
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&body); err != nil {
		writeError(w, http.StatusBadRequest, "invalid_body", "the body must be a JSON object {\"reason\": \"...\"}")
		return
	}
	if strings.TrimSpace(body.Reason) == "" {
		writeError(w, http.StatusBadRequest, "reason_required", "a decision needs a non-empty reason")
		return
	}
	rctx, rcancel := h.ctx(r)
	a, found, err := h.opts.Approvals.GetApproval(rctx, id)
	rcancel()
	if err != nil {
		h.storeFailed(w, "read approval", err)
		return
	}
	if !found || !ops[a.Operation] {
		h.report(r, security.Event{Reason: ReasonUnknownApproval, Operation: a.Operation, Nonce: a.Key})
		writeError(w, http.StatusNotFound, "not_found", "no such approval")
		return
	}
	d, stepUpNeeded := h.decision(&a, who, approve, body.Reason)
	if stepUpNeeded != nil {
		h.askStepUp(w, r, &a, stepUpNeeded)
		writeError(w, http.StatusUnauthorized, "insufficient_user_authentication", "you requested this operation: approving it yourself needs a stronger or more recent authentication ("+stepUpNeeded.describe()+"); authenticate again and retry")
		return
	}
	out, after, err := h.makeDecision(r, d, "api")
	if err != nil {
		h.storeFailed(w, "decide approval", err)
		return
	}
	switch out {
	case state.DecisionRecorded, state.DecisionRepeated:
		writeJSON(w, http.StatusOK, ViewOf(&after))
	case state.DecisionSelfApproval:
		writeError(w, http.StatusForbidden, "approval_forbidden", "the requester may not approve their own operation (distinct_from_requester); they may deny it")
	case state.DecisionNotPending:
		writeJSON(w, http.StatusConflict, map[string]any{"error": "not_pending", "message": "the approval is " + strings.ToLower(string(after.State)) + ", not pending", "approval": ViewOf(&after)})
	case state.DecisionNotFound:
		h.report(r, security.Event{Reason: ReasonUnknownApproval, Operation: after.Operation, Nonce: after.Key, SubjectTag: after.SubjectTag})
		writeError(w, http.StatusNotFound, "not_found", "no such approval")
	}
}

// makeDecision makes a decision and does what every surface does with it: a
// recorded one is logged, counted (approved, denied) and traced; a
// self-approval and a decision on a lapsed approval are security events.
// The caller writes the answer (and reports an unknown id its own way).
func (h *Handler) makeDecision(r *http.Request, d state.Decision, via string) (state.DecisionOutcome, state.Approval, error) {
	ctx, cancel := h.ctx(r)
	defer cancel()
	out, after, err := h.opts.Approvals.DecideApproval(ctx, d)
	if err != nil {
		return out, after, err
	}
	ev := security.Event{Operation: after.Operation, Nonce: after.Key, SubjectTag: after.SubjectTag}
	switch out {
	case state.DecisionRecorded, state.DecisionRepeated:
		if out == state.DecisionRecorded {
			h.recorded(r, d.Approve, &after)
		}
		h.opts.Logger.Info("approval decision", "approval_id", d.ID, "approver", d.Approver, "approve", d.Approve, "state", after.State, "outcome", out, "via", via)
	case state.DecisionSelfApproval:
		ev.Reason = ReasonSelfApproval
		h.report(r, ev)
	case state.DecisionNotPending:
		if after.State == state.ApprovalExpired {
			ev.Reason = ReasonLapsedApproval
			h.report(r, ev)
		}
	}
	return out, after, nil
}

// recorded counts and traces a decision that changed what is stored. A
// decision is recorded only on a PENDING approval, so an approval that is
// now APPROVED or DENIED moved there by this decision; an approve that
// leaves it PENDING, waiting for more approvers, moves nothing: it is
// traced as approval.decision and not counted.
func (h *Handler) recorded(r *http.Request, approve bool, after *state.Approval) {
	transition := ""
	switch after.State {
	case state.ApprovalApproved:
		transition = "approved"
	case state.ApprovalDenied:
		transition = "denied"
	}
	if h.opts.Transition != nil && transition != "" {
		h.opts.Transition(after.Operation, transition)
	}
	if h.opts.Tracer == nil {
		return
	}
	event := "approval.decision"
	if transition != "" {
		event = "approval." + transition
	}
	ctx := traceContext.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
	_, span := h.opts.Tracer.Start(ctx, "idemgate.approval.decide", trace.WithSpanKind(trace.SpanKindServer))
	span.AddEvent(event, trace.WithAttributes(
		attribute.String("idemgate.approval_id", after.ID),
		attribute.String("idemgate.operation", after.Operation),
		attribute.String("idemgate.nonce", after.Key),
		attribute.Bool("idemgate.approval.approve", approve),
		attribute.String("idemgate.approval.state", strings.ToLower(string(after.State))),
	))
	span.End()
}

// traceContext reads a W3C traceparent, as the confirm stream does.
var traceContext = propagation.TraceContext{}

func (h *Handler) storeFailed(w http.ResponseWriter, op string, err error) {
	h.opts.Logger.Warn("approval store call failed", "store_op", op, "error", err)
	w.Header().Set("Retry-After", "1")
	writeError(w, http.StatusServiceUnavailable, "temporarily_unavailable", "the approval store cannot be reached; nothing was decided, retry")
}

// ParseState reads a lower-case state name.
func ParseState(s string) (state.ApprovalState, bool) {
	st := state.ApprovalState(strings.ToUpper(s))
	switch st {
	case state.ApprovalPending, state.ApprovalApproved, state.ApprovalDenied, state.ApprovalExpired, state.ApprovalConsumed:
		return st, true
	}
	return "", false
}

// View is <approval> as docs/design.md §10 shows it. The fingerprint and
// unbound fields are never part of it: an approval holds neither.
type View struct {
	ApprovalID string         `json:"approval_id"`
	State      string         `json:"state"`
	Operation  string         `json:"operation"`
	Requester  string         `json:"requester"`
	Params     map[string]any `json:"params"`
	Rules      []string       `json:"rules"`
	Required   int            `json:"required"`
	CreatedAt  time.Time      `json:"created_at"`
	ExpiresAt  time.Time      `json:"expires_at"`
	Decisions  []DecisionView `json:"decisions"`
}

// DecisionView is one approve or deny.
type DecisionView struct {
	Approver string    `json:"approver"`
	Decision string    `json:"decision"`
	Reason   string    `json:"reason"`
	At       time.Time `json:"at"`
	// How the approver authenticated, when their token said
	// (docs/design.md §13).
	ACR      string     `json:"acr,omitempty"`
	AMR      []string   `json:"amr,omitempty"`
	AuthTime *time.Time `json:"auth_time,omitempty"`
}

// ViewOf renders a.
func ViewOf(a *state.Approval) View {
	v := View{
		ApprovalID: a.ID, State: strings.ToLower(string(a.State)), Operation: a.Operation, Requester: a.Requester,
		Params: NestParams(a.Params), Rules: append([]string{}, a.Rules...), Required: a.Required,
		CreatedAt: a.CreatedAt.UTC(), ExpiresAt: a.ExpiresAt.UTC(), Decisions: []DecisionView{},
	}
	for _, e := range a.Events {
		switch e.Kind {
		case state.EventApproved, state.EventDenied:
			d := "approve"
			if e.Kind == state.EventDenied {
				d = "deny"
			}
			dv := DecisionView{Approver: e.Actor, Decision: d, Reason: e.Reason, At: e.At.UTC(), ACR: e.ACR, AMR: e.AMR}
			if !e.AuthTime.IsZero() {
				at := e.AuthTime.UTC()
				dv.AuthTime = &at
			}
			v.Decisions = append(v.Decisions, dv)
		}
	}
	return v
}

// NestParams turns the canonical bound params (a flat object keyed by the
// param paths as written, "payee.account_id") into the object nested as in
// the request, numbers as strings (decimals stay exact).
func NestParams(canonical []byte) map[string]any {
	out := map[string]any{}
	dec := json.NewDecoder(bytes.NewReader(canonical))
	dec.UseNumber()
	var flat map[string]any
	if err := dec.Decode(&flat); err != nil {
		return out
	}
	keys := make([]string, 0, len(flat))
	for k := range flat {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		segs := strings.Split(k, ".")
		m := out
		for _, s := range segs[:len(segs)-1] {
			next, ok := m[s].(map[string]any)
			if !ok {
				next = map[string]any{}
				m[s] = next
			}
			m = next
		}
		m[segs[len(segs)-1]] = numbersAsStrings(flat[k])
	}
	return out
}

func numbersAsStrings(v any) any {
	switch x := v.(type) {
	case json.Number:
		return x.String()
	case map[string]any:
		for k, e := range x {
			x[k] = numbersAsStrings(e)
		}
	case []any:
		for i, e := range x {
			x[i] = numbersAsStrings(e)
		}
	}
	return v
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, status int, code, msg string) {
	writeJSON(w, status, map[string]string{"error": code, "message": msg})
}

// quoteCut bounds a message for a security event.
func quoteCut(s string) string {
	if len(s) > 200 {
		s = s[:200]
	}
	return s
}
