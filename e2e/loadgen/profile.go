package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"
)

// cellProfiler fetches pprof profiles from idemgate (its admin server, which
// serves /debug/pprof/ when started with serve --pprof) while a cell's
// window is measured: a CPU profile and an allocation delta profile,
// both covering the window. The figures of a profiled cell carry a note:
// the profiler itself costs the server some CPU.
type cellProfiler struct {
	active bool
	start  func()

	mu     sync.Mutex
	closed bool // wait was called: a late start fetches nothing
	wg     sync.WaitGroup
}

// wait returns when every fetch that started has finished.
func (p *cellProfiler) wait() {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.wg.Wait()
}

// profiler returns the profiler for one cell; inactive (start nil) unless
// profiling was asked for, the server is idemgate, the concurrency is the
// profiled one and the admin server serves pprof.
func (b *bench) profiler(ctx context.Context, spec cellSpec, c int) *cellProfiler {
	p := &cellProfiler{}
	o := b.opts
	if spec.idemgate == nil || c != o.profileConcurrency || (o.cpuProfileDir == "" && o.memProfileDir == "") {
		return p
	}
	if !spec.idemgate.hasPprof(ctx) {
		return p
	}
	p.active = true
	seconds := max(1, int(o.duration/time.Second))
	fetch := func(dir, path, suffix string) {
		if dir == "" {
			return
		}
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			file := filepath.Join(dir, fmt.Sprintf("%s-c%d.%s.pprof", spec.scenario, c, suffix))
			if err := b.saveProfile(ctx, spec.idemgate, path, file); err != nil {
				b.log.Warn("failed to fetch a profile", "file", file, "error", err)
				return
			}
			b.log.Info("profile written", "file", file)
		}()
	}
	p.start = func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		if p.closed {
			return
		}
		fetch(o.cpuProfileDir, fmt.Sprintf("/debug/pprof/profile?seconds=%d", seconds), "cpu")
		fetch(o.memProfileDir, fmt.Sprintf("/debug/pprof/allocs?seconds=%d", seconds), "allocs")
	}
	return p
}

func (b *bench) saveProfile(ctx context.Context, p *idemgateProcess, path, file string) error {
	if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
		return fmt.Errorf("failed to create the profile directory: %w", err)
	}
	f, err := os.Create(file)
	if err != nil {
		return fmt.Errorf("failed to create %s: %w", file, err)
	}
	defer f.Close()
	ctx, cancel := context.WithTimeout(ctx, b.opts.duration+30*time.Second)
	defer cancel()
	if err := p.get(ctx, p.pprofAddr, path, f); err != nil {
		return err
	}
	return f.Close()
}
