package floor

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/jackc/pgx/v5/pgxpool"
	goredis "github.com/redis/go-redis/v9"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// The acquire-like and complete-like scripts: one hash per key, the same
// shape of work as idemgate's (read state, write the record, set expiry),
// without its bookkeeping.
var (
	acquireScript = goredis.NewScript(`
local st = redis.call('HGET', KEYS[1], 'state')
if st then return st end
redis.call('HSET', KEYS[1], 'state', 'IN_FLIGHT', 'owner', ARGV[1], 'fence', '1', 'param_hash', ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 'ACQUIRED'`)
	completeScript = goredis.NewScript(`
if redis.call('HGET', KEYS[1], 'owner') ~= ARGV[1] then return 'NOT_OWNER' end
redis.call('HSET', KEYS[1], 'state', 'DONE', 'result_status', ARGV[2], 'result_body', ARGV[3])
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return 'OK'`)
)

// Table is the I/O floor's table: the columns, constraints and indexes of
// idemgate's idempotency_record (state/postgres/migrations), so an insert
// and an update cost what they cost there.
const Table = "iofloor_record"

const createTableSQL = `CREATE TABLE IF NOT EXISTS ` + Table + ` (
    idem_key       char(32)    PRIMARY KEY,
    scope          text        NOT NULL,
    subject_tag    text        NOT NULL,
    param_hash     text        NOT NULL,
    state          text        NOT NULL CHECK (state IN ('IN_FLIGHT', 'DONE', 'FAILED', 'UNKNOWN')),
    owner          text        NOT NULL,
    fence          bigint      NOT NULL CHECK (fence > 0),
    lease_until    timestamptz NOT NULL,
    result_status  int,
    result_headers jsonb,
    result_body    bytea,
    created_at     timestamptz NOT NULL,
    updated_at     timestamptz NOT NULL,
    expires_at     timestamptz NOT NULL,
    CHECK (state NOT IN ('DONE', 'FAILED') OR result_status IS NOT NULL)
);
CREATE INDEX IF NOT EXISTS ` + Table + `_sweep_idx ON ` + Table + ` (expires_at) WHERE state IN ('DONE', 'FAILED');
CREATE INDEX IF NOT EXISTS ` + Table + `_state_updated_idx ON ` + Table + ` (state, updated_at);`

const (
	insertSQL = `INSERT INTO ` + Table + ` (idem_key, scope, subject_tag, param_hash, state, owner, fence,
	lease_until, created_at, updated_at, expires_at)
VALUES ($1::char(32), $2, $3, $4, 'IN_FLIGHT', $5, 1, now() + interval '2 minutes', now(), now(), now() + interval '72 hours')`
	updateSQL = `UPDATE ` + Table + `
SET state = 'DONE', result_status = $3, result_headers = $4::jsonb, result_body = $5,
	updated_at = now(), expires_at = now() + interval '72 hours'
WHERE idem_key = $1::char(32) AND owner = $2 AND fence = 1 AND state = 'IN_FLIGHT'`
)

// Fixed values of every record: the floor hashes and signs nothing.
const (
	ioScope      = "payments.transfer"
	ioSubjectTag = "c3ViamVjdC10YWctZmxvb3I"
	ioParamHash  = "5e884898da28047151d0e56f8dc6292773603d0d6aabbdd62a11ef721d1542d8"
	ioHeaders    = `{"content-type":["application/json"]}`
	leaseMS      = "120000"
	retentionMS  = "259200000"
)

// IO is the I/O floor: per stream it makes exactly the store round trips a
// first-time confirm on the tiered store makes, where idemgate makes them —
// at the request body an acquire EVALSHA then the PostgreSQL INSERT, at the
// response body the PostgreSQL UPDATE (truth first) then a complete EVALSHA
// — and answers CONTINUE to every message. Each call is bounded by the store
// timeout on a context detached from the stream, as idemgate's are.
type IO struct {
	extprocv3.UnimplementedExternalProcessorServer
	redis   *goredis.Client
	pg      *pgxpool.Pool
	timeout time.Duration
	prefix  string // of the 32-character keys
	keyPref string // of the Redis keys
	seq     atomic.Uint64
}

var _ extprocv3.ExternalProcessorServer = (*IO)(nil)

// IOOptions configure an IO floor.
type IOOptions struct {
	Redis    *goredis.Client
	Postgres *pgxpool.Pool
	// StoreTimeout bounds each store call (default 250ms, idemgate's default).
	StoreTimeout time.Duration
	// KeyPrefix starts every Redis key (default "iofloor:"): on a shared
	// Redis the run's keys can be found and deleted afterwards.
	KeyPrefix string
}

