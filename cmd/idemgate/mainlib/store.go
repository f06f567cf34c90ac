package mainlib

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemgate/idemgate/cmd/idemgate/settings"
	"github.com/idemgate/idemgate/extproc"
	"github.com/idemgate/idemgate/state"
	"github.com/idemgate/idemgate/state/memory"
	"github.com/idemgate/idemgate/state/postgres"
	"github.com/idemgate/idemgate/state/redis"
	"github.com/idemgate/idemgate/state/tiered"
)

// storeSet is the store the server uses and the parts readiness needs.
type storeSet struct {
	store   state.Store // instrumented
	backend string
	pg      *postgres.Store
	redis   *redis.Store
	// approvals keeps approvals: PostgreSQL's (alone or under a tiered
	// store) or the memory store's; nil for Redis alone.
	approvals state.Approvals
	// refusal holds why a Redis-only store may not start executions (its
	// server unchecked or unfit); empty when it may. Unused otherwise.
	refusal *refusal
}

// openStore builds the configured store without waiting for any service: a
// store that is down at start must not stop serve (it starts not ready and
// answers confirms with temporarily_unavailable until the store answers).
func openStore(ctx context.Context, s settings.StoreSettings, lapsed func(operation string), metrics *extproc.Metrics, logger *slog.Logger) (*storeSet, error) {
	ss := &storeSet{backend: s.Backend()}
	obs := metrics.StoreObserver()
	var pgStore state.Store
	if p := s.Postgres; p != nil {
		// max_conns 0 takes the package default (see state/postgres for the
		// sizing); serve keeps more of them warm than the default MinConns.
		pg, err := postgres.New(ctx, postgres.Options{DSN: p.DSN.Reveal(), MaxConns: int32(p.MaxConns), MinConns: serveMinConns,
			TransactionPooler: p.TransactionPooler,
			// A partition for every day a fingerprint signed now can expire on.
			PartitionsAhead: max(postgres.DefaultPartitionsAhead, s.FingerprintTTL+24*time.Hour)})
		if err != nil {
			return nil, fmt.Errorf("failed to set up the PostgreSQL store (DSN from %s): %w", p.DSNSource, err)
		}
		// Lapses happen when an approval is next read, by whichever call
		// (a confirm, the approvers' API): the store reports them once.
		pg.OnApprovalLapse(lapsed)
		ss.pg = pg
		pgStore = state.Instrument(pg, "postgres", obs)
	}
	if r := s.Redis; r != nil {
		opts := redis.Options{
			Addrs: r.Addrs, Mode: r.Mode, MasterName: r.MasterName, Username: r.Username,
			Password: r.Password.Reveal(), DB: r.DB, KeyPrefix: r.KeyPrefix,
		}
		if r.TLS != nil {
			opts.TLS = r.TLS.Config
		}
		rd, err := redis.New(opts)
		if err != nil {
			if ss.pg != nil {
				ss.pg.Close()
			}
			return nil, fmt.Errorf("failed to set up the Redis store: %w", err)
		}
		ss.redis = rd
	}
	if ss.pg != nil {
		ss.approvals = ss.pg
	}
	switch ss.backend {
	case "memory":
		mem := memory.New(memory.Options{})
		mem.OnApprovalLapse(lapsed)
		ss.store, ss.approvals = state.Instrument(mem, "memory", obs), mem
	case "postgres":
		ss.store = pgStore
	case "redis":
		// Fail closed until the server has been checked (checkRedis).
		ss.refusal = &refusal{}
		ss.refusal.set("the Redis server has not been checked yet")
		ss.store = &refusingStore{Store: state.Instrument(ss.redis, "redis", obs), why: ss.refusal}
	case "tiered":
		ts, err := tiered.New(tiered.Options{
			Redis: ss.redis, Postgres: pgStore, RedisTimeout: s.Redis.Timeout, RedisMaxTTL: s.ReplayCache,
			OnFallback: metrics.Fallback, Logger: logger,
		})
		if err != nil {
			ss.redis.Close()
			ss.pg.Close()
			return nil, fmt.Errorf("failed to set up the tiered store: %w", err)
		}
		ss.store = state.Instrument(ts, "tiered", obs)
	}
	return ss, nil
}

// serveMinConns is how many PostgreSQL connections serve keeps open and
// warm: one per batch the write path may have in flight
// (postgres.DefaultBatchConns) plus two for single statements, so a burst
// after start or after a quiet spell finds them ready instead of opening
// connections inside its 250ms store deadline. (Capped by max_conns.)
const serveMinConns = postgres.DefaultBatchConns + 2

