package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemgate/idemgate/state"
	"github.com/idemgate/idemgate/state/postgres"
)

type bench struct {
	store *postgres.Store
	today time.Time // the database's UTC day
}

func newBench(ctx context.Context, dsn string) (*bench, error) {
	if err := postgres.Migrate(ctx, dsn); err != nil {
		return nil, err
	}
	s, err := postgres.New(ctx, postgres.Options{DSN: dsn})
	if err != nil {
		return nil, err
	}
	b := &bench{store: s}
	if err := s.Pool().QueryRow(ctx, `SELECT (now() AT TIME ZONE 'UTC')::date`).Scan(&b.today); err != nil {
		s.Close()
		return nil, err
	}
	b.today = b.today.UTC()
	return b, nil
}

func (b *bench) close() { b.store.Close() }

func partitionTable(day time.Time) string { return "idempotency_record_p" + day.Format("20060102") }

// A record as a confirm leaves it: a transfer's JSON answer (256 bytes),
// one stored header, a result reference.
const recordColumns = `(idem_key, scope, subject_tag, param_hash, state, owner, fence, lease_until,
	result_status, result_headers, result_body, result_ref, created_at, updated_at, expires_at, bucket)`

func recordSelect(from, to int, expires, bucket string) string {
	return fmt.Sprintf(`SELECT md5('r' || i::text), 'payments.transfer', md5('subject' || (i %% 1000)::text),
		md5('params' || i::text) || md5(i::text), 'DONE', 'gw-' || (i %% 8)::text, 1, now(),
		200, '[["content-type","application/json"]]'::jsonb, convert_to(repeat(md5(i::text), 8), 'UTF8'),
		'tr_' || substr(md5(i::text), 1, 16), now() - interval '2 days', now() - interval '2 days', %s, %s
		FROM generate_series(%d, %d) AS i`, expires, bucket, from, to-1)
}

// load inserts n records in chunks (progress in the log).
func (b *bench) load(ctx context.Context, first, n int, expires, bucket string) error {
	const chunk = 500_000
	for from := first; from < first+n; from += chunk {
		to := min(from+chunk, first+n)
		if _, err := b.store.Pool().Exec(ctx, "INSERT INTO idempotency_record "+recordColumns+" "+recordSelect(from, to, expires, bucket)); err != nil {
			return err
		}
		log.Printf("  loaded %d/%d", to-first, n)
	}
	return nil
}

// settle makes both runs start alike: statistics, hint bits and the
// visibility map set, and a checkpoint (so both pay the same first-touch
// full-page writes).
func (b *bench) settle(ctx context.Context) error {
	for _, sql := range []string{"VACUUM (ANALYZE) idempotency_record", "CHECKPOINT"} {
		if _, err := b.store.Pool().Exec(ctx, sql); err != nil {
			return fmt.Errorf("%s: %w", sql, err)
		}
	}
	return nil
}

