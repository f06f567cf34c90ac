// Package redis is the Redis backend: the fast path of the tiered store, or
// a store of its own where losing records on a Redis failover is acceptable.
//
// Design choices:
//   - One go-redis UniversalClient for single, sentinel and cluster mode, so
//     the rest of the code never knows which one it talks to.
//   - Every operation is one Lua script on one key, so each decision is
//     atomic on the server (never SETNX plus separate commands). Keys are
//     <prefix>{<nonce>}: the hash tag keeps a record on one cluster slot and
//     leaves room for more keys per record later without cross-slot scripts.
//   - Scripts live in .lua files embedded with go:embed, each prefixed with
//     the shared lib.lua, wrapped once in goredis.NewScript and run with
//     Run (EVALSHA, EVAL when the server answers NOSCRIPT). LoadScripts
//     loads them ahead of traffic (on every cluster shard) for readiness.
//   - Time comes from Redis TIME inside the scripts, never from the client:
//     lease_until and LeaseExpired are judged by one clock for every gateway
//     instance, whatever their own clocks say.
//   - The record is a Redis hash holding the result's status, its headers as
//     JSON (state/internal/codec, lossless for any bytes) and the raw body
//     bytes, so a replay is byte-identical.
//   - The key's TTL is the record's retention (PEXPIREAT in the same script
//     that writes it), so Redis forgets records on its own and Sweep has
//     nothing to do.
//   - go-redis retries are switched off (MaxRetries -1, and every script
//     command is marked NoRetry, which the Cluster client needs: see
//     noretry.go): a script whose reply was lost may already have run, and
//     running Acquire or Takeover again would answer IN_FLIGHT to the caller
//     that just won. A failure is reported instead; the tiered store then
//     asks PostgreSQL. Dial retries
//     are cut to one attempt for the same reason a dead Redis must fail
//     fast: the tiered store's circuit breaker does the retrying, once per
//     cool-down, instead of every request paying for backoff.
//   - ContextTimeoutEnabled is on, so the caller's deadline (the tiered
//     store's short Redis timeout) bounds socket reads too, instead of the
//     seconds-long ReadTimeout.
//   - Every script answers one shape, {outcome, now_us, field, value, ...},
//     decoded by one function with checked type assertions: an unexpected
//     reply is an error, never a panic.
//   - Script calls that arrive together share one pipeline (pipeline.go):
//     one write and one read for many calls instead of one each.
package redis

import (
	"context"
	"crypto/tls"
	_ "embed"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/idemgate/idemgate/state"
	"github.com/idemgate/idemgate/state/internal/codec"
)

// DefaultKeyPrefix prefixes every key unless Options.KeyPrefix says otherwise.
const DefaultKeyPrefix = "idem:"

// Modes accepted by Options.Mode.
const (
	ModeSingle   = "single"
	ModeCluster  = "cluster"
	ModeSentinel = "sentinel"
)

// Options configures a connection. Zero values take go-redis defaults,
// except where noted.
type Options struct {
	Addrs []string
	// Mode is single (default), cluster or sentinel.
	Mode string
	// MasterName names the monitored master in sentinel mode.
	MasterName string
	Username   string
	Password   string
	// DB selects a database in single and sentinel mode; cluster has only 0.
	DB        int
	KeyPrefix string
	PoolSize  int
	// TLS, when set, encrypts every connection, to sentinels too (managed
	// Redis services require it); nil is plain TCP.
	TLS *tls.Config
	// DialTimeout, ReadTimeout and WriteTimeout bound the socket; the
	// caller's context deadline bounds each call as well.
	DialTimeout  time.Duration
	ReadTimeout  time.Duration
	WriteTimeout time.Duration
	// Batch tunes how script calls that arrive together share a pipeline
	// (on unless Batch.Disabled; see pipeline.go).
	Batch BatchOptions
}

// Store is a Redis state.Store.
type Store struct {
	c          goredis.UniversalClient
	prefix     string
	ownsClient bool
	pipe       *pipeliner // nil when pipelining is disabled
}

var _ state.Store = (*Store)(nil)

