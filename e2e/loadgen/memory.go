package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemgate/idemgate/e2e/loadgen/driver"
	"github.com/idemgate/idemgate/e2e/loadgen/report"
	"github.com/idemgate/idemgate/internal/extprocdriver"
)

// runMemory measures idemgate's resident memory while many streams are open
// at once, per route: each stream sends its request headers and a request
// body of -memory-body bytes, gets both replies, and then holds (the
// upstream is "working") until all are open; VmRSS of the idemgate process
// is read before and while they are open, then the streams finish their
// response phase.
func (b *bench) runMemory(ctx context.Context) error {
	for _, r := range b.opts.memRoutes {
		if b.bin == "" {
			b.rep.Memory = append(b.rep.Memory, report.Memory{Route: r, Skipped: "idemgate unavailable"})
			continue
		}
		m, err := b.memoryRoute(ctx, r)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			b.log.Error("memory measurement failed", "route", r, "error", err)
			m = report.Memory{Route: r, Skipped: err.Error()}
		}
		b.rep.Memory = append(b.rep.Memory, m)
	}
	return nil
}

func (b *bench) memoryRoute(ctx context.Context, routeName string) (report.Memory, error) {
	o := b.opts
	m := report.Memory{Route: routeName, Streams: o.memStreams, BodyBytes: o.memBody}
	store := "memory"
	if b.haveStores() {
		store = "tiered"
		if err := b.resetStores(ctx); err != nil {
			return m, err
		}
	} else if routeName == "confirm" {
		return m, errors.New("the confirm route needs Redis and PostgreSQL")
	}

	// The held streams' requests, and a separate set for the warm-up.
	var rt *route
	var held, warm driver.Source
	var expect func(extprocdriver.Outcome) bool
	switch routeName {
	case "preview":
		rt, expect = b.preview, expectPreview
		body := paddedBody(previewBody, o.memBody)
		held = newFixedBodySource(rt, body, o.memStreams, 0)
		warm = newFixedBodySource(rt, body, 16, 0)
		m.BodyBytes = len(body)
	default:
		rt, expect = b.confirm, expectConfirm
		// Pad the base so that the body with its fingerprint has the size asked.
		sample, err := b.minter.mint(1, []byte(previewBody))
		if err != nil {
			return m, err
		}
		overhead := len(sample[0].body) - len(previewBody)
		base := paddedBody(previewBody, o.memBody-overhead)
		items, err := b.minter.mint(o.memStreams+2000, base)
		if err != nil {
			return m, err
		}
		held = &poolSource{route: rt, items: items[:o.memStreams], rng: newRNGs(o.memStreams, 5)}
		warm = &poolSource{route: rt, items: items[o.memStreams:], rng: newRNGs(16, 6)}
		m.BodyBytes = len(items[0].body)
	}

	p, err := b.startIdemgateFor(ctx, "memory-"+routeName, store)
	if err != nil {
		return m, err
	}
	defer p.stop(5 * time.Second)
	conns, err := extprocdriver.Dial(ctx, p.grpcAddr, o.memConns)
	if err != nil {
		return m, err
	}
	defer conns.Close()
	filter := extprocdriver.EnvoyFilter()
	// A memory measurement, not a latency one: a burst of openings on a busy
	// machine must not turn into 504s.
	filter.MessageTimeout = max(o.messageTimeout, 5*time.Second)

	// Warm-up: connection pools, prepared statements, heap grown to steady state.
	if _, err := (driver.Run{Conns: conns, Filter: filter, Source: warm, Concurrency: 16, Duration: time.Second, Expect: expect}).Execute(ctx); err != nil && !errors.Is(err, driver.ErrExhaustedInWarmup) {
		return m, fmt.Errorf("warm-up: %w", err)
	}
	settle()
	if m.Before, err = report.ResidentBytes(p.pid()); err != nil {
		return m, err
	}

	release := make(chan struct{})
	var (
		opened, failed atomic.Int64
		settled        = make(chan struct{}, o.memStreams)
		wg             sync.WaitGroup
		mu             sync.Mutex
		outcomes       = map[extprocdriver.Outcome]int{}
	)
	// At most 64 streams are being opened at any moment; a held stream no
	// longer counts.
	opening := make(chan struct{}, 64)
	deadline := time.NewTimer(2 * time.Minute)
	defer deadline.Stop()
	abandon := func() {
		close(release)
		wg.Wait()
	}
	start := time.Now()
	spawned := 0
spawn:
	for ; spawned < o.memStreams; spawned++ {
		req := held.Next(spawned)
		if req == nil {
			abandon()
			return m, errors.New("ran out of requests for the held streams")
		}
		select {
		case opening <- struct{}{}:
		case <-deadline.C:
			break spawn
		case <-ctx.Done():
			abandon()
			return m, ctx.Err()
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			isHeld := false
			out := filter.Do(ctx, conns.Next(), req, func(ctx context.Context) error {
				isHeld = true
				<-opening
				opened.Add(1)
				settled <- struct{}{}
				select {
				case <-release:
					return nil
				case <-ctx.Done():
					return ctx.Err()
				}
			})
			if !isHeld {
				<-opening
				failed.Add(1)
				settled <- struct{}{}
			}
			mu.Lock()
			outcomes[out]++
			mu.Unlock()
		}()
	}
wait:
	for n := 0; n < spawned; n++ {
		select {
		case <-settled:
		case <-deadline.C:
			break wait
		case <-ctx.Done():
			abandon()
			return m, ctx.Err()
		}
	}
	m.Reached = int(opened.Load())
	b.log.Info("streams open", "route", routeName, "open", m.Reached, "failed", failed.Load(), "took", time.Since(start).Round(time.Millisecond))
	settle()
	for i := 0; i < 3; i++ {
		rss, err := report.ResidentBytes(p.pid())
		if err != nil {
			abandon()
			return m, err
		}
		m.Open = max(m.Open, rss)
		time.Sleep(200 * time.Millisecond)
	}
	gauge := p.openStreamsGauge(ctx)
	abandon()
	time.Sleep(500 * time.Millisecond)
	if rss, err := report.ResidentBytes(p.pid()); err == nil {
		m.After = rss
	}

	var notes []string
	if gauge != "" {
		notes = append(notes, "idemgate_open_streams "+gauge)
	}
	bad := 0
	for out, n := range outcomes {
		if !expect(out) {
			bad += n
			notes = append(notes, fmt.Sprintf("%s ×%d", out, n))
		}
	}
	if bad > 0 {
		notes = append(notes, fmt.Sprintf("%d streams did not end as expected", bad))
	}
	m.Note = strings.Join(notes, "; ")
	b.log.Info("memory measured", "route", routeName, "rss_before", m.Before, "rss_open", m.Open, "per_stream_bytes", int(m.PerStream()), "note", m.Note)
	return m, nil
}

// settle pauses before a reading so that the server's work on the last
// messages is done. No GC is forced: the figure is what the kernel sees.
func settle() { time.Sleep(500 * time.Millisecond) }

// openStreamsGauge reads idemgate_open_streams from /metrics ("" if absent).
func (p *idemgateProcess) openStreamsGauge(ctx context.Context) string {
	var buf bytes.Buffer
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := p.get(ctx, p.adminAddr, "/metrics", &buf); err != nil {
		return ""
	}
	sc := bufio.NewScanner(&buf)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "idemgate_open_streams "); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}
