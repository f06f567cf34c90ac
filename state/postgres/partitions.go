package postgres

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemgate/idemgate/state"
)

// Retention by whole partitions (migration 0003). idempotency_record is
// partitioned by bucket, the UTC day of the fingerprint's expiry: one
// partition per day, idempotency_record_pYYYYMMDD, plus the held partition
// (bucket before 2000-01-01) for records whose expiry is not known, for the
// rows of the table as it was before partitioning, and for unresolved
// records moved out of a partition about to be dropped.
//
// A daily partition is dropped when
//   - its day ended more than partitionGrace ago: every fingerprint filed
//     there has expired, and an expired fingerprint never acquires, so no
//     row can arrive; and
//   - every terminal record in it is past its expires_at (one probe of the
//     partial sweep index): records live at least their retention, a little
//     longer at most (until the last of their day expires).
//
// Before the drop, its IN_FLIGHT and UNKNOWN records move to the held
// partition (never dropped with it): reconciliation (`idemgate ops list`,
// status, late completions) keeps finding them, since every lookup is by
// idem_key over all partitions. Then the partition is detached
// CONCURRENTLY (no lock that blocks the request path) and dropped: no
// per-row DELETE, no dead tuples to vacuum, a few kB of WAL.
//
// Lookups cannot prune partitions (a Claim carries no bucket), so each
// probes every partition's primary-key index; that is why partitions are
// days, not hours, and only PartitionsAhead of them are created ahead.

const (
	heldBucket = `DATE '1970-01-01'`
	heldUpper  = `DATE '2000-01-01'`
	// partitionPrefix names the daily partitions.
	partitionPrefix = "idempotency_record_p"
	// partitionGrace is how long after its day ends a partition still
	// takes rows: clocks differ between gateways and the database.
	partitionGrace = time.Hour
	// DefaultPartitionsAhead is how far ahead daily partitions are kept
	// ready unless Options.PartitionsAhead says otherwise.
	DefaultPartitionsAhead = 48 * time.Hour
	// partitionLockID serialises partition creation and drops between
	// replicas (pg_advisory_xact_lock).
	partitionLockID = migrationLockID + 1
)

// bucketSQL is the bucket of an Acquire: the UTC day of the fingerprint's
// expiry ($8) when it lies in the window of days that have partitions
// (yesterday to $9 days ahead), else the held bucket. Outside the window
// means a clock days off, or a fingerprint outliving PartitionsAhead; such a
// record is kept (swept row by row) rather than refused. A later attempt at
// the same nonce that falls inside the window finds it through acquireSQL's
// NOT EXISTS.
const bucketSQL = `CASE
		WHEN $8::timestamptz IS NULL THEN ` + heldBucket + `
		WHEN ($8::timestamptz AT TIME ZONE 'UTC')::date BETWEEN (now() AT TIME ZONE 'UTC')::date - 1
			AND (now() AT TIME ZONE 'UTC')::date + $9::int THEN ($8::timestamptz AT TIME ZONE 'UTC')::date
		ELSE ` + heldBucket + ` END`

// aheadDays is PartitionsAhead in whole days (the partitions that exist).
func (s *Store) aheadDays() int32 {
	ahead := s.ahead
	if ahead <= 0 {
		ahead = DefaultPartitionsAhead
	}
	return int32(ahead / (24 * time.Hour))
}

// querier is what partition maintenance needs of a pool or a transaction.
type querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

func partitionName(day time.Time) string { return partitionPrefix + day.Format("20060102") }

// dailyPartitions lists the daily partitions by day.
func dailyPartitions(ctx context.Context, q querier) (map[string]time.Time, error) {
	rows, err := q.Query(ctx, `SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
		WHERE i.inhparent = 'idempotency_record'::regclass`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]time.Time{}
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			return nil, err
		}
		day, ok := strings.CutPrefix(name, partitionPrefix)
		if !ok {
			continue
		}
		d, err := time.Parse("20060102", day)
		if err != nil {
			continue // not one of ours
		}
		out[name] = d
	}
	return out, rows.Err()
}

// dbToday is the database's current UTC day and time.
func dbToday(ctx context.Context, q querier) (today, now time.Time, err error) {
	err = q.QueryRow(ctx, `SELECT (now() AT TIME ZONE 'UTC')::date, now()`).Scan(&today, &now)
	return today.UTC(), now.UTC(), err
}

