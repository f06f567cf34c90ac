package config

import (
	"errors"
	"io/fs"
	"net/url"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"
	"unicode"

	"github.com/idemgate/idemgate/extproc/envelope"
	"github.com/idemgate/idemgate/extproc/route"
	"github.com/idemgate/idemgate/fingerprint"
)

// Defaults (docs/design.md §6; docs/configuration.md). The process
// settings' defaults (listeners, log, store backends, drain, tracing) are in
// cmd/idemgate/settings.
const (
	DefaultSubjectHeader  = "x-idemgate-subject"
	DefaultStoreTimeout   = 250 * time.Millisecond
	DefaultFingerprintTTL = 15 * time.Minute
	DefaultInFlightTTL    = 2 * time.Minute
	DefaultTerminalTTL    = 72 * time.Hour
	DefaultMaxBodyBytes   = 1 << 20
	DefaultMaxJSONDepth   = 32
	// DefaultTerminalCacheBytes holds the results of a few thousand recent
	// confirms per replica: enough for an agent's retry loop, small beside
	// the process.
	DefaultTerminalCacheBytes = 16 << 20
	DefaultLanguage           = "en"
	DefaultWebhookTimeout     = 2 * time.Second
	DefaultWebhookQueue       = 1000
	DefaultFingerprintField   = "fingerprint"
	DefaultDownstreamHeader   = "idempotency-key"
	DefaultPollAfter          = 2 * time.Second
	// DefaultUpstreamTimeout is an operation's upstream_timeout when it sets
	// none, unless ttl.in_flight is too short for it (DefaultUpstreamTimeoutFor).
	// Never "no timeout": Envoy reads a 0s route timeout as unbounded, and a
	// hung upstream would then hold a confirm past its lease.
	DefaultUpstreamTimeout = 30 * time.Second
)

// DefaultUpstreamTimeoutFor is the upstream_timeout of an operation that
// sets none: DefaultUpstreamTimeout, or less when ttl.in_flight is short —
// at most half of in_flight / (1 + retries), whole seconds and at least one,
// so the in_flight rule (in_flight > timeout × (1 + retries)) holds for the
// default with room for Envoy's retry backoff.
func DefaultUpstreamTimeoutFor(inFlight time.Duration, retries int) time.Duration {
	d := min(DefaultUpstreamTimeout, inFlight/time.Duration(2*(1+max(retries, 0))))
	return max(d.Truncate(time.Second), time.Second)
}

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
	// languageOK: messages.language names a built-in catalogue, so
	// envelopes can be compiled.
	languageOK bool
	// fingerprintKeys are the signing keys read, which no attestation key
	// may equal.
	fingerprintKeys [][]byte
}

func p(segs ...any) []any { return segs }

func (c *compiler) errorf(path []any, format string, args ...any) {
	c.errs = append(c.errs, c.d.problem(path, format, args...))
}

func (c *compiler) keyErrorf(path []any, format string, args ...any) {
	c.errs = append(c.errs, c.d.problemAt(path, atKey, format, args...))
}

func (c *compiler) warnf(path []any, format string, args ...any) {
	c.warns = append(c.warns, c.d.problem(path, format, args...))
}

// DurationRule says what a duration setting accepts: "" gives Default, zero
// only with AllowZero, a negative duration never.
type DurationRule struct {
	Default   time.Duration
	AllowZero bool
}

// duration parses a Go duration under rule r.
func (c *compiler) duration(path []any, s string, r DurationRule) time.Duration {
	if s == "" {
		return r.Default
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		c.errorf(path, "invalid duration %q: use a Go duration such as 250ms, 15m or 72h", s)
		return r.Default
	}
	if d < 0 || (d == 0 && !r.AllowZero) {
		if r.AllowZero {
			c.errorf(path, "must not be negative, got %s", s)
		} else {
			c.errorf(path, "must be positive, got %s", s)
		}
		return r.Default
	}
	return d
}

// SecretRef is where a secret is read from: the environment variable Env,
// written under the key EnvKey, or the file File, written under FileKey.
// Exactly one must be given unless Optional (then neither is fine). What
// names the secret in messages. With Options.Offline the reference is
// checked but not followed, and StandIn (a well-formed value that is never
// a real secret) is returned instead.
type SecretRef struct {
	What     string
	EnvKey   string
	Env      string
	FileKey  string
	File     string
	Optional bool
	StandIn  string
}

