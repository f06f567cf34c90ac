package stack

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/idemgate/idemgate/e2e/demoauth"
)

// Operation paths of the shipped configs.
const (
	previewPath = "/v1/transfers/preview"
	statusPath  = "/v1/transfers/status"
)

// Agent is an LLM agent's HTTP client: one user, a bearer JWT the shipped
// envoy.yaml accepts, and the three tools preview, confirm and status.
type Agent struct {
	User   string
	token  string
	base   string
	client *http.Client
}

// agentUserAgents numbers requests, so a real Envoy's access log line can
// be found for each.
var agentUserAgents atomic.Int64

// Response is one HTTP answer as the agent saw it.
type Response struct {
	StatusCode int
	Header     http.Header
	// ContentLength is what the answer's content-length said (-1: none).
	ContentLength int64
	Body          []byte
	// Envelope is set when the body is an idemgate envelope (an object
	// with status, instruction and trace_id).
	Envelope *Envelope
	// UserAgent is the unique User-Agent the request was sent with.
	UserAgent string
}

// Envelope is the JSON idemgate writes for an agent (docs/design.md §5).
type Envelope struct {
	Status        string          `json:"status"`
	Meaning       string          `json:"meaning"`
	Instruction   string          `json:"instruction"`
	Retryable     *bool           `json:"retryable"`
	TraceID       string          `json:"trace_id"`
	PollWith      string          `json:"poll_with"`
	PollAfterMS   *int64          `json:"poll_after_ms"`
	PreviewWith   string          `json:"preview_with"`
	RetryAfterMS  *int64          `json:"retry_after_ms"`
	ChangedFields []string        `json:"changed_fields"`
	ResultRef     string          `json:"result_ref"`
	ResultStatus  int             `json:"result_status"`
	Result        json.RawMessage `json:"result"`
}

// Replayed says the answer carries Idempotent-Replayed: true.
func (r *Response) Replayed() bool { return r.Header.Get("Idempotent-Replayed") == "true" }

func (r *Response) String() string {
	return fmt.Sprintf("%d %s", r.StatusCode, bytes.TrimSpace(r.Body))
}

// Preview is a successful preview: the upstream's quote with the fingerprint
// idemgate signed into it.
type Preview struct {
	// Params is the body the preview was sent with.
	Params map[string]any
	// Response is the answer as received.
	Response *Response
	// Fingerprint and ExpiresAt are the injected fields.
	Fingerprint string
	ExpiresAt   time.Time
	// Nonce and Exp come from the token's payload (n, exp).
	Nonce string
	Exp   int64
}

// ConfirmBody returns the preview's params with the fingerprint added, the
// body an agent sends to confirm; change copies of it to tamper.
func (p *Preview) ConfirmBody() map[string]any {
	body := maps.Clone(p.Params)
	body["fingerprint"] = p.Fingerprint
	return body
}

func newAgent(user, base string, client *http.Client) (*Agent, error) {
	token, err := demoauth.Mint(user, time.Hour, time.Now())
	if err != nil {
		return nil, fmt.Errorf("failed to mint a JWT for %s: %w", user, err)
	}
	return &Agent{User: user, token: token, base: base, client: client}, nil
}

// Preview calls the preview tool and decodes the fingerprint it got.
func (a *Agent) Preview(params map[string]any) (*Preview, error) {
	resp, err := a.Post(previewPath, params, nil)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("preview answered %s", resp)
	}
	var quote struct {
		Fingerprint string `json:"fingerprint"`
		ExpiresAt   string `json:"fingerprint_expires_at"`
	}
	if err := json.Unmarshal(resp.Body, &quote); err != nil {
		return nil, fmt.Errorf("preview body is not JSON: %w", err)
	}
	if quote.Fingerprint == "" {
		return nil, fmt.Errorf("preview has no fingerprint: %s", resp)
	}
	exp, err := time.Parse(time.RFC3339, quote.ExpiresAt)
	if err != nil {
		return nil, fmt.Errorf("bad fingerprint_expires_at %q: %w", quote.ExpiresAt, err)
	}
	payload, err := DecodeFingerprint(quote.Fingerprint)
	if err != nil {
		return nil, err
	}
	return &Preview{Params: maps.Clone(params), Response: resp, Fingerprint: quote.Fingerprint, ExpiresAt: exp, Nonce: payload.Nonce, Exp: payload.Exp}, nil
}

