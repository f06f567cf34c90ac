package settings

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemgate/idemgate/extproc/config"
)

// Defaults (docs/design.md §6; docs/configuration.md).
const (
	// DefaultGRPCListen is loopback: the sidecar's Envoy reaches it there
	// and nothing else can (docs/design.md §12).
	DefaultGRPCListen     = "127.0.0.1:50051"
	DefaultAdminListen    = ":9090"
	DefaultRedisTimeout   = 50 * time.Millisecond
	DefaultRedisKeyPrefix = "idem:"
	DefaultDrainPeriod    = 5 * time.Second
	DefaultDrainTimeout   = 25 * time.Second
	// DefaultLogFormat is text, so that the literal event=security_alert of a
	// security event is what a grep of the default log finds.
	DefaultLogFormat = "text"
	// DefaultTracingServiceName and DefaultTracingTimeout are the tracing
	// defaults.
	DefaultTracingServiceName = "idemgate"
	DefaultTracingTimeout     = 10 * time.Second
)

// sections are idemgate.yaml's top-level keys in the order of its
// reference: the order problems are listed in.
var sections = []string{
	"grpc_listen", "grpc_tls", "grpc_plaintext_remote", "admin_listen", "approval_listen", "approval_tls",
	"approval_plaintext_remote", "log", "signing", "attestation", "subject", "store", "ttl",
	"limits", "messages", "security", "drain", "tracing", "operations",
}

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

// Settings is the compiled idemgate.yaml: the process settings, and the
// ext_proc server's part as Runtime. It is immutable after Load.
type Settings struct {
	// Source is the file the settings were compiled from.
	Source string
	// GRPCListen is grpc_listen as written: host:port or unix:///path
	// (UnixSocketPath).
	GRPCListen string
	// GRPCTLS is grpc_tls (nil: plaintext, allowed on a loopback address or
	// a unix socket, or by GRPCPlaintextRemote).
	GRPCTLS *ListenerTLS
	// GRPCPlaintextRemote is grpc_plaintext_remote as written: plaintext on
	// a routable grpc_listen was asked for explicitly.
	GRPCPlaintextRemote bool
	AdminListen         string
	// ApprovalListen is where the approvers' API listens (empty: off;
	// approvals are then decided with idemgate ops approvals only).
	ApprovalListen string
	// ApprovalTLS is approval_tls (only CertFile and KeyFile are used).
	ApprovalTLS *ListenerTLS
	// ApprovalPlaintextRemote is approval_plaintext_remote as written.
	ApprovalPlaintextRemote bool
	Log                     LogSettings
	Store                   StoreSettings
	Drain                   DrainSettings
	Tracing                 TracingSettings
	// Runtime is what the ext_proc server is given: operations, routes,
	// envelopes, keys and the settings of request handling.
	Runtime *config.Runtime
}

// LogSettings is the logger configuration.
type LogSettings struct {
	Level  slog.Level
	Format string // "text" or "json"
}

// StoreSettings are the resolved store settings (secrets read).
type StoreSettings struct {
	// Timeout is store.timeout, the deadline of each store call (read by
	// extproc/config: Runtime.Store.Timeout; copied here for the backends).
	Timeout  time.Duration
	Redis    *RedisSettings
	Postgres *PostgresSettings
	// ReplayCache is ttl.replay_cache (read by extproc/config; copied here
	// for the tiered store): how long Redis keeps a record PostgreSQL holds.
	ReplayCache time.Duration
	// FingerprintTTL is ttl.fingerprint (copied for the PostgreSQL store,
	// which keeps a partition ready for every day a fingerprint can expire on).
	FingerprintTTL time.Duration
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
	// TransactionPooler: the DSN points at a pooler in transaction mode
	// (store.postgres.pooler: transaction).
	TransactionPooler bool
}

// DrainSettings is the SIGTERM sequence.
type DrainSettings struct {
	Period  time.Duration
	Timeout time.Duration
}

// TracingSettings is the compiled tracing section. Enabled is false unless
// an OTLP endpoint is configured.
type TracingSettings struct {
	Enabled     bool
	Endpoint    string
	Insecure    bool
	Timeout     time.Duration
	SampleRatio float64
	ServiceName string
}

// Load reads, checks and compiles the config file at path: its process
// settings and, through extproc/config, the rest. It returns the settings
// and the warnings, or an error joining every *config.Problem found (and
// the warnings found so far). Relative key, password, DSN and TLS file
// paths are resolved against the config file's directory.
func Load(path string, opts config.Options) (*Settings, []*config.Problem, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, fmt.Errorf("failed to read config: %w", err)
	}
	return Parse(path, data, filepath.Dir(path), opts)
}

