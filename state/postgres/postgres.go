// Package postgres is the PostgreSQL backend: the system of record. On its
// own it is a complete, slower store; under state/tiered it is the truth
// behind the Redis fast path.
//
// Design choices:
//   - Acquire is INSERT … ON CONFLICT DO NOTHING and a read of the existing
//     row in one statement (a CTE). The primary key, not any read-then-write
//     logic, guarantees one owner. When a concurrent insert committed after
//     the statement's snapshot was taken, neither half returns a row; a
//     second, fresh SELECT then reads the winner (rare: only under races).
//   - Every state change is one UPDATE whose WHERE clause holds the whole
//     rule (owner, fence, state, lease), so PostgreSQL's row lock decides
//     races: of many takeovers of one expired lease exactly one matches. When
//     it matches nothing, a fresh SELECT says why.
//   - Time is the database's now(): lease_until, LeaseExpired and expiry are
//     judged by one clock for all gateway replicas.
//   - idem_key is char(32) and every query compares it with $1::char(32): a
//     text parameter would compare as text and skip the primary-key index
//     (measured ~15x slower); a test EXPLAINs the lookup to keep it so.
//   - Do not ANALYZE the table while it is empty (say, after a TRUNCATE):
//     with statistics of an empty table PostgreSQL plans key lookups as
//     sequential scans, and the cached plans of every connection keep
//     scanning the growing table until autovacuum analyzes it again. (The
//     load benchmark did exactly that between scenarios and measured every
//     later scenario on scanning plans.) Forcing custom plans instead costs
//     a plan per statement, which halved confirm throughput when measured.
//   - Unresolved records (IN_FLIGHT, UNKNOWN) are never swept: they wait for
//     a person (`idemgate ops list/resolve`). Terminal records leave with
//     their daily partition, dropped whole once all of them have expired
//     (partitions.go); only the held partition is swept row by row, in
//     bounded batches with FOR UPDATE SKIP LOCKED so several replicas can
//     sweep at once without blocking each other or the request path.
//   - Concurrent Acquire inserts and Complete updates share one round trip
//     and one commit: batch.go queues them for at most about a millisecond
//     (only while a batch is already in flight) and sends them as one
//     pipelined implicit transaction.
//   - The pool is small on purpose (default MaxConns 8, MinConns 2). On the
//     2-core machines idemgate is sized for, PostgreSQL runs about as many
//     statements at once as it has cores; more connections only queue inside
//     the server, where each backend also costs several MB. The write path
//     needs DefaultBatchConns connections (2 batches in flight, each carrying
//     up to 64 statements); the rest serve the single statements (status
//     reads, releases, takeovers) and readiness. Small pools also matter for
//     the shared server's max_connections (100): every gateway replica —
//     and every test and benchmark process — brings its own pool, so 8 per
//     pool leaves room for a dozen at once. MinConns keeps connections warm
//     so the first confirm after a quiet spell does not pay TCP+TLS+auth
//     inside its store deadline; Warm opens them before serving. Every new
//     connection prepares the request path's statements when it is opened.
//     Raise MaxConns only when pool waits show up in the store latency
//     metric.
//   - pgx's statement cache (the default exec mode) prepares each query once
//     per connection, as a named statement. Behind a pooler in transaction
//     mode (Options.TransactionPooler; PgBouncer pool_mode=transaction)
//     consecutive transactions of one client connection run on different
//     server connections, where a named statement does not exist (PgBouncer
//     before 1.21, or with max_prepared_statements = 0). There the store
//     uses pgx's describe cache instead (unnamed statements: parse, bind
//     and execute travel in one message sequence) and prepares nothing when
//     a connection opens; likewise whenever the DSN picks an exec mode of
//     its own (default_query_exec_mode), since a statement prepared under
//     its text is used whatever the mode says. Migrations take a
//     transaction-level advisory lock for the same reason (migrate.go).
//   - Backend failures are wrapped with state.ErrUnavailable; outcomes are
//     values.
package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemgate/idemgate/state"
	"github.com/idemgate/idemgate/state/internal/codec"
)

// Pool defaults; see the package doc for why they are small.
const (
	DefaultMaxConns = 8
	DefaultMinConns = 2
)