var (
	//go:embed lua/lib.lua
	libLua string
	//go:embed lua/acquire.lua
	acquireLua string
	//go:embed lua/complete.lua
	completeLua string
	//go:embed lua/end_lease.lua
	endLeaseLua string
	//go:embed lua/abandon_unsent.lua
	abandonUnsentLua string
	//go:embed lua/mark_unknown.lua
	markUnknownLua string
	//go:embed lua/takeover.lua
	takeoverLua string
	//go:embed lua/resolve.lua
	resolveLua string
	//go:embed lua/get.lua
	getLua string
	//go:embed lua/repair.lua
	repairLua string
	//go:embed lua/drop_orphan.lua
	dropOrphanLua string
)

// scriptSources keeps each script's text for EVAL (go-redis does not
// expose it).
var scriptSources = map[*goredis.Script]string{}

func script(body string) *goredis.Script {
	src := libLua + "\n" + body
	sc := goredis.NewScript(src)
	scriptSources[sc] = src
	return sc
}

var (
	acquireScript       = script(acquireLua)
	completeScript      = script(completeLua)
	endLeaseScript      = script(endLeaseLua)
	abandonUnsentScript = script(abandonUnsentLua)
	markUnknownScript   = script(markUnknownLua)
	takeoverScript      = script(takeoverLua)
	resolveScript       = script(resolveLua)
	getScript           = script(getLua)
	repairScript        = script(repairLua)
	dropOrphanScript    = script(dropOrphanLua)
	allScripts          = []*goredis.Script{
		acquireScript, completeScript, endLeaseScript, abandonUnsentScript, markUnknownScript, takeoverScript,
		resolveScript, getScript, repairScript, dropOrphanScript,
	}
)

// New builds a client from opts. It does not contact Redis: a store that is
// down at start must not stop the server (call Ping or LoadScripts for
// readiness).
func New(opts Options) (*Store, error) {
	if len(opts.Addrs) == 0 {
		return nil, fmt.Errorf("%w: redis needs at least one address", state.ErrInvalidArgument)
	}
	u := &goredis.UniversalOptions{
		Addrs:                 opts.Addrs,
		Username:              opts.Username,
		Password:              opts.Password,
		PoolSize:              opts.PoolSize,
		DialTimeout:           opts.DialTimeout,
		ReadTimeout:           opts.ReadTimeout,
		WriteTimeout:          opts.WriteTimeout,
		MaxRetries:            -1,
		DialerRetries:         1,
		ContextTimeoutEnabled: true,
		TLSConfig:             opts.TLS,
		// RESP2: the scripts' replies are flat arrays of strings either way,
		// and RESP3 makes go-redis look for push notifications around every
		// command, which this store never subscribes to.
		Protocol: 2,
	}
	switch opts.Mode {
	case "", ModeSingle:
		if len(opts.Addrs) != 1 {
			return nil, fmt.Errorf("%w: redis single mode takes exactly one address, got %d", state.ErrInvalidArgument, len(opts.Addrs))
		}
		u.DB = opts.DB
	case ModeCluster:
		if opts.DB != 0 {
			return nil, fmt.Errorf("%w: redis cluster mode has only database 0", state.ErrInvalidArgument)
		}
		u.IsClusterMode = true
	case ModeSentinel:
		if opts.MasterName == "" {
			return nil, fmt.Errorf("%w: redis sentinel mode needs a master name", state.ErrInvalidArgument)
		}
		u.MasterName = opts.MasterName
		u.DB = opts.DB
	default:
		return nil, fmt.Errorf("%w: unknown redis mode %q (single, cluster or sentinel)", state.ErrInvalidArgument, opts.Mode)
	}
	s := newStore(goredis.NewUniversalClient(u), opts.KeyPrefix, opts.Batch)
	s.ownsClient = true
	return s, nil
}

// NewFromClient wraps an existing client (tests, or a server sharing one
// pool). Close leaves a borrowed client open. The client should have
// MaxRetries -1 and ContextTimeoutEnabled, for the reasons in the package
// doc.
func NewFromClient(c goredis.UniversalClient, keyPrefix string) *Store {
	return newStore(c, keyPrefix, BatchOptions{})
}

func newStore(c goredis.UniversalClient, keyPrefix string, batch BatchOptions) *Store {
	if keyPrefix == "" {
		keyPrefix = DefaultKeyPrefix
	}
	s := &Store{c: c, prefix: keyPrefix}
	if !batch.Disabled {
		s.pipe = newPipeliner(c, batch)
	}
	return s
}