// Confirm calls the confirm tool with body.
func (a *Agent) Confirm(body map[string]any) (*Response, error) {
	return a.Post(confirmPath, body, nil)
}

// ConfirmWith calls the confirm tool with extra request headers.
func (a *Agent) ConfirmWith(body map[string]any, extra http.Header) (*Response, error) {
	return a.Post(confirmPath, body, extra)
}

// Status calls the status tool for a fingerprint.
func (a *Agent) Status(fingerprint string) (*Response, error) {
	return a.Post(statusPath, map[string]any{"fingerprint": fingerprint}, nil)
}

// Post sends body as JSON to path with the agent's JWT and extra headers.
func (a *Agent) Post(path string, body map[string]any, extra http.Header) (*Response, error) {
	raw, err := json.Marshal(body)
	if err != nil {
		return nil, fmt.Errorf("failed to encode the body: %w", err)
	}
	req, err := http.NewRequest(http.MethodPost, a.base+path, bytes.NewReader(raw))
	if err != nil {
		return nil, err
	}
	for k, vs := range extra {
		for _, v := range vs {
			req.Header.Add(k, v)
		}
	}
	req.Header.Set("Content-Type", "application/json")
	if a.token != "" {
		req.Header.Set("Authorization", "Bearer "+a.token)
	}
	ua := fmt.Sprintf("idemgate-e2e/%d", agentUserAgents.Add(1))
	req.Header.Set("User-Agent", ua)
	resp, err := a.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("POST %s: %w", path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("POST %s: failed to read the answer: %w", path, err)
	}
	return newResponse(resp, b, ua)
}

// newResponse wraps an answer, decoding an idemgate envelope when the body
// is one (an object with status, instruction and trace_id).
func newResponse(resp *http.Response, b []byte, ua string) (*Response, error) {
	out := &Response{StatusCode: resp.StatusCode, Header: resp.Header, ContentLength: resp.ContentLength, Body: b, UserAgent: ua}
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
		var probe map[string]json.RawMessage
		if json.Unmarshal(b, &probe) == nil && probe["status"] != nil && probe["instruction"] != nil && probe["trace_id"] != nil {
			var env Envelope
			if err := json.Unmarshal(b, &env); err != nil {
				return nil, fmt.Errorf("bad envelope: %w", err)
			}
			out.Envelope = &env
		}
	}
	return out, nil
}

// FingerprintPayload is the part of a token's payload the tests read.
type FingerprintPayload struct {
	Version int    `json:"v"`
	KeyID   string `json:"k"`
	Nonce   string `json:"n"`
	Exp     int64  `json:"exp"`
	Scope   string `json:"s"`
}

// DecodeFingerprint reads a fingerprint's payload (without verifying it):
// base64url(payload) "." base64url(mac).
func DecodeFingerprint(fp string) (FingerprintPayload, error) {
	enc, _, ok := strings.Cut(fp, ".")
	if !ok {
		return FingerprintPayload{}, errors.New("fingerprint has no '.'")
	}
	raw, err := base64.RawURLEncoding.DecodeString(enc)
	if err != nil {
		return FingerprintPayload{}, fmt.Errorf("fingerprint payload is not base64url: %w", err)
	}
	var p FingerprintPayload
	if err := json.Unmarshal(raw, &p); err != nil {
		return FingerprintPayload{}, fmt.Errorf("fingerprint payload is not JSON: %w", err)
	}
	if len(p.Nonce) != 32 {
		return FingerprintPayload{}, fmt.Errorf("fingerprint nonce %q is not 32 hex characters", p.Nonce)
	}
	return p, nil
}