// Parse is Load for bytes already read; name is used in problem locations.
func Parse(name string, data []byte, baseDir string, opts config.Options) (*Settings, []*config.Problem, error) {
	doc, err := config.ParseDocument(name, data, baseDir, opts, File{})
	if err != nil {
		return nil, nil, err
	}
	rt, ch, err := doc.Compile()
	if err != nil {
		return nil, nil, err
	}
	var f File
	if err := doc.Decode(&f); err != nil {
		return nil, nil, err
	}
	c := &compiler{ch: ch}
	s := &Settings{Source: name, Runtime: rt}
	s.GRPCListen = f.GRPCListen
	if s.GRPCListen == "" {
		s.GRPCListen = DefaultGRPCListen
	}
	s.GRPCTLS = c.grpcTLS(f.GRPCTLS, baseDir)
	s.GRPCPlaintextRemote = f.GRPCPlaintextRemote
	c.checkListen(GRPC, s.GRPCListen, s.GRPCTLS != nil, s.GRPCPlaintextRemote)
	s.AdminListen = c.listen(p("admin_listen"), f.AdminListen, DefaultAdminListen)
	if s.GRPCListen == s.AdminListen {
		ch.Errorf(p("admin_listen"), "must differ from grpc_listen (%s)", s.GRPCListen)
	}
	s.approvalListen(c, f, rt, baseDir)
	s.Log = c.log(f.Log)
	s.Store = c.store(f.Store, rt.Store.Timeout)
	s.Store.ReplayCache = rt.TTL.ReplayCache
	s.Store.FingerprintTTL = rt.TTL.Fingerprint
	if s.Store.Backend() == "redis" {
		for _, op := range rt.Operations {
			if op.Approval != nil {
				ch.Warnf(p("operations"), "operation %s needs approvals, which live in PostgreSQL (or the memory store): without PostgreSQL every gated confirm answers temporarily_unavailable", op.Name)
				break
			}
		}
	}
	s.Drain = DrainSettings{
		Period:  ch.Duration(p("drain", "period"), f.Drain.Period, config.DurationRule{Default: DefaultDrainPeriod, AllowZero: true}),
		Timeout: ch.Duration(p("drain", "timeout"), f.Drain.Timeout, config.DurationRule{Default: DefaultDrainTimeout}),
	}
	s.Tracing = c.tracing(f.Tracing)
	warns, err := ch.Result(sections...)
	if err != nil {
		return nil, warns, err
	}
	return s, warns, nil
}

func p(segs ...any) []any { return segs }

func clonePath(path []any) []any { return append(make([]any, 0, len(path)+1), path...) }

// compiler compiles the process settings, reporting through the Checker of
// the document the ext_proc part was compiled from.
type compiler struct {
	ch *config.Checker
}

func (c *compiler) listen(path []any, s, def string) string {
	if s == "" {
		return def
	}
	if _, port, err := net.SplitHostPort(s); err != nil || port == "" {
		c.ch.Errorf(path, "invalid listen address %q: use host:port or :port", s)
	}
	return s
}

func (c *compiler) log(l Log) LogSettings {
	out := LogSettings{Level: slog.LevelInfo, Format: DefaultLogFormat}
	switch l.Level {
	case "", "info":
	case "debug":
		out.Level = slog.LevelDebug
	case "warn":
		out.Level = slog.LevelWarn
	case "error":
		out.Level = slog.LevelError
	default:
		c.ch.Errorf(p("log", "level"), "unknown level %q (known: debug, info, warn, error)", l.Level)
	}
	switch l.Format {
	case "":
	case "text", "json":
		out.Format = l.Format
	default:
		c.ch.Errorf(p("log", "format"), "unknown format %q (known: text, json)", l.Format)
	}
	return out
}

// store compiles the backends; timeout is store.timeout, which
// extproc/config read.
func (c *compiler) store(s Store, timeout time.Duration) StoreSettings {
	out := StoreSettings{Timeout: timeout}
	if s.Redis != nil {
		out.Redis = c.redis(s.Redis, timeout)
	}
	if s.Postgres != nil {
		out.Postgres = c.postgres(s.Postgres)
	}
	if out.Redis != nil && out.Postgres == nil {
		c.ch.Warnf(p("store", "redis"), "Redis without PostgreSQL: Redis is not a system of record; a failover or flush can forget completed operations and let them execute again")
	}
	return out
}