// Client returns the underlying client.
func (s *Store) Client() goredis.UniversalClient { return s.c }

// Key returns the Redis key of a nonce.
func (s *Store) Key(nonce string) string { return s.prefix + "{" + nonce + "}" }

// LoadScripts loads every script into the server's script cache (every
// shard in cluster mode), so the first real call is an EVALSHA hit.
func (s *Store) LoadScripts(ctx context.Context) error {
	for _, sc := range allScripts {
		if err := sc.Load(ctx, s.c).Err(); err != nil {
			return state.Unavailable("load redis scripts", err)
		}
	}
	return nil
}

func (s *Store) run(ctx context.Context, op string, sc *goredis.Script, key string, args ...any) (reply, error) {
	var (
		v   any
		err error
	)
	if s.pipe != nil {
		v, err = s.pipe.run(ctx, sc, s.Key(key), args...)
	} else {
		v, err = runScript(ctx, s.c, sc, s.Key(key), args...)
	}
	if err != nil {
		return reply{}, state.Unavailable(op, err)
	}
	r, err := decodeReply(v)
	if err != nil {
		return reply{}, fmt.Errorf("failed to %s: %w", op, err)
	}
	if r.found {
		r.record.Key = key
	}
	return r, nil
}

func micros(d time.Duration) string { return strconv.FormatInt(state.DurationMicros(d), 10) }

func fence(f int64) string { return strconv.FormatInt(f, 10) }

// answer turns a reply into an Answer, checking that the script said one of
// the outcomes this call may produce.
func answer(r reply, allowed ...state.Outcome) (state.Answer, error) {
	for _, o := range allowed {
		if r.outcome == string(o) {
			return state.Answer{Outcome: o, Record: r.record}, nil
		}
	}
	return state.Answer{}, fmt.Errorf("%w: unexpected outcome %q", errBadReply, r.outcome)
}

// Acquire implements state.Store.
func (s *Store) Acquire(ctx context.Context, req state.AcquireRequest) (state.Answer, error) {
	if err := req.Validate(); err != nil {
		return state.Answer{}, err
	}
	r, err := s.run(ctx, "acquire in redis", acquireScript, req.Key,
		req.ParamHash, req.Owner, micros(req.Lease), micros(req.Retention), req.Scope, req.SubjectTag)
	if err != nil {
		return state.Answer{}, err
	}
	return answer(r, state.OutcomeAcquired, state.OutcomeParamMismatch, state.OutcomeDone,
		state.OutcomeFailed, state.OutcomeUnknown, state.OutcomeInFlight)
}

func resultArgs(c state.Completion) ([]any, error) {
	hs, err := codec.EncodeHeaders(c.Result.Headers)
	if err != nil {
		return nil, err
	}
	body := c.Result.Body
	if body == nil {
		body = []byte{}
	}
	return []any{string(c.State), strconv.Itoa(c.Result.Status), hs, body, micros(c.Retention), c.Result.Ref}, nil
}

// Complete implements state.Store.
func (s *Store) Complete(ctx context.Context, claim state.Claim, c state.Completion) (state.Answer, error) {
	if err := claim.Validate(); err != nil {
		return state.Answer{}, err
	}
	if err := c.Validate(); err != nil {
		return state.Answer{}, err
	}
	res, err := resultArgs(c)
	if err != nil {
		return state.Answer{}, err
	}
	args := append([]any{claim.Owner, fence(claim.Fence)}, res...)
	r, err := s.run(ctx, "complete in redis", completeScript, claim.Key, args...)
	if err != nil {
		return state.Answer{}, err
	}
	return answer(r, state.OutcomeOK, state.OutcomeNotOwner)
}

// EndLease implements state.Store.
func (s *Store) EndLease(ctx context.Context, claim state.Claim) (state.Answer, error) {
	if err := claim.Validate(); err != nil {
		return state.Answer{}, err
	}
	r, err := s.run(ctx, "end lease in redis", endLeaseScript, claim.Key, claim.Owner, fence(claim.Fence))
	if err != nil {
		return state.Answer{}, err
	}
	return answer(r, state.OutcomeOK, state.OutcomeNotOwner)
}

