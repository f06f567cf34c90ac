package config

import (
	"time"

	"github.com/idemgate/idemgate/extproc/envelope"
	"github.com/idemgate/idemgate/extproc/route"
	"github.com/idemgate/idemgate/fingerprint"
)

// Runtime is the compiled configuration of the ext_proc server. It is
// immutable after Load.
type Runtime struct {
	// Source is the file the runtime was compiled from.
	Source string
	Keys   *fingerprint.KeyRing
	// KeySources describes where each key came from (for the summary; no material).
	KeySources map[string]string
	// Attestation signs what is forwarded after ACQUIRED (nil: off).
	Attestation *AttestationSettings
	Subject     SubjectSource
	Store       StoreCallSettings
	TTL         TTLSettings
	Limits      LimitSettings
	Language    string
	Webhook     WebhookSettings
	Operations  []*Operation
	// Routes maps method + path to an operation's route.
	Routes *route.Table[Target]
	// MCPEndpoints holds the MCP endpoints of MCP operations by path (nil
	// when no operation is MCP).
	MCPEndpoints map[string]*MCPEndpoint
	// Guard tells the exact spelling and method of a guarded path from
	// every other (GuardedPaths).
	Guard *route.Guard
	// Envelopes renders answers given before any operation is known (for
	// example a recovered panic at request headers).
	Envelopes *envelope.Set
}

// SubjectSource is where the subject is read: a header, or a dynamic
// metadata namespace and path.
type SubjectSource struct {
	Header            string // lower-case; empty when metadata is used
	MetadataNamespace string
	MetadataPath      []string
}

// StoreCallSettings bound the store calls the server makes.
type StoreCallSettings struct {
	// Timeout is the deadline of each call (store.timeout).
	Timeout time.Duration
}

// TTLSettings are the three lifetimes.
type TTLSettings struct {
	Fingerprint time.Duration
	InFlight    time.Duration
	Terminal    time.Duration
	// ReplayCache is how long Redis, the fast path of a tiered store, keeps
	// a record: replays come within minutes and PostgreSQL, the truth,
	// keeps it for Terminal. A Redis-only store ignores it (Redis is the
	// record there and keeps it for Terminal).
	ReplayCache time.Duration
}

// LimitSettings bound body reading.
type LimitSettings struct {
	MaxBodyBytes int64
	MaxJSONDepth int
	// TerminalCacheBytes bounds the replica's memory of terminal records
	// (limits.terminal_cache_bytes; 0: none kept, every replay asks the
	// store).
	TerminalCacheBytes int64
}

// WebhookSettings configures the security-event webhook (URL empty = off).
type WebhookSettings struct {
	URL       string
	Timeout   time.Duration
	QueueSize int
}

// Kind is which of an operation's routes a request hit.
type Kind uint8

// The three route kinds.
const (
	KindPreview Kind = iota + 1
	KindConfirm
	KindStatus
)

func (k Kind) String() string {
	switch k {
	case KindPreview:
		return "preview"
	case KindConfirm:
		return "confirm"
	case KindStatus:
		return "status"
	}
	return "unknown"
}

// Target is what a route resolves to.
type Target struct {
	Op   *Operation
	Kind Kind
}

// Replay selects how DONE/FAILED results are replayed.
type Replay uint8

// Replay modes.
const (
	ReplayEnvelope Replay = iota
	ReplayRaw
)

func (r Replay) String() string {
	if r == ReplayRaw {
		return "raw"
	}
	return "envelope"
}

// Route is a compiled method and path template.
type Route struct {
	Method   string
	Template route.Template
}

// Operation is one compiled operation.
type Operation struct {
	Name        string
	Scope       string
	Preview     Route
	Confirm     Route
	Status      Route
	PreviewTool string
	StatusTool  string
	// PreviewFingerprintHeader: a preview's fingerprint also travels in the
	// Idempotency-Fingerprint response header (preview.fingerprint_header,
	// default true). Without it the preview skips its response-headers
	// message and reads the status from the response.code attribute.
	PreviewFingerprintHeader bool
	Params                   []fingerprint.Param
	Selector                 *fingerprint.Selector
	// FingerprintField is the body field carrying the fingerprint;
	// ExpiresAtField is FingerprintField + "_expires_at".
	FingerprintField string
	ExpiresAtField   string
	// ResultRef is the dotted path of result_ref in the original result
	// (nil: the nonce is the reference).
	ResultRef     []string
	ResultRefPath string
	// DownstreamHeader is the lower-case header that carries the nonce to
	// the upstream; empty means the downstream ignores idempotency keys.
	DownstreamHeader string
	Replay           Replay
	UpstreamTimeout  time.Duration
	UpstreamRetries  int
	PollAfter        time.Duration
	// Outcomes classes the upstream's statuses (defaults plus `outcomes`).
	Outcomes Outcomes
	// Overrides are the per-message text overrides as configured.
	Overrides map[envelope.Message]envelope.Text
	Envelopes *envelope.Set
	// MCP is set when the operation is an MCP tool pair (its HTTP routes
	// are then unset).
	MCP *MCPTools
	// Approval is set when some confirms of the operation need people's
	// approval (docs/design.md §10).
	Approval *ApprovalSettings
}

// HonoursKeys reports whether the downstream deduplicates by the
// idempotency key, which decides EndLease versus MarkUnknown after an
// ambiguous outcome.
func (o *Operation) HonoursKeys() bool { return o.DownstreamHeader != "" }

// ReadsResponseCode reports whether an operation's preview skips its
// response headers (an HTTP preview's fingerprint_header: false, an MCP
// operation's mcp.preview_response_headers: false) and so reads the
// upstream's status from Envoy's response.code attribute: Envoy must be
// asked for it, and idemgate must decode attributes.
func (rt *Runtime) ReadsResponseCode() bool {
	for _, op := range rt.Operations {
		if op.PreviewStatusFromAttribute() {
			return true
		}
	}
	return false
}

// PreviewStatusFromAttribute reports whether the operation's preview skips
// its response headers and reads the status from response.code.
func (o *Operation) PreviewStatusFromAttribute() bool {
	if o.MCP != nil {
		return o.MCP.PreviewStatusFromAttribute
	}
	return !o.PreviewFingerprintHeader
}
