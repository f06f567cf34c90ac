package envoytest

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"time"

	"sigs.k8s.io/yaml"
)

// IdemgateConfig is the part of an idemgate.yaml that the Envoy and Kubernetes
// configs must agree with, read loosely (unknown keys are ignored) with the
// defaults of the agreed schema applied. Strict validation of the whole file
// belongs to idemgate's own config loader; this only cross-checks.
type IdemgateConfig struct {
	GRPCListen  string `json:"grpc_listen"`
	AdminListen string `json:"admin_listen"`
	Signing     struct {
		ActiveKey string                  `json:"active_key"`
		Keys      map[string]KeyReference `json:"keys"`
	} `json:"signing"`
	Subject struct {
		Header   string `json:"header"`
		Metadata *struct {
			Namespace string `json:"namespace"`
			Path      string `json:"path"`
		} `json:"metadata"`
	} `json:"subject"`
	Store struct {
		Timeout Duration `json:"timeout"`
		Redis   *struct {
			Addrs        []string `json:"addrs"`
			PasswordEnv  string   `json:"password_env"`
			PasswordFile string   `json:"password_file"`
		} `json:"redis"`
		Postgres *struct {
			DSN     string `json:"dsn"`
			DSNEnv  string `json:"dsn_env"`
			DSNFile string `json:"dsn_file"`
		} `json:"postgres"`
	} `json:"store"`
	TTL struct {
		Fingerprint Duration `json:"fingerprint"`
		InFlight    Duration `json:"in_flight"`
		Terminal    Duration `json:"terminal"`
	} `json:"ttl"`
	Limits struct {
		MaxBodyBytes int64 `json:"max_body_bytes"`
	} `json:"limits"`
	Drain struct {
		Period  Duration `json:"period"`
		Timeout Duration `json:"timeout"`
	} `json:"drain"`
	Operations []Operation `json:"operations"`
}

// KeyReference says where one signing key comes from: exactly one of Env, File.
type KeyReference struct {
	Env  string `json:"env"`
	File string `json:"file"`
}

// Operation is one idempotent operation of idemgate.yaml.
type Operation struct {
	Name            string   `json:"name"`
	Preview         Endpoint `json:"preview"`
	Confirm         Endpoint `json:"confirm"`
	Status          Endpoint `json:"status"`
	UpstreamTimeout Duration `json:"upstream_timeout"`
	UpstreamRetries *int     `json:"upstream_retries"`
	// DownstreamIdempotencyHeader is nil when the file omits it (default
	// Idempotency-Key) and "" when the downstream ignores keys.
	DownstreamIdempotencyHeader *string `json:"downstream_idempotency_header"`
	// MCP is set for an operation served as MCP tools on one endpoint
	// (docs/design.md §9) instead of three routes.
	MCP *struct {
		Endpoint string `json:"endpoint"`
		// PreviewResponseHeaders is mcp.preview_response_headers (nil:
		// default true).
		PreviewResponseHeaders *bool `json:"preview_response_headers"`
	} `json:"mcp"`
}

// ReadsResponseCode reports whether the operation's preview skips its
// response headers (preview.fingerprint_header: false, or an MCP
// operation's mcp.preview_response_headers: false), so the ext_proc filter
// must send response.code.
func (o Operation) ReadsResponseCode() bool {
	if o.MCP != nil {
		return o.MCP.PreviewResponseHeaders != nil && !*o.MCP.PreviewResponseHeaders
	}
	return o.Preview.FingerprintHeader != nil && !*o.Preview.FingerprintHeader
}

// ConfirmPath is the path a confirm takes: the confirm route, or an MCP
// operation's endpoint.
func (o Operation) ConfirmPath() string {
	if o.MCP != nil {
		return o.MCP.Endpoint
	}
	return o.Confirm.Path
}

// IdempotencyHeader is the header idemgate sets on the upstream confirm, or ""
// when the downstream ignores keys.
func (o Operation) IdempotencyHeader() string {
	if o.DownstreamIdempotencyHeader == nil {
		return "Idempotency-Key"
	}
	return *o.DownstreamIdempotencyHeader
}

// Endpoint is the method and path of one operation phase.
type Endpoint struct {
	Method string `json:"method"`
	Path   string `json:"path"`
	// FingerprintHeader is a preview's fingerprint_header (nil: default
	// true); false means idemgate reads the status from response.code.
	FingerprintHeader *bool `json:"fingerprint_header"`
}

// Duration reads a Go duration string ("250ms").
type Duration time.Duration

// UnmarshalJSON implements json.Unmarshaler.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("failed to read duration %s: want a string like \"250ms\": %w", b, err)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("failed to read duration: %w", err)
	}
	*d = Duration(v)
	return nil
}

// Defaults of the agreed schema (notes/CONFIG.md), for keys a file omits.
const (
	DefaultGRPCListen    = "127.0.0.1:50051"
	DefaultAdminListen   = ":9090"
	DefaultSubjectHeader = "x-idemgate-subject"
	DefaultStoreTimeout  = 250 * time.Millisecond
	DefaultMaxBodyBytes  = 1 << 20
	DefaultInFlightTTL   = 2 * time.Minute
	DefaultDrainPeriod   = 5 * time.Second
	DefaultDrainTimeout  = 25 * time.Second
)

// ReadIdemgateConfig reads an idemgate.yaml loosely and applies the defaults.
func ReadIdemgateConfig(data []byte) (*IdemgateConfig, error) {
	var c IdemgateConfig
	if err := yaml.Unmarshal(data, &c); err != nil {
		return nil, fmt.Errorf("failed to read idemgate config: %w", err)
	}
	setDefault(&c.GRPCListen, DefaultGRPCListen)
	setDefault(&c.AdminListen, DefaultAdminListen)
	if c.Subject.Metadata == nil {
		setDefault(&c.Subject.Header, DefaultSubjectHeader)
	}
	setDefault(&c.Store.Timeout, Duration(DefaultStoreTimeout))
	setDefault(&c.Limits.MaxBodyBytes, DefaultMaxBodyBytes)
	setDefault(&c.TTL.InFlight, Duration(DefaultInFlightTTL))
	setDefault(&c.Drain.Period, Duration(DefaultDrainPeriod))
	setDefault(&c.Drain.Timeout, Duration(DefaultDrainTimeout))
	if len(c.Operations) == 0 {
		return nil, errors.New("idemgate config lists no operations")
	}
	return &c, nil
}

func setDefault[T comparable](v *T, def T) {
	var zero T
	if *v == zero {
		*v = def
	}
}

// OperationPaths returns every preview, confirm and status path, in file order.
func (c *IdemgateConfig) OperationPaths() []string {
	var out []string
	for _, op := range c.Operations {
		if op.MCP != nil {
			if !slices.Contains(out, op.MCP.Endpoint) { // one endpoint may serve several operations
				out = append(out, op.MCP.Endpoint)
			}
			continue
		}
		out = append(out, op.Preview.Path, op.Confirm.Path, op.Status.Path)
	}
	return out
}

// OperationFor returns the operation whose confirm path is p, if any.
func (c *IdemgateConfig) OperationFor(confirmPath string) (Operation, bool) {
	for _, op := range c.Operations {
		if op.ConfirmPath() == confirmPath {
			return op, true
		}
	}
	return Operation{}, false
}

// HostPort splits a listen address such as "127.0.0.1:50051" or ":9090".
func HostPort(addr string) (string, uint32, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, fmt.Errorf("failed to split listen address %q: %w", addr, err)
	}
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil {
		return "", 0, fmt.Errorf("failed to read port of %q: %w", addr, err)
	}
	return host, uint32(p), nil
}
