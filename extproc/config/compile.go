package config

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io/fs"
	"log/slog"
	"net"
	"net/url"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"
	"unicode"

	"github.com/jackc/pgx/v5"

	"github.com/idemgate/idemgate/extproc/envelope"
	"github.com/idemgate/idemgate/extproc/route"
	"github.com/idemgate/idemgate/fingerprint"
)

// Defaults (DESIGN section 6; README's Configuration section).
const (
	DefaultGRPCListen       = ":50051"
	DefaultAdminListen      = ":9090"
	DefaultSubjectHeader    = "x-idemgate-subject"
	DefaultStoreTimeout     = 250 * time.Millisecond
	DefaultRedisTimeout     = 50 * time.Millisecond
	DefaultRedisKeyPrefix   = "idem:"
	DefaultFingerprintTTL   = 15 * time.Minute
	DefaultInFlightTTL      = 2 * time.Minute
	DefaultTerminalTTL      = 72 * time.Hour
	DefaultMaxBodyBytes     = 1 << 20
	DefaultMaxJSONDepth     = 32
	DefaultLanguage         = "en"
	DefaultWebhookTimeout   = 2 * time.Second
	DefaultWebhookQueue     = 1000
	DefaultDrainPeriod      = 5 * time.Second
	DefaultDrainTimeout     = 25 * time.Second
	DefaultFingerprintField = "fingerprint"
	DefaultDownstreamHeader = "idempotency-key"
	DefaultPollAfter        = 2 * time.Second
	// DefaultLogFormat is text, so that the literal event=security_alert of a
	// security event is what a grep of the default log finds.
	DefaultLogFormat = "text"
)

// storeTimeoutWarnAbove is where store.timeout starts to collide with the
// shipped Envoy message_timeout (1s): a confirm may make two store calls
// (acquire, then takeover or mark-unknown) while Envoy waits for one reply.
const storeTimeoutWarnAbove = 500 * time.Millisecond

