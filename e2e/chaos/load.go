package chaos

import (
	"context"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/idemgate/idemgate/e2e/internal/stack"
)

// RunLoad runs the chaos run's load alone for opts.Duration: the topology,
// the agents, the approvers and the fault injector, without the sweep and
// the invariant check that follow in Run. watch runs beside the load with
// the topology and a context that ends with it; a soak (e2e/soak) samples
// the processes there. RunLoad returns once watch has returned and every
// replica answers /readyz again; the topology stops at t's cleanup. It
// returns the faults injected and the injector's error (a part it could not
// bring back: that lane stopped injecting, the load went on) for the caller
// to judge after it has kept what watch measured.
func RunLoad(t testing.TB, env stack.Env, opts Options, watch func(ctx context.Context, tp *Topology)) ([]Fault, error) {
	t.Helper()
	opts.defaults()
	rec := NewRecorder()
	ledger := NewLedger(rec)
	client := &http.Client{Transport: &http.Transport{
		MaxIdleConnsPerHost: 64, IdleConnTimeout: 10 * time.Second,
		DialContext: (&net.Dialer{Timeout: 2 * time.Second}).DialContext,
	}}
	defer client.CloseIdleConnections()
	approvers, err := NewApprovers(client, rec)
	if err != nil {
		t.Fatal(err)
	}
	tp := StartTopology(t, env, opts, ledger, approvers)
	approvers.pods = tp.Pods

	ctx, cancel := context.WithTimeout(context.Background(), opts.Duration)
	defer cancel()
	setup := agentSetup{seed: opts.Seed, users: opts.Users, pods: tp.Pods, client: client, rec: rec}
	var wg sync.WaitGroup
	mem := &memory{}
	for i := range opts.Agents {
		a, err := setup.newAgent(i, mem)
		if err != nil {
			t.Fatal(err)
		}
		wg.Go(func() { a.Run(ctx) })
	}
	wg.Go(func() { approvers.Run(ctx, opts.Seed, opts.Approvers) })
	wg.Go(func() { watch(ctx, tp) })
	injErr := NewInjector(tp, rec, opts.Seed, opts.FaultKinds).Run(ctx, opts.FaultGap)
	wg.Wait()
	for _, p := range tp.Pods {
		if err := p.Idemgate.WaitReady(60 * time.Second); err != nil {
			t.Errorf("idemgate %d not ready after the faults: %v", p.Index, err)
		}
	}
	_, faults, _ := rec.Snapshot()
	return faults, injErr
}