// secret reads the secret ref names, reporting problems at path. It never
// puts the value in a message.
func (c *compiler) secret(path []any, ref SecretRef) (value, source string, ok bool) {
	if c.opts.Offline && (ref.Env == "") != (ref.File == "") {
		if ref.Env != "" {
			return ref.StandIn, "env " + ref.Env + " (not read: offline check)", true
		}
		return ref.StandIn, "file " + ref.File + " (not read: offline check)", true
	}
	switch {
	case ref.Env != "" && ref.File != "":
		c.errorf(path, "set only one of %s and %s", ref.EnvKey, ref.FileKey)
		return "", "", false
	case ref.Env == "" && ref.File == "":
		if !ref.Optional {
			c.errorf(path, "set one of %s or %s (the %s is never written in the config itself)", ref.EnvKey, ref.FileKey, ref.What)
		}
		return "", "", ref.Optional
	case ref.Env != "":
		v, found := c.opts.LookupEnv(ref.Env)
		if !found {
			c.errorf(append(clonePath(path), ref.EnvKey), "environment variable %s (the %s) is not set", ref.Env, ref.What)
			return "", "", false
		}
		v = strings.TrimSpace(v)
		if v == "" {
			c.errorf(append(clonePath(path), ref.EnvKey), "environment variable %s (the %s) is empty", ref.Env, ref.What)
			return "", "", false
		}
		return v, "env " + ref.Env, true
	default:
		data, ok := c.readFile(path, ref.FileKey, ref.What, ref.File)
		if !ok {
			return "", "", false
		}
		v := strings.TrimSpace(string(data))
		if v == "" {
			c.errorf(append(clonePath(path), ref.FileKey), "%s file %s is empty", ref.What, ref.File)
			return "", "", false
		}
		return v, "file " + ref.File, true
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
	rt.Keys, rt.KeySources = c.signing(f.Signing)
	rt.Attestation = c.attestation(f.Attestation, c.fingerprintKeys)
	rt.Subject = c.subject(f.Subject)
	rt.Store = c.storeCalls(f.Store)
	rt.TTL = c.ttl(f.TTL)
	rt.Limits = c.limits(f.Limits)
	rt.Language = c.language(f.Messages)
	rt.Webhook = c.webhook(f.Security.Webhook)
	rt.Operations, rt.Routes = c.operations(f.Operations, rt)
	rt.MCPEndpoints = c.mcpEndpoints(rt.Operations, rt.Routes)
	rt.Guard = c.guard(rt)
	if c.languageOK {
		set, err := envelope.Compile(rt.Language, nil, envelope.Operation{MaxBodyBytes: rt.Limits.MaxBodyBytes})
		if err != nil {
			c.errorf(p("messages"), "%v", err)
		}
		rt.Envelopes = set
	}
	return rt
}

// language is messages.language; it sets c.languageOK.
func (c *compiler) language(m Messages) string {
	lang := m.Language
	if lang == "" {
		lang = DefaultLanguage
	}
	for _, l := range envelope.Languages() {
		c.languageOK = c.languageOK || l == lang
	}
	if !c.languageOK {
		c.errorf(p("messages", "language"), "unknown language %q (known: %s)", lang, strings.Join(envelope.Languages(), ", "))
	}
	return lang
}

// storeCalls is store.timeout: the deadline of every store call the server
// makes. (store.redis and store.postgres, the backends, are process
// settings: cmd/idemgate/settings.)
func (c *compiler) storeCalls(s StoreCalls) StoreCallSettings {
	out := StoreCallSettings{Timeout: c.duration(p("store", "timeout"), s.Timeout, DurationRule{Default: DefaultStoreTimeout})}
	if out.Timeout > storeTimeoutWarnAbove {
		c.warnf(p("store", "timeout"), "%s is long: Envoy's message_timeout (1s in the shipped config) must cover up to two store calls per confirm", out.Timeout)
	}
	return out
}

func (c *compiler) signing(s *Signing) (*fingerprint.KeyRing, map[string]string) {
	if s == nil {
		c.errorf(p("signing"), "required: the keys that sign fingerprints (generate one with `idemgate keygen`)")
		return nil, nil
	}
	sec := keySection{name: "signing", what: "signing key", example: "k1: {env: IDEMGATE_KEY_K1}", standIn: offlineKey}
	keys, sources, ok := readKeys(c, sec, s.ActiveKey, s.Keys, func(path []any, from, text string) ([]byte, bool) {
		key, err := fingerprint.ParseKey(text)
		if err != nil {
			// ParseKey's messages never contain key material.
			c.errorf(path, "key from %s: %v (generate one with `idemgate keygen`)", from, err)
			return nil, false
		}
		c.fingerprintKeys = append(c.fingerprintKeys, key)
		return key, true
	})
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

func (c *compiler) ttl(t TTL) TTLSettings {
	out := TTLSettings{
		Fingerprint: c.duration(p("ttl", "fingerprint"), t.Fingerprint, DurationRule{Default: DefaultFingerprintTTL}),
		InFlight:    c.duration(p("ttl", "in_flight"), t.InFlight, DurationRule{Default: DefaultInFlightTTL}),
		Terminal:    c.duration(p("ttl", "terminal"), t.Terminal, DurationRule{Default: DefaultTerminalTTL}),
	}
	// A confirm may start at the fingerprint's last second and hold its
	// lease for in_flight before it completes; the record must outlive both,
	// with room for the clocks that judge them to differ (the gateway's
	// judges exp, the database's judges expires_at).
	if need := out.Fingerprint + out.InFlight + TTLClockMargin; out.Terminal < need {
		c.errorf(p("ttl", "terminal"), "%s must be at least ttl.fingerprint + ttl.in_flight + %s (%s): a record must outlive every fingerprint that can reach it, or a late confirm would execute again", out.Terminal, TTLClockMargin, need)
	}
	if out.InFlight >= out.Terminal {
		c.errorf(p("ttl", "in_flight"), "%s must be shorter than ttl.terminal (%s)", out.InFlight, out.Terminal)
	}
	out.ReplayCache = c.duration(p("ttl", "replay_cache"), t.ReplayCache, DurationRule{Default: DefaultReplayCache(out.Fingerprint, out.Terminal)})
	if out.ReplayCache > out.Terminal {
		c.errorf(p("ttl", "replay_cache"), "%s must not be longer than ttl.terminal (%s): Redis never needs a record PostgreSQL no longer keeps", out.ReplayCache, out.Terminal)
	}
	return out
}

// TTLClockMargin is what ttl.terminal must exceed ttl.fingerprint +
// ttl.in_flight by: room for the gateway's and the database's clocks to
// differ.
const TTLClockMargin = time.Minute

// DefaultReplayCache is ttl.replay_cache when it is not set: replays come
// within minutes, so Redis keeps a record for max(ttl.fingerprint, 1h) —
// never longer than ttl.terminal.
func DefaultReplayCache(fingerprint, terminal time.Duration) time.Duration {
	return min(max(fingerprint, time.Hour), terminal)
}

func (c *compiler) limits(l Limits) LimitSettings {
	out := LimitSettings{MaxBodyBytes: DefaultMaxBodyBytes, MaxJSONDepth: DefaultMaxJSONDepth, TerminalCacheBytes: DefaultTerminalCacheBytes}
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
	if l.TerminalCacheBytes != nil {
		out.TerminalCacheBytes = *l.TerminalCacheBytes
		if out.TerminalCacheBytes < 0 {
			c.errorf(p("limits", "terminal_cache_bytes"), "must not be negative (0 keeps no terminal records in memory)")
			out.TerminalCacheBytes = DefaultTerminalCacheBytes
		}
	}
	return out
}

func (c *compiler) webhook(w Webhook) WebhookSettings {
	out := WebhookSettings{
		URL:       w.URL,
		Timeout:   c.duration(p("security", "webhook", "timeout"), w.Timeout, DurationRule{Default: DefaultWebhookTimeout}),
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

// opIndex is what the operations know about each other while they compile:
// the names, scopes and routes already taken, and the route table entries.
type opIndex struct {
	names   map[string]int
	scopes  map[string]int
	routes  map[string][]any // method + shape → path of the first route
	entries []route.Entry[Target]
}

func (c *compiler) operations(ops []OperationSpec, rt *Runtime) ([]*Operation, *route.Table[Target]) {
	if len(ops) == 0 {
		c.errorf(p("operations"), "required: at least one operation")
		return nil, nil
	}
	idx := &opIndex{names: map[string]int{}, scopes: map[string]int{}, routes: map[string][]any{}}
	out := make([]*Operation, 0, len(ops))
	for i := range ops {
		out = append(out, c.operation(i, &ops[i], idx, rt))
	}
	table, err := route.NewTable(idx.entries)
	if err != nil {
		c.errorf(p("operations"), "%v", err)
	}
	return out, table
}

// operation compiles operations[i], one concern after another.
func (c *compiler) operation(i int, o *OperationSpec, idx *opIndex, rt *Runtime) *Operation {
	base := p("operations", i)
	at := func(segs ...any) []any { return append(clonePath(base), segs...) }
	op := &Operation{Name: o.Name, Scope: o.Scope, PreviewTool: o.PreviewTool, StatusTool: o.StatusTool, PreviewFingerprintHeader: true}
	c.identity(i, o, idx, at)
	c.routes(op, o, idx, at)
	c.tools(op, o, at)
	c.fingerprintField(op, o, at)
	c.params(op, o, at, rt)
	c.resultRef(op, o, at)
	c.confirmExecution(op, o, at, rt)
	op.PollAfter = c.duration(at("poll_after"), o.PollAfter, DurationRule{Default: DefaultPollAfter})
	op.Outcomes = c.outcomes(o.Outcomes, at)
	if o.MCP != nil {
		c.mcpOperation(op, o, at)
	}
	if o.Approval != nil {
		op.Approval = c.approval(op, o.Approval, at, rt)
	}
	c.envelopes(op, o, at, rt)
	return op
}

// identity checks the operation's name and scope, each unique.
func (c *compiler) identity(i int, o *OperationSpec, idx *opIndex, at func(...any) []any) {
	switch {
	case o.Name == "":
		c.errorf(at("name"), "required")
	case !opNamePattern.MatchString(o.Name):
		c.errorf(at("name"), "%q must be 1-64 characters of A-Z a-z 0-9 _ . -", o.Name)
	default:
		if first, dup := idx.names[o.Name]; dup {
			c.errorf(at("name"), "duplicate operation name %q (first used by operations[%d])", o.Name, first)
		} else {
			idx.names[o.Name] = i
		}
	}
	switch {
	case o.Scope == "":
		c.errorf(at("scope"), "required: the string that binds a fingerprint to this operation")
	case !printable(o.Scope):
		c.errorf(at("scope"), "must not contain control characters")
	default:
		if first, dup := idx.scopes[o.Scope]; dup {
			c.errorf(at("scope"), "duplicate scope %q (first used by operations[%d]): a fingerprint of one operation would confirm the other", o.Scope, first)
		} else {
			idx.scopes[o.Scope] = i
		}
	}
}

// routes compiles the preview, confirm and status routes of an HTTP
// operation (an MCP operation must have none) and enters them in the table.
func (c *compiler) routes(op *Operation, o *OperationSpec, idx *opIndex, at func(...any) []any) {
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
		if h := r.spec.FingerprintHeader; h != nil {
			if r.kind != KindPreview {
				c.errorf(at(r.key, "fingerprint_header"), "only a preview sends a fingerprint header: remove fingerprint_header")
			} else {
				op.PreviewFingerprintHeader = *h
			}
		}
		rt, ok := c.route(r.spec, at(r.key))
		if !ok {
			continue
		}
		*r.dst = rt
		key := rt.Method + " " + rt.Template.Shape()
		if first, dup := idx.routes[key]; dup {
			c.errorf(at(r.key, "path"), "route %s %s matches the same requests as %s", rt.Method, r.spec.Path, pathString(first))
			continue
		}
		idx.routes[key] = at(r.key)
		idx.entries = append(idx.entries, route.Entry[Target]{Method: rt.Method, Path: r.spec.Path, Value: Target{Op: op, Kind: r.kind}})
	}
}

// route compiles one method and path template written at path.
func (c *compiler) route(spec *RouteSpec, path []any) (Route, bool) {
	at := func(key string) []any { return append(clonePath(path), key) }
	ok := true
	method := strings.ToUpper(spec.Method)
	switch {
	case spec.Method == "":
		c.errorf(at("method"), "required")
		ok = false
	case !methodPattern.MatchString(method):
		c.errorf(at("method"), "invalid HTTP method %q", spec.Method)
		ok = false
	}
	var tmpl route.Template
	if spec.Path == "" {
		c.errorf(at("path"), "required")
		ok = false
	} else if t, err := route.ParseTemplate(spec.Path); err != nil {
		c.errorf(at("path"), "invalid path template %q: %v", spec.Path, err)
		ok = false
	} else {
		tmpl = t
	}
	return Route{Method: method, Template: tmpl}, ok
}

// tools checks the tool names the envelopes mention: preview_tool and
// status_tool of an HTTP operation, the mcp block of an MCP one.
func (c *compiler) tools(op *Operation, o *OperationSpec, at func(...any) []any) {
	if o.MCP != nil {
		c.mcpTools(op, o, at)
		return
	}
	if o.PreviewTool == "" {
		c.errorf(at("preview_tool"), "required: the tool name the agent calls to preview (used in instructions)")
	} else if !toolNamePattern.MatchString(o.PreviewTool) {
		c.errorf(at("preview_tool"), "invalid tool name %q", o.PreviewTool)
	}
	if o.StatusTool == "" {
		c.errorf(at("status_tool"), "required: the tool name the agent polls for the result (used in instructions)")
	} else if !toolNamePattern.MatchString(o.StatusTool) {
		c.errorf(at("status_tool"), "invalid tool name %q", o.StatusTool)
	}
}

// fingerprintField is the body field that carries the fingerprint, and the
// field beside it that says when it expires.
func (c *compiler) fingerprintField(op *Operation, o *OperationSpec, at func(...any) []any) {
	op.FingerprintField = DefaultFingerprintField
	if o.FingerprintField != nil {
		op.FingerprintField = *o.FingerprintField
		if op.FingerprintField == "" || !printable(op.FingerprintField) {
			c.errorf(at("fingerprint_field"), "must be a non-empty JSON field name")
		}
	}
	op.ExpiresAtField = op.FingerprintField + "_expires_at"
}

// resultRef is the dotted path a replay names the result by.
func (c *compiler) resultRef(op *Operation, o *OperationSpec, at func(...any) []any) {
	if o.ResultRef == "" {
		return
	}
	op.ResultRefPath = o.ResultRef
	op.ResultRef = strings.Split(o.ResultRef, ".")
	for _, seg := range op.ResultRef {
		if seg == "" {
			c.errorf(at("result_ref"), "invalid path %q: empty segment", o.ResultRef)
			break
		}
	}
}

// confirmExecution is how the confirm reaches the upstream and is replayed:
// the idempotency header, the replay mode and the upstream's time budget,
// which the lease (ttl.in_flight) must outlast.
func (c *compiler) confirmExecution(op *Operation, o *OperationSpec, at func(...any) []any, rt *Runtime) {
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
	if o.UpstreamRetries != nil {
		op.UpstreamRetries = *o.UpstreamRetries
		if op.UpstreamRetries < 0 {
			c.errorf(at("upstream_retries"), "must not be negative")
		}
	}
	// 0s is refused (must be positive): Envoy reads it as no timeout.
	op.UpstreamTimeout = c.duration(at("upstream_timeout"), o.UpstreamTimeout, DurationRule{Default: DefaultUpstreamTimeoutFor(rt.TTL.InFlight, op.UpstreamRetries)})
	if budget := op.UpstreamTimeout * time.Duration(1+max(op.UpstreamRetries, 0)); rt.TTL.InFlight <= budget {
		c.warnf(at("upstream_timeout"), "ttl.in_flight (%s) should exceed upstream_timeout × (1 + upstream_retries) = %s: a confirm still running when its lease ends can be taken over or marked unknown while the upstream is working on it", rt.TTL.InFlight, budget)
	}
}

// envelopes compiles the operation's message overrides and, when the
// language is known, its envelope set.
func (c *compiler) envelopes(op *Operation, o *OperationSpec, at func(...any) []any, rt *Runtime) {
	op.Overrides = c.overrides(o.Messages, at)
	if !c.languageOK {
		return
	}
	set, err := envelope.Compile(rt.Language, op.Overrides, envelope.Operation{
		PreviewTool: op.PreviewTool, StatusTool: op.StatusTool, PollAfter: op.PollAfter, MaxBodyBytes: rt.Limits.MaxBodyBytes,
	})
	if err != nil {
		c.errorf(at("messages"), "%v", err)
	}
	op.Envelopes = set
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
			// The binding rule (docs/design.md §2): an equivalence only
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