// Options configures the pool.
type Options struct {
	// DSN is a libpq URL or keyword string (connect_timeout, sslmode,
	// application_name … are read from it).
	DSN string
	// MaxConns caps the pool (default 8).
	MaxConns int32
	// MinConns is kept open and warm (default 2).
	MinConns int32
	// MaxConnLifetime recycles connections (default: pgx's hour), so a
	// failover or DNS change is picked up.
	MaxConnLifetime time.Duration
	// MaxConnIdleTime closes idle connections above MinConns (default:
	// pgx's 30 minutes).
	MaxConnIdleTime time.Duration
	// HealthCheckPeriod checks idle connections (default: pgx's minute).
	HealthCheckPeriod time.Duration
	// Batch tunes how concurrent Acquire and Complete statements share a
	// round trip and a commit (on unless Batch.Disabled; see batch.go).
	Batch BatchOptions
	// TransactionPooler says the DSN points at a connection pooler in
	// transaction mode (PgBouncer pool_mode=transaction): no named
	// prepared statements (see the package doc).
	TransactionPooler bool
	// PartitionsAhead is how far ahead of today daily partitions are kept
	// ready: at least ttl.fingerprint (default 2 days; see partitions.go).
	PartitionsAhead time.Duration
}

// Store is a PostgreSQL state.Store.
type Store struct {
	pool  *pgxpool.Pool
	batch *batcher // nil when batching is disabled
	ahead time.Duration
	// onLapse is told of approvals marked EXPIRED (OnApprovalLapse).
	onLapse func(operation string)
}

var _ state.Store = (*Store)(nil)

// New creates the pool. It does not wait for PostgreSQL: a database that is
// down at start must not stop the server (Ping reports readiness; the pool
// connects when it can).
func New(ctx context.Context, opts Options) (*Store, error) {
	cfg, err := pgxpool.ParseConfig(opts.DSN)
	if err != nil {
		return nil, fmt.Errorf("%w: failed to parse postgres dsn: %w", state.ErrInvalidArgument, err)
	}
	cfg.MaxConns = DefaultMaxConns
	if opts.MaxConns > 0 {
		cfg.MaxConns = opts.MaxConns
	}
	cfg.MinConns = DefaultMinConns
	if opts.MinConns > 0 {
		cfg.MinConns = opts.MinConns
	}
	if cfg.MinConns > cfg.MaxConns {
		cfg.MinConns = cfg.MaxConns
	}
	if opts.MaxConnLifetime > 0 {
		cfg.MaxConnLifetime = opts.MaxConnLifetime
	}
	if opts.MaxConnIdleTime > 0 {
		cfg.MaxConnIdleTime = opts.MaxConnIdleTime
	}
	if opts.HealthCheckPeriod > 0 {
		cfg.HealthCheckPeriod = opts.HealthCheckPeriod
	}
	if opts.TransactionPooler && cfg.ConnConfig.DefaultQueryExecMode == pgx.QueryExecModeCacheStatement {
		cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeCacheDescribe
	}
	// Every new connection prepares the statements of the request path
	// before it is used, so that the first calls on it do not each pay a
	// Parse/Describe round trip inside their store deadline — only with
	// the statement cache: a statement prepared under its text is used
	// whatever the exec mode, and behind a transaction pooler it would
	// live on one server connection only.
	if cfg.ConnConfig.DefaultQueryExecMode == pgx.QueryExecModeCacheStatement {
		cfg.AfterConnect = prepareHotStatements
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, state.Unavailable("create postgres pool", err)
	}
	s := &Store{pool: pool, ahead: opts.PartitionsAhead}
	if !opts.Batch.Disabled {
		s.batch = newBatcher(pool, queueOptions(opts.Batch))
	}
	return s, nil
}

// hotStatements are prepared on every new connection. Each is prepared
// under its own text as name: pgx then uses the prepared statement whenever
// that text is run.
var hotStatements = []string{acquireSQL, completeSQL, selectSQL, endLeaseSQL, abandonUnsentSQL, takeoverSQL, markUnknownSQL}

