package verify

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"sync"
	"time"
)

// Options configure a Verifier. Exactly one of Keys and JWKSURL is needed.
type Options struct {
	// Keys is a fixed key set (for example ParseJWKS of `idemgate jwks`).
	Keys KeySet
	// JWKSURL is idemgate's admin /.well-known/jwks.json. The set is
	// fetched on first use, again when a token names a kid it lacks (at
	// most once per RefreshMinInterval: a key rotation needs no restart),
	// and after MaxAge (so a withdrawn key stops verifying).
	JWKSURL            string
	HTTPClient         *http.Client
	RefreshMinInterval time.Duration // default 5s
	MaxAge             time.Duration // default 5m
	// MaxStale is how long past MaxAge a key set stays in use while every
	// re-fetch fails (default 1m; negative: not at all). After MaxAge +
	// MaxStale without a successful fetch, every verification fails with
	// ErrKeysStale: a key withdrawn from the JWKS must not stay valid
	// because the JWKS cannot be reached.
	MaxStale time.Duration

	// MCPTools, when set, makes the verifier an MCP endpoint's: only a
	// tools/call of one of these tools (the confirm tools) needs an
	// attestation; every other JSON-RPC message passes. Unset, every
	// request through the middleware needs one (an HTTP confirm route).
	MCPTools []string
	// KeyHeader is the idempotency header the upstream reads (default
	// Idempotency-Key); when the request has it, it must equal the
	// attested key.
	KeyHeader string
	// Leeway tolerates clock skew between idemgate and the upstream in
	// the expiry check (default 5s; negative: none).
	Leeway time.Duration
	// MaxBodyBytes bounds the body read to recompute the param hash
	// (default 1 MiB, idemgate's limits.max_body_bytes default).
	MaxBodyBytes int64
	// NFC normalises strings for params that say normalize: nfc (for
	// example golang.org/x/text/unicode/norm.NFC.String); without it such
	// params are refused. The standard library has no NFC.
	NFC func(string) string
	// LogOnly logs every refusal and lets the request through: the first
	// step of a rollout, to find traffic that bypasses idemgate.
	LogOnly bool
	// Logger receives refusals (default slog.Default()).
	Logger *slog.Logger
	// Now is the clock (default time.Now).
	Now func() time.Time
}

// Verifier checks attestations. Safe for concurrent use.
type Verifier struct {
	opts Options

	mu        sync.Mutex
	keys      KeySet
	fetchedAt time.Time
	triedAt   time.Time
}

// New checks opts and returns a Verifier.
func New(opts Options) (*Verifier, error) {
	if (opts.Keys == nil) == (opts.JWKSURL == "") {
		return nil, errors.New("verify: set exactly one of Keys and JWKSURL")
	}
	if opts.HTTPClient == nil {
		opts.HTTPClient = &http.Client{Timeout: 5 * time.Second}
	}
	if opts.RefreshMinInterval == 0 {
		opts.RefreshMinInterval = 5 * time.Second
	}
	if opts.MaxAge == 0 {
		opts.MaxAge = 5 * time.Minute
	}
	if opts.MaxStale == 0 {
		opts.MaxStale = time.Minute
	} else if opts.MaxStale < 0 {
		opts.MaxStale = 0
	}
	if opts.KeyHeader == "" {
		opts.KeyHeader = "Idempotency-Key"
	}
	if opts.Leeway == 0 {
		opts.Leeway = 5 * time.Second
	} else if opts.Leeway < 0 {
		opts.Leeway = 0
	}
	if opts.MaxBodyBytes <= 0 {
		opts.MaxBodyBytes = 1 << 20
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	return &Verifier{opts: opts, keys: opts.Keys}, nil
}

// key returns the public key for kid, fetching the JWKS when it is
// unknown or stale; ErrKeysStale when the set is older than MaxAge +
// MaxStale because every re-fetch failed.
func (v *Verifier) key(ctx context.Context, kid string) (ed25519.PublicKey, error) {
	if v.opts.JWKSURL == "" {
		return v.opts.Keys[kid], nil
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	now := v.opts.Now()
	stale := v.keys == nil || now.Sub(v.fetchedAt) > v.opts.MaxAge
	if (stale || v.keys[kid] == nil) && now.Sub(v.triedAt) >= v.opts.RefreshMinInterval {
		v.triedAt = now
		keys, err := v.fetch(ctx)
		if err != nil {
			v.opts.Logger.Warn("idemgate attestation: failed to fetch the JWKS", "url", v.opts.JWKSURL, "error", err)
		} else {
			v.keys, v.fetchedAt = keys, now
		}
	}
	if v.keys != nil && now.Sub(v.fetchedAt) > v.opts.MaxAge+v.opts.MaxStale {
		// Too old to trust a key that may have been withdrawn.
		return nil, fmt.Errorf("%w: last fetched %s ago from %s (max_age %s + max_stale %s)",
			ErrKeysStale, now.Sub(v.fetchedAt).Round(time.Second), v.opts.JWKSURL, v.opts.MaxAge, v.opts.MaxStale)
	}
	return v.keys[kid], nil
}

func (v *Verifier) fetch(ctx context.Context) (KeySet, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, v.opts.JWKSURL, nil)
	if err != nil {
		return nil, err
	}
	resp, err := v.opts.HTTPClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("status %d", resp.StatusCode)
	}
	data, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return nil, err
	}
	return ParseJWKS(data)
}

