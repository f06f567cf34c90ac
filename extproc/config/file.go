// Package config reads the ext_proc server's part of idemgate.yaml strictly
// and compiles it, once, into the runtime form the server uses: route
// templates, param selectors, the signing key ring, per-operation envelopes
// and the settings of request handling (subject, store call timeout, TTLs,
// limits, messages, the security webhook). The process settings of the same
// file (listeners, log, store backends and their TLS, drain, tracing) belong
// to the binary: cmd/idemgate/settings reads them from the same node tree
// (ParseDocument), so users keep one file and one strict check.
//
// Strictness: an unknown key, a value of the wrong kind, a bad duration, a
// missing secret — every problem is reported together (errors.Join of
// *Problem), each naming file:line:column and the YAML path. Warnings (for
// example ttl.in_flight not longer than an operation's upstream time budget,
// which docs/design.md §8 says check-config "warns" about) do not stop serving.
//
// Secrets (signing keys here; the Redis password and the PostgreSQL DSN in
// the settings package, through Checker.Secret) are read from environment
// variables or files named in the config, never from the YAML itself.
package config

import (
	"github.com/goccy/go-yaml/ast"
)

// File is this package's part of idemgate.yaml as written (the schema of
// docs/design.md §6; docs/configuration.md has every key, the
// process settings' too). Durations are Go duration strings; pointers mark
// optional values whose zero is meaningful or invalid.
type File struct {
	Signing *Signing `yaml:"signing"`
	// Attestation is in attestation.go (docs/design.md §11).
	Attestation *Attestation    `yaml:"attestation"`
	Subject     *Subject        `yaml:"subject"`
	Store       StoreCalls      `yaml:"store"`
	TTL         TTL             `yaml:"ttl"`
	Limits      Limits          `yaml:"limits"`
	Messages    Messages        `yaml:"messages"`
	Security    Security        `yaml:"security"`
	Operations  []OperationSpec `yaml:"operations"`
}

// Signing names the active key and every key that verifies.
type Signing struct {
	ActiveKey string               `yaml:"active_key"`
	Keys      map[string]KeySource `yaml:"keys"`
}

// KeySource says where a key's base64 text lives: exactly one of Env or File.
type KeySource struct {
	Env  string `yaml:"env"`
	File string `yaml:"file"`
}

// Subject says where the authenticated subject comes from: a trusted request
// header or Envoy dynamic metadata (exactly one).
type Subject struct {
	Header   *string          `yaml:"header"`
	Metadata *MetadataSubject `yaml:"metadata"`
}

// MetadataSubject is a dynamic metadata namespace and a dotted path inside it
// (for jwt_authn: namespace envoy.filters.http.jwt_authn, path jwt_payload.sub).
type MetadataSubject struct {
	Namespace string `yaml:"namespace"`
	Path      string `yaml:"path"`
}

// StoreCalls is this package's key of the store section: how long each
// store call the server makes may take. The backends (store.redis,
// store.postgres) are process settings.
type StoreCalls struct {
	Timeout string `yaml:"timeout"`
}

// TTL holds the three lifetimes of docs/design.md §3.
type TTL struct {
	Fingerprint string `yaml:"fingerprint"`
	InFlight    string `yaml:"in_flight"`
	Terminal    string `yaml:"terminal"`
	// ReplayCache is how long Redis keeps a record under a tiered store
	// (PostgreSQL keeps it for Terminal); see TTLSettings.ReplayCache.
	ReplayCache string `yaml:"replay_cache"`
}

// Limits bound what idemgate reads from a body and what it keeps in memory.
type Limits struct {
	MaxBodyBytes       *int64 `yaml:"max_body_bytes"`
	MaxJSONDepth       *int   `yaml:"max_json_depth"`
	TerminalCacheBytes *int64 `yaml:"terminal_cache_bytes"`
}

// Messages selects the built-in catalogue.
type Messages struct {
	Language string `yaml:"language"`
}

// Security configures the optional security-event webhook.
type Security struct {
	Webhook Webhook `yaml:"webhook"`
}

// Webhook posts every security event as JSON; an empty URL turns it off.
type Webhook struct {
	URL       string `yaml:"url"`
	Timeout   string `yaml:"timeout"`
	QueueSize *int   `yaml:"queue_size"`
}

// OperationSpec is one money-moving operation as written: its three routes,
// the params its fingerprint binds and how its confirm is executed and
// replayed.
type OperationSpec struct {
	Name                        string                 `yaml:"name"`
	Scope                       string                 `yaml:"scope"`
	Preview                     *RouteSpec             `yaml:"preview"`
	Confirm                     *RouteSpec             `yaml:"confirm"`
	Status                      *RouteSpec             `yaml:"status"`
	PreviewTool                 string                 `yaml:"preview_tool"`
	StatusTool                  string                 `yaml:"status_tool"`
	Params                      []Param                `yaml:"params"`
	FingerprintField            *string                `yaml:"fingerprint_field"`
	ResultRef                   string                 `yaml:"result_ref"`
	DownstreamIdempotencyHeader *string                `yaml:"downstream_idempotency_header"`
	Replay                      string                 `yaml:"replay"`
	UpstreamTimeout             string                 `yaml:"upstream_timeout"`
	UpstreamRetries             *int                   `yaml:"upstream_retries"`
	PollAfter                   string                 `yaml:"poll_after"`
	Outcomes                    map[string]string      `yaml:"outcomes"`
	Messages                    map[string]MessageText `yaml:"messages"`
	// MCP makes the operation an MCP tool pair instead of three HTTP routes
	// (docs/design.md §9); see MCPSpec.
	MCP *MCPSpec `yaml:"mcp"`
	// Approval makes some confirms wait for people (docs/design.md §10);
	// see ApprovalSpec in approval.go.
	Approval *ApprovalSpec `yaml:"approval"`
}

// RouteSpec is an HTTP method and a path template.
type RouteSpec struct {
	Method string `yaml:"method"`
	Path   string `yaml:"path"`
	// FingerprintHeader (preview only, default true) sends the fingerprint
	// in the Idempotency-Fingerprint response header too. false: the body
	// alone carries it, and the preview costs Envoy one ext_proc message
	// less (docs/performance.md "Fewer messages per stream").
	FingerprintHeader *bool `yaml:"fingerprint_header"`
}

// MessageText overrides the meaning and/or instruction of one envelope.
type MessageText struct {
	Meaning     string `yaml:"meaning"`
	Instruction string `yaml:"instruction"`
}

// Param is a params item: either a plain path string or {path, type,
// normalize}.
type Param struct {
	Path      string `yaml:"path"`
	Type      string `yaml:"type"`
	Normalize string `yaml:"normalize"`
}

// paramMapping is the mapping form of a Param; a separate type so decoding it
// does not recurse into Param.UnmarshalYAML.
type paramMapping struct {
	Path      string `yaml:"path"`
	Type      string `yaml:"type"`
	Normalize string `yaml:"normalize"`
}

// UnmarshalYAML accepts "amount" as well as {path: amount, type: decimal}.
// The shape has already been checked by the schema walk (see shape.go), so
// only the two valid forms reach this point.
func (p *Param) UnmarshalYAML(node ast.Node) error {
	switch n := unwrap(node).(type) {
	case *ast.MappingNode:
		var m paramMapping
		for _, mv := range n.Values {
			key := scalarText(mv.Key)
			val := scalarText(mv.Value)
			switch key {
			case "path":
				m.Path = val
			case "type":
				m.Type = val
			case "normalize":
				m.Normalize = val
			}
		}
		*p = Param(m)
	default:
		*p = Param{Path: scalarText(node)}
	}
	return nil
}
