package chaos

import (
	"flag"
	"fmt"
	"testing"
	"time"

	"github.com/idemgate/idemgate/e2e/internal/stack"
)

// make test runs the short, fixed-seed run; make chaos sets both flags.
var (
	seedFlag     = flag.Int64("chaos.seed", 15, "seed of the chaos run (agents' choices, fault moments and kinds)")
	durationFlag = flag.Duration("chaos.duration", 40*time.Second, "load time of the chaos run, split between the two upstream modes")
)

var (
	env    stack.Env
	envErr error
)

func TestMain(m *testing.M) { stack.Main(m, "chaos", &env, &envErr) }

// TestChaos: agents work through real Envoys in front of three idemgate
// replicas while faults hit every part at seeded moments; the recorded
// history must satisfy every invariant. Half the time against a payments
// upstream that honours Idempotency-Key, half against one that ignores it.
func TestChaos(t *testing.T) {
	if testing.Short() {
		t.Skip("chaos: builds idemgate and needs Envoy, Redis and PostgreSQL; skipped with -short")
	}
	if envErr != nil {
		t.Fatalf("chaos: %v", envErr)
	}
	// The run's own PostgreSQL, so it can crash it; without initdb a
	// database on the shared server, which is never restarted.
	_, noInitdb := pgBinDir()
	if noInitdb != nil {
		t.Logf("chaos: %v: PostgreSQL restarts are left out", noInitdb)
	}
	for _, honours := range []bool{true, false} {
		name := "ignores_keys"
		if honours {
			name = "honours_keys"
		}
		t.Run(name, func(t *testing.T) {
			opts := Options{Seed: *seedFlag, Duration: *durationFlag / 2, HonoursKeys: honours, OwnPostgres: noInitdb == nil,
				Rerun: fmt.Sprintf("make chaos SEED=%d DURATION=%s", *seedFlag, *durationFlag)}
			res := Run(t, env, opts)
			if testing.Verbose() {
				t.Logf("\n%s", FaultLog(res.History))
			}
			t.Logf("\n%s", res.Report)
			for _, v := range res.Violations {
				t.Errorf("%s", v)
			}
			seen := map[string]bool{}
			for _, f := range res.History.Faults {
				seen[f.Kind] = true
			}
			for _, lane := range lanes {
				for _, k := range lane {
					if !seen[k] && (k != FaultPGRestart || opts.OwnPostgres) {
						t.Logf("fault kind %s did not come up in this run", k)
					}
				}
			}
			if n := len(res.History.Faults); n == 0 {
				t.Errorf("no fault was injected: nothing was tested")
			}
			if n := res.History.TotalExecutions; n == 0 {
				t.Errorf("nothing executed: nothing was tested")
			}
			consumed, denied := 0, 0
			for _, a := range res.History.Approvals {
				switch a.State {
				case "CONSUMED":
					consumed++
				case "DENIED":
					denied++
				}
			}
			if consumed == 0 {
				t.Errorf("no approved transfer executed: invariant 7 tested nothing")
			}
			selfRefused, steppedUp := 0, 0
			for _, d := range res.History.Decisions {
				if d.Self && !d.StepUp && d.Error == "insufficient_user_authentication" {
					selfRefused++
				}
				if d.Self && d.StepUp && d.HTTP == 200 {
					steppedUp++
				}
			}
			if denied == 0 || selfRefused == 0 || steppedUp == 0 {
				t.Logf("approvals: %d denied, %d self-approvals without step-up refused, %d stepped-up requester approvals in this run", denied, selfRefused, steppedUp)
			}
		})
	}
}