// readiness tracks whether the required store answers (PostgreSQL, or the
// only store) and whether the process is draining.
type readiness struct {
	ready    atomic.Bool
	draining atomic.Bool
	mu       sync.Mutex
	reason   string
	// logger receives the Redis warnings (checkRedis); redisWarning is
	// the last one logged.
	logger       *slog.Logger
	redisWarning string
}

func (r *readiness) set(ready bool, reason string) (changed bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	changed = r.ready.Load() != ready || r.reason != reason
	r.ready.Store(ready)
	r.reason = reason
	return changed
}

// Ready reports readiness and, when not ready, why.
func (r *readiness) Ready() (bool, string) {
	if r.draining.Load() {
		return false, "draining"
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.ready.Load(), r.reason
}

// readinessPingTimeout bounds a readiness ping; it is off the request path
// and must leave room for a cold connection (TCP, TLS, authentication).
const readinessPingTimeout = 5 * time.Second

// watch keeps retrying migrations (PostgreSQL) and script loading (Redis)
// until they succeed, then pings the store; readiness follows the answers.
func (r *readiness) watch(ctx context.Context, ss *storeSet, metrics *extproc.Metrics, logger *slog.Logger) {
	r.mu.Lock()
	r.logger = logger
	r.mu.Unlock()
	done := startupSteps{migrated: ss.pg == nil, warmed: ss.pg == nil, scripts: ss.redis == nil}
	for {
		ready, reason := r.check(ctx, ss, &done)
		if r.set(ready, reason) {
			if ready {
				logger.Info("store ready", "store", ss.backend)
			} else {
				logger.Warn("store not ready; confirms are answered temporarily_unavailable until it answers", "store", ss.backend, "reason", reason)
			}
		}
		ok, _ := r.Ready()
		metrics.SetReady(ok)
		wait := time.Second
		if ready {
			wait = 2 * time.Second
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
	}
}

// startupSteps are the one-time steps before the first "ready"; a step is
// true once done (or when the store has nothing to do for it).
type startupSteps struct {
	migrated bool // PostgreSQL migrations applied
	warmed   bool // PostgreSQL's warm connections open, statements prepared
	scripts  bool // Redis scripts loaded
}

// check runs the steps not done yet, then pings the store.
func (r *readiness) check(ctx context.Context, ss *storeSet, done *startupSteps) (bool, string) {
	if !done.migrated {
		mctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		err := ss.pg.Migrate(mctx)
		cancel()
		if err != nil {
			return false, "postgres migrations not applied: " + err.Error()
		}
		done.migrated = true
		// Once per start: whether an acknowledged DONE survives a failover.
		dctx, dcancel := context.WithTimeout(ctx, readinessPingTimeout)
		if w, err := ss.pg.DurabilityWarning(dctx); err == nil && w != "" {
			r.warn(w)
		}
		dcancel()
	}
	if !done.warmed {
		// Before the first "ready": the pool's warm connections exist and
		// have the request path's statements prepared.
		wctx, cancel := context.WithTimeout(ctx, readinessPingTimeout)
		err := ss.pg.Warm(wctx, serveMinConns)
		cancel()
		if err != nil {
			return false, "postgres connections not open: " + err.Error()
		}
		done.warmed = true
	}
	if ss.redis != nil {
		if ready, reason := r.checkRedis(ctx, ss); !ready {
			return false, reason
		}
	}
	if !done.scripts {
		lctx, cancel := context.WithTimeout(ctx, readinessPingTimeout)
		err := ss.redis.LoadScripts(lctx)
		cancel()
		if err == nil {
			done.scripts = true
		} else if ss.backend == "redis" {
			return false, "redis scripts not loaded: " + err.Error()
		}
		// Tiered: Redis is only the fast path; the store works without it.
	}
	pctx, cancel := context.WithTimeout(ctx, readinessPingTimeout)
	err := ss.store.Ping(pctx)
	cancel()
	if err != nil {
		return false, fmt.Sprintf("%s does not answer: %v", requiredStore(ss.backend), err)
	}
	return true, ""
}

// requiredStore names the store readiness depends on.
func requiredStore(backend string) string {
	if backend == "tiered" {
		return "postgres"
	}
	return backend
}

// sweepEvery is how often expired records are swept.
const sweepEvery = time.Minute

// sweep deletes expired records in bounded batches until ctx ends.
func sweep(ctx context.Context, store state.Store, logger *slog.Logger) {
	const batch = 1000
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(sweepEvery):
		}
		total := 0
		for {
			sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			n, err := store.Sweep(sctx, batch)
			cancel()
			if err != nil {
				if !errors.Is(err, context.Canceled) {
					logger.Warn("failed to sweep expired records", "error", err)
				}
				break
			}
			total += n
			if n < batch {
				break
			}
		}
		if total > 0 {
			logger.Debug("swept expired records", "count", total)
		}
	}
}

