package e2e

import (
	"encoding/json"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/e2e/internal/stack"
)

// transfer is a preview/confirm body. memo is free text: it is not one of
// the operation's params (amount, currency, payee.account_id), so rewording
// it must not matter.
func transfer(amount, account, memo string) map[string]any {
	return map[string]any{
		"amount":   amount,
		"currency": "EUR",
		"payee":    map[string]any{"account_id": account, "name": "Bob Example"},
		"memo":     memo,
	}
}

// preview runs the preview tool and requires it to succeed.
func preview(t *testing.T, a *stack.Agent, params map[string]any) *stack.Preview {
	t.Helper()
	p, err := a.Preview(params)
	require.NoError(t, err)
	return p
}

// confirm runs the confirm tool and requires an HTTP answer.
func confirm(t *testing.T, a *stack.Agent, body map[string]any) *stack.Response {
	t.Helper()
	r, err := a.Confirm(body)
	require.NoError(t, err)
	return r
}

// status runs the status tool and requires an HTTP answer.
func status(t *testing.T, a *stack.Agent, fingerprint string) *stack.Response {
	t.Helper()
	r, err := a.Status(fingerprint)
	require.NoError(t, err)
	return r
}

// retry is the envelope's retryable that an answer must carry.
type retry bool

const (
	retryable    retry = true
	notRetryable retry = false
)

// requireEnvelope checks an answer idemgate wrote itself: the HTTP status,
// the envelope status, retryable, a meaning and an instruction for the
// agent, and trace_id equal to the x-request-id the front gave the request.
func requireEnvelope(t *testing.T, s *stack.Stack, r *stack.Response, httpStatus int, envStatus string, want retry) *stack.Envelope {
	t.Helper()
	require.NotNil(t, r.Envelope, "expected an idemgate envelope, got %s", r)
	e := r.Envelope
	require.Equal(t, httpStatus, r.StatusCode, "HTTP status of %s", r)
	require.Equal(t, envStatus, e.Status, "envelope status of %s", r)
	require.NotNil(t, e.Retryable, "retryable missing in %s", r)
	require.Equal(t, bool(want), *e.Retryable, "retryable in %s", r)
	require.NotEmpty(t, e.Meaning, "meaning missing in %s", r)
	require.NotEmpty(t, e.Instruction, "instruction missing in %s", r)
	require.Equal(t, "application/json", r.Header.Get("Content-Type"))
	rid, err := s.RequestID(r)
	require.NoError(t, err)
	require.NotEmpty(t, rid)
	require.Equal(t, rid, e.TraceID, "trace_id must be the x-request-id of the request")
	return e
}

// transferAnswer is the payments upstream's confirm answer.
type transferAnswer struct {
	TransferID string `json:"transfer_id"`
	Status     string `json:"status"`
	Amount     string `json:"amount"`
	Currency   string `json:"currency"`
}

// requireExecuted checks an answer that came from the upstream executing
// the transfer (not a replay, not an envelope) and returns it.
func requireExecuted(t *testing.T, r *stack.Response) transferAnswer {
	t.Helper()
	require.Equal(t, http.StatusOK, r.StatusCode, "expected the upstream's 200, got %s", r)
	require.Nil(t, r.Envelope, "expected the upstream's own answer, got an envelope: %s", r)
	require.False(t, r.Replayed(), "the first execution must not be marked replayed")
	var tr transferAnswer
	require.NoError(t, json.Unmarshal(r.Body, &tr))
	require.NotEmpty(t, tr.TransferID, "no transfer_id in %s", r)
	return tr
}

// requireReplay checks an already_completed answer: the original status,
// Idempotent-Replayed and Idempotency-Key headers, and the original body
// byte for byte in result.
func requireReplay(t *testing.T, s *stack.Stack, r *stack.Response, nonce string, original []byte) {
	t.Helper()
	e := requireEnvelope(t, s, r, http.StatusOK, "already_completed", notRetryable)
	require.True(t, r.Replayed(), "a replay carries Idempotent-Replayed: true")
	require.Equal(t, nonce, r.Header.Get("Idempotency-Key"))
	require.Equal(t, string(original), string(e.Result), "the replayed result must be the original bytes")
	var tr transferAnswer
	require.NoError(t, json.Unmarshal(original, &tr))
	require.Equal(t, tr.TransferID, e.ResultRef, "result_ref is the original transfer_id")
}

// requireInProgress checks an in_progress answer: 409, Retry-After, poll
// the status tool.
func requireInProgress(t *testing.T, s *stack.Stack, r *stack.Response) {
	t.Helper()
	e := requireEnvelope(t, s, r, http.StatusConflict, "in_progress", notRetryable)
	require.Equal(t, "transfer_status", e.PollWith)
	require.NotNil(t, e.PollAfterMS)
	secs, err := strconv.Atoi(r.Header.Get("Retry-After"))
	require.NoError(t, err, "Retry-After must be a number of seconds, got %q", r.Header.Get("Retry-After"))
	require.Positive(t, secs)
}

// requireRow checks the PostgreSQL record of nonce.
func requireRow(t *testing.T, s *stack.Stack, nonce, state string) stack.Row {
	t.Helper()
	row, err := s.Row(nonce)
	require.NoError(t, err)
	require.Equal(t, state, row.State, "PostgreSQL state of %s", nonce)
	return row
}

// requireRowCounts checks the whole idempotency_record table by state.
func requireRowCounts(t *testing.T, s *stack.Stack, want map[string]int) {
	t.Helper()
	got, err := s.RowCounts()
	require.NoError(t, err)
	require.Equal(t, want, got, "idempotency_record rows by state")
}

// statusOf polls the status tool once and returns its envelope status.
func statusOf(t *testing.T, s *stack.Stack, a *stack.Agent, fingerprint string) string {
	t.Helper()
	r := status(t, a, fingerprint)
	require.NotNil(t, r.Envelope, "status tool answered %s", r)
	return r.Envelope.Status
}

// waitStatus polls the status tool until it answers want.
func waitStatus(t *testing.T, s *stack.Stack, a *stack.Agent, fingerprint, want string, within time.Duration) {
	t.Helper()
	var last string
	require.Eventually(t, func() bool {
		r, err := a.Status(fingerprint)
		if err != nil || r.Envelope == nil {
			return false
		}
		last = r.Envelope.Status
		return last == want
	}, within, 50*time.Millisecond, "status tool never answered %s (last %q)", want, last)
}

// metric reads one idemgate metric sample.
func metric(t *testing.T, s *stack.Stack, sample string) float64 {
	t.Helper()
	v, err := s.Idemgate.Metric(sample)
	require.NoError(t, err)
	return v
}