// ensurePartitions creates the daily partitions from today to ahead of
// today that do not exist yet. Creating a partition takes no lock that
// blocks reads or writes of the table.
func ensurePartitions(ctx context.Context, tx pgx.Tx, ahead time.Duration) error {
	if ahead <= 0 {
		ahead = DefaultPartitionsAhead
	}
	if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", partitionLockID); err != nil {
		return err
	}
	existing, err := dailyPartitions(ctx, tx)
	if err != nil {
		return err
	}
	today, _, err := dbToday(ctx, tx)
	if err != nil {
		return err
	}
	last := today.Add(ahead)
	// From today: yesterday's partition was created when it was today,
	// and re-creating it after its drop would churn.
	for d := today; !d.After(last); d = d.AddDate(0, 0, 1) {
		name := partitionName(d)
		if _, ok := existing[name]; ok {
			continue
		}
		// Identifiers and bounds come from a date, never from input.
		sql := fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s PARTITION OF idempotency_record FOR VALUES FROM ('%s') TO ('%s')`,
			name, d.Format(time.DateOnly), d.AddDate(0, 0, 1).Format(time.DateOnly))
		if _, err := tx.Exec(ctx, sql); err != nil {
			return err
		}
	}
	return nil
}

// EnsurePartitions creates the daily partitions the next PartitionsAhead
// of confirms will be filed in (Migrate and Sweep call it).
func (s *Store) EnsurePartitions(ctx context.Context) error {
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error { return ensurePartitions(ctx, tx, s.ahead) })
	return state.Unavailable("create postgres partitions", err)
}

// MaintainPartitions creates the partitions ahead and drops the expired
// ones (see DropExpiredPartitions).
func (s *Store) MaintainPartitions(ctx context.Context) error {
	if err := s.EnsurePartitions(ctx); err != nil {
		return err
	}
	_, err := s.DropExpiredPartitions(ctx)
	return err
}

// errPartitionBusy: a partition could not be locked in time; it is tried
// again on the next sweep.
var errPartitionBusy = errors.New("partition busy")

// DropExpiredPartitions drops every daily partition whose records have all
// expired, after moving its unresolved records to the held partition, and
// returns the names dropped. A partition whose terminal records have not
// all expired, or that is busy, is left for a later call.
func (s *Store) DropExpiredPartitions(ctx context.Context) ([]string, error) {
	_, now, err := dbToday(ctx, s.pool)
	if err != nil {
		return nil, state.Unavailable("read the postgres clock", err)
	}
	return s.dropExpiredPartitions(ctx, now)
}

// dropExpiredPartitions drops as if the days before now had ended (tests
// move now ahead; records' expiry is still judged by the database clock).
func (s *Store) dropExpiredPartitions(ctx context.Context, now time.Time) ([]string, error) {
	parts, err := dailyPartitions(ctx, s.pool)
	if err != nil {
		return nil, state.Unavailable("list postgres partitions", err)
	}
	var dropped []string
	for name, day := range parts {
		if day.AddDate(0, 0, 1).Add(partitionGrace).After(now) {
			continue // fingerprints filed there may still confirm
		}
		ok, err := s.emptyOfLiveRecords(ctx, name, day)
		if errors.Is(err, errPartitionBusy) {
			continue
		}
		if err != nil {
			return dropped, state.Unavailable("prepare partition "+name+" for its drop", err)
		}
		if !ok {
			continue
		}
		// CONCURRENTLY: no lock that blocks the request path's statements
		// (they touch every partition); it cannot run in a transaction.
		if _, err := s.pool.Exec(ctx, "ALTER TABLE idempotency_record DETACH PARTITION "+name+" CONCURRENTLY"); err != nil {
			return dropped, state.Unavailable("detach partition "+name, err)
		}
		if _, err := s.pool.Exec(ctx, "DROP TABLE "+name); err != nil {
			return dropped, state.Unavailable("drop partition "+name, err)
		}
		dropped = append(dropped, name)
	}
	return dropped, nil
}

// emptyOfLiveRecords reports whether every terminal record of the
// partition is past its expires_at, and if so moves its unresolved records
// to the held partition, in one transaction that keeps writers out of the
// partition meanwhile. The lock is waited for briefly: while it is queued,
// request-path writes (which lock every partition) would queue behind it.
func (s *Store) emptyOfLiveRecords(ctx context.Context, name string, day time.Time) (ok bool, err error) {
	// Asked first without a lock (one probe of the sweep index), so that a
	// partition still holding live records costs the request path nothing.
	live, err := anyLive(ctx, s.pool, name)
	if err != nil || live {
		return false, err
	}
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", partitionLockID); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, "SET LOCAL lock_timeout = '100ms'"); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, "LOCK TABLE "+name+" IN EXCLUSIVE MODE"); err != nil {
			var pgErr *pgconn.PgError
			if errors.As(err, &pgErr) && pgErr.Code == lockNotAvailable {
				return errPartitionBusy
			}
			return err
		}
		// Again under the lock: a late completion may have landed.
		if live, err := anyLive(ctx, tx, name); err != nil || live {
			return err
		}
		if _, err := tx.Exec(ctx, `UPDATE idempotency_record SET bucket = `+heldBucket+`
			WHERE bucket = $1::date AND state IN ('IN_FLIGHT', 'UNKNOWN')`, day.Format(time.DateOnly)); err != nil {
			return err
		}
		ok = true
		return nil
	})
	return ok, err
}

// anyLive reports whether a terminal record of the partition is not yet
// past its expires_at.
func anyLive(ctx context.Context, q querier, name string) (bool, error) {
	var live bool
	err := q.QueryRow(ctx, "SELECT coalesce(max(expires_at) > now(), false) FROM "+name+
		" WHERE state IN ('DONE', 'FAILED')").Scan(&live)
	return live, err
}

// lockNotAvailable is SQLSTATE 55P03 (lock_timeout).
const lockNotAvailable = "55P03"