func prepareHotStatements(ctx context.Context, conn *pgx.Conn) error {
	for _, sql := range hotStatements {
		if _, err := conn.Prepare(ctx, sql, sql); err != nil {
			var pgErr *pgconn.PgError
			if errors.As(err, &pgErr) && pgErr.Code == undefinedTable {
				// Not migrated yet (serve opens its pool before the
				// migrations run): the connection is fine, and pgx
				// prepares each statement on first use instead.
				return nil
			}
			return fmt.Errorf("failed to prepare statements: %w", poolerHint(err))
		}
	}
	return nil
}

// ErrTransactionPoolerUnset says PostgreSQL answered like a connection
// pooler in transaction mode that idemgate was not told about: a named
// prepared statement already exists on the server connection (SQLSTATE
// 42P05), since the pooler hands one server connection to many clients.
var ErrTransactionPoolerUnset = errors.New("PostgreSQL is reached through a connection pooler in transaction mode " +
	"(PgBouncer pool_mode=transaction), where named prepared statements collide: " +
	"set store.postgres.pooler: transaction in idemgate.yaml (or point the DSN at PostgreSQL or a session-mode pooler)")

// duplicatePreparedStatement is SQLSTATE 42P05.
const duplicatePreparedStatement = "42P05"

// poolerHint wraps err with ErrTransactionPoolerUnset when PostgreSQL's
// answer means a transaction pooler sits in between.
func poolerHint(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == duplicatePreparedStatement && !errors.Is(err, ErrTransactionPoolerUnset) {
		return fmt.Errorf("%w: %w", ErrTransactionPoolerUnset, err)
	}
	return err
}

// undefinedTable is SQLSTATE 42P01.
const undefinedTable = "42P01"

// Warm opens connections until the pool holds at least n of them (at most
// MaxConns), each with the request path's statements prepared, so that the
// first burst of traffic does not pay for connection set-up inside its store
// deadline. serve calls it before it reports ready.
func (s *Store) Warm(ctx context.Context, n int) error {
	n = min(n, int(s.pool.Config().MaxConns))
	conns := make([]*pgxpool.Conn, 0, n)
	defer func() {
		for _, c := range conns {
			c.Release()
		}
	}()
	for len(conns) < n {
		c, err := s.pool.Acquire(ctx)
		if err != nil {
			return state.Unavailable("warm the postgres pool", poolerHint(err))
		}
		conns = append(conns, c)
	}
	return nil
}

// Pool returns the underlying pool (for tests and diagnostics).
func (s *Store) Pool() *pgxpool.Pool { return s.pool }

// Migrate applies the embedded migrations over a dedicated connection with
// the pool's settings (see the package-level Migrate).
func (s *Store) Migrate(ctx context.Context) error {
	if err := migrateWith(ctx, s.pool.Config().ConnConfig.Copy()); err != nil {
		return err
	}
	return s.MaintainPartitions(ctx)
}

// recordCols is the select list every query returns: the stored columns and
// LeaseExpired judged by the database clock.
const recordCols = `idem_key, scope, subject_tag, param_hash, state, owner, fence, lease_until,
	result_status, result_headers, result_body, result_ref, created_at, updated_at, expires_at,
	lease_until <= now() AS lease_expired`

const returningCols = `idem_key, scope, subject_tag, param_hash, state, owner, fence, lease_until,
	result_status, result_headers, result_body, result_ref, created_at, updated_at, expires_at`

// micro turns a bigint parameter of microseconds into an interval.
const micro = `* interval '1 microsecond'`

