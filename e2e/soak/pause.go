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
func PauseReplicas(ctx context.Context, tp *chaos.Topology, seed int64, gap time.Duration) (int, error) {
	rng := rand.New(rand.NewPCG(uint64(seed), 0x5700))
	n := 0
	for {
		select {
		case <-ctx.Done():
			return n, nil
		case <-time.After(time.Duration(float64(gap) * (0.5 + rng.Float64()))):
		}
		p := tp.Pods[rng.IntN(len(tp.Pods))]
		if err := p.Idemgate.Pause(); err != nil {
			_ = p.Idemgate.Resume()
			return n, err
		}
		time.Sleep(time.Second + time.Duration(rng.Int64N(int64(2*time.Second))))
		if err := p.Idemgate.Resume(); err != nil {
			return n, err
		}
		n++
	}
}