// checkRedis judges the Redis server(s) from INFO on every readiness round
// (a policy can be changed at run time). A Redis-only store refuses to start
// executions on an evicting maxmemory-policy, and any store on a cluster
// node addressed as a single server; a tiered store only warns about
// eviction (PostgreSQL answers what Redis forgets). ready is false with the
// reason when serve must report not ready.
func (r *readiness) checkRedis(ctx context.Context, ss *storeSet) (ready bool, reason string) {
	// Short: with a tiered store a hung Redis must not hold up every round.
	cctx, cancel := context.WithTimeout(ctx, time.Second)
	warnings, err := ss.redis.CheckServer(cctx, ss.backend == "redis")
	cancel()
	r.warnOnce(strings.Join(warnings, "; "))
	switch {
	case err == nil:
		if ss.refusal != nil {
			ss.refusal.set("")
		}
		return true, ""
	case errors.Is(err, redis.ErrMisconfigured):
		if ss.refusal != nil {
			ss.refusal.set(err.Error())
		}
		return false, err.Error()
	case ss.backend == "redis":
		ss.refusal.set("the Redis server could not be checked: " + err.Error())
		return false, "redis server not checked: " + err.Error()
	}
	// Tiered, Redis unreachable: it is only the fast path.
	return true, ""
}

// warn logs a warning about the stores.
func (r *readiness) warn(warning string) {
	r.mu.Lock()
	logger := r.logger
	r.mu.Unlock()
	if logger != nil {
		logger.Warn(warning)
	}
}

// warnOnce logs a Redis warning when it differs from the last one logged.
func (r *readiness) warnOnce(warning string) {
	r.mu.Lock()
	changed := warning != r.redisWarning
	r.redisWarning = warning
	logger := r.logger
	r.mu.Unlock()
	if changed && warning != "" && logger != nil {
		logger.Warn(warning)
	}
}

// refusal is a reason to refuse new executions; empty means none.
type refusal struct{ why atomic.Pointer[string] }

func (f *refusal) set(why string) { f.why.Store(&why) }

func (f *refusal) reason() string {
	if p := f.why.Load(); p != nil {
		return *p
	}
	return ""
}

// refusingStore refuses the calls that start an execution (Acquire,
// Takeover) while its refusal holds a reason; everything else (completing
// what runs, status reads, reconciliation) passes.
type refusingStore struct {
	state.Store
	why *refusal
}

func (s *refusingStore) refused() error {
	if why := s.why.reason(); why != "" {
		return state.Unavailable("start an execution", errors.New(why))
	}
	return nil
}

// Acquire implements state.Store.
func (s *refusingStore) Acquire(ctx context.Context, req state.AcquireRequest) (state.Answer, error) {
	if err := s.refused(); err != nil {
		return state.Answer{}, err
	}
	return s.Store.Acquire(ctx, req)
}

// Takeover implements state.Store.
func (s *refusingStore) Takeover(ctx context.Context, req state.TakeoverRequest) (state.Answer, error) {
	if err := s.refused(); err != nil {
		return state.Answer{}, err
	}
	return s.Store.Takeover(ctx, req)
}

// approvalLapsed is told of each approval the store marks EXPIRED, once,
// after the marking committed: the lapse happens when the approval is next
// read, by whichever call, outside any confirm stream. It counts the
// transition and, with tracing on, records it as a span of its own with
// the event approval.expired.
func approvalLapsed(metrics *extproc.Metrics, tracer trace.Tracer) func(operation string) {
	return func(operation string) {
		metrics.ApprovalTransition(operation, "expired")
		if tracer == nil {
			return
		}
		_, span := tracer.Start(context.Background(), "idemgate.approval.lapse")
		span.AddEvent("approval.expired", trace.WithAttributes(attribute.String("idemgate.operation", operation)))
		span.End()
	}
}