const (
	selectSQL = `SELECT ` + recordCols + ` FROM idempotency_record WHERE idem_key = $1::char(32)`

	// acquireSQL files the record under its bucket ($8, the fingerprint's
	// expiry; see partitions.go). Every attempt at one nonce computes the
	// same bucket, so the primary key (idem_key, bucket) decides races; the
	// NOT EXISTS keeps one row per nonce across buckets as well (a record
	// moved to the held partition).
	acquireSQL = `WITH ins AS (
	INSERT INTO idempotency_record (idem_key, scope, subject_tag, param_hash, state, owner, fence,
		lease_until, created_at, updated_at, expires_at, bucket)
	SELECT $1::char(32), $2, $3, $4, 'IN_FLIGHT', $5, 1,
		now() + $6::bigint ` + micro + `, now(), now(),
		greatest(now() + $7::bigint ` + micro + `, now() + $6::bigint ` + micro + `),
		` + bucketSQL + `
	WHERE NOT EXISTS (SELECT 1 FROM idempotency_record WHERE idem_key = $1::char(32))
	ON CONFLICT (idem_key, bucket) DO NOTHING
	RETURNING ` + returningCols + `
)
SELECT true AS inserted, ` + recordCols + ` FROM ins
UNION ALL
SELECT false AS inserted, ` + recordCols + ` FROM idempotency_record WHERE idem_key = $1::char(32)`

	completeSQL = `UPDATE idempotency_record
SET state = $4, result_status = $5, result_headers = $6::jsonb, result_body = $7, result_ref = NULLIF($9, ''),
	updated_at = now(), expires_at = now() + $8::bigint ` + micro + `
WHERE idem_key = $1::char(32) AND owner = $2 AND fence = $3 AND state IN ('IN_FLIGHT', 'UNKNOWN')
RETURNING ` + recordCols

	endLeaseSQL = `UPDATE idempotency_record
SET lease_until = now(), updated_at = now()
WHERE idem_key = $1::char(32) AND owner = $2 AND fence = $3 AND state = 'IN_FLIGHT'
RETURNING ` + recordCols

	// abandonUnsentSQL deletes a fresh claim (fence 1) whose request never
	// reached the upstream; a later fence is ended with endLeaseSQL instead.
	abandonUnsentSQL = `DELETE FROM idempotency_record
WHERE idem_key = $1::char(32) AND owner = $2 AND fence = 1 AND state = 'IN_FLIGHT'`

	markUnknownSQL = `UPDATE idempotency_record
SET state = 'UNKNOWN', updated_at = now()
WHERE idem_key = $1::char(32) AND fence = $3 AND state = 'IN_FLIGHT'
	AND (owner = $2 OR lease_until <= now())
RETURNING ` + recordCols

	takeoverSQL = `UPDATE idempotency_record
SET owner = $2, fence = fence + 1, lease_until = now() + $4::bigint ` + micro + `, updated_at = now(),
	expires_at = greatest(expires_at, now() + $4::bigint ` + micro + `)
WHERE idem_key = $1::char(32) AND fence = $3 AND state = 'IN_FLIGHT' AND lease_until <= now()
RETURNING ` + recordCols

	resolveSQL = `UPDATE idempotency_record
SET state = $2, result_status = $3, result_headers = $4::jsonb, result_body = $5, result_ref = NULLIF($7, ''),
	updated_at = now(), expires_at = now() + $6::bigint ` + micro + `
WHERE idem_key = $1::char(32) AND state IN ('IN_FLIGHT', 'UNKNOWN')
RETURNING ` + recordCols

	// sweepSQL deletes row by row in the held partition only: the daily
	// partitions leave whole (dropExpiredPartitions).
	sweepSQL = `DELETE FROM idempotency_record WHERE bucket < ` + heldUpper + ` AND (idem_key, bucket) IN (
	SELECT idem_key, bucket FROM idempotency_record
	WHERE bucket < ` + heldUpper + ` AND state IN ('DONE', 'FAILED') AND expires_at <= now()
	ORDER BY expires_at
	LIMIT $1
	FOR UPDATE SKIP LOCKED)`
)

// headerCache decodes stored header sets, which repeat across records (a
// memo: its answers are DecodeHeaders').
var headerCache codec.Cache

// scanRecord reads one row of recordCols (after any leading columns in dst).
func scanRecord(row pgx.Row, lead ...any) (state.Record, error) {
	var (
		rec     state.Record
		st      string
		status  *int32
		headers []byte
		body    []byte
		ref     *string
	)
	dst := append(lead, &rec.Key, &rec.Scope, &rec.SubjectTag, &rec.ParamHash, &st, &rec.Owner, &rec.Fence,
		&rec.LeaseUntil, &status, &headers, &body, &ref, &rec.CreatedAt, &rec.UpdatedAt, &rec.ExpiresAt, &rec.LeaseExpired)
	if err := row.Scan(dst...); err != nil {
		return state.Record{}, err
	}
	rec.State = state.RecordState(st)
	if status != nil {
		hs, err := headerCache.Decode(headers)
		if err != nil {
			return state.Record{}, err
		}
		res := &state.Result{Status: int(*status), Headers: hs}
		if len(body) > 0 {
			res.Body = body
		}
		if ref != nil {
			res.Ref = *ref
		}
		rec.Result = res
	}
	return rec, nil
}

