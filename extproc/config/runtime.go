package config

import (
	"crypto/tls"
	"encoding/json"
	"log/slog"
	"time"

	"github.com/idemgate/idemgate/extproc/envelope"
	"github.com/idemgate/idemgate/extproc/route"
	"github.com/idemgate/idemgate/fingerprint"
)

// Secret is a string that must never be printed: logs, %v and JSON all show
// [REDACTED]. Reveal returns the value for the one place that needs it.
type Secret struct{ value string }

// NewSecret wraps s.
func NewSecret(s string) Secret { return Secret{value: s} }

// Reveal returns the secret value.
func (s Secret) Reveal() string { return s.value }

// IsZero reports whether the secret is empty.
func (s Secret) IsZero() bool { return s.value == "" }

const redacted = "[REDACTED]"

// String implements fmt.Stringer.
func (s Secret) String() string { return redacted }

// GoString implements fmt.GoStringer.
func (s Secret) GoString() string { return redacted }

// LogValue implements slog.LogValuer.
func (s Secret) LogValue() slog.Value { return slog.StringValue(redacted) }

// MarshalJSON implements json.Marshaler.
func (s Secret) MarshalJSON() ([]byte, error) { return []byte(`"` + redacted + `"`), nil }

// Runtime is the compiled configuration. It is immutable after Load.
type Runtime struct {
	// Source is the file the runtime was compiled from.
	Source      string
	GRPCListen  string
	AdminListen string
	Log         LogSettings
	Keys        *fingerprint.KeyRing
	// KeySources describes where each key came from (for the summary; no material).
	KeySources map[string]string
	Subject    SubjectSource
	Store      StoreSettings
	TTL        TTLSettings
	Limits     LimitSettings
	Language   string
	Webhook    WebhookSettings
	Drain      DrainSettings
	Tracing    TracingSettings
	Operations []*Operation
	// Routes maps method + path to an operation's route.
	Routes *route.Table[Target]
	// MCPEndpoints holds the MCP endpoints of MCP operations by path (nil
	// when no operation is MCP).
	MCPEndpoints map[string]*MCPEndpoint
	// Envelopes renders answers given before any operation is known (for
	// example a recovered panic at request headers).
	Envelopes *envelope.Set
}

// LogSettings is the logger configuration.
type LogSettings struct {
	Level  slog.Level
	Format string // "text" or "json"
}

// SubjectSource is where the subject is read: a header, or a dynamic
// metadata namespace and path.
type SubjectSource struct {
	Header            string // lower-case; empty when metadata is used
	MetadataNamespace string
	MetadataPath      []string
}

// StoreSettings are the resolved store settings (secrets read).
type StoreSettings struct {
	Timeout  time.Duration
	Redis    *RedisSettings
	Postgres *PostgresSettings
}

// Backend names the store configuration: memory, redis, postgres or tiered.
func (s StoreSettings) Backend() string {
	switch {
	case s.Redis != nil && s.Postgres != nil:
		return "tiered"
	case s.Redis != nil:
		return "redis"
	case s.Postgres != nil:
		return "postgres"
	}
	return "memory"
}

// RedisSettings configures the Redis client.
type RedisSettings struct {
	Addrs      []string
	Mode       string // single|cluster|sentinel
	MasterName string
	KeyPrefix  string
	Username   string
	Password   Secret
	DB         int
	Timeout    time.Duration
	TLS        *TLSSettings // nil: plain TCP
}

// TLSSettings is a compiled client TLS configuration. It logs and marshals
// as its summary, never as the key material it holds.
type TLSSettings struct {
	Config  *tls.Config
	Summary string
}

// String implements fmt.Stringer, for %v.
func (t *TLSSettings) String() string { return t.Summary }

// LogValue implements slog.LogValuer.
func (t *TLSSettings) LogValue() slog.Value { return slog.StringValue(t.Summary) }

// MarshalJSON implements json.Marshaler.
func (t *TLSSettings) MarshalJSON() ([]byte, error) { return json.Marshal(t.Summary) }

// PostgresSettings configures the PostgreSQL pool.
type PostgresSettings struct {
	DSN Secret
	// DSNSource says where the DSN came from ("inline", "env NAME", "file PATH").
	DSNSource string
	MaxConns  int
}

// TTLSettings are the three lifetimes.
type TTLSettings struct {
	Fingerprint time.Duration
	InFlight    time.Duration
	Terminal    time.Duration
}

// LimitSettings bound body reading.
type LimitSettings struct {
	MaxBodyBytes int64
	MaxJSONDepth int
}

// WebhookSettings configures the security-event webhook (URL empty = off).
type WebhookSettings struct {
	URL       string
	Timeout   time.Duration
	QueueSize int
}

// DrainSettings is the SIGTERM sequence.
type DrainSettings struct {
	Period  time.Duration
	Timeout time.Duration
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
	Params      []fingerprint.Param
	Selector    *fingerprint.Selector
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
}

// HonoursKeys reports whether the downstream deduplicates by the
// idempotency key, which decides EndLease versus MarkUnknown after an
// ambiguous outcome.
func (o *Operation) HonoursKeys() bool { return o.DownstreamHeader != "" }
