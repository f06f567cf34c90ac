// Package tiered composes the Redis fast path with PostgreSQL, the truth, as
// docs/design.md §3 describes. It answers exactly what the PostgreSQL store
// alone would answer, only faster in the common cases, and keeps answering
// correctly when Redis is lost, flushed, failed over or hung.
//
// Rules, and why:
//   - Never ACQUIRED unless PostgreSQL holds the claim. A Redis ACQUIRED is
//     followed by the PostgreSQL insert; if PostgreSQL already has the key,
//     Redis lost data (flush, failover, eviction) and the PostgreSQL record
//     decides: replay, wait, unknown or mismatch. Redis is repaired from it.
//   - Redis DONE, FAILED and PARAM_MISMATCH are answered from Redis alone.
//     Terminal records reach Redis only by being copied from PostgreSQL after
//     PostgreSQL committed them, and a terminal PostgreSQL record never
//     changes, so such an answer is always backed. (A parameter hash in Redis
//     comes from a claim that PostgreSQL either confirmed or will overwrite
//     on the next repair; the only unbacked case, a failed DropOrphan, can
//     only refuse a tampered confirm, never let one through.)
//   - Redis IN_FLIGHT or UNKNOWN is checked against PostgreSQL before it is
//     answered: a person may have resolved the record, the owner may have
//     finished while the Redis update failed, or the Redis claim may be an
//     orphan of a PostgreSQL failure. The PostgreSQL check is an Acquire,
//     which also creates the claim if PostgreSQL has none.
//   - Complete, EndLease, MarkUnknown, Takeover and Resolve go to PostgreSQL
//     first (it decides NOT_OWNER) and then copy the result to Redis, best
//     effort. A stale Redis IN_FLIGHT is harmless because IN_FLIGHT is
//     always checked; a Redis write that fails costs only speed.
//   - Redis repairs overwrite the key with the PostgreSQL record, except
//     that a terminal Redis record is never replaced by a non-terminal one,
//     so two racing repairs cannot move Redis backwards.
//   - Redis failures send calls to PostgreSQL alone, behind a circuit
//     breaker: after FailureThreshold consecutive failures, or one timeout,
//     calls skip Redis without waiting; after CoolDown one call probes Redis
//     and closes the breaker on success. Each Redis call has its own short
//     RedisTimeout, well below the caller's deadline, so a hung Redis leaves
//     the caller's budget to PostgreSQL.
//   - While the breaker was open, Redis missed every write. That needs no
//     catch-up: a missing key makes Redis answer ACQUIRED, and an outdated
//     one IN_FLIGHT or UNKNOWN, and both are checked against PostgreSQL,
//     which then repairs Redis key by key as traffic arrives.
//   - PostgreSQL failures are returned wrapped in state.ErrUnavailable (the
//     server answers temporarily_unavailable, nothing executed), and a Redis
//     claim made by the same call is dropped with DropOrphan so the retry is
//     not told to wait for a claim nobody holds.
//   - Metrics and logs go through Options.OnFallback and Options.Logger, so
//     this package needs no metrics library. Idempotency keys are never
//     logged.
package tiered

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync/atomic"
	"time"

	"github.com/idemgate/idemgate/state"
)

// Cache is the fast path: a store plus the two calls the tiered store needs
// to keep it in line with PostgreSQL. *redis.Store implements it.
type Cache interface {
	state.Store
	// Repair overwrites the record with one copied from PostgreSQL.
	Repair(ctx context.Context, rec state.Record, ttl time.Duration) (bool, error)
	// DropOrphan deletes the record if claim still holds it IN_FLIGHT,
	// whatever the fence: a claim PostgreSQL does not hold.
	DropOrphan(ctx context.Context, claim state.Claim) (bool, error)
}

// Reasons passed to Options.OnFallback.
const (
	// FallbackBreakerOpen: Redis was skipped because the breaker is open.
	FallbackBreakerOpen = "breaker_open"
	// FallbackRedisTimeout: a Redis call ran out of RedisTimeout.
	FallbackRedisTimeout = "redis_timeout"
	// FallbackRedisError: a Redis call failed.
	FallbackRedisError = "redis_error"
)

// Defaults for Options.
const (
	DefaultRedisTimeout     = 50 * time.Millisecond
	DefaultFailureThreshold = 3
	DefaultCoolDown         = time.Second
)