// get reads the record with a fresh statement (a fresh snapshot).
func (s *Store) get(ctx context.Context, key string) (state.Record, bool, error) {
	rec, err := scanRecord(s.pool.QueryRow(ctx, selectSQL, key))
	if errors.Is(err, pgx.ErrNoRows) {
		return state.Record{}, false, nil
	}
	if err != nil {
		return state.Record{}, false, err
	}
	return rec, true, nil
}

// queryRecord runs a statement returning one row of recordCols (after an
// "inserted" column with st.lead) through the batcher when st.batchable and
// batching is on, else on its own.
func (s *Store) queryRecord(ctx context.Context, st stmt) (inserted bool, rec state.Record, err error) {
	if st.batchable && s.batch != nil {
		inserted, rec, err = s.batch.query(ctx, st)
		if !errors.Is(err, errRunAlone) {
			return inserted, rec, err
		}
	}
	if st.lead {
		rec, err = scanRecord(s.pool.QueryRow(ctx, st.sql, st.args...), &inserted)
	} else {
		rec, err = scanRecord(s.pool.QueryRow(ctx, st.sql, st.args...))
	}
	return inserted, rec, err
}

// conditionalUpdate is one UPDATE … RETURNING whose WHERE clause holds a
// call's whole rule, and how to answer when it changed nothing.
type conditionalUpdate struct {
	op   string // names the call in errors
	stmt stmt
	// success is the outcome when the row was updated; ifAbsent when there
	// is no record; explain says why an existing record was left alone.
	success  state.Outcome
	ifAbsent state.Outcome
	explain  func(state.Record) state.Outcome
}

// update runs u. When it changed nothing it reads the record to say why.
func (s *Store) update(ctx context.Context, u conditionalUpdate) (state.Answer, error) {
	_, rec, err := s.queryRecord(ctx, u.stmt)
	if err == nil {
		return state.Answer{Outcome: u.success, Record: rec}, nil
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return state.Answer{}, state.Unavailable(u.op, err)
	}
	rec, found, err := s.get(ctx, u.stmt.key)
	if err != nil {
		return state.Answer{}, state.Unavailable(u.op, err)
	}
	if !found {
		return state.Answer{Outcome: u.ifAbsent}, nil
	}
	return state.Answer{Outcome: u.explain(rec), Record: rec}, nil
}

func notOwner(state.Record) state.Outcome { return state.OutcomeNotOwner }

func stateOutcome(rec state.Record) state.Outcome { return state.OutcomeOf(rec.State) }

func micros(d time.Duration) int64 { return state.DurationMicros(d) }

// Acquire implements state.Store.
func (s *Store) Acquire(ctx context.Context, req state.AcquireRequest) (state.Answer, error) {
	if err := req.Validate(); err != nil {
		return state.Answer{}, err
	}
	var expiry *time.Time
	if !req.FingerprintExpiry.IsZero() {
		e := req.FingerprintExpiry.UTC()
		expiry = &e
	}
	inserted, rec, err := s.queryRecord(ctx, stmt{key: req.Key, sql: acquireSQL, lead: true, batchable: true, args: []any{
		req.Key, req.Scope, req.SubjectTag, req.ParamHash, req.Owner, micros(req.Lease), micros(req.Retention), expiry, s.aheadDays()}})
	if errors.Is(err, pgx.ErrNoRows) {
		// A concurrent insert committed after this statement's snapshot:
		// read the winner with a fresh one.
		var found bool
		rec, found, err = s.get(ctx, req.Key)
		if err == nil && !found {
			err = errors.New("record vanished between insert conflict and read")
		}
	}
	if err != nil {
		return state.Answer{}, state.Unavailable("acquire in postgres", err)
	}
	switch {
	case inserted:
		return state.Answer{Outcome: state.OutcomeAcquired, Record: rec}, nil
	case rec.ParamHash != req.ParamHash:
		return state.Answer{Outcome: state.OutcomeParamMismatch, Record: rec}, nil
	default:
		return state.Answer{Outcome: state.OutcomeOf(rec.State), Record: rec}, nil
	}
}

