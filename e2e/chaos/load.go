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
	l := runLoad(t, env, opts, watch)
	defer l.client.CloseIdleConnections()
	for _, p := range l.tp.Pods {
		if err := p.Idemgate.WaitReady(60 * time.Second); err != nil {
			t.Errorf("idemgate %d not ready after the faults: %v", p.Index, err)
		}
	}
	_, faults, _ := l.rec.Snapshot()
	return faults, l.injErr
}

// load is what a run's load leaves behind for what follows it.
type load struct {
	rec       *Recorder
	ledger    *Ledger
	client    *http.Client // the caller closes its idle connections
	approvers *Approvers
	tp        *Topology
	faultsEnd time.Time // when the last fault was undone
	injErr    error     // a part the injector could not bring back
}

// runLoad brings up a topology and lets the agents work under faults for
// opts.Duration while people decide the gated transfers through the same
// pods; watch, when set, runs beside them with a context that ends with
// the load.
func runLoad(t testing.TB, env stack.Env, opts Options, watch func(ctx context.Context, tp *Topology)) *load {
	t.Helper()
	l := &load{rec: NewRecorder()}
	l.ledger = NewLedger(l.rec)
	l.client = &http.Client{Transport: &http.Transport{
		MaxIdleConnsPerHost: 64, IdleConnTimeout: 10 * time.Second,
		DialContext: (&net.Dialer{Timeout: 2 * time.Second}).DialContext,
	}}
	approvers, err := NewApprovers(l.client, l.rec)
	if err != nil {
		t.Fatal(err)
	}
	l.approvers = approvers
	l.tp = StartTopology(t, env, opts, l.ledger, approvers)
	approvers.pods = l.tp.Pods

	ctx, cancel := context.WithTimeout(context.Background(), opts.Duration)
	defer cancel()
	setup := agentSetup{seed: opts.Seed, users: opts.Users, pods: l.tp.Pods, client: l.client, rec: l.rec}
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
	if watch != nil {
		wg.Go(func() { watch(ctx, l.tp) })
	}
	in := NewInjector(l.tp, l.rec, opts.Seed, opts.FaultKinds)
	l.injErr = in.Run(ctx, opts.FaultGap)
	wg.Wait()
	l.faultsEnd = in.End()
	return l
}