// Options configures a tiered store.
type Options struct {
	// Redis is the fast path and Postgres the truth; both required. The
	// tiered store owns them: Close closes both.
	Redis    Cache
	Postgres state.Store
	// RedisTimeout bounds each Redis call (default 50ms). Keep it well below
	// the store deadline (store.timeout, 250ms) so PostgreSQL has time left.
	RedisTimeout time.Duration
	// FailureThreshold is how many consecutive Redis failures open the
	// breaker (default 3). One timeout opens it at once.
	FailureThreshold int
	// CoolDown is how long the breaker stays open before a probe (default 1s).
	CoolDown time.Duration
	// RedisMaxTTL caps how long any record lives in Redis (0: its full
	// retention): ttl.replay_cache. Replays come within minutes, and a
	// record Redis has forgotten is answered from PostgreSQL, which keeps it
	// for its whole retention. Claims and copies from PostgreSQL alike.
	RedisMaxTTL time.Duration
	// OnFallback is called whenever a call could not use Redis, with one of
	// the Fallback* reasons (count it as a metric).
	OnFallback func(reason string)
	// Logger receives breaker changes and Redis data-loss notices.
	Logger *slog.Logger
	// Now is the breaker's clock (default time.Now).
	Now func() time.Time
}

// Stats are counters for diagnostics and tests.
type Stats struct {
	// RedisCalls counts calls sent to Redis, RedisFailures those that failed.
	RedisCalls    uint64
	RedisFailures uint64
	// RedisSkipped counts calls that did not try Redis (breaker open).
	RedisSkipped uint64
	// Repairs counts records copied from PostgreSQL to Redis.
	Repairs uint64
	// OrphansDropped counts Redis claims dropped after a PostgreSQL
	// failure or an AbandonUnsent.
	OrphansDropped uint64
	Breaker        string
}

// Store is the tiered state.Store.
type Store struct {
	redis        Cache
	pg           state.Store
	redisTimeout time.Duration
	maxTTL       time.Duration
	onFallback   func(string)
	log          *slog.Logger
	br           *breaker

	calls, failures, skipped, repairs, orphansDropped atomic.Uint64
}

var _ state.Store = (*Store)(nil)