func resultParams(c state.Completion) (status int32, headers string, body []byte, err error) {
	hs, err := codec.EncodeHeaders(c.Result.Headers)
	if err != nil {
		return 0, "", nil, err
	}
	body = c.Result.Body
	if body == nil {
		body = []byte{}
	}
	return int32(c.Result.Status), string(hs), body, nil
}

// Complete implements state.Store.
func (s *Store) Complete(ctx context.Context, claim state.Claim, c state.Completion) (state.Answer, error) {
	if err := claim.Validate(); err != nil {
		return state.Answer{}, err
	}
	if err := c.Validate(); err != nil {
		return state.Answer{}, err
	}
	status, headers, body, err := resultParams(c)
	if err != nil {
		return state.Answer{}, err
	}
	return s.update(ctx, conditionalUpdate{
		op: "complete in postgres", stmt: stmt{key: claim.Key, sql: completeSQL, batchable: true, args: []any{
			claim.Key, claim.Owner, claim.Fence, string(c.State), status, headers, body, micros(c.Retention), c.Result.Ref}},
		success: state.OutcomeOK, ifAbsent: state.OutcomeNotOwner, explain: notOwner,
	})
}

// EndLease implements state.Store.
func (s *Store) EndLease(ctx context.Context, claim state.Claim) (state.Answer, error) {
	if err := claim.Validate(); err != nil {
		return state.Answer{}, err
	}
	return s.update(ctx, conditionalUpdate{
		op: "end lease in postgres", stmt: stmt{key: claim.Key, sql: endLeaseSQL, args: []any{claim.Key, claim.Owner, claim.Fence}},
		success: state.OutcomeOK, ifAbsent: state.OutcomeNotOwner, explain: notOwner,
	})
}

// AbandonUnsent implements state.Store: a fresh claim is deleted, a
// taken-over one's lease ended (EndLease).
func (s *Store) AbandonUnsent(ctx context.Context, claim state.Claim) (state.Answer, error) {
	if err := claim.Validate(); err != nil {
		return state.Answer{}, err
	}
	if claim.Fence != 1 {
		return s.EndLease(ctx, claim)
	}
	tag, err := s.pool.Exec(ctx, abandonUnsentSQL, claim.Key, claim.Owner)
	if err != nil {
		return state.Answer{}, state.Unavailable("abandon unsent in postgres", err)
	}
	if tag.RowsAffected() == 1 {
		return state.Answer{Outcome: state.OutcomeOK}, nil
	}
	rec, _, err := s.get(ctx, claim.Key)
	if err != nil {
		return state.Answer{}, state.Unavailable("abandon unsent in postgres", err)
	}
	return state.Answer{Outcome: state.OutcomeNotOwner, Record: rec}, nil
}

// MarkUnknown implements state.Store.
func (s *Store) MarkUnknown(ctx context.Context, claim state.Claim) (state.Answer, error) {
	if err := claim.Validate(); err != nil {
		return state.Answer{}, err
	}
	return s.update(ctx, conditionalUpdate{
		op: "mark unknown in postgres", stmt: stmt{key: claim.Key, sql: markUnknownSQL, args: []any{claim.Key, claim.Owner, claim.Fence}},
		success: state.OutcomeOK, ifAbsent: state.OutcomeNotFound, explain: notOwner,
	})
}

// Takeover implements state.Store.
func (s *Store) Takeover(ctx context.Context, req state.TakeoverRequest) (state.Answer, error) {
	if err := req.Validate(); err != nil {
		return state.Answer{}, err
	}
	return s.update(ctx, conditionalUpdate{
		op: "take over in postgres", stmt: stmt{key: req.Key, sql: takeoverSQL, args: []any{req.Key, req.NewOwner, req.Fence, micros(req.Lease)}},
		success: state.OutcomeAcquired, ifAbsent: state.OutcomeNotFound, explain: stateOutcome,
	})
}

// Get implements state.Store.
func (s *Store) Get(ctx context.Context, key string) (state.Record, bool, error) {
	if err := state.ValidKey(key); err != nil {
		return state.Record{}, false, err
	}
	rec, found, err := s.get(ctx, key)
	if err != nil {
		return state.Record{}, false, state.Unavailable("get from postgres", err)
	}
	return rec, found, nil
}