func (c *compiler) redis(r *Redis, storeTimeout time.Duration) *RedisSettings {
	at := func(segs ...any) []any { return append(p("store", "redis"), segs...) }
	rs := &RedisSettings{Addrs: r.Addrs, Mode: r.Mode, MasterName: r.MasterName, Username: r.Username, KeyPrefix: DefaultRedisKeyPrefix}
	if len(r.Addrs) == 0 {
		c.ch.Errorf(at("addrs"), "required: at least one host:port")
	}
	for i, a := range r.Addrs {
		if _, port, err := net.SplitHostPort(a); err != nil || port == "" {
			c.ch.Errorf(at("addrs", i), "invalid address %q: use host:port", a)
		}
	}
	switch r.Mode {
	case "":
		rs.Mode = "single"
	case "single", "cluster", "sentinel":
	default:
		c.ch.Errorf(at("mode"), "unknown mode %q (known: single, cluster, sentinel)", r.Mode)
	}
	if rs.Mode == "sentinel" && r.MasterName == "" {
		c.ch.Errorf(at("master_name"), "required when mode is sentinel")
	}
	if rs.Mode != "sentinel" && r.MasterName != "" {
		c.ch.Errorf(at("master_name"), "only used when mode is sentinel")
	}
	if r.KeyPrefix != nil {
		rs.KeyPrefix = *r.KeyPrefix
	}
	if strings.ContainsAny(rs.KeyPrefix, "{}") {
		c.ch.Errorf(at("key_prefix"), "must not contain { or }: idemgate adds the {nonce} hash tag itself")
	}
	if r.DB != nil {
		rs.DB = *r.DB
		if rs.DB < 0 {
			c.ch.Errorf(at("db"), "must not be negative")
		}
		if rs.DB != 0 && rs.Mode == "cluster" {
			c.ch.Errorf(at("db"), "Redis Cluster only has db 0")
		}
	}
	if pw, _, ok := c.ch.Secret(at(), config.SecretRef{
		What: "Redis password", EnvKey: "password_env", Env: r.PasswordEnv, FileKey: "password_file", File: r.PasswordFile,
		Optional: true, StandIn: "offline",
	}); ok {
		rs.Password = NewSecret(pw)
	}
	if r.TLS != nil {
		rs.TLS = c.redisTLS(*r.TLS)
	}
	rs.Timeout = c.ch.Duration(at("timeout"), r.Timeout, config.DurationRule{Default: DefaultRedisTimeout})
	if rs.Timeout > storeTimeout {
		c.ch.Warnf(at("timeout"), "%s is longer than store.timeout (%s): a slow Redis would use up the whole budget before PostgreSQL is asked", rs.Timeout, storeTimeout)
	}
	return rs
}

func (c *compiler) postgres(pg *Postgres) *PostgresSettings {
	at := func(segs ...any) []any { return append(p("store", "postgres"), segs...) }
	ps := &PostgresSettings{}
	set := 0
	for _, v := range []string{pg.DSN, pg.DSNEnv, pg.DSNFile} {
		if v != "" {
			set++
		}
	}
	switch {
	case set != 1:
		c.ch.Errorf(at(), "set exactly one of dsn, dsn_env and dsn_file")
	case pg.DSN != "":
		ps.DSN, ps.DSNSource = NewSecret(pg.DSN), "inline"
	default:
		if v, from, ok := c.ch.Secret(at(), config.SecretRef{
			What: "PostgreSQL DSN", EnvKey: "dsn_env", Env: pg.DSNEnv, FileKey: "dsn_file", File: pg.DSNFile,
			StandIn: "postgres://offline@localhost/offline",
		}); ok {
			ps.DSN, ps.DSNSource = NewSecret(v), from
		}
	}
	if !ps.DSN.IsZero() {
		if _, err := pgx.ParseConfig(ps.DSN.Reveal()); err != nil {
			// pgx's message may quote the DSN, password included: say only where it came from.
			c.ch.Errorf(at(), "invalid PostgreSQL DSN (from %s; not shown because it may hold a password)", ps.DSNSource)
		}
	}
	if pg.MaxConns != nil {
		ps.MaxConns = *pg.MaxConns
		if ps.MaxConns < 0 {
			c.ch.Errorf(at("max_conns"), "must not be negative (0 lets idemgate size the pool)")
		}
	}
	switch pg.Pooler {
	case "", "none", "session":
	case "transaction":
		ps.TransactionPooler = true
	default:
		c.ch.Errorf(at("pooler"), "unknown pooler mode %q (known: none, session, transaction; statement pooling breaks transactions and is not supported)", pg.Pooler)
	}
	return ps
}