// New builds a tiered store. It does not contact either backend.
func New(opts Options) (*Store, error) {
	if opts.Redis == nil || opts.Postgres == nil {
		return nil, fmt.Errorf("%w: tiered store needs both redis and postgres", state.ErrInvalidArgument)
	}
	s := &Store{
		redis:        opts.Redis,
		pg:           opts.Postgres,
		redisTimeout: opts.RedisTimeout,
		maxTTL:       opts.RedisMaxTTL,
		onFallback:   opts.OnFallback,
		log:          opts.Logger,
	}
	if s.redisTimeout <= 0 {
		s.redisTimeout = DefaultRedisTimeout
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	threshold := opts.FailureThreshold
	if threshold <= 0 {
		threshold = DefaultFailureThreshold
	}
	coolDown := opts.CoolDown
	if coolDown <= 0 {
		coolDown = DefaultCoolDown
	}
	now := opts.Now
	if now == nil {
		now = time.Now
	}
	s.br = newBreaker(threshold, coolDown, now, func(from, to string) {
		if to == BreakerOpen {
			s.log.Warn("redis circuit breaker opened; serving from postgres only", "from", from)
		} else {
			s.log.Info("redis circuit breaker changed", "from", from, "to", to)
		}
	})
	return s, nil
}

// Stats returns the counters.
func (s *Store) Stats() Stats {
	return Stats{
		RedisCalls:     s.calls.Load(),
		RedisFailures:  s.failures.Load(),
		RedisSkipped:   s.skipped.Load(),
		Repairs:        s.repairs.Load(),
		OrphansDropped: s.orphansDropped.Load(),
		Breaker:        s.br.current(),
	}
}

func (s *Store) fallback(reason string) {
	if s.onFallback != nil {
		s.onFallback(reason)
	}
}

func isTimeout(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// tryRedis runs fn against Redis under the breaker and RedisTimeout. It
// reports whether fn ran and succeeded.
func (s *Store) tryRedis(ctx context.Context, fn func(ctx context.Context) error) bool {
	ok, c := s.br.allow()
	if !ok {
		s.skipped.Add(1)
		s.fallback(FallbackBreakerOpen)
		return false
	}
	rctx, cancel := context.WithTimeout(ctx, s.redisTimeout)
	defer cancel()
	s.calls.Add(1)
	err := fn(rctx)
	if err == nil {
		s.br.success(c)
		return true
	}
	if ctx.Err() != nil || errors.Is(err, state.ErrInvalidArgument) {
		// The caller's own deadline or a bad argument: nothing learned
		// about Redis.
		s.br.abandon(c)
		return false
	}
	s.failures.Add(1)
	if isTimeout(err) {
		s.br.timeout(c)
		s.fallback(FallbackRedisTimeout)
	} else {
		s.br.failure(c)
		s.fallback(FallbackRedisError)
	}
	s.log.Debug("redis call failed; using postgres", "error", err)
	return false
}

// pgErr makes sure a PostgreSQL failure carries state.ErrUnavailable.
func pgErr(op string, err error) error {
	if errors.Is(err, state.ErrInvalidArgument) || errors.Is(err, state.ErrUnavailable) {
		return fmt.Errorf("failed to %s: %w", op, err)
	}
	return state.Unavailable(op, err)
}

// repair copies rec from PostgreSQL to Redis, best effort.
func (s *Store) repair(ctx context.Context, rec state.Record) {
	if rec.Key == "" {
		return
	}
	ttl := time.Until(rec.ExpiresAt)
	if s.maxTTL > 0 && ttl > s.maxTTL {
		ttl = s.maxTTL
	}
	if ttl <= 0 {
		return
	}
	if s.tryRedis(ctx, func(ctx context.Context) error {
		_, err := s.redis.Repair(ctx, rec, ttl)
		return err
	}) {
		s.repairs.Add(1)
	}
}

// differs reports whether Redis holds something other than PostgreSQL's
// record in the fields that drive answers. Timestamps are left out: each
// backend stamps its own clock, and Redis leases are never trusted anyway.
func differs(redis, pg state.Record) bool {
	return redis.State != pg.State || redis.Owner != pg.Owner || redis.Fence != pg.Fence ||
		redis.ParamHash != pg.ParamHash || (redis.Result == nil) != (pg.Result == nil)
}

func claimOf(a state.Answer) state.Claim {
	return state.Claim{Key: a.Record.Key, Owner: a.Record.Owner, Fence: a.Record.Fence}
}

// Acquire implements state.Store; see the package doc for the rules.
func (s *Store) Acquire(ctx context.Context, req state.AcquireRequest) (state.Answer, error) {
	if err := req.Validate(); err != nil {
		return state.Answer{}, err
	}
	var ra state.Answer
	rreq := req
	if s.maxTTL > 0 && rreq.Retention > s.maxTTL {
		rreq.Retention = s.maxTTL
	}
	haveRedis := s.tryRedis(ctx, func(ctx context.Context) error {
		var err error
		ra, err = s.redis.Acquire(ctx, rreq)
		return err
	})
	if haveRedis {
		switch ra.Outcome {
		case state.OutcomeDone, state.OutcomeFailed, state.OutcomeParamMismatch:
			return ra, nil
		}
	}
	pa, err := s.pg.Acquire(ctx, req)
	if err != nil {
		if haveRedis && ra.Outcome == state.OutcomeAcquired {
			s.dropOrphan(ctx, claimOf(ra))
		}
		return state.Answer{}, pgErr("acquire", err)
	}
	if haveRedis && differs(ra.Record, pa.Record) {
		if ra.Outcome == state.OutcomeAcquired {
			s.log.Warn("redis lost a record that postgres holds; answering from postgres and repairing redis",
				"postgres_state", string(pa.Record.State))
		}
		s.repair(ctx, pa.Record)
	}
	return pa, nil
}

// dropOrphan drops a Redis claim that PostgreSQL does not hold. It runs on a
// context detached from the caller's cancellation (bounded by RedisTimeout)
// because the caller's deadline is often what failed PostgreSQL.
func (s *Store) dropOrphan(ctx context.Context, claim state.Claim) {
	if s.tryRedis(context.WithoutCancel(ctx), func(ctx context.Context) error {
		_, err := s.redis.DropOrphan(ctx, claim)
		return err
	}) {
		s.orphansDropped.Add(1)
	}
}

// afterTruth copies a successful PostgreSQL change to Redis.
func (s *Store) afterTruth(ctx context.Context, a state.Answer, success state.Outcome) {
	if a.Outcome == success {
		s.repair(ctx, a.Record)
	}
}

// Complete implements state.Store: PostgreSQL decides, Redis follows.
func (s *Store) Complete(ctx context.Context, claim state.Claim, c state.Completion) (state.Answer, error) {
	a, err := s.pg.Complete(ctx, claim, c)
	if err != nil {
		return state.Answer{}, pgErr("complete", err)
	}
	s.afterTruth(ctx, a, state.OutcomeOK)
	return a, nil
}

// EndLease implements state.Store: PostgreSQL decides, Redis follows.
func (s *Store) EndLease(ctx context.Context, claim state.Claim) (state.Answer, error) {
	a, err := s.pg.EndLease(ctx, claim)
	if err != nil {
		return state.Answer{}, pgErr("end lease", err)
	}
	s.afterTruth(ctx, a, state.OutcomeOK)
	return a, nil
}

// AbandonUnsent implements state.Store: PostgreSQL decides, Redis follows.
// When PostgreSQL deleted the claim (or never had it), the Redis copy is
// dropped with DropOrphan, which deletes the key only while it still holds this claim:
// a newer claim another confirm made in the meantime is left alone. A
// taken-over claim keeps its record and Redis gets PostgreSQL's copy.
func (s *Store) AbandonUnsent(ctx context.Context, claim state.Claim) (state.Answer, error) {
	a, err := s.pg.AbandonUnsent(ctx, claim)
	if err != nil {
		return state.Answer{}, pgErr("abandon unsent", err)
	}
	switch {
	case a.Record.Key == "":
		// Deleted, or absent in PostgreSQL: a Redis claim of ours would
		// only make the next confirm ask PostgreSQL again.
		s.dropOrphan(ctx, claim)
	case a.Outcome == state.OutcomeOK:
		s.repair(ctx, a.Record)
	}
	return a, nil
}

// MarkUnknown implements state.Store: PostgreSQL decides, Redis follows.
func (s *Store) MarkUnknown(ctx context.Context, claim state.Claim) (state.Answer, error) {
	a, err := s.pg.MarkUnknown(ctx, claim)
	if err != nil {
		return state.Answer{}, pgErr("mark unknown", err)
	}
	s.afterTruth(ctx, a, state.OutcomeOK)
	return a, nil
}

// Takeover implements state.Store: PostgreSQL decides, Redis follows.
func (s *Store) Takeover(ctx context.Context, req state.TakeoverRequest) (state.Answer, error) {
	a, err := s.pg.Takeover(ctx, req)
	if err != nil {
		return state.Answer{}, pgErr("take over", err)
	}
	s.afterTruth(ctx, a, state.OutcomeAcquired)
	return a, nil
}

// Resolve implements state.Store: PostgreSQL decides, Redis follows.
func (s *Store) Resolve(ctx context.Context, key string, c state.Completion) (state.Answer, error) {
	a, err := s.pg.Resolve(ctx, key, c)
	if err != nil {
		return state.Answer{}, pgErr("resolve", err)
	}
	s.afterTruth(ctx, a, state.OutcomeOK)
	return a, nil
}

// Get answers a terminal record from Redis, anything else from PostgreSQL
// (copying a terminal record it finds there back to Redis).
func (s *Store) Get(ctx context.Context, key string) (state.Record, bool, error) {
	if err := state.ValidKey(key); err != nil {
		return state.Record{}, false, err
	}
	var (
		rr     state.Record
		rfound bool
	)
	haveRedis := s.tryRedis(ctx, func(ctx context.Context) error {
		var err error
		rr, rfound, err = s.redis.Get(ctx, key)
		return err
	})
	if haveRedis && rfound && rr.State.Terminal() {
		return rr, true, nil
	}
	pr, pfound, err := s.pg.Get(ctx, key)
	if err != nil {
		return state.Record{}, false, pgErr("get", err)
	}
	if haveRedis && pfound && pr.State.Terminal() {
		s.repair(ctx, pr)
	}
	return pr, pfound, nil
}

// Sweep sweeps PostgreSQL; Redis expires keys itself.
func (s *Store) Sweep(ctx context.Context, limit int) (int, error) {
	n, err := s.pg.Sweep(ctx, limit)
	if err != nil {
		return 0, pgErr("sweep", err)
	}
	return n, nil
}

// Ping reports PostgreSQL's health, which is what correctness needs: with
// Redis down the store still answers, more slowly. It also pings Redis
// through the breaker, so a readiness check doubles as the half-open probe;
// PingRedis reports that result separately.
func (s *Store) Ping(ctx context.Context) error {
	_ = s.PingRedis(ctx)
	if err := s.pg.Ping(ctx); err != nil {
		return pgErr("ping", err)
	}
	return nil
}

// ErrBreakerOpen is returned by PingRedis while the breaker keeps Redis out.
var ErrBreakerOpen = errors.New("redis circuit breaker open")

// PingRedis pings Redis through the breaker (for /readyz detail).
func (s *Store) PingRedis(ctx context.Context) error {
	var perr error
	if s.tryRedis(ctx, func(ctx context.Context) error {
		perr = s.redis.Ping(ctx)
		return perr
	}) {
		return nil
	}
	if perr == nil {
		if err := ctx.Err(); err != nil {
			return err
		}
		return ErrBreakerOpen
	}
	return perr
}

// Close closes both backends.
func (s *Store) Close() error {
	return errors.Join(s.redis.Close(), s.pg.Close())
}