// AbandonUnsent implements state.Store.
func (s *Store) AbandonUnsent(ctx context.Context, claim state.Claim) (state.Answer, error) {
	if err := claim.Validate(); err != nil {
		return state.Answer{}, err
	}
	r, err := s.run(ctx, "abandon unsent in redis", abandonUnsentScript, claim.Key, claim.Owner, fence(claim.Fence))
	if err != nil {
		return state.Answer{}, err
	}
	return answer(r, state.OutcomeOK, state.OutcomeNotOwner)
}

// MarkUnknown implements state.Store.
func (s *Store) MarkUnknown(ctx context.Context, claim state.Claim) (state.Answer, error) {
	if err := claim.Validate(); err != nil {
		return state.Answer{}, err
	}
	r, err := s.run(ctx, "mark unknown in redis", markUnknownScript, claim.Key, claim.Owner, fence(claim.Fence))
	if err != nil {
		return state.Answer{}, err
	}
	return answer(r, state.OutcomeOK, state.OutcomeNotOwner, state.OutcomeNotFound)
}

// Takeover implements state.Store.
func (s *Store) Takeover(ctx context.Context, req state.TakeoverRequest) (state.Answer, error) {
	if err := req.Validate(); err != nil {
		return state.Answer{}, err
	}
	r, err := s.run(ctx, "take over in redis", takeoverScript, req.Key, req.NewOwner, fence(req.Fence), micros(req.Lease))
	if err != nil {
		return state.Answer{}, err
	}
	return answer(r, state.OutcomeAcquired, state.OutcomeNotFound, state.OutcomeDone,
		state.OutcomeFailed, state.OutcomeUnknown, state.OutcomeInFlight)
}

// Get implements state.Store.
func (s *Store) Get(ctx context.Context, key string) (state.Record, bool, error) {
	if err := state.ValidKey(key); err != nil {
		return state.Record{}, false, err
	}
	r, err := s.run(ctx, "get from redis", getScript, key)
	if err != nil {
		return state.Record{}, false, err
	}
	switch r.outcome {
	case "FOUND":
		return r.record, true, nil
	case string(state.OutcomeNotFound):
		return state.Record{}, false, nil
	}
	return state.Record{}, false, fmt.Errorf("failed to get from redis: %w: unexpected outcome %q", errBadReply, r.outcome)
}

// Resolve implements state.Store.
func (s *Store) Resolve(ctx context.Context, key string, c state.Completion) (state.Answer, error) {
	if err := state.ValidKey(key); err != nil {
		return state.Answer{}, err
	}
	if err := c.Validate(); err != nil {
		return state.Answer{}, err
	}
	args, err := resultArgs(c)
	if err != nil {
		return state.Answer{}, err
	}
	r, err := s.run(ctx, "resolve in redis", resolveScript, key, args...)
	if err != nil {
		return state.Answer{}, err
	}
	return answer(r, state.OutcomeOK, state.OutcomeNotOwner, state.OutcomeNotFound)
}

// Sweep does nothing: Redis expires keys itself (their TTL is the
// retention). It still honours the context like every call.
func (s *Store) Sweep(ctx context.Context, limit int) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, state.Unavailable("sweep redis", err)
	}
	return 0, nil
}

// Ping implements state.Store.
func (s *Store) Ping(ctx context.Context) error {
	return state.Unavailable("ping redis", s.c.Ping(ctx).Err())
}

// Close stops the pipelining (queued calls fail, pipelines in flight
// finish) and closes the client unless it was borrowed (NewFromClient).
func (s *Store) Close() error {
	if s.pipe != nil {
		s.pipe.close()
	}
	if !s.ownsClient {
		return nil
	}
	return s.c.Close()
}

// BatchStats reports how many pipelines carried how many calls.
func (s *Store) BatchStats() (pipelines, calls uint64) {
	if s.pipe == nil {
		return 0, 0
	}
	st := s.pipe.q.Stats()
	return st.Batches, st.Calls
}