// redisTLS compiles store.redis.tls. TLS 1.2 is the floor; the server is
// always verified (there is deliberately no way to skip it: the store holds
// who paid whom). Offline, the files are named but not read.
func (c *compiler) redisTLS(t RedisTLS) *TLSSettings {
	path := p("store", "redis", "tls")
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: t.ServerName}
	summary := []string{"tls"}
	if (t.CertFile == "") != (t.KeyFile == "") {
		c.ch.Errorf(path, "set both cert_file and key_file (a client certificate) or neither")
	}
	if t.CAFile == "" {
		summary = append(summary, "system roots")
	} else {
		summary = append(summary, "ca "+t.CAFile)
		if data, ok := c.readTLSFile(path, "ca_file", "Redis CA", t.CAFile); ok {
			cfg.RootCAs = x509.NewCertPool()
			if !cfg.RootCAs.AppendCertsFromPEM(data) {
				c.ch.Errorf(append(clonePath(path), "ca_file"), "%s holds no PEM certificate", t.CAFile)
			}
		}
	}
	if t.CertFile != "" && t.KeyFile != "" {
		summary = append(summary, "client cert "+t.CertFile)
		certPEM, certOK := c.readTLSFile(path, "cert_file", "Redis client certificate", t.CertFile)
		keyPEM, keyOK := c.readTLSFile(path, "key_file", "Redis client key", t.KeyFile)
		if certOK && keyOK {
			cert, err := tls.X509KeyPair(certPEM, keyPEM)
			if err != nil {
				c.ch.Errorf(append(clonePath(path), "cert_file"), "cert_file and key_file are not a certificate and its key: %v", err)
			} else {
				cfg.Certificates = []tls.Certificate{cert}
			}
		}
	}
	if t.ServerName != "" {
		summary = append(summary, "server name "+t.ServerName)
	}
	return &TLSSettings{Config: cfg, Summary: strings.Join(summary, ", ")}
}

// readTLSFile is Checker.ReadFile, except that an offline check only names
// the file.
func (c *compiler) readTLSFile(path []any, key, what, file string) ([]byte, bool) {
	if c.ch.Offline() {
		return nil, false
	}
	return c.ch.ReadFile(path, key, what, file)
}

func (c *compiler) tracing(t Tracing) TracingSettings {
	s := TracingSettings{SampleRatio: 1, ServiceName: t.ServiceName}
	if s.ServiceName == "" {
		s.ServiceName = DefaultTracingServiceName
	}
	if t.SampleRatio != nil {
		s.SampleRatio = *t.SampleRatio
		if s.SampleRatio < 0 || s.SampleRatio > 1 {
			c.ch.Errorf(p("tracing", "sample_ratio"), "must be between 0 and 1, got %v", s.SampleRatio)
		}
	}
	if t.OTLP == nil {
		if t.SampleRatio != nil || t.ServiceName != "" {
			// Settings with no exporter would silently do nothing.
			c.ch.Errorf(p("tracing"), "tracing.otlp.endpoint is required when tracing is configured")
		}
		return s
	}
	s.Enabled, s.Endpoint, s.Insecure = true, t.OTLP.Endpoint, t.OTLP.Insecure
	if _, _, err := net.SplitHostPort(s.Endpoint); err != nil {
		c.ch.Errorf(p("tracing", "otlp", "endpoint"), "must be host:port (%v)", err)
	}
	s.Timeout = c.ch.Duration(p("tracing", "otlp", "timeout"), t.OTLP.Timeout, config.DurationRule{Default: DefaultTracingTimeout})
	return s
}

// approvalListen checks approval_listen, its TLS and switch, against the
// listeners and the operations that need approval.
func (s *Settings) approvalListen(c *compiler, f File, rt *config.Runtime, baseDir string) {
	ch, listen := c.ch, f.ApprovalListen
	gated := ""
	for _, op := range rt.Operations {
		if op.Approval != nil {
			gated = op.Name
			break
		}
	}
	if listen == "" {
		if gated != "" {
			ch.Warnf(p("approval_listen"), "operation %s needs approvals but approval_listen is not set: approvals can be decided only with idemgate ops approvals", gated)
		}
		if f.ApprovalTLS != nil || f.ApprovalPlaintextRemote {
			ch.Errorf(p("approval_listen"), "required when approval_tls or approval_plaintext_remote is set")
		}
		return
	}
	s.ApprovalTLS = c.approvalTLS(f.ApprovalTLS, baseDir)
	s.ApprovalPlaintextRemote = f.ApprovalPlaintextRemote
	c.checkListen(Approval, listen, s.ApprovalTLS != nil, s.ApprovalPlaintextRemote)
	if listen == s.GRPCListen || listen == s.AdminListen {
		ch.Errorf(p("approval_listen"), "must differ from grpc_listen (%s) and admin_listen (%s)", s.GRPCListen, s.AdminListen)
	}
	s.ApprovalListen = listen
}
