// Package settings reads the process settings of idemgate.yaml — the
// listeners, the log, the store backends and their TLS, the drain sequence
// and the tracing exporter — and, from the same file, hands the rest
// (operations, routes, envelopes, keys and the settings of request
// handling) to extproc/config. It belongs to the binary: these settings say
// how the idemgate process runs, not what the ext_proc server does with a
// request, so extproc never sees them.
//
// Users keep one file. Both parts are decoded from one node tree parsed
// once (config.ParseDocument), whose strict shape check knows the keys of
// both, so an unknown key anywhere is reported with its line; problems and
// warnings of both parts are listed section by section, in the order of the
// file's reference (docs/configuration.md), as one list.
package settings

// File is the process settings' part of idemgate.yaml as written. The top
// level and store are shared with config.File (store.timeout is the
// server's).
type File struct {
	GRPCListen string `yaml:"grpc_listen"`
	// GRPCTLS and GRPCPlaintextRemote: who may reach a routable grpc_listen
	// (docs/design.md §12, docs/security.md).
	GRPCTLS             *GRPCTLS `yaml:"grpc_tls"`
	GRPCPlaintextRemote bool     `yaml:"grpc_plaintext_remote"`
	AdminListen         string   `yaml:"admin_listen"`
	// ApprovalListen serves the approvers' API (docs/design.md §10).
	ApprovalListen          string       `yaml:"approval_listen"`
	ApprovalTLS             *ApprovalTLS `yaml:"approval_tls"`
	ApprovalPlaintextRemote bool         `yaml:"approval_plaintext_remote"`
	Log                     Log          `yaml:"log"`
	Store                   Store        `yaml:"store"`
	Drain                   Drain        `yaml:"drain"`
	Tracing                 Tracing      `yaml:"tracing"`
}

// GRPCTLS is grpc_tls: the server certificate of the ext_proc listener and
// who may connect to it (mutual TLS: a client certificate is required).
type GRPCTLS struct {
	CertFile string `yaml:"cert_file"`
	KeyFile  string `yaml:"key_file"`
	// ClientCAFile holds the CA certificates that sign Envoy's client
	// certificate.
	ClientCAFile string `yaml:"client_ca_file"`
	// ClientSANs are the identities allowed to connect: a URI SAN (a
	// SPIFFE ID) or a DNS SAN of the client certificate must equal one.
	ClientSANs []string `yaml:"client_sans"`
}

// ApprovalTLS is approval_tls: the approvers' listener's server
// certificate (approvers authenticate with bearer tokens, not certificates).
type ApprovalTLS struct {
	CertFile string `yaml:"cert_file"`
	KeyFile  string `yaml:"key_file"`
}

// Log selects the log level (debug|info|warn|error) and format (text|json).
type Log struct {
	Level  string `yaml:"level"`
	Format string `yaml:"format"`
}

// Store configures the backends; omitting both Redis and Postgres selects the
// embedded memory store.
type Store struct {
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
	// Pooler names the connection pooler between idemgate and PostgreSQL:
	// none (default, or a pooler in session mode) or transaction
	// (PgBouncer pool_mode=transaction).
	Pooler string `yaml:"pooler"`
}

// Drain is the SIGTERM sequence: NOT_SERVING for Period, then GracefulStop
// bounded by Timeout.
type Drain struct {
	Period  string `yaml:"period"`
	Timeout string `yaml:"timeout"`
}

// Tracing is the tracing section of idemgate.yaml: OpenTelemetry spans for
// the guarded streams, exported over OTLP/gRPC. Absent (or without otlp)
// means off: the server then uses a no-op tracer and pays nothing per
// request.
type Tracing struct {
	OTLP *OTLP `yaml:"otlp"`
	// SampleRatio is the share of new traces sampled (0..1, default 1); a
	// request whose traceparent says sampled is always followed, so a
	// caller's sampling decision is kept (parent-based sampling).
	SampleRatio *float64 `yaml:"sample_ratio"`
	ServiceName string   `yaml:"service_name"`
}

// OTLP is the OTLP/gRPC collector idemgate exports spans to.
type OTLP struct {
	Endpoint string `yaml:"endpoint"` // host:port
	Insecure bool   `yaml:"insecure"` // plaintext gRPC (a local collector)
	Timeout  string `yaml:"timeout"`  // per export batch
}