// Resolve implements state.Store.
func (s *Store) Resolve(ctx context.Context, key string, c state.Completion) (state.Answer, error) {
	if err := state.ValidKey(key); err != nil {
		return state.Answer{}, err
	}
	if err := c.Validate(); err != nil {
		return state.Answer{}, err
	}
	status, headers, body, err := resultParams(c)
	if err != nil {
		return state.Answer{}, err
	}
	return s.update(ctx, conditionalUpdate{
		op: "resolve in postgres", stmt: stmt{key: key, sql: resolveSQL, args: []any{key, string(c.State), status, headers, body, micros(c.Retention), c.Result.Ref}},
		success: state.OutcomeOK, ifAbsent: state.OutcomeNotFound, explain: notOwner,
	})
}

// Sweep drops the daily partitions whose records have all expired (moving
// the unresolved ones to the held partition first; see partitions.go),
// creates the ones ahead, and deletes up to limit terminal records past
// their retention from the held partition. It returns the rows deleted one
// by one.
func (s *Store) Sweep(ctx context.Context, limit int) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, state.Unavailable("sweep postgres", err)
	}
	if err := s.MaintainPartitions(ctx); err != nil {
		return 0, err
	}
	if limit <= 0 {
		return 0, nil
	}
	tag, err := s.pool.Exec(ctx, sweepSQL, limit)
	if err != nil {
		return 0, state.Unavailable("sweep postgres", err)
	}
	return int(tag.RowsAffected()), nil
}

// Ping implements state.Store.
func (s *Store) Ping(ctx context.Context) error {
	return state.Unavailable("ping postgres", poolerHint(s.pool.Ping(ctx)))
}

// Close stops the batcher (queued calls fail, batches in flight finish)
// and closes the pool.
func (s *Store) Close() error {
	if s.batch != nil {
		s.batch.close()
	}
	s.pool.Close()
	return nil
}

// BatchStats reports what the batcher did (zero when batching is off).
func (s *Store) BatchStats() BatchStats {
	if s.batch == nil {
		return BatchStats{}
	}
	return s.batch.stats()
}

// ListFilter selects records for `idemgate ops list`.
type ListFilter struct {
	// State keeps only records in this state; empty means every state.
	State state.RecordState
	// OlderThan keeps only records not updated for at least this long.
	OlderThan time.Duration
	// Limit caps the answer (default 100, at most 10000).
	Limit int
}

// List returns records matching f, least recently updated first (the ones
// waiting longest for a person come first).
func (s *Store) List(ctx context.Context, f ListFilter) ([]state.Record, error) {
	if f.OlderThan < 0 {
		return nil, fmt.Errorf("%w: older-than must not be negative", state.ErrInvalidArgument)
	}
	limit := f.Limit
	switch {
	case limit <= 0:
		limit = 100
	case limit > 10000:
		limit = 10000
	}
	// Two query texts rather than "$1 = '' OR state = $1", so that a cached
	// generic plan can still use the (state, updated_at) index.
	var (
		sql  string
		args []any
	)
	if f.State != "" {
		switch f.State {
		case state.InFlight, state.Done, state.Failed, state.Unknown:
		default:
			return nil, fmt.Errorf("%w: unknown state %q", state.ErrInvalidArgument, f.State)
		}
		sql = `SELECT ` + recordCols + ` FROM idempotency_record
WHERE state = $1 AND updated_at <= now() - $2::bigint ` + micro + `
ORDER BY updated_at LIMIT $3`
		args = []any{string(f.State), micros(f.OlderThan), limit}
	} else {
		sql = `SELECT ` + recordCols + ` FROM idempotency_record
WHERE updated_at <= now() - $1::bigint ` + micro + `
ORDER BY updated_at LIMIT $2`
		args = []any{micros(f.OlderThan), limit}
	}
	rows, err := s.pool.Query(ctx, sql, args...)
	if err != nil {
		return nil, state.Unavailable("list postgres records", err)
	}
	defer rows.Close()
	var out []state.Record
	for rows.Next() {
		rec, err := scanRecord(rows)
		if err != nil {
			return nil, state.Unavailable("list postgres records", err)
		}
		out = append(out, rec)
	}
	if err := rows.Err(); err != nil {
		return nil, state.Unavailable("list postgres records", err)
	}
	return out, nil
}