// loadPartitions files a third of the records under a day three days ago
// (all expired: the day to remove) and a third under each of the two days
// after it (still kept).
func (b *bench) loadPartitions(ctx context.Context, records int) error {
	third := records / 3
	for i, ago := range []int{3, 2, 1} {
		day := b.today.AddDate(0, 0, -ago)
		if _, err := b.store.Pool().Exec(ctx, fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s PARTITION OF idempotency_record FOR VALUES FROM ('%s') TO ('%s')`,
			partitionTable(day), day.Format(time.DateOnly), day.AddDate(0, 0, 1).Format(time.DateOnly))); err != nil {
			return err
		}
		expires := "now() + interval '1 day'"
		if ago == 3 {
			expires = "now() - interval '1 hour'"
		}
		if err := b.load(ctx, i*third, third, expires, "DATE '"+day.Format(time.DateOnly)+"'"); err != nil {
			return err
		}
	}
	return b.settle(ctx)
}

// loadTable puts the same records in the held partition, which is today's
// table as it was before partitioning: one table, swept row by row.
func (b *bench) loadTable(ctx context.Context, records int) error {
	third := records / 3
	if err := b.load(ctx, 0, third, "now() - interval '1 hour'", "DATE '1970-01-01'"); err != nil {
		return err
	}
	if err := b.load(ctx, third, records-third, "now() + interval '1 day'", "DATE '1970-01-01'"); err != nil {
		return err
	}
	return b.settle(ctx)
}

// cleanPartitions drops what the partition run left, so that the sweeper
// run starts from the same table size.
func (b *bench) cleanPartitions(ctx context.Context) error {
	for _, ago := range []int{2, 1} {
		if _, err := b.store.Pool().Exec(ctx, "DROP TABLE IF EXISTS "+partitionTable(b.today.AddDate(0, 0, -ago))); err != nil {
			return err
		}
	}
	return nil
}

func (b *bench) bytesPerRecord(ctx context.Context, table string) (float64, error) {
	var size, rows int64
	err := b.store.Pool().QueryRow(ctx, "SELECT pg_total_relation_size($1::regclass), (SELECT count(*) FROM "+table+")", table).Scan(&size, &rows)
	if err != nil || rows == 0 {
		return 0, errors.Join(err, fmt.Errorf("no rows in %s", table))
	}
	return float64(size) / float64(rows), nil
}

// removal is what removing the day cost.
type removal struct {
	what     string
	took     time.Duration
	walBytes int64
	removed  int64
	during   latencies // confirms that started while it ran
}

func (b *bench) measure(ctx context.Context, what string, remove func(ctx context.Context) (int64, error)) (removal, error) {
	log.Printf("measuring: %s", what)
	r := removal{what: what}
	var lsn0, lsn1 string
	during, err := b.confirmsDuring(ctx, func() error {
		if err := b.store.Pool().QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&lsn0); err != nil {
			return err
		}
		start := time.Now()
		n, err := remove(ctx)
		r.took, r.removed = time.Since(start), n
		if err != nil {
			return err
		}
		return b.store.Pool().QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&lsn1)
	})
	if err != nil {
		return r, err
	}
	r.during = during
	err = b.store.Pool().QueryRow(ctx, "SELECT pg_wal_lsn_diff($1::pg_lsn, $2::pg_lsn)::bigint", lsn1, lsn0).Scan(&r.walBytes)
	log.Printf("  %s: %s, %d records, %d WAL bytes, confirms p99 %s", what, r.took, r.removed, r.walBytes, r.during.pct(0.99))
	return r, err
}

// dayRecords counts the records of the day to drop (before, and outside,
// the timed removal).
func (b *bench) dayRecords(ctx context.Context) (int64, error) {
	var n int64
	err := b.store.Pool().QueryRow(ctx, "SELECT count(*) FROM "+partitionTable(b.today.AddDate(0, 0, -3))).Scan(&n)
	return n, err
}

// dropDay drops the day's partition as the sweep does; n is its records.
func (b *bench) dropDay(ctx context.Context, n int64) (int64, error) {
	table := partitionTable(b.today.AddDate(0, 0, -3))
	dropped, err := b.store.DropExpiredPartitions(ctx)
	if err != nil {
		return 0, err
	}
	if !slices.Contains(dropped, table) {
		return 0, fmt.Errorf("%s was not dropped (dropped %v)", table, dropped)
	}
	return n, nil
}

// sweepDay runs the sweeper as serve does (batches of 1000 until a short
// one), each call bounded like serve's.
func (b *bench) sweepDay(ctx context.Context) (int64, error) {
	var total int64
	for {
		sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		n, err := b.store.Sweep(sctx, 1000)
		cancel()
		if err != nil {
			return total, err
		}
		total += int64(n)
		if n < 1000 {
			return total, nil
		}
	}
}

// latencies are confirm durations.
type latencies []time.Duration

func (l latencies) pct(p float64) time.Duration {
	if len(l) == 0 {
		return 0
	}
	s := slices.Clone(l)
	slices.Sort(s)
	return s[min(len(s)-1, int(float64(len(s))*p))]
}

// confirmsDuring runs confirms (Acquire, then Complete DONE) from four
// agents, paced at about 200/s in all, around fn, and returns the
// latencies of those that started while fn ran.
func (b *bench) confirmsDuring(ctx context.Context, fn func() error) (latencies, error) {
	var (
		mu      sync.Mutex
		lat     latencies
		running atomic.Bool
		stop    = make(chan struct{})
		wg      sync.WaitGroup
		failed  atomic.Value
	)
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tick := time.NewTicker(20 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-stop:
					return
				case <-tick.C:
				}
				d, err := b.confirm(ctx)
				if err != nil {
					failed.Store(err)
					continue
				}
				if running.Load() {
					mu.Lock()
					lat = append(lat, d)
					mu.Unlock()
				}
			}
		}()
	}
	time.Sleep(time.Second)
	running.Store(true)
	err := fn()
	running.Store(false)
	time.Sleep(time.Second)
	close(stop)
	wg.Wait()
	if e, ok := failed.Load().(error); ok && err == nil {
		err = fmt.Errorf("a confirm failed: %w", e)
	}
	return lat, err
}

func (b *bench) confirm(ctx context.Context) (time.Duration, error) {
	var raw [16]byte
	_, _ = rand.Read(raw[:])
	key := hex.EncodeToString(raw[:])
	start := time.Now()
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	a, err := b.store.Acquire(cctx, state.AcquireRequest{Key: key, Scope: "payments.transfer", SubjectTag: "t", ParamHash: "p",
		Owner: "bench", Lease: 2 * time.Minute, Retention: 72 * time.Hour, FingerprintExpiry: time.Now().Add(15 * time.Minute)})
	if err != nil {
		return 0, err
	}
	_, err = b.store.Complete(cctx, state.Claim{Key: key, Owner: "bench", Fence: a.Record.Fence}, state.Completion{
		State: state.Done, Retention: 72 * time.Hour,
		Result: state.Result{Status: 200, Headers: []state.Header{{Name: "content-type", Value: "application/json"}}, Body: make([]byte, 256)}})
	return time.Since(start), err
}
