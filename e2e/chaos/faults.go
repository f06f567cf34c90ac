package chaos

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// Injector injects faults at seeded random moments and logs each with its
// window. Faults run in three lanes, one fault at a time in each, so that
// a slow one (a Sentinel failover takes seconds) does not starve the
// others and faults of different parts overlap as they do in production:
// Redis (on the test goroutine: a failed Redis restart ends the test
// there), the pods (replica kills, Envoy restarts), and PostgreSQL with the
// upstream.
type Injector struct {
	tp    *Topology
	rec   *Recorder
	seed  int64
	kinds map[string]bool
	// faultsEnd is when the last fault's window closed.
	faultsEnd time.Time
}

// Fault lanes and the kinds each draws from.
var lanes = [][]string{
	{FaultKillRedis, FaultFlushAll, FaultFailover},
	{FaultKillReplica, FaultEnvoyRestart},
	{FaultPGCut, FaultPGRestart, FaultUpstreamSlow, FaultUpstreamReset, FaultUpstream5xx},
}

// NewInjector returns an injector drawing its moments and kinds from seed;
// kinds limits the kinds injected (nil: all).
func NewInjector(tp *Topology, rec *Recorder, seed int64, kinds []string) *Injector {
	in := &Injector{tp: tp, rec: rec, seed: seed, kinds: map[string]bool{}}
	for _, lane := range lanes {
		for _, k := range lane {
			in.kinds[k] = len(kinds) == 0
		}
	}
	for _, k := range kinds {
		in.kinds[k] = true
	}
	if tp.PG == nil {
		in.kinds[FaultPGRestart] = false // never the shared server
	}
	return in
}

// Run injects faults until ctx ends, a pause of meanGap on average between
// two in each lane, and leaves every part running again. It returns an
// error when a part could not be brought back.
func (in *Injector) Run(ctx context.Context, meanGap time.Duration) error {
	errs := make(chan error, len(lanes))
	var wg sync.WaitGroup
	for i := 1; i < len(lanes); i++ {
		wg.Go(func() { errs <- in.lane(ctx, i, meanGap) })
	}
	errs <- in.lane(ctx, 0, meanGap)
	wg.Wait()
	in.faultsEnd = time.Now()
	close(errs)
	for err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

func (in *Injector) lane(ctx context.Context, i int, meanGap time.Duration) error {
	var kinds []string
	for _, k := range lanes[i] {
		if in.kinds[k] {
			kinds = append(kinds, k)
		}
	}
	if len(kinds) == 0 {
		return nil
	}
	rng := rand.New(rand.NewPCG(uint64(in.seed), 0xfa17+uint64(i)))
	// A shuffled deck, not independent draws: every kind comes up once
	// before any comes up again, so a short run still sees them all.
	var deck []string
	for {
		gap := time.Duration(float64(meanGap) * (0.5 + rng.Float64()))
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(gap):
		}
		if len(deck) == 0 {
			deck = append(deck, kinds...)
			rng.Shuffle(len(deck), func(a, b int) { deck[a], deck[b] = deck[b], deck[a] })
		}
		kind := deck[0]
		deck = deck[1:]
		if err := in.inject(rng, kind); err != nil {
			return fmt.Errorf("fault %s: %w", kind, err)
		}
	}
}

// End is when the last fault ended, upstream delays included.
func (in *Injector) End() time.Time {
	end := in.faultsEnd
	if slow := in.tp.Ledger.Disarm(); slow.After(end) {
		end = slow
	}
	return end
}

func between(rng *rand.Rand, lo, hi time.Duration) time.Duration {
	return lo + time.Duration(rng.Int64N(int64(hi-lo)+1))
}

