package chaos

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// Injector injects faults at seeded random moments, one at a time, each
// logged with its window. It runs on the test goroutine (a failed restart
// ends the test there).
type Injector struct {
	tp    *Topology
	rec   *Recorder
	rng   *rand.Rand
	kinds []string
	// faultsEnd is when the last fault's window closed.
	faultsEnd time.Time
}

// faultKinds are the kinds the injector draws from, uniformly.
var faultKinds = []string{
	FaultKillReplica, FaultEnvoyRestart, FaultKillRedis, FaultFlushAll, FaultFailover,
	FaultPGCut, FaultUpstreamSlow, FaultUpstreamReset, FaultUpstream5xx,
}

// NewInjector returns an injector drawing its moments and kinds from seed.
func NewInjector(tp *Topology, rec *Recorder, seed int64, kinds []string) *Injector {
	if len(kinds) == 0 {
		kinds = faultKinds
	}
	return &Injector{tp: tp, rec: rec, rng: rand.New(rand.NewPCG(uint64(seed), 0xfa17)), kinds: kinds}
}

// Run injects faults until ctx ends, a pause of meanGap on average between
// two, and leaves every part running again. It returns an error when a part
// could not be brought back.
func (in *Injector) Run(ctx context.Context, meanGap time.Duration) error {
	for {
		gap := time.Duration(float64(meanGap) * (0.5 + in.rng.Float64()))
		select {
		case <-ctx.Done():
			in.faultsEnd = time.Now()
			return nil
		case <-time.After(gap):
		}
		kind := in.kinds[in.rng.IntN(len(in.kinds))]
		if err := in.inject(kind); err != nil {
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

func (in *Injector) between(lo, hi time.Duration) time.Duration {
	return lo + time.Duration(in.rng.Int64N(int64(hi-lo)+1))
}

func (in *Injector) inject(kind string) error {
	tp := in.tp
	ttl := tp.opts.InFlightTTL
	switch kind {
	case FaultKillReplica:
		p := tp.Pods[in.rng.IntN(len(tp.Pods))]
		down := in.between(300*time.Millisecond, 2*time.Second)
		at := time.Now()
		p.Idemgate.Kill()
		time.Sleep(down)
		err := p.Idemgate.StartProcess()
		in.rec.Fault(Fault{Kind: kind, At: at, Until: time.Now(), Pod: p.Index, Detail: fmt.Sprintf("kill -9 idemgate %d, restarted after %s", p.Index, down)})
		return err

	case FaultEnvoyRestart:
		p := tp.Pods[in.rng.IntN(len(tp.Pods))]
		at := time.Now()
		err := p.RestartEnvoy()
		in.rec.Fault(Fault{Kind: kind, At: at, Until: time.Now(), Pod: p.Index, Detail: fmt.Sprintf("kill -9 envoy %d, started again", p.Index)})
		return err

	case FaultKillRedis:
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if err := tp.waitReplicas(1, 20*time.Second); err != nil {
			return err
		}
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
		d := in.between(300*time.Millisecond, 3*time.Second)
		at := time.Now()
		tp.PGProxy.Cut()
		time.Sleep(d)
		tp.PGProxy.Restore()
		in.rec.Fault(Fault{Kind: kind, At: at, Until: time.Now(), Pod: -1, Detail: fmt.Sprintf("every PostgreSQL connection cut for %s", d)})
		return nil

	case FaultUpstreamSlow:
		// Beyond the lease: a retry meanwhile finds it expired.
		tp.Ledger.Arm(kind, ttl+in.between(500*time.Millisecond, 2*time.Second))
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
