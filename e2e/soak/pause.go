package soak

import (
	"context"
	"math/rand/v2"
	"time"

	"github.com/idemgate/idemgate/e2e/chaos"
)

// PauseReplicas is the soak's fault beside chaos's kinds (which kill
// replicas, and a killed process's memory starts over, hiding a leak): it
// stops a replica (SIGSTOP) for one to three seconds, as a hung process
// looks to Envoy, and continues it, about every gap, until ctx ends. It
// returns how many pauses it made and the first error.
//
// RestartRedisMaster below is the soak's other fault.
func PauseReplicas(ctx context.Context, tp *chaos.Topology, seed int64, gap time.Duration) (int, error) {
	rng := rand.New(rand.NewPCG(uint64(seed), 0x5700))
	return everyGap(ctx, rng, gap, func() (bool, error) {
		p := tp.Pods[rng.IntN(len(tp.Pods))]
		if err := p.Idemgate.Pause(); err != nil {
			_ = p.Idemgate.Resume()
			return false, err
		}
		time.Sleep(time.Second + time.Duration(rng.Int64N(int64(2*time.Second))))
		if err := p.Idemgate.Resume(); err != nil {
			return false, err
		}
		return true, nil
	})
}

// RestartRedisMaster kills the Redis master (SIGKILL) about every gap and
// starts it again, empty, on its port after a few hundred milliseconds —
// under Sentinel's down-after, so usually without a failover: idemgate's
// connections break and are made again, which is what a leak would grow
// on. chaos's kill_redis_master waits for a synced replica first, which on
// a busy machine can take longer than its bound; this fault does not
// depend on one. It returns how many restarts it made.
func RestartRedisMaster(ctx context.Context, tp *chaos.Topology, seed int64, gap time.Duration) (int, error) {
	rng := rand.New(rand.NewPCG(uint64(seed), 0x4ed1))
	return everyGap(ctx, rng, gap, func() (bool, error) {
		actx, cancel := context.WithTimeout(ctx, 2*time.Second)
		addr, err := tp.MasterAddr(actx)
		cancel()
		if err != nil {
			return false, nil // Sentinel busy (a failover): try at the next turn
		}
		restarted := false
		for _, r := range tp.Redis {
			if r.Addr == addr {
				r.Kill()
				time.Sleep(200*time.Millisecond + time.Duration(rng.Int64N(int64(400*time.Millisecond))))
				r.Restart()
				restarted = true
			}
		}
		return restarted, nil
	})
}

// everyGap runs fault about every gap (0.5 to 1.5 gaps apart) until ctx
// ends or fault fails. It returns how many times fault reported that it
// acted, and fault's error.
func everyGap(ctx context.Context, rng *rand.Rand, gap time.Duration, fault func() (acted bool, err error)) (int, error) {
	n := 0
	for {
		select {
		case <-ctx.Done():
			return n, nil
		case <-time.After(time.Duration(float64(gap) * (0.5 + rng.Float64()))):
		}
		acted, err := fault()
		if acted {
			n++
		}
		if err != nil {
			return n, err
		}
	}
}
