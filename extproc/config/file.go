// Package config reads idemgate.yaml strictly and compiles it, once, into the
// runtime form the server uses: route templates, param selectors, the signing
// key ring, per-operation envelopes and resolved store settings.
//
// Strictness: an unknown key, a value of the wrong kind, a bad duration, a
// missing secret — every problem is reported together (errors.Join of
// *Problem), each naming file:line:column and the YAML path. Warnings (for
// example ttl.in_flight not longer than an operation's upstream time budget,
// which DESIGN section 8 says check-config "warns" about) do not stop serving.
//
// Secrets (signing keys, the Redis password, the PostgreSQL DSN) are read from
// environment variables or files named in the config, never from the YAML
// itself, and the types holding them print [REDACTED].
package config

import (
	"github.com/goccy/go-yaml/ast"
)

// File is idemgate.yaml as written (the schema of DESIGN section 6; every
// key in README's Configuration section). Durations are Go duration
// strings; pointers mark optional values whose zero is meaningful or invalid.
type File struct {
	GRPCListen  string          `yaml:"grpc_listen"`
	AdminListen string          `yaml:"admin_listen"`
	Log         Log             `yaml:"log"`
	Signing     *Signing        `yaml:"signing"`
	Subject     *Subject        `yaml:"subject"`
	Store       Store           `yaml:"store"`
	TTL         TTL             `yaml:"ttl"`
	Limits      Limits          `yaml:"limits"`
	Messages    Messages        `yaml:"messages"`
	Security    Security        `yaml:"security"`
	Drain       Drain           `yaml:"drain"`
	Tracing     Tracing         `yaml:"tracing"`
	Operations  []OperationSpec `yaml:"operations"`
}

// Log selects the log level (debug|info|warn|error) and format (text|json).
type Log struct {
	Level  string `yaml:"level"`
	Format string `yaml:"format"`
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

// Store configures the backends; omitting both Redis and Postgres selects the
// embedded memory store.
type Store struct {
	Timeout  string    `yaml:"timeout"`
	Redis    *Redis    `yaml:"redis"`
	Postgres *Postgres `yaml:"postgres"`
}

// Redis is the fast-path store.
type Redis struct {
	Addrs        []string  `yaml:"addrs"`
	Mode         string    `yaml:"mode"`
	MasterName   string    `yaml:"master_name"`
	KeyPrefix    *string   `yaml:"key_prefix"`
	Username     string    `yaml:"username"`
	PasswordEnv  string    `yaml:"password_env"`
	PasswordFile string    `yaml:"password_file"`
	DB           *int      `yaml:"db"`
	Timeout      string    `yaml:"timeout"`
	TLS          *RedisTLS `yaml:"tls"`
}

// RedisTLS turns on TLS to Redis (managed Redis services require it). An
// empty block, tls: {}, verifies the server against the system roots.
type RedisTLS struct {
	// CAFile holds the PEM certificates that sign the server's; empty: the
	// system roots.
	CAFile string `yaml:"ca_file"`
	// CertFile and KeyFile are a client certificate and its key, for a
	// Redis that asks for one (tls-auth-clients yes).
	CertFile string `yaml:"cert_file"`
	KeyFile  string `yaml:"key_file"`
	// ServerName overrides the name verified in the server's certificate
	// (default: the host of each address).
	ServerName string `yaml:"server_name"`
}

// Postgres is the store of record; exactly one of DSN, DSNEnv, DSNFile.
type Postgres struct {
	DSN      string `yaml:"dsn"`
	DSNEnv   string `yaml:"dsn_env"`
	DSNFile  string `yaml:"dsn_file"`
	MaxConns *int   `yaml:"max_conns"`
}

// TTL holds the three lifetimes of DESIGN section 3 / seed section 六.
type TTL struct {
	Fingerprint string `yaml:"fingerprint"`
	InFlight    string `yaml:"in_flight"`
	Terminal    string `yaml:"terminal"`
}

// Limits bound what idemgate reads from a body.
type Limits struct {
	MaxBodyBytes *int64 `yaml:"max_body_bytes"`
	MaxJSONDepth *int   `yaml:"max_json_depth"`
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

// Drain is the SIGTERM sequence: NOT_SERVING for Period, then GracefulStop
// bounded by Timeout.
type Drain struct {
	Period  string `yaml:"period"`
	Timeout string `yaml:"timeout"`
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
	// (DESIGN section 9); see MCPSpec.
	MCP *MCPSpec `yaml:"mcp"`
}

// RouteSpec is an HTTP method and a path template.
type RouteSpec struct {
	Method string `yaml:"method"`
	Path   string `yaml:"path"`
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