var (
	keyIDPattern    = regexp.MustCompile(`^[A-Za-z0-9._-]{1,64}$`)
	opNamePattern   = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,64}$`)
	methodPattern   = regexp.MustCompile(`^[A-Z]{1,20}$`)
	toolNamePattern = regexp.MustCompile(`^[A-Za-z0-9_.:/-]{1,128}$`)
)

type compiler struct {
	d       *doc
	opts    Options
	baseDir string
	errs    []error
	warns   []*Problem
}

func p(segs ...any) []any { return segs }

func (c *compiler) errorf(path []any, format string, args ...any) {
	c.errs = append(c.errs, c.d.problem(path, format, args...))
}

func (c *compiler) keyErrorf(path []any, format string, args ...any) {
	c.errs = append(c.errs, c.d.problemAt(path, true, format, args...))
}

func (c *compiler) warnf(path []any, format string, args ...any) {
	c.warns = append(c.warns, c.d.problem(path, format, args...))
}

// duration parses a Go duration; "" gives def. Zero is allowed only when
// allowZero; negative never.
func (c *compiler) duration(path []any, s string, def time.Duration, allowZero bool) time.Duration {
	if s == "" {
		return def
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		c.errorf(path, "invalid duration %q: use a Go duration such as 250ms, 15m or 72h", s)
		return def
	}
	if d < 0 || (d == 0 && !allowZero) {
		if allowZero {
			c.errorf(path, "must not be negative, got %s", s)
		} else {
			c.errorf(path, "must be positive, got %s", s)
		}
		return def
	}
	return d
}

// secret reads a value from an environment variable or a file; exactly one
// of env and file must be given unless both may be empty (optional). what
// names the secret in messages. It never puts the value in a message. With
// Options.Offline the reference is checked but not followed, and stand-in
// (a well-formed value that is never a real secret) is returned instead.
func (c *compiler) secret(path []any, what, envKey, env, fileKey, file string, optional bool, standIn string) (value, source string, ok bool) {
	if c.opts.Offline && (env == "") != (file == "") {
		if env != "" {
			return standIn, "env " + env + " (not read: offline check)", true
		}
		return standIn, "file " + file + " (not read: offline check)", true
	}
	switch {
	case env != "" && file != "":
		c.errorf(path, "set only one of %s and %s", envKey, fileKey)
		return "", "", false
	case env == "" && file == "":
		if !optional {
			c.errorf(path, "set one of %s or %s (the %s is never written in the config itself)", envKey, fileKey, what)
		}
		return "", "", optional
	case env != "":
		v, found := c.opts.LookupEnv(env)
		if !found {
			c.errorf(append(clonePath(path), envKey), "environment variable %s (the %s) is not set", env, what)
			return "", "", false
		}
		v = strings.TrimSpace(v)
		if v == "" {
			c.errorf(append(clonePath(path), envKey), "environment variable %s (the %s) is empty", env, what)
			return "", "", false
		}
		return v, "env " + env, true
	default:
		data, ok := c.readFile(path, fileKey, what, file)
		if !ok {
			return "", "", false
		}
		v := strings.TrimSpace(string(data))
		if v == "" {
			c.errorf(append(clonePath(path), fileKey), "%s file %s is empty", what, file)
			return "", "", false
		}
		return v, "file " + file, true
	}
}

// readFile reads a file the config names; a relative name resolves against
// the config file's directory. A failure is reported at path.key.
func (c *compiler) readFile(path []any, key, what, file string) ([]byte, bool) {
	name := file
	if !filepath.IsAbs(name) && c.baseDir != "" {
		name = filepath.Join(c.baseDir, name)
	}
	data, err := c.opts.ReadFile(name)
	if err != nil {
		var pe *fs.PathError
		if errors.As(err, &pe) {
			err = pe.Err
		}
		c.errorf(append(clonePath(path), key), "failed to read %s file %s: %v", what, file, err)
		return nil, false
	}
	return data, true
}

func (c *compiler) compile(f *File) *Runtime {
	rt := &Runtime{}
	rt.GRPCListen = c.listen(p("grpc_listen"), f.GRPCListen, DefaultGRPCListen)
	rt.AdminListen = c.listen(p("admin_listen"), f.AdminListen, DefaultAdminListen)
	if rt.GRPCListen == rt.AdminListen {
		c.errorf(p("admin_listen"), "must differ from grpc_listen (%s)", rt.GRPCListen)
	}
	rt.Log = c.log(f.Log)
	rt.Keys, rt.KeySources = c.signing(f.Signing)
	rt.Subject = c.subject(f.Subject)
	rt.Store = c.store(f.Store)
	rt.TTL = c.ttl(f.TTL)
	rt.Limits = c.limits(f.Limits)
	rt.Language = f.Messages.Language
	if rt.Language == "" {
		rt.Language = DefaultLanguage
	}
	languageOK := false
	for _, l := range envelope.Languages() {
		languageOK = languageOK || l == rt.Language
	}
	if !languageOK {
		c.errorf(p("messages", "language"), "unknown language %q (known: %s)", rt.Language, strings.Join(envelope.Languages(), ", "))
	}
	rt.Webhook = c.webhook(f.Security.Webhook)
	rt.Drain = DrainSettings{
		Period:  c.duration(p("drain", "period"), f.Drain.Period, DefaultDrainPeriod, true),
		Timeout: c.duration(p("drain", "timeout"), f.Drain.Timeout, DefaultDrainTimeout, false),
	}
	rt.Tracing = c.tracing(f.Tracing)
	rt.Operations, rt.Routes = c.operations(f.Operations, rt, languageOK)
	rt.MCPEndpoints = c.mcpEndpoints(rt.Operations, rt.Routes)
	if languageOK {
		set, err := envelope.Compile(rt.Language, nil, envelope.Operation{MaxBodyBytes: rt.Limits.MaxBodyBytes})
		if err != nil {
			c.errorf(p("messages"), "%v", err)
		}
		rt.Envelopes = set
	}
	return rt
}

func (c *compiler) listen(path []any, s, def string) string {
	if s == "" {
		return def
	}
	if _, port, err := net.SplitHostPort(s); err != nil || port == "" {
		c.errorf(path, "invalid listen address %q: use host:port or :port", s)
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
		c.errorf(p("log", "level"), "unknown level %q (known: debug, info, warn, error)", l.Level)
	}
	switch l.Format {
	case "":
	case "text", "json":
		out.Format = l.Format
	default:
		c.errorf(p("log", "format"), "unknown format %q (known: text, json)", l.Format)
	}
	return out
}

func (c *compiler) signing(s *Signing) (*fingerprint.KeyRing, map[string]string) {
	if s == nil {
		c.errorf(p("signing"), "required: the keys that sign fingerprints (generate one with `idemgate keygen`)")
		return nil, nil
	}
	ok := true
	if s.ActiveKey == "" {
		c.errorf(p("signing", "active_key"), "required")
		ok = false
	}
	if len(s.Keys) == 0 {
		c.errorf(p("signing", "keys"), "required: at least one key, e.g. k1: {env: IDEMGATE_KEY_K1}")
		return nil, nil
	}
	if s.ActiveKey != "" {
		if _, found := s.Keys[s.ActiveKey]; !found {
			c.errorf(p("signing", "active_key"), "names key %q, which is not under signing.keys", s.ActiveKey)
			ok = false
		}
	}
	ids := make([]string, 0, len(s.Keys))
	for id := range s.Keys {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	keys := make(map[string][]byte, len(ids))
	sources := make(map[string]string, len(ids))
	for _, id := range ids {
		src := s.Keys[id]
		path := p("signing", "keys", id)
		if !keyIDPattern.MatchString(id) {
			c.keyErrorf(path, "key id %q must be 1-64 characters of A-Z a-z 0-9 . _ -", id)
			ok = false
			continue
		}
		text, from, found := c.secret(path, "signing key", "env", src.Env, "file", src.File, false, offlineKey)
		if !found {
			ok = false
			continue
		}
		key, err := fingerprint.ParseKey(text)
		if err != nil {
			// ParseKey's messages never contain key material.
			c.errorf(path, "key from %s: %v (generate one with `idemgate keygen`)", from, err)
			ok = false
			continue
		}
		keys[id] = key
		sources[id] = from
	}
	if !ok {
		return nil, sources
	}
	ring, err := fingerprint.NewKeyRing(s.ActiveKey, keys)
	if err != nil {
		c.errorf(p("signing"), "%v", err)
		return nil, sources
	}
	return ring, sources
}

// validHeaderName reports whether s is an HTTP field name (RFC 9110 token).
func validHeaderName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		ch := s[i]
		switch {
		case ch >= 'a' && ch <= 'z', ch >= 'A' && ch <= 'Z', ch >= '0' && ch <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", ch) >= 0:
		default:
			return false
		}
	}
	return true
}

func (c *compiler) subject(s *Subject) SubjectSource {
	if s == nil || (s.Header == nil && s.Metadata == nil) {
		return SubjectSource{Header: DefaultSubjectHeader}
	}
	if s.Header != nil && s.Metadata != nil {
		c.errorf(p("subject"), "set only one of header and metadata")
		return SubjectSource{}
	}
	if s.Header != nil {
		if !validHeaderName(*s.Header) {
			c.errorf(p("subject", "header"), "invalid header name %q", *s.Header)
		}
		return SubjectSource{Header: strings.ToLower(*s.Header)}
	}
	out := SubjectSource{MetadataNamespace: s.Metadata.Namespace}
	if s.Metadata.Namespace == "" {
		c.errorf(p("subject", "metadata", "namespace"), "required (e.g. envoy.filters.http.jwt_authn)")
	}
	if s.Metadata.Path == "" {
		c.errorf(p("subject", "metadata", "path"), "required (e.g. jwt_payload.sub)")
		return out
	}
	out.MetadataPath = strings.Split(s.Metadata.Path, ".")
	for _, seg := range out.MetadataPath {
		if seg == "" {
			c.errorf(p("subject", "metadata", "path"), "invalid path %q: empty segment", s.Metadata.Path)
			break
		}
	}
	return out
}

// redisTLS compiles store.redis.tls. TLS 1.2 is the floor; the server is
// always verified (there is deliberately no way to skip it: the store holds
// who paid whom). Offline, the files are named but not read.
func (c *compiler) redisTLS(t RedisTLS) *TLSSettings {
	path := p("store", "redis", "tls")
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: t.ServerName}
	summary := []string{"tls"}
	if (t.CertFile == "") != (t.KeyFile == "") {
		c.errorf(path, "set both cert_file and key_file (a client certificate) or neither")
	}
	if t.CAFile == "" {
		summary = append(summary, "system roots")
	} else {
		summary = append(summary, "ca "+t.CAFile)
		if data, ok := c.readTLSFile(path, "ca_file", "Redis CA", t.CAFile); ok {
			cfg.RootCAs = x509.NewCertPool()
			if !cfg.RootCAs.AppendCertsFromPEM(data) {
				c.errorf(append(clonePath(path), "ca_file"), "%s holds no PEM certificate", t.CAFile)
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
				c.errorf(append(clonePath(path), "cert_file"), "cert_file and key_file are not a certificate and its key: %v", err)
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

// readTLSFile is readFile, except that an offline check only names the file.
func (c *compiler) readTLSFile(path []any, key, what, file string) ([]byte, bool) {
	if c.opts.Offline {
		return nil, false
	}
	return c.readFile(path, key, what, file)
}

func (c *compiler) store(s Store) StoreSettings {
	out := StoreSettings{Timeout: c.duration(p("store", "timeout"), s.Timeout, DefaultStoreTimeout, false)}
	if out.Timeout > storeTimeoutWarnAbove {
		c.warnf(p("store", "timeout"), "%s is long: Envoy's message_timeout (1s in the shipped config) must cover up to two store calls per confirm", out.Timeout)
	}
	if r := s.Redis; r != nil {
		rs := &RedisSettings{Addrs: r.Addrs, Mode: r.Mode, MasterName: r.MasterName, Username: r.Username, KeyPrefix: DefaultRedisKeyPrefix}
		if len(r.Addrs) == 0 {
			c.errorf(p("store", "redis", "addrs"), "required: at least one host:port")
		}
		for i, a := range r.Addrs {
			if _, port, err := net.SplitHostPort(a); err != nil || port == "" {
				c.errorf(p("store", "redis", "addrs", i), "invalid address %q: use host:port", a)
			}
		}
		switch r.Mode {
		case "":
			rs.Mode = "single"
		case "single", "cluster", "sentinel":
		default:
			c.errorf(p("store", "redis", "mode"), "unknown mode %q (known: single, cluster, sentinel)", r.Mode)
		}
		if rs.Mode == "sentinel" && r.MasterName == "" {
			c.errorf(p("store", "redis", "master_name"), "required when mode is sentinel")
		}
		if rs.Mode != "sentinel" && r.MasterName != "" {
			c.errorf(p("store", "redis", "master_name"), "only used when mode is sentinel")
		}
		if r.KeyPrefix != nil {
			rs.KeyPrefix = *r.KeyPrefix
		}
		if strings.ContainsAny(rs.KeyPrefix, "{}") {
			c.errorf(p("store", "redis", "key_prefix"), "must not contain { or }: idemgate adds the {nonce} hash tag itself")
		}
		if r.DB != nil {
			rs.DB = *r.DB
			if rs.DB < 0 {
				c.errorf(p("store", "redis", "db"), "must not be negative")
			}
			if rs.DB != 0 && rs.Mode == "cluster" {
				c.errorf(p("store", "redis", "db"), "Redis Cluster only has db 0")
			}
		}
		if pw, _, ok := c.secret(p("store", "redis"), "Redis password", "password_env", r.PasswordEnv, "password_file", r.PasswordFile, true, "offline"); ok {
			rs.Password = NewSecret(pw)
		}
		if r.TLS != nil {
			rs.TLS = c.redisTLS(*r.TLS)
		}
		rs.Timeout = c.duration(p("store", "redis", "timeout"), r.Timeout, DefaultRedisTimeout, false)
		if rs.Timeout > out.Timeout {
			c.warnf(p("store", "redis", "timeout"), "%s is longer than store.timeout (%s): a slow Redis would use up the whole budget before PostgreSQL is asked", rs.Timeout, out.Timeout)
		}
		out.Redis = rs
	}
	if pg := s.Postgres; pg != nil {
		ps := &PostgresSettings{}
		set := 0
		for _, v := range []string{pg.DSN, pg.DSNEnv, pg.DSNFile} {
			if v != "" {
				set++
			}
		}
		switch {
		case set != 1:
			c.errorf(p("store", "postgres"), "set exactly one of dsn, dsn_env and dsn_file")
		case pg.DSN != "":
			ps.DSN, ps.DSNSource = NewSecret(pg.DSN), "inline"
		default:
			if v, from, ok := c.secret(p("store", "postgres"), "PostgreSQL DSN", "dsn_env", pg.DSNEnv, "dsn_file", pg.DSNFile, false, "postgres://offline@localhost/offline"); ok {
				ps.DSN, ps.DSNSource = NewSecret(v), from
			}
		}
		if !ps.DSN.IsZero() {
			if _, err := pgx.ParseConfig(ps.DSN.Reveal()); err != nil {
				// pgx's message may quote the DSN, password included: say only where it came from.
				c.errorf(p("store", "postgres"), "invalid PostgreSQL DSN (from %s; not shown because it may hold a password)", ps.DSNSource)
			}
		}
		if pg.MaxConns != nil {
			ps.MaxConns = *pg.MaxConns
			if ps.MaxConns < 0 {
				c.errorf(p("store", "postgres", "max_conns"), "must not be negative (0 lets idemgate size the pool)")
			}
		}
		out.Postgres = ps
	}
	if out.Redis != nil && out.Postgres == nil {
		c.warnf(p("store", "redis"), "Redis without PostgreSQL: Redis is not a system of record; a failover or flush can forget completed operations and let them execute again")
	}
	return out
}

func (c *compiler) ttl(t TTL) TTLSettings {
	out := TTLSettings{
		Fingerprint: c.duration(p("ttl", "fingerprint"), t.Fingerprint, DefaultFingerprintTTL, false),
		InFlight:    c.duration(p("ttl", "in_flight"), t.InFlight, DefaultInFlightTTL, false),
		Terminal:    c.duration(p("ttl", "terminal"), t.Terminal, DefaultTerminalTTL, false),
	}
	if out.Terminal <= out.Fingerprint {
		c.errorf(p("ttl", "terminal"), "%s must be longer than ttl.fingerprint (%s): a record must outlive every fingerprint that can reach it, or a late confirm would execute again", out.Terminal, out.Fingerprint)
	}
	if out.InFlight >= out.Terminal {
		c.errorf(p("ttl", "in_flight"), "%s must be shorter than ttl.terminal (%s)", out.InFlight, out.Terminal)
	}
	return out
}

func (c *compiler) limits(l Limits) LimitSettings {
	out := LimitSettings{MaxBodyBytes: DefaultMaxBodyBytes, MaxJSONDepth: DefaultMaxJSONDepth}
	if l.MaxBodyBytes != nil {
		out.MaxBodyBytes = *l.MaxBodyBytes
		if out.MaxBodyBytes <= 0 {
			c.errorf(p("limits", "max_body_bytes"), "must be positive")
			out.MaxBodyBytes = DefaultMaxBodyBytes
		}
	}
	if l.MaxJSONDepth != nil {
		out.MaxJSONDepth = *l.MaxJSONDepth
		if out.MaxJSONDepth < 1 || out.MaxJSONDepth > fingerprint.HardMaxDepth {
			c.errorf(p("limits", "max_json_depth"), "must be between 1 and %d", fingerprint.HardMaxDepth)
			out.MaxJSONDepth = DefaultMaxJSONDepth
		}
	}
	return out
}

func (c *compiler) webhook(w Webhook) WebhookSettings {
	out := WebhookSettings{
		URL:       w.URL,
		Timeout:   c.duration(p("security", "webhook", "timeout"), w.Timeout, DefaultWebhookTimeout, false),
		QueueSize: DefaultWebhookQueue,
	}
	if w.URL != "" {
		u, err := url.Parse(w.URL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			c.errorf(p("security", "webhook", "url"), "invalid URL %q: use http:// or https:// with a host", w.URL)
		}
	}
	if w.QueueSize != nil {
		out.QueueSize = *w.QueueSize
		if out.QueueSize <= 0 {
			c.errorf(p("security", "webhook", "queue_size"), "must be positive")
		}
	}
	return out
}

// printable reports whether s has no control characters.
func printable(s string) bool {
	for _, r := range s {
		if unicode.IsControl(r) {
			return false
		}
	}
	return true
}

func (c *compiler) operations(ops []OperationSpec, rt *Runtime, languageOK bool) ([]*Operation, *route.Table[Target]) {
	if len(ops) == 0 {
		c.errorf(p("operations"), "required: at least one operation")
		return nil, nil
	}
	names := map[string]int{}
	scopes := map[string]int{}
	routes := map[string][]any{} // method + shape → path of the first route
	var entries []route.Entry[Target]
	out := make([]*Operation, 0, len(ops))
	for i := range ops {
		o := &ops[i]
		base := p("operations", i)
		at := func(segs ...any) []any { return append(clonePath(base), segs...) }
		op := &Operation{Name: o.Name, Scope: o.Scope, PreviewTool: o.PreviewTool, StatusTool: o.StatusTool}

		switch {
		case o.Name == "":
			c.errorf(at("name"), "required")
		case !opNamePattern.MatchString(o.Name):
			c.errorf(at("name"), "%q must be 1-64 characters of A-Z a-z 0-9 _ . -", o.Name)
		default:
			if first, dup := names[o.Name]; dup {
				c.errorf(at("name"), "duplicate operation name %q (first used by operations[%d])", o.Name, first)
			} else {
				names[o.Name] = i
			}
		}
		switch {
		case o.Scope == "":
			c.errorf(at("scope"), "required: the string that binds a fingerprint to this operation")
		case !printable(o.Scope):
			c.errorf(at("scope"), "must not contain control characters")
		default:
			if first, dup := scopes[o.Scope]; dup {
				c.errorf(at("scope"), "duplicate scope %q (first used by operations[%d]): a fingerprint of one operation would confirm the other", o.Scope, first)
			} else {
				scopes[o.Scope] = i
			}
		}
		for _, r := range []struct {
			key  string
			spec *RouteSpec
			dst  *Route
			kind Kind
		}{
			{"preview", o.Preview, &op.Preview, KindPreview},
			{"confirm", o.Confirm, &op.Confirm, KindConfirm},
			{"status", o.Status, &op.Status, KindStatus},
		} {
			if o.MCP != nil {
				if r.spec != nil {
					c.errorf(at(r.key), "an operation is either HTTP routes or mcp, not both: remove %s (the MCP endpoint carries preview, confirm and status)", r.key)
				}
				continue
			}
			if r.spec == nil {
				c.errorf(at(r.key), "required: {method: POST, path: /...}")
				continue
			}
			okRoute := true
			method := strings.ToUpper(r.spec.Method)
			switch {
			case r.spec.Method == "":
				c.errorf(at(r.key, "method"), "required")
				okRoute = false
			case !methodPattern.MatchString(method):
				c.errorf(at(r.key, "method"), "invalid HTTP method %q", r.spec.Method)
				okRoute = false
			}
			var tmpl route.Template
			if r.spec.Path == "" {
				c.errorf(at(r.key, "path"), "required")
				okRoute = false
			} else if t, err := route.ParseTemplate(r.spec.Path); err != nil {
				c.errorf(at(r.key, "path"), "invalid path template %q: %v", r.spec.Path, err)
				okRoute = false
			} else {
				tmpl = t
			}
			if !okRoute {
				continue
			}
			*r.dst = Route{Method: method, Template: tmpl}
			key := method + " " + tmpl.Shape()
			if first, dup := routes[key]; dup {
				c.errorf(at(r.key, "path"), "route %s %s matches the same requests as %s", method, r.spec.Path, pathString(first))
				continue
			}
			routes[key] = at(r.key)
			entries = append(entries, route.Entry[Target]{Method: method, Path: r.spec.Path, Value: Target{Op: op, Kind: r.kind}})
		}
		if o.MCP != nil {
			c.mcpTools(op, o, at)
		} else if o.PreviewTool == "" {
			c.errorf(at("preview_tool"), "required: the tool name the agent calls to preview (used in instructions)")
		} else if !toolNamePattern.MatchString(o.PreviewTool) {
			c.errorf(at("preview_tool"), "invalid tool name %q", o.PreviewTool)
		}
		if o.MCP != nil {
			// Checked by mcpTools.
		} else if o.StatusTool == "" {
			c.errorf(at("status_tool"), "required: the tool name the agent polls for the result (used in instructions)")
		} else if !toolNamePattern.MatchString(o.StatusTool) {
			c.errorf(at("status_tool"), "invalid tool name %q", o.StatusTool)
		}

		op.FingerprintField = DefaultFingerprintField
		if o.FingerprintField != nil {
			op.FingerprintField = *o.FingerprintField
			if op.FingerprintField == "" || !printable(op.FingerprintField) {
				c.errorf(at("fingerprint_field"), "must be a non-empty JSON field name")
			}
		}
		op.ExpiresAtField = op.FingerprintField + "_expires_at"
		c.params(op, o, at, rt)

		if o.ResultRef != "" {
			op.ResultRefPath = o.ResultRef
			op.ResultRef = strings.Split(o.ResultRef, ".")
			for _, seg := range op.ResultRef {
				if seg == "" {
					c.errorf(at("result_ref"), "invalid path %q: empty segment", o.ResultRef)
					break
				}
			}
		}
		op.DownstreamHeader = DefaultDownstreamHeader
		if h := o.DownstreamIdempotencyHeader; h != nil {
			op.DownstreamHeader = strings.ToLower(*h)
			if *h != "" && !validHeaderName(*h) {
				c.errorf(at("downstream_idempotency_header"), "invalid header name %q (an empty string means the downstream ignores idempotency keys)", *h)
			}
		}
		switch o.Replay {
		case "", "envelope":
			op.Replay = ReplayEnvelope
		case "raw":
			op.Replay = ReplayRaw
		default:
			c.errorf(at("replay"), "unknown replay mode %q (known: envelope, raw)", o.Replay)
		}
		if o.UpstreamTimeout != "" {
			op.UpstreamTimeout = c.duration(at("upstream_timeout"), o.UpstreamTimeout, 0, false)
		}
		if o.UpstreamRetries != nil {
			op.UpstreamRetries = *o.UpstreamRetries
			switch {
			case op.UpstreamRetries < 0:
				c.errorf(at("upstream_retries"), "must not be negative")
			case o.UpstreamTimeout == "":
				c.warnf(at("upstream_retries"), "has no effect without upstream_timeout")
			}
		}
		if budget := op.UpstreamTimeout * time.Duration(1+max(op.UpstreamRetries, 0)); op.UpstreamTimeout > 0 && rt.TTL.InFlight <= budget {
			c.warnf(at("upstream_timeout"), "ttl.in_flight (%s) should exceed upstream_timeout × (1 + upstream_retries) = %s: a confirm still running when its lease ends can be taken over or marked unknown while the upstream is working on it", rt.TTL.InFlight, budget)
		}
		op.PollAfter = c.duration(at("poll_after"), o.PollAfter, DefaultPollAfter, false)
		op.Outcomes = c.outcomes(o.Outcomes, at)
		if o.MCP != nil {
			c.mcpOperation(op, o, at)
		}

		op.Overrides = c.overrides(o.Messages, at)
		if languageOK {
			set, err := envelope.Compile(rt.Language, op.Overrides, envelope.Operation{
				PreviewTool: op.PreviewTool, StatusTool: op.StatusTool, PollAfter: op.PollAfter, MaxBodyBytes: rt.Limits.MaxBodyBytes,
			})
			if err != nil {
				c.errorf(at("messages"), "%v", err)
			}
			op.Envelopes = set
		}
		out = append(out, op)
	}
	table, err := route.NewTable(entries)
	if err != nil {
		c.errorf(p("operations"), "%v", err)
	}
	return out, table
}

func (c *compiler) params(op *Operation, o *OperationSpec, at func(...any) []any, rt *Runtime) {
	if len(o.Params) == 0 {
		c.errorf(at("params"), "required: the fields that change money or have irreversible effect (an unbound fingerprint could confirm any amount)")
		return
	}
	ok := true
	for j, prm := range o.Params {
		fp := fingerprint.Param{Path: prm.Path}
		switch prm.Type {
		case "":
		case "decimal":
			fp.Decimal = true
		default:
			c.errorf(at("params", j, "type"), "unknown type %q (known: decimal)", prm.Type)
			ok = false
		}
		switch prm.Normalize {
		case "":
		case "nfc":
			fp.NFC = true
			// The binding rule (DESIGN section 2): an equivalence only
			// idemgate makes is a hole, so say plainly when this is safe.
			c.warnf(at("params", j, "normalize"), "nfc makes byte-different spellings of %s (NFD \"cafe\\u0301\" and NFC \"caf\\u00e9\") confirm as one value: safe only if the upstream itself NFC-normalises %s before using it; otherwise remove normalize and let strings compare byte for byte", prm.Path, prm.Path)
		default:
			c.errorf(at("params", j, "normalize"), "unknown normalization %q (known: nfc; omit it to compare strings byte for byte)", prm.Normalize)
			ok = false
		}
		if prm.Path == "" {
			c.errorf(at("params", j), "empty param path")
			ok = false
			continue
		}
		if name, isVar := strings.CutPrefix(prm.Path, "path."); isVar {
			for _, r := range []struct {
				key string
				rt  Route
			}{{"preview", op.Preview}, {"confirm", op.Confirm}} {
				if r.rt.Method != "" && !r.rt.Template.HasVar(name) {
					c.errorf(at("params", j), "%s needs a {%s} segment in the %s path %s", prm.Path, name, r.key, r.rt.Template)
					ok = false
				}
			}
		} else if first, _, _ := strings.Cut(prm.Path, "."); first == op.FingerprintField {
			c.errorf(at("params", j), "%s is inside fingerprint_field %q, which carries the fingerprint itself", prm.Path, op.FingerprintField)
			ok = false
		}
		op.Params = append(op.Params, fp)
	}
	// The selector checks the paths themselves (empty segments, duplicates,
	// normalisation); run it even after other problems so they are all listed.
	sel, err := fingerprint.NewSelector(op.Params, fingerprint.Limits{MaxDepth: rt.Limits.MaxJSONDepth})
	if err != nil {
		for _, e := range unjoin(err) {
			c.errorf(at("params"), "%v", e)
		}
		return
	}
	if ok {
		op.Selector = sel
	}
}

// unjoin splits an errors.Join into its parts.
func unjoin(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	return []error{err}
}

func (c *compiler) overrides(m map[string]MessageText, at func(...any) []any) map[envelope.Message]envelope.Text {
	if len(m) == 0 {
		return nil
	}
	known := map[envelope.Message]bool{}
	var names []string
	for _, id := range envelope.Messages() {
		known[id] = true
		names = append(names, string(id))
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	out := make(map[envelope.Message]envelope.Text, len(m))
	for _, k := range keys {
		v := m[k]
		path := at("messages", k)
		if !known[envelope.Message(k)] {
			c.keyErrorf(path, "unknown message %q (known: %s)", k, strings.Join(names, ", "))
			continue
		}
		if v.Meaning == "" && v.Instruction == "" {
			c.errorf(path, "set meaning, instruction or both")
			continue
		}
		for _, f := range []struct{ key, text string }{{"meaning", v.Meaning}, {"instruction", v.Instruction}} {
			if err := envelope.CheckPlaceholders(f.text); err != nil {
				c.errorf(append(clonePath(path), f.key), "%v", err)
			}
		}
		out[envelope.Message(k)] = envelope.Text{Meaning: v.Meaning, Instruction: v.Instruction}
	}
	return out
}
