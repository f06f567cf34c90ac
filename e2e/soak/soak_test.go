//go:build soak

// The soak itself, behind the soak build tag: `go test ./...` (make test)
// compiles only the unit tests beside it; make soak runs it.

package soak

import (
	"context"
	"flag"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/idemgate/idemgate/e2e/chaos"
	"github.com/idemgate/idemgate/e2e/internal/stack"
)

var (
	durationFlag = flag.Duration("soak.duration", 20*time.Minute, "how long the load runs")
	warmupFlag   = flag.Duration("soak.warmup", 0, "samples before this are plotted, not judged (0: a quarter of the duration, at most 5m; Redis's working set fills for ttl.replay_cache)")
	everyFlag    = flag.Duration("soak.every", 5*time.Second, "sampling period")
	seedFlag     = flag.Int64("soak.seed", 33, "seed of the agents and the faults")
	outFlag      = flag.String("soak.out", "", "directory the report and plots are written to (empty: none)")
)

var (
	env    stack.Env
	envErr error
)

func TestMain(m *testing.M) { stack.Main(m, "soak", &env, &envErr) }

// soakFaults are chaos's fault kinds the soak injects: the reconnect paths
// to PostgreSQL (connections cut) and from Envoy (restarted), and the
// upstream slow, reset or failing; none kills an idemgate replica, whose
// memory would then start over and hide a leak. Redis gets the soak's own
// fault (RestartRedisMaster): chaos's Redis kinds wait for a synced
// replica, and on the busy two-core machine that wait ran out twice in
// twenty minutes, stopping their lane; that says nothing about idemgate.
var soakFaults = []string{
	chaos.FaultEnvoyRestart, chaos.FaultPGCut,
	chaos.FaultUpstreamSlow, chaos.FaultUpstreamReset, chaos.FaultUpstream5xx,
}

// TestSoak runs the chaos agents at a steady rate with periodic faults for
// -soak.duration, samples every -soak.every, and fails when a series grows
// beyond its bound after the warm-up.
func TestSoak(t *testing.T) {
	if envErr != nil {
		t.Fatalf("soak: %v", envErr)
	}
	warmup := *warmupFlag
	if warmup == 0 {
		warmup = min(*durationFlag/4, 5*time.Minute)
	}
	opts := chaos.Options{
		Seed: *seedFlag, Duration: *durationFlag, HonoursKeys: true, Pods: 3, Agents: 6,
		// A fault about every 20 s per lane rather than chaos's 2 s: a
		// steady load with periodic faults, not a storm.
		FaultGap: 20 * time.Second, FaultKinds: soakFaults,
		// Short retention, so that Redis's working set (fingerprints,
		// cached records) levels off within the warm-up.
		FingerprintTTL: 2 * time.Minute, ApprovalTTL: 2 * time.Minute, TerminalTTL: 4 * time.Minute, ReplayCacheTTL: 3 * time.Minute,
	}
	series := NewSeries()
	var started time.Time
	var pauses, redisRestarts int
	faults, injErr := chaos.RunLoad(t, env, opts, func(ctx context.Context, tp *chaos.Topology) {
		started = time.Now()
		s, err := NewSampler(ctx, tp, started)
		if err != nil {
			t.Errorf("soak: sampler: %v", err)
			return
		}
		defer s.Close()
		var wg sync.WaitGroup
		wg.Go(func() {
			n, err := PauseReplicas(ctx, tp, *seedFlag, 45*time.Second)
			pauses = n
			if err != nil {
				t.Errorf("soak: pausing a replica: %v", err)
			}
		})
		wg.Go(func() {
			n, err := RestartRedisMaster(ctx, tp, *seedFlag, 60*time.Second)
			redisRestarts = n
			if err != nil {
				t.Errorf("soak: restarting the Redis master: %v", err)
			}
		})
		tick := time.NewTicker(*everyFlag)
		defer tick.Stop()
		for {
			s.Sample(context.WithoutCancel(ctx), series)
			select {
			case <-ctx.Done():
				wg.Wait()
				return
			case <-tick.C:
			}
		}
	})
	if started.IsZero() {
		return // the topology did not come up; RunLoad failed the test
	}
	if injErr != nil {
		t.Errorf("soak: the fault injector could not bring a part back (its lane stopped, the load went on): %v", injErr)
	}
	counts := map[string]int{"sigstop_replica": pauses, "restart_redis_master": redisRestarts}
	for _, f := range faults {
		counts[f.Kind]++
	}
	verdicts := make([]Verdict, len(series))
	for i, s := range series {
		verdicts[i] = Check(s, warmup)
		t.Log(verdicts[i])
		if verdicts[i].Grew || verdicts[i].Insufficient {
			t.Errorf("soak: %s", verdicts[i])
		}
	}
	run := Run{Duration: *durationFlag, Warmup: warmup, Every: *everyFlag, Seed: *seedFlag,
		Pods: 3, Agents: 6, Faults: counts, Started: started}
	report := Report(run, series, verdicts)
	t.Logf("\n%s", report)
	if *outFlag == "" {
		return
	}
	if err := os.MkdirAll(*outFlag, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(*outFlag, "README.md"), []byte(report), 0o644); err != nil {
		t.Fatal(err)
	}
	for i, s := range series {
		if err := os.WriteFile(filepath.Join(*outFlag, s.Name+".svg"), []byte(SVG(s, warmup, verdicts[i])), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
