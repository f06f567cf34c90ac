package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sync"
	"time"
)

// idemgateServer is `idemgate serve` running as a child process.
type idemgateServer struct {
	*child
	grpcAddr, adminAddr string
	// approvalAddr is where the approvers' API (approval_listen) listens.
	approvalAddr string
}

// idemgateReadyTimeout bounds idemgate's start (the memory store needs no
// connection, so this is process start and two listeners).
const idemgateReadyTimeout = 30 * time.Second

// servingLine is idemgate's start-up log line in text format (the demo
// config asks for text logs), which names the addresses it bound:
// msg="idemgate serving" version=... grpc=127.0.0.1:N admin=127.0.0.1:M ...
var servingLine = regexp.MustCompile(`msg="idemgate serving" .*\bgrpc=(\S+) admin=(\S+)`)

// approvalsLine is logged before servingLine when approval_listen is set
// (the demo config sets it to port 0): msg="approvers' API serving" listen=...
var approvalsLine = regexp.MustCompile(`msg="approvers' API serving" listen=(\S+)`)

// startIdemgate runs `bin serve` on config (written to w.dir) with both
// listeners on loopback port 0, so no port can be taken between choosing
// and binding it, and waits for its `ready` line. key is the signing key,
// passed in the variable the config names.
func (w workspace) startIdemgate(ctx context.Context, bin string, config []byte, key string) (*idemgateServer, error) {
	cfg := filepath.Join(w.dir, "idemgate.yaml")
	if err := os.WriteFile(cfg, config, 0o600); err != nil {
		return nil, err
	}
	s := &idemgateServer{}
	var once sync.Once
	ready := make(chan struct{})
	var mu sync.Mutex
	c, err := w.startChild(childSpec{
		name: "idemgate", bin: bin,
		args: []string{"serve", "--config", cfg, "--grpc-listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"},
		env:  append(os.Environ(), demoKeyEnv+"="+key, demoAttestKeyEnv+"="+attestationKey(os.LookupEnv)),
		onLine: func(line string) {
			if m := servingLine.FindStringSubmatch(line); m != nil {
				mu.Lock()
				s.grpcAddr, s.adminAddr = m[1], m[2]
				mu.Unlock()
			}
			if m := approvalsLine.FindStringSubmatch(line); m != nil {
				mu.Lock()
				s.approvalAddr = m[1]
				mu.Unlock()
			}
			// serve prints this plain line once both listeners serve.
			if line == "ready" {
				once.Do(func() { close(ready) })
			}
		},
	})
	if err != nil {
		return nil, err
	}
	s.child = c
	timer := time.NewTimer(idemgateReadyTimeout)
	defer timer.Stop()
	select {
	case <-ready:
	case <-c.done:
		return nil, fmt.Errorf("idemgate failed to start: %w", c.exited())
	case <-ctx.Done():
		_ = c.stop(5 * time.Second)
		return nil, ctx.Err()
	case <-timer.C:
		_ = c.stop(5 * time.Second)
		return nil, fmt.Errorf("idemgate printed no ready line within %s", idemgateReadyTimeout)
	}
	mu.Lock()
	defer mu.Unlock()
	if s.grpcAddr == "" || s.adminAddr == "" {
		_ = c.stop(5 * time.Second)
		return nil, fmt.Errorf(`idemgate is ready but logged no msg="idemgate serving" line with its addresses`)
	}
	if s.approvalAddr == "" {
		_ = c.stop(5 * time.Second)
		return nil, fmt.Errorf(`idemgate is ready but logged no msg="approvers' API serving" line with its address`)
	}
	return s, nil
}