// Repair overwrites the key with rec, a record copied from PostgreSQL, and
// lets it live for ttl. A terminal record in Redis is never replaced by a
// non-terminal one (see repair.lua); applied is false then.
func (s *Store) Repair(ctx context.Context, rec state.Record, ttl time.Duration) (applied bool, err error) {
	if err := state.ValidKey(rec.Key); err != nil {
		return false, err
	}
	if ttl <= 0 {
		return false, fmt.Errorf("%w: repair ttl must be positive", state.ErrInvalidArgument)
	}
	ttlMS := int64(ttl / time.Millisecond)
	if ttlMS == 0 {
		ttlMS = 1
	}
	args := []any{strconv.FormatInt(ttlMS, 10),
		"state", string(rec.State),
		"param_hash", rec.ParamHash,
		"scope", rec.Scope,
		"subject_tag", rec.SubjectTag,
		"owner", rec.Owner,
		"fence", fence(rec.Fence),
		"lease_until_us", strconv.FormatInt(rec.LeaseUntil.UnixMicro(), 10),
		"created_at_us", strconv.FormatInt(rec.CreatedAt.UnixMicro(), 10),
		"updated_at_us", strconv.FormatInt(rec.UpdatedAt.UnixMicro(), 10),
		"expires_at_us", strconv.FormatInt(rec.ExpiresAt.UnixMicro(), 10),
	}
	if rec.Result != nil {
		hs, err := codec.EncodeHeaders(rec.Result.Headers)
		if err != nil {
			return false, err
		}
		body := rec.Result.Body
		if body == nil {
			body = []byte{}
		}
		args = append(args, "result_status", strconv.Itoa(rec.Result.Status), "result_headers", hs, "result_body", body)
		if rec.Result.Ref != "" {
			args = append(args, "result_ref", rec.Result.Ref)
		}
	}
	r, err := s.run(ctx, "repair redis", repairScript, rec.Key, args...)
	if err != nil {
		return false, err
	}
	switch r.outcome {
	case "OK":
		return true, nil
	case "KEPT":
		return false, nil
	}
	return false, fmt.Errorf("failed to repair redis: %w: unexpected outcome %q", errBadReply, r.outcome)
}

// DropOrphan deletes the key only while it is still claim's IN_FLIGHT
// record, whatever the fence: the tiered store drops a Redis claim that
// PostgreSQL never got, or whose PostgreSQL record AbandonUnsent has just
// deleted. It is not a state.Store call: no other backend has a copy to
// drop. deleted is false when the key was absent or belongs to someone else.
func (s *Store) DropOrphan(ctx context.Context, claim state.Claim) (deleted bool, err error) {
	if err := claim.Validate(); err != nil {
		return false, err
	}
	r, err := s.run(ctx, "drop orphan in redis", dropOrphanScript, claim.Key, claim.Owner, fence(claim.Fence))
	if err != nil {
		return false, err
	}
	switch r.outcome {
	case "OK":
		return true, nil
	case string(state.OutcomeNotOwner), string(state.OutcomeNotFound):
		return false, nil
	}
	return false, fmt.Errorf("failed to drop orphan in redis: %w: unexpected outcome %q", errBadReply, r.outcome)
}

// errBadReply marks a script reply this code does not understand (a script
// and its decoder out of step, or a foreign value under our key).
var errBadReply = errors.New("unexpected redis script reply")

// reply is a decoded script answer.
type reply struct {
	outcome string
	found   bool
	record  state.Record
}

// decodeReply is the one place that looks inside a script reply. Every type
// assertion is checked.
func decodeReply(v any) (reply, error) {
	arr, ok := v.([]any)
	if !ok {
		return reply{}, fmt.Errorf("%w: %T instead of an array", errBadReply, v)
	}
	if len(arr) < 2 || len(arr)%2 != 0 {
		return reply{}, fmt.Errorf("%w: array of %d elements", errBadReply, len(arr))
	}
	outcome, ok := arr[0].(string)
	if !ok {
		return reply{}, fmt.Errorf("%w: outcome is %T", errBadReply, arr[0])
	}
	nowStr, ok := arr[1].(string)
	if !ok {
		return reply{}, fmt.Errorf("%w: clock is %T", errBadReply, arr[1])
	}
	nowUS, err := strconv.ParseInt(nowStr, 10, 64)
	if err != nil {
		return reply{}, fmt.Errorf("%w: clock %q", errBadReply, nowStr)
	}
	r := reply{outcome: outcome}
	if len(arr) == 2 {
		return r, nil
	}
	rec, err := decodeRecord(arr[2:], nowUS)
	if err != nil {
		return reply{}, err
	}
	r.found = true
	r.record = rec
	return r, nil
}