// NewIO creates the table if needed, loads both scripts (so every call is a
// plain EVALSHA) and returns the server.
func NewIO(ctx context.Context, opts IOOptions) (*IO, error) {
	if opts.Redis == nil || opts.Postgres == nil {
		return nil, fmt.Errorf("the I/O floor needs Redis and PostgreSQL")
	}
	if opts.StoreTimeout <= 0 {
		opts.StoreTimeout = 250 * time.Millisecond
	}
	if _, err := opts.Postgres.Exec(ctx, createTableSQL); err != nil {
		return nil, fmt.Errorf("failed to create %s: %w", Table, err)
	}
	for _, s := range []*goredis.Script{acquireScript, completeScript} {
		if err := s.Load(ctx, opts.Redis).Err(); err != nil {
			return nil, fmt.Errorf("failed to load a script: %w", err)
		}
	}
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return nil, fmt.Errorf("failed to create a key prefix: %w", err)
	}
	if opts.KeyPrefix == "" {
		opts.KeyPrefix = "iofloor:"
	}
	return &IO{redis: opts.Redis, pg: opts.Postgres, timeout: opts.StoreTimeout, prefix: hex.EncodeToString(b[:]), keyPref: opts.KeyPrefix}, nil
}

// newKey returns a fresh 32-hex-character key (like a fingerprint nonce).
func (s *IO) newKey() string {
	var b [32]byte
	copy(b[:], s.prefix)
	n := s.seq.Add(1)
	const digits = "0123456789abcdef"
	for i := 31; i >= 16; i-- {
		b[i] = digits[n&0xf]
		n >>= 4
	}
	return string(b[:])
}

// Process answers one stream.
func (s *IO) Process(stream extprocv3.ExternalProcessor_ProcessServer) error {
	var key, owner string
	acquired := false
	for {
		req, err := stream.Recv()
		if err != nil {
			if streamEnded(err) {
				return nil
			}
			return err
		}
		switch r := req.GetRequest().(type) {
		case *extprocv3.ProcessingRequest_RequestBody:
			key = s.newKey()
			owner = "iofloor-" + key[16:]
			if err := s.acquire(stream.Context(), key, owner); err != nil {
				return status.Errorf(codes.Unavailable, "acquire: %v", err)
			}
			acquired = true
		case *extprocv3.ProcessingRequest_ResponseBody:
			if acquired {
				if err := s.complete(stream.Context(), key, owner, r.ResponseBody.GetBody()); err != nil {
					return status.Errorf(codes.Unavailable, "complete: %v", err)
				}
				acquired = false
			}
		}
		resp, err := continueFor(req)
		if err != nil {
			return err
		}
		if err := stream.Send(resp); err != nil {
			if streamEnded(err) {
				return nil
			}
			return err
		}
	}
}

func (s *IO) storeContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), s.timeout)
}

func (s *IO) acquire(ctx context.Context, key, owner string) error {
	ctx, cancel := s.storeContext(ctx)
	defer cancel()
	res, err := acquireScript.Run(ctx, s.redis, []string{s.keyPref + "{" + key + "}"}, owner, ioParamHash, leaseMS).Text()
	if err != nil {
		return fmt.Errorf("failed to run the acquire script: %w", err)
	}
	if res != "ACQUIRED" {
		return fmt.Errorf("acquire answered %q", res)
	}
	if _, err := s.pg.Exec(ctx, insertSQL, key, ioScope, ioSubjectTag, ioParamHash, owner); err != nil {
		return fmt.Errorf("failed to insert: %w", err)
	}
	return nil
}

func (s *IO) complete(ctx context.Context, key, owner string, body []byte) error {
	ctx, cancel := s.storeContext(ctx)
	defer cancel()
	tag, err := s.pg.Exec(ctx, updateSQL, key, owner, 200, ioHeaders, body)
	if err != nil {
		return fmt.Errorf("failed to update: %w", err)
	}
	if tag.RowsAffected() != 1 {
		return fmt.Errorf("update touched %d rows", tag.RowsAffected())
	}
	res, err := completeScript.Run(ctx, s.redis, []string{s.keyPref + "{" + key + "}"}, owner, strconv.Itoa(200), body, retentionMS).Text()
	if err != nil {
		return fmt.Errorf("failed to run the complete script: %w", err)
	}
	if res != "OK" {
		return fmt.Errorf("complete answered %q", res)
	}
	return nil
}
