// Package envelope renders the JSON bodies idemgate writes itself: every
// answer an agent reads when idemgate, not the upstream, decides what happens
// (docs/design.md §5). The text is written for an LLM: what happened, what to
// do next, and whether to retry.
//
// Everything that does not change per request (status, meaning, instruction,
// retryable, tool names, poll and retry delays) is rendered once per operation
// into a byte prefix; a request only appends its dynamic fields and trace id.
package envelope

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Message names one catalogue entry. Most are equal to the envelope status
// they produce; answers of the status route are prefixed "status." because
// they share status names with confirm answers but need different text.
type Message string

// Messages of the confirm (and preview) routes.
const (
	AlreadyCompleted           Message = "already_completed"
	AlreadyFailed              Message = "already_failed"
	InProgress                 Message = "in_progress"
	NeedsReconciliation        Message = "needs_reconciliation"
	FingerprintRequired        Message = "fingerprint_required"
	FingerprintInvalid         Message = "fingerprint_invalid"
	FingerprintExpired         Message = "fingerprint_expired"
	FingerprintSubjectMismatch Message = "fingerprint_subject_mismatch"
	ParamsChanged              Message = "params_changed"
	InvalidParams              Message = "invalid_params"
	TemporarilyUnavailable     Message = "temporarily_unavailable"
	RequestTooLarge            Message = "request_too_large"
	InvalidJSON                Message = "invalid_json"
	SubjectRequired            Message = "subject_required"
	InternalError              Message = "internal_error"
	// PathNotExact, MethodNotAllowed and HeaderNotAllowed refuse a request
	// that names a guarded operation in a way idemgate does not check: some
	// other spelling of its path, another method, or headers that would
	// make Envoy send it more than once. Detail names the exact route.
	PathNotExact     Message = "path_not_exact"
	MethodNotAllowed Message = "method_not_allowed"
	HeaderNotAllowed Message = "header_not_allowed"
	// ApprovalPending, ApprovalDenied and ApprovalExpired answer a confirm
	// that needs people's approval (docs/design.md §10); ApprovalID names it.
	ApprovalPending Message = "approval_pending"
	ApprovalDenied  Message = "approval_denied"
	ApprovalExpired Message = "approval_expired"
)

// Messages of the status route.
const (
	StatusNotStarted             Message = "status.not_started"
	StatusInterrupted            Message = "status.interrupted"
	StatusInProgress             Message = "status.in_progress"
	StatusCompleted              Message = "status.completed"
	StatusFailed                 Message = "status.failed"
	StatusNeedsReconciliation    Message = "status.needs_reconciliation"
	StatusFingerprintRequired    Message = "status.fingerprint_required"
	StatusFingerprintInvalid     Message = "status.fingerprint_invalid"
	StatusTemporarilyUnavailable Message = "status.temporarily_unavailable"
	StatusApprovalPending        Message = "status.approval_pending"
	StatusApprovalGranted        Message = "status.approval_granted"
	StatusApprovalDenied         Message = "status.approval_denied"
	StatusApprovalExpired        Message = "status.approval_expired"
)

// RetryAfter is the delay idemgate asks for in temporarily_unavailable
// answers (Retry-After header and retry_after_ms).
const RetryAfter = time.Second

// Spec is the fixed part of a message: the envelope status, the HTTP status
// (0 = the original upstream status of a replayed result), whether the same
// call may be retried, and which static extra fields it carries.
type Spec struct {
	Status      string
	HTTPStatus  int
	Retryable   bool
	PollWith    bool // poll_with + poll_after_ms (and Retry-After header when HTTPStatus is 409)
	PollOnly    bool // poll_with without poll_after_ms
	PreviewWith bool
	RetryAfter  bool // retry_after_ms + Retry-After header
}