// Record fields every stored record has, as bits (see decodeRecord).
const (
	fieldState = 1 << iota
	fieldParamHash
	fieldScope
	fieldSubjectTag
	fieldOwner
	fieldFence
	fieldLeaseUntil
	fieldCreatedAt
	fieldUpdatedAt
	fieldExpiresAt
	allFields = 1<<iota - 1
)

var fieldNames = [...]string{"state", "param_hash", "scope", "subject_tag", "owner", "fence",
	"lease_until_us", "created_at_us", "updated_at_us", "expires_at_us"}

// headerCache decodes stored header sets, which repeat across records (a
// memo: its answers are DecodeHeaders').
var headerCache codec.Cache

// decodeRecord reads the field, value pairs of HGETALL straight into a
// Record (no intermediate map: this runs on every answer).
func decodeRecord(pairs []any, nowUS int64) (state.Record, error) {
	var (
		rec                   state.Record
		seen                  int
		fenceStr              string
		lu, ca, ua, ea        string
		status, headers, body string
		ref                   string
		hasStatus             bool
	)
	for i := 0; i < len(pairs); i += 2 {
		k, ok1 := pairs[i].(string)
		v, ok2 := pairs[i+1].(string)
		if !ok1 || !ok2 {
			return state.Record{}, fmt.Errorf("%w: field pair of %T and %T", errBadReply, pairs[i], pairs[i+1])
		}
		switch k {
		case "state":
			rec.State, seen = state.RecordState(v), seen|fieldState
		case "param_hash":
			rec.ParamHash, seen = v, seen|fieldParamHash
		case "scope":
			rec.Scope, seen = v, seen|fieldScope
		case "subject_tag":
			rec.SubjectTag, seen = v, seen|fieldSubjectTag
		case "owner":
			rec.Owner, seen = v, seen|fieldOwner
		case "fence":
			fenceStr, seen = v, seen|fieldFence
		case "lease_until_us":
			lu, seen = v, seen|fieldLeaseUntil
		case "created_at_us":
			ca, seen = v, seen|fieldCreatedAt
		case "updated_at_us":
			ua, seen = v, seen|fieldUpdatedAt
		case "expires_at_us":
			ea, seen = v, seen|fieldExpiresAt
		case "result_status":
			status, hasStatus = v, true
		case "result_headers":
			headers = v
		case "result_body":
			body = v
		case "result_ref":
			ref = v
		}
	}
	if seen != allFields {
		var missing []string
		for bit, name := range fieldNames {
			if seen&(1<<bit) == 0 {
				missing = append(missing, name)
			}
		}
		return state.Record{}, fmt.Errorf("%w: record lacks %s", errBadReply, strings.Join(missing, ", "))
	}
	switch rec.State {
	case state.InFlight, state.Done, state.Failed, state.Unknown:
	default:
		return state.Record{}, fmt.Errorf("%w: unknown state %q", errBadReply, rec.State)
	}
	var err error
	if rec.Fence, err = strconv.ParseInt(fenceStr, 10, 64); err != nil {
		return state.Record{}, fmt.Errorf("%w: fence %q", errBadReply, fenceStr)
	}
	times := [...]struct {
		s   string
		dst *time.Time
	}{{lu, &rec.LeaseUntil}, {ca, &rec.CreatedAt}, {ua, &rec.UpdatedAt}, {ea, &rec.ExpiresAt}}
	for _, tm := range times {
		us, err := strconv.ParseInt(tm.s, 10, 64)
		if err != nil {
			return state.Record{}, fmt.Errorf("%w: timestamp %q", errBadReply, tm.s)
		}
		*tm.dst = time.UnixMicro(us).UTC()
	}
	rec.LeaseExpired = rec.LeaseUntil.UnixMicro() <= nowUS
	if hasStatus {
		code, err := strconv.Atoi(status)
		if err != nil {
			return state.Record{}, fmt.Errorf("%w: result status %q", errBadReply, status)
		}
		hs, err := headerCache.DecodeString(headers)
		if err != nil {
			return state.Record{}, fmt.Errorf("%w: %w", errBadReply, err)
		}
		res := &state.Result{Status: code, Headers: hs, Ref: ref}
		if len(body) > 0 {
			res.Body = []byte(body)
		}
		rec.Result = res
	}
	return rec, nil
}