func (in *Injector) inject(rng *rand.Rand, kind string) error {
	tp := in.tp
	ttl := tp.opts.InFlightTTL
	switch kind {
	case FaultKillReplica:
		p := tp.Pods[rng.IntN(len(tp.Pods))]
		down := between(rng, 300*time.Millisecond, 2*time.Second)
		at := time.Now()
		p.Idemgate.Kill()
		time.Sleep(down)
		err := p.Idemgate.StartProcess()
		in.rec.Fault(Fault{Kind: kind, At: at, Until: time.Now(), Pod: p.Index, Detail: fmt.Sprintf("kill -9 idemgate %d, restarted after %s", p.Index, down)})
		return err

	case FaultEnvoyRestart:
		p := tp.Pods[rng.IntN(len(tp.Pods))]
		at := time.Now()
		err := p.RestartEnvoy()
		in.rec.Fault(Fault{Kind: kind, At: at, Until: time.Now(), Pod: p.Index, Detail: fmt.Sprintf("kill -9 envoy %d, started again", p.Index)})
		return err

	case FaultKillRedis:
		if err := tp.waitReplicas(1, 20*time.Second); err != nil {
			return err
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		addr, err := tp.MasterAddr(ctx)
		if err != nil {
			return err
		}
		srv := tp.server(addr)
		if srv == nil {
			return fmt.Errorf("sentinel names master %s, not one of ours", addr)
		}
		at := time.Now()
		srv.Kill()
		// Sentinel promotes the replica after down-after; then the old
		// master comes back, empty, and is made a replica.
		promoted := tp.waitMasterChange(addr, 20*time.Second)
		srv.Restart()
		in.rec.Fault(Fault{Kind: kind, At: at, Until: time.Now(), Pod: -1, Detail: fmt.Sprintf("kill -9 redis master %s; promoted %s; restarted empty", addr, promoted)})
		return nil

	case FaultFlushAll:
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		addr, err := tp.MasterAddr(ctx)
		if err != nil {
			return err
		}
		c := goredis.NewClient(&goredis.Options{Addr: addr})
		defer c.Close()
		at := time.Now()
		res := c.FlushAll(ctx).Err()
		in.rec.Fault(Fault{Kind: kind, At: at, Pod: -1, Detail: fmt.Sprintf("FLUSHALL on master %s (err %v)", addr, res)})
		return nil

	case FaultFailover:
		if err := tp.waitReplicas(1, 20*time.Second); err != nil {
			return err
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		addr, err := tp.MasterAddr(ctx)
		if err != nil {
			return err
		}
		at := time.Now()
		res := tp.sentinel.Failover(ctx, tp.MasterName).Err()
		promoted := tp.waitMasterChange(addr, 20*time.Second)
		in.rec.Fault(Fault{Kind: kind, At: at, Until: time.Now(), Pod: -1, Detail: fmt.Sprintf("SENTINEL FAILOVER from %s to %s (err %v)", addr, promoted, res)})
		return nil

	case FaultPGCut:
		d := between(rng, 300*time.Millisecond, 3*time.Second)
		at := time.Now()
		tp.PGProxy.Cut()
		time.Sleep(d)
		tp.PGProxy.Restore()
		in.rec.Fault(Fault{Kind: kind, At: at, Until: time.Now(), Pod: -1, Detail: fmt.Sprintf("every PostgreSQL connection cut for %s", d)})
		return nil

	case FaultPGRestart:
		down := between(rng, 200*time.Millisecond, 2*time.Second)
		at := time.Now()
		err := tp.PG.Restart(down)
		in.rec.Fault(Fault{Kind: kind, At: at, Until: time.Now(), Pod: -1, Detail: fmt.Sprintf("kill -9 PostgreSQL (every backend), started again after %s (crash recovery)", down)})
		return err

	case FaultUpstreamSlow:
		// Beyond the lease: a retry meanwhile finds it expired.
		tp.Ledger.Arm(kind, ttl+between(rng, 500*time.Millisecond, 2*time.Second))
	case FaultUpstreamReset, FaultUpstream5xx:
		tp.Ledger.Arm(kind, 0)
	}
	return nil
}

// waitMasterChange waits until Sentinel names a master other than old and
// returns it ("" on timeout).
func (tp *Topology) waitMasterChange(old string, timeout time.Duration) string {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		addr, err := tp.MasterAddr(ctx)
		cancel()
		if err == nil && addr != old {
			return addr
		}
		time.Sleep(100 * time.Millisecond)
	}
	return ""
}
