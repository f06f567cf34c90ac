package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/idemgate/idemgate/e2e/loadgen/driver"
	"github.com/idemgate/idemgate/e2e/loadgen/report"
)

// interleaved reports whether floor, preview and replay are measured
// together in rotated rounds: each of their ratios then compares cells taken
// seconds apart, so drift on a shared machine hits both sides alike, instead
// of servers measured one after the other minutes apart.
func (b *bench) interleaved() bool {
	o := b.opts
	return o.rounds > 1 && o.selected(scFloor) && o.selected(scPreview) && o.selected(scReplay) && b.bin != "" && b.haveStores()
}

// runRotated runs the floor and one idemgate (tiered store, as deployed:
// previews never call it, replays do) side by side; for each concurrency,
// rounds of floor, preview and replay cells, the order rotated each round,
// merged per server.
func (b *bench) runRotated(ctx context.Context) error {
	o := b.opts
	if err := b.resetStores(ctx); err != nil {
		return err
	}
	floorSrv, floorAddr, err := b.startFloor(ctx, "noop")
	if err != nil {
		return err
	}
	defer floorSrv.stop(2 * time.Second)
	p, err := b.startIdemgateFor(ctx, "preview+replay", "tiered")
	if err != nil {
		return err
	}
	defer p.stop(5 * time.Second)
	items, err := b.minter.mint(o.replayPool, []byte(previewBody))
	if err != nil {
		return err
	}
	done, failures, err := b.completeAll(ctx, p.grpcAddr, items)
	if err != nil {
		return err
	}
	if len(done) < len(items)*9/10 {
		return fmt.Errorf("replay pool: only %d of %d first confirms completed (%s): %s", len(done), len(items), failures, p.lastLines())
	}
	if failures != "" {
		b.rep.Notes = append(b.rep.Notes, fmt.Sprintf("replay pool: %d of %d first confirms did not complete and were left out (%s).", len(items)-len(done), len(items), failures))
	}
	specs := []cellSpec{
		{scenario: scFloor, addr: floorAddr, server: floorSrv, expect: driver.PassThrough200,
			source: func(c int) (driver.Source, error) {
				return newFixedBodySource(b.preview, []byte(previewBody), c, b.budget()), nil
			}},
		{scenario: scPreview, addr: p.grpcAddr, server: p.child, idemgate: p, expect: expectPreview,
			source: func(c int) (driver.Source, error) {
				return newFixedBodySource(b.preview, []byte(previewBody), c, b.budget()), nil
			}},
		{scenario: scReplay, addr: p.grpcAddr, server: p.child, idemgate: p, expect: expectReplay,
			source: func(c int) (driver.Source, error) {
				return &poolSource{route: b.confirm, items: done, rng: newRNGs(c, 3), cycle: true, limit: b.budget()}, nil
			}},
	}
	round := time.Duration(math.Ceil(float64(o.duration) / float64(o.rounds)))
	for _, c := range o.concurrencies {
		merged := make([]*driver.Result, len(specs))
		profiled := make([]bool, len(specs))
		for r := 0; r < o.rounds; r++ {
			for k := range specs {
				i := (k + r) % len(specs)
				src, err := specs[i].source(c)
				if err != nil {
					return err
				}
				res, prof, err := b.runCell(ctx, specs[i], c, src, round)
				if err != nil {
					return fmt.Errorf("%s at concurrency %d, round %d: %w", specs[i].scenario, c, r+1, err)
				}
				if merged[i] == nil {
					merged[i] = res
				} else if err := mergeResult(merged[i], res); err != nil {
					return err
				}
				profiled[i] = profiled[i] || prof
				time.Sleep(200 * time.Millisecond)
			}
		}
		for i, spec := range specs {
			fig := cellFigures(merged[i], profiled[i])
			b.rep.Cells = append(b.rep.Cells, report.Cell{Scenario: spec.scenario, Concurrency: c, Figures: fig})
			b.log.Info("measured", "server", spec.scenario, "c", c, "req_per_s", math.Round(fig.RPS),
				"p50", fig.P50, "p99", fig.P99, "errors", fig.Errors, "outcomes", fig.Outcomes)
		}
	}
	return nil
}

// mergeResult adds round o to m: the rate over all rounds is their
// requests over the sum of their windows.
func mergeResult(m, o *driver.Result) error {
	if m.Concurrency != o.Concurrency {
		return errors.New("merging results of different concurrencies")
	}
	m.Requests += o.Requests
	m.Unexpected += o.Unexpected
	m.Elapsed += o.Elapsed
	m.Latency.Merge(o.Latency)
	for k, v := range o.Outcomes {
		m.Outcomes[k] += v
	}
	m.Exhausted = m.Exhausted || o.Exhausted
	return nil
}
