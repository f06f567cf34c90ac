package soak

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	goredis "github.com/redis/go-redis/v9"

	"github.com/idemgate/idemgate/e2e/chaos"
)

// The series a soak samples, in report order.
const (
	SeriesRSS        = "idemgate_rss"
	SeriesGoroutines = "idemgate_goroutines"
	SeriesFDs        = "idemgate_open_fds"
	SeriesPGConns    = "postgres_connections"
	SeriesRedisMem   = "redis_used_memory"
)

// Bounds are the growth each series may show after the warm-up (see
// Bound). The slacks are absolute room for what a busy two-core machine
// moves by without anything leaking: a GC cycle's worth of heap over three
// replicas, a burst of streams after an Envoy restart, a pool refilling
// after a cut.
var Bounds = map[string]Bound{
	SeriesRSS:        {Ratio: 1.20, Slack: 24 << 20},
	SeriesGoroutines: {Ratio: 1.20, Slack: 60},
	SeriesFDs:        {Ratio: 1.20, Slack: 30},
	SeriesPGConns:    {Ratio: 1.20, Slack: 6},
	SeriesRedisMem:   {Ratio: 1.30, Slack: 2 << 20},
}

// NewSeries returns the empty series a sampler fills, with their bounds.
func NewSeries() []Series {
	return []Series{
		{Name: SeriesRSS, Unit: "bytes", Bound: Bounds[SeriesRSS]},
		{Name: SeriesGoroutines, Bound: Bounds[SeriesGoroutines]},
		{Name: SeriesFDs, Bound: Bounds[SeriesFDs]},
		{Name: SeriesPGConns, Bound: Bounds[SeriesPGConns]},
		{Name: SeriesRedisMem, Unit: "bytes", Bound: Bounds[SeriesRedisMem]},
	}
}

// Sampler reads the series from a running topology: the idemgate values
// summed over the replicas (they are one deployment), PostgreSQL's client
// connections to the run's database, and the Redis master's used_memory.
type Sampler struct {
	tp    *chaos.Topology
	db    string
	conn  *pgx.Conn
	start time.Time
}

// NewSampler connects to the run's database (directly, not through the
// proxy the faults cut) to read pg_stat_activity.
func NewSampler(ctx context.Context, tp *chaos.Topology, start time.Time) (*Sampler, error) {
	cfg, err := pgx.ParseConfig(tp.DSN)
	if err != nil {
		return nil, err
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	return &Sampler{tp: tp, db: cfg.Database, conn: conn, start: start}, nil
}

// Close closes the sampler's PostgreSQL connection.
func (s *Sampler) Close() { _ = s.conn.Close(context.Background()) }

// Sample appends one point to each series; a value that cannot be read is
// NaN (left out by the check, a gap in the plot).
func (s *Sampler) Sample(ctx context.Context, series []Series) {
	at := time.Since(s.start)
	vals := map[string]float64{
		SeriesRSS: 0, SeriesGoroutines: 0, SeriesFDs: 0,
	}
	for _, p := range s.tp.Pods {
		pid := p.Idemgate.PID()
		rss, err := rssBytes(pid)
		add(vals, SeriesRSS, rss, err)
		fds, err := openFDs(pid)
		add(vals, SeriesFDs, fds, err)
		g, err := p.Idemgate.Metric("go_goroutines")
		if err == nil && g == 0 {
			err = fmt.Errorf("idemgate %d exports no go_goroutines", p.Index)
		}
		add(vals, SeriesGoroutines, g, err)
	}
	vals[SeriesPGConns] = s.pgConnections(ctx)
	vals[SeriesRedisMem] = s.redisMemory(ctx)
	for i := range series {
		series[i].Points = append(series[i].Points, Point{At: at, Value: vals[series[i].Name]})
	}
}

// add sums v into vals[name]; once one replica's value is missing the sum
// is NaN, not a dip.
func add(vals map[string]float64, name string, v float64, err error) {
	if err != nil {
		vals[name] = math.NaN()
		return
	}
	vals[name] += v
}

func (s *Sampler) pgConnections(ctx context.Context) float64 {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var n int64
	err := s.conn.QueryRow(ctx,
		`SELECT count(*) FROM pg_stat_activity WHERE datname = $1 AND backend_type = 'client backend' AND pid <> pg_backend_pid()`,
		s.db).Scan(&n)
	if err != nil {
		return math.NaN()
	}
	return float64(n)
}

func (s *Sampler) redisMemory(ctx context.Context) float64 {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	addr, err := s.tp.MasterAddr(ctx)
	if err != nil {
		return math.NaN()
	}
	c := goredis.NewClient(&goredis.Options{Addr: addr, MaxRetries: -1})
	defer c.Close()
	info, err := c.Info(ctx, "memory").Result()
	if err != nil {
		return math.NaN()
	}
	v, err := infoField(info, "used_memory")
	if err != nil {
		return math.NaN()
	}
	return v
}

// infoField reads a numeric field of a Redis INFO answer.
func infoField(info, field string) (float64, error) {
	sc := bufio.NewScanner(strings.NewReader(info))
	for sc.Scan() {
		k, v, ok := strings.Cut(strings.TrimSpace(sc.Text()), ":")
		if ok && k == field {
			return strconv.ParseFloat(v, 64)
		}
	}
	return 0, fmt.Errorf("INFO has no %s", field)
}

// rssBytes reads VmRSS from /proc/pid/status.
func rssBytes(pid int) (float64, error) {
	if pid == 0 {
		return 0, fmt.Errorf("not running")
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	return statusKB(b, "VmRSS")
}

// statusKB reads a "Name:   123 kB" line of /proc/pid/status, in bytes.
func statusKB(status []byte, name string) (float64, error) {
	for line := range bytes.Lines(status) {
		k, v, ok := bytes.Cut(line, []byte(":"))
		if !ok || string(k) != name {
			continue
		}
		f := strings.Fields(string(v))
		if len(f) != 2 || f[1] != "kB" {
			return 0, fmt.Errorf("unexpected %s line %q", name, line)
		}
		n, err := strconv.ParseFloat(f[0], 64)
		return n * 1024, err
	}
	return 0, fmt.Errorf("no %s in /proc/pid/status", name)
}

// openFDs counts /proc/pid/fd.
func openFDs(pid int) (float64, error) {
	if pid == 0 {
		return 0, fmt.Errorf("not running")
	}
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return 0, err
	}
	return float64(len(ents)), nil
}