// Request is what a verification looks at: the request line as the
// upstream received it, the idempotency header, the attestation and the
// body's parsed value.
type Request struct {
	Method string
	// Path is the request target as received (path and query).
	Path string
	// IdempotencyKey is the value of Options.KeyHeader ("" when absent).
	IdempotencyKey string
	Token          string
	// Doc is the JSON value the params are read from (the body, or an MCP
	// call's params.arguments).
	Doc any
	// MCPTool is the called tool for an MCP tools/call.
	MCPTool string
}

// Verify checks one request and returns its claims.
func (v *Verifier) Verify(ctx context.Context, r Request) (*Claims, error) {
	if r.Token == "" {
		return nil, ErrMissing
	}
	var keyErr error
	c, kid, err := parseToken(r.Token, func(kid string) ed25519.PublicKey {
		k, err := v.key(ctx, kid)
		keyErr = err
		return k
	})
	if keyErr != nil {
		return nil, keyErr
	}
	if err != nil {
		if kid != "" {
			return nil, fmt.Errorf("%w (kid %s)", err, kid)
		}
		return nil, err
	}
	now := v.opts.Now().Unix()
	leeway := int64(v.opts.Leeway / time.Second)
	if now > c.Expiry+leeway {
		return nil, fmt.Errorf("%w at %d (now %d)", ErrExpired, c.Expiry, now)
	}
	if c.IssuedAt > now+leeway {
		return nil, fmt.Errorf("%w: issued in the future (%d, now %d)", ErrExpired, c.IssuedAt, now)
	}
	if c.Method != r.Method || c.Path != r.Path {
		return nil, fmt.Errorf("%w: attested %s %q, received %s %q", ErrRequest, c.Method, c.Path, r.Method, r.Path)
	}
	if c.MCPTool != r.MCPTool {
		return nil, fmt.Errorf("%w: attested tool %q, called %q", ErrRequest, c.MCPTool, r.MCPTool)
	}
	if r.IdempotencyKey != "" && r.IdempotencyKey != c.Key {
		return nil, fmt.Errorf("%w: idempotency key differs from the attested one", ErrRequest)
	}
	ph, err := ParamHash(c.Params, r.Doc, c.PathVars, v.opts.NFC)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrParams, err)
	}
	if ph != c.ParamHash {
		return nil, ErrParams
	}
	return c, nil
}

type claimsKey struct{}

// ClaimsFrom returns the verified claims Middleware put in a request's
// context (none in log-only mode when the check failed). Use Key as the
// idempotency key of the execution.
func ClaimsFrom(ctx context.Context) (*Claims, bool) {
	c, ok := ctx.Value(claimsKey{}).(*Claims)
	return c, ok
}

// guarded reports whether tools names a guarded tool.
func (v *Verifier) guarded(tool string) bool { return slices.Contains(v.opts.MCPTools, tool) }

func withClaims(ctx context.Context, c *Claims) context.Context {
	return context.WithValue(ctx, claimsKey{}, c)
}