var specs = map[Message]Spec{
	AlreadyCompleted:           {Status: "already_completed"},
	AlreadyFailed:              {Status: "already_failed"},
	InProgress:                 {Status: "in_progress", HTTPStatus: 409, PollWith: true},
	NeedsReconciliation:        {Status: "needs_reconciliation", HTTPStatus: 409, PollOnly: true},
	FingerprintRequired:        {Status: "fingerprint_required", HTTPStatus: 400, PreviewWith: true},
	FingerprintInvalid:         {Status: "fingerprint_invalid", HTTPStatus: 400, PreviewWith: true},
	FingerprintExpired:         {Status: "fingerprint_expired", HTTPStatus: 410, PreviewWith: true},
	FingerprintSubjectMismatch: {Status: "fingerprint_subject_mismatch", HTTPStatus: 403},
	ParamsChanged:              {Status: "params_changed", HTTPStatus: 422, PreviewWith: true},
	InvalidParams:              {Status: "invalid_params", HTTPStatus: 400, PreviewWith: true},
	TemporarilyUnavailable:     {Status: "temporarily_unavailable", HTTPStatus: 503, Retryable: true, RetryAfter: true},
	RequestTooLarge:            {Status: "request_too_large", HTTPStatus: 413},
	InvalidJSON:                {Status: "invalid_json", HTTPStatus: 400},
	SubjectRequired:            {Status: "subject_required", HTTPStatus: 401},
	InternalError:              {Status: "internal_error", HTTPStatus: 500},
	PathNotExact:               {Status: "path_not_exact", HTTPStatus: 404},
	MethodNotAllowed:           {Status: "method_not_allowed", HTTPStatus: 405},
	HeaderNotAllowed:           {Status: "header_not_allowed", HTTPStatus: 400},
	ApprovalPending:            {Status: "approval_pending", HTTPStatus: 202, Retryable: true, PollWith: true},
	ApprovalDenied:             {Status: "approval_denied", HTTPStatus: 403},
	ApprovalExpired:            {Status: "approval_expired", HTTPStatus: 410, PreviewWith: true},

	StatusNotStarted:             {Status: "not_started", HTTPStatus: 200},
	StatusInterrupted:            {Status: "not_started", HTTPStatus: 200},
	StatusInProgress:             {Status: "in_progress", HTTPStatus: 200, Retryable: true, PollWith: true},
	StatusCompleted:              {Status: "completed", HTTPStatus: 200},
	StatusFailed:                 {Status: "failed", HTTPStatus: 200},
	StatusNeedsReconciliation:    {Status: "needs_reconciliation", HTTPStatus: 200},
	StatusFingerprintRequired:    {Status: "fingerprint_required", HTTPStatus: 400},
	StatusFingerprintInvalid:     {Status: "fingerprint_invalid", HTTPStatus: 400},
	StatusTemporarilyUnavailable: {Status: "temporarily_unavailable", HTTPStatus: 503, Retryable: true, RetryAfter: true},
	StatusApprovalPending:        {Status: "approval_pending", HTTPStatus: 200, Retryable: true, PollWith: true},
	StatusApprovalGranted:        {Status: "approval_granted", HTTPStatus: 200},
	StatusApprovalDenied:         {Status: "approval_denied", HTTPStatus: 200},
	StatusApprovalExpired:        {Status: "approval_expired", HTTPStatus: 200, PreviewWith: true},
}

// SpecOf returns the fixed part of m.
func SpecOf(m Message) (Spec, bool) {
	s, ok := specs[m]
	return s, ok
}

// Messages lists every message id in a stable order (the valid keys of
// per-operation overrides).
func Messages() []Message {
	out := make([]Message, 0, len(specs))
	for m := range specs {
		out = append(out, m)
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

// Text is the human (LLM) readable part of an envelope.
type Text struct {
	Meaning     string
	Instruction string
}

// Placeholders that catalogue and override texts may use; they are replaced
// once, when an operation's envelopes are compiled.
var placeholders = []string{
	"{preview_tool}", "{status_tool}", "{poll_after_seconds}",
	"{retry_after_seconds}", "{max_body_bytes}",
}

// CheckPlaceholders returns an error naming the first "{...}" in s that is
// not a known placeholder.
func CheckPlaceholders(s string) error {
	for rest := s; ; {
		i := strings.IndexByte(rest, '{')
		if i < 0 {
			return nil
		}
		j := strings.IndexByte(rest[i:], '}')
		if j < 0 {
			return nil
		}
		ph := rest[i : i+j+1]
		known := false
		for _, p := range placeholders {
			if p == ph {
				known = true
				break
			}
		}
		if !known {
			return fmt.Errorf("unknown placeholder %s (known: %s)", ph, strings.Join(placeholders, " "))
		}
		rest = rest[i+j+1:]
	}
}

// Operation carries what an operation's envelopes mention.
type Operation struct {
	PreviewTool  string
	StatusTool   string
	PollAfter    time.Duration
	MaxBodyBytes int64
}

// Set is the compiled envelopes of one operation (or of no operation, for
// answers given before a route is known).
type Set struct {
	prefix [numSlots][]byte
	spec   [numSlots]Spec
	// text is each message's text as rendered (placeholders filled), for
	// renderings that show meaning and instruction apart from the body.
	text [numSlots]Text
	op   Operation
}

// numSlots bounds the fixed-size tables of a Set; every Message has a slot.
const numSlots = 48

var slots = func() map[Message]int {
	m := make(map[Message]int, len(specs))
	for i, id := range Messages() {
		m[id] = i
	}
	if len(m) > numSlots {
		panic("envelope: numSlots too small")
	}
	return m
}()

// Compile renders the static part of every message for op, using the
// catalogue of language and per-message overrides (empty fields of an
// override keep the catalogue text).
func Compile(language string, overrides map[Message]Text, op Operation) (*Set, error) {
	cat, ok := catalogues[language]
	if !ok {
		return nil, fmt.Errorf("unknown language %q (known: %s)", language, strings.Join(Languages(), ", "))
	}
	s := &Set{op: op}
	for id, slot := range slots {
		text := cat[id]
		if o, ok := overrides[id]; ok {
			if o.Meaning != "" {
				text.Meaning = o.Meaning
			}
			if o.Instruction != "" {
				text.Instruction = o.Instruction
			}
		}
		spec := specs[id]
		s.spec[slot] = spec
		s.text[slot] = expand(text, op)
		s.prefix[slot] = renderPrefix(spec, s.text[slot], op)
	}
	for id := range overrides {
		if _, ok := slots[id]; !ok {
			return nil, fmt.Errorf("unknown message %q", id)
		}
	}
	return s, nil
}

// Languages lists the built-in catalogues.
func Languages() []string {
	out := make([]string, 0, len(catalogues))
	for l := range catalogues {
		out = append(out, l)
	}
	sort.Strings(out)
	return out
}

func expand(t Text, op Operation) Text {
	preview := op.PreviewTool
	if preview == "" {
		preview = "the preview tool"
	}
	status := op.StatusTool
	if status == "" {
		status = "the status tool"
	}
	r := strings.NewReplacer(
		"{preview_tool}", preview,
		"{status_tool}", status,
		"{poll_after_seconds}", strconv.FormatInt(ceilSeconds(op.PollAfter), 10),
		"{retry_after_seconds}", strconv.FormatInt(ceilSeconds(RetryAfter), 10),
		"{max_body_bytes}", strconv.FormatInt(op.MaxBodyBytes, 10),
	)
	return Text{Meaning: r.Replace(t.Meaning), Instruction: r.Replace(t.Instruction)}
}

// ceilSeconds rounds d up to whole seconds, at least 1 (Retry-After has
// second resolution and 0 would invite an immediate retry).
func ceilSeconds(d time.Duration) int64 {
	s := int64((d + time.Second - 1) / time.Second)
	if s < 1 {
		s = 1
	}
	return s
}

func renderPrefix(spec Spec, t Text, op Operation) []byte {
	b := make([]byte, 0, 256+len(t.Meaning)+len(t.Instruction))
	b = append(b, `{"status":`...)
	b = AppendString(b, spec.Status)
	b = append(b, `,"meaning":`...)
	b = AppendString(b, t.Meaning)
	b = append(b, `,"instruction":`...)
	b = AppendString(b, t.Instruction)
	b = append(b, `,"retryable":`...)
	b = strconv.AppendBool(b, spec.Retryable)
	if (spec.PollWith || spec.PollOnly) && op.StatusTool != "" {
		b = append(b, `,"poll_with":`...)
		b = AppendString(b, op.StatusTool)
	}
	if spec.PollWith {
		b = append(b, `,"poll_after_ms":`...)
		b = strconv.AppendInt(b, op.PollAfter.Milliseconds(), 10)
	}
	if spec.PreviewWith && op.PreviewTool != "" {
		b = append(b, `,"preview_with":`...)
		b = AppendString(b, op.PreviewTool)
	}
	if spec.RetryAfter {
		b = append(b, `,"retry_after_ms":`...)
		b = strconv.AppendInt(b, RetryAfter.Milliseconds(), 10)
	}
	return b
}

// Extra holds the per-request fields of an envelope.
type Extra struct {
	ChangedFields []string
	// ResultRef is set (with Result) for replays and terminal status answers.
	ResultRef string
	// Result is the original upstream body: embedded as JSON when it is
	// valid JSON, else as a JSON string.
	Result    []byte
	HasResult bool
	// ResultJSON reports that Result is known to be strict JSON (checked
	// once when it was kept in memory): it is embedded without checking it
	// again.
	ResultJSON bool
	// ResultStatus is the original HTTP status (status route only).
	ResultStatus int
	// Detail says what exactly was wrong with the request (invalid_json,
	// invalid_params): the position of a syntax error or the param path.
	// It only ever echoes the caller's own input.
	Detail string
	// ApprovalID names the approval of an approval_* answer.
	ApprovalID string
	// ApprovalURL is where a person decides it (approval.public_url;
	// docs/design.md §13), "" when not configured.
	ApprovalURL string
}

// Rendered is one envelope ready to send.
type Rendered struct {
	HTTPStatus int
	// RetryAfterSeconds is >0 when a Retry-After header belongs to the answer.
	RetryAfterSeconds int64
	Status            string
	Body              []byte
}

// Text is message m's meaning and instruction exactly as its envelopes
// carry them.
func (s *Set) Text(m Message) Text {
	slot, ok := slots[m]
	if !ok {
		slot = slots[InternalError]
	}
	return s.text[slot]
}

// Render builds the envelope m with the request's trace id and dynamic
// fields. originalStatus is the HTTP status for replays (messages whose spec
// has HTTPStatus 0) and is ignored otherwise.
func (s *Set) Render(m Message, traceID string, originalStatus int, x Extra) Rendered {
	return s.RenderTo(nil, m, traceID, originalStatus, x)
}

// RenderTo is Render writing the body into dst's memory when it is large
// enough (a pooled buffer the caller reuses once the body is sent).
func (s *Set) RenderTo(dst []byte, m Message, traceID string, originalStatus int, x Extra) Rendered {
	slot, ok := slots[m]
	if !ok {
		slot = slots[InternalError]
	}
	spec := s.spec[slot]
	prefix := s.prefix[slot]
	b := dst[:0]
	if need := len(prefix) + 64 + len(traceID) + len(x.Result) + len(x.ResultRef); cap(b) < need {
		b = make([]byte, 0, need)
	}
	b = append(b, prefix...)
	if len(x.ChangedFields) > 0 {
		b = append(b, `,"changed_fields":[`...)
		for i, f := range x.ChangedFields {
			if i > 0 {
				b = append(b, ',')
			}
			b = AppendString(b, f)
		}
		b = append(b, ']')
	}
	if x.Detail != "" {
		b = append(b, `,"detail":`...)
		b = AppendString(b, x.Detail)
	}
	if x.ApprovalID != "" {
		b = append(b, `,"approval_id":`...)
		b = AppendString(b, x.ApprovalID)
	}
	if x.ApprovalURL != "" {
		b = append(b, `,"approval_url":`...)
		b = AppendString(b, x.ApprovalURL)
	}
	if x.HasResult {
		b = append(b, `,"result_ref":`...)
		b = AppendString(b, x.ResultRef)
		if x.ResultStatus != 0 {
			b = append(b, `,"result_status":`...)
			b = strconv.AppendInt(b, int64(x.ResultStatus), 10)
		}
		b = append(b, `,"result":`...)
		if x.ResultJSON && len(x.Result) > 0 {
			b = append(b, x.Result...)
		} else {
			b = AppendJSONOrString(b, x.Result)
		}
	}
	b = append(b, `,"trace_id":`...)
	b = AppendString(b, traceID)
	b = append(b, '}')

	r := Rendered{HTTPStatus: spec.HTTPStatus, Status: spec.Status, Body: b}
	if r.HTTPStatus == 0 {
		r.HTTPStatus = originalStatus
	}
	switch {
	case spec.RetryAfter:
		r.RetryAfterSeconds = ceilSeconds(RetryAfter)
	case spec.PollWith && (spec.HTTPStatus == 409 || spec.HTTPStatus == 202):
		r.RetryAfterSeconds = ceilSeconds(s.op.PollAfter)
	}
	return r
}
