package testutil

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// StartRedisSentinel starts one redis-server in sentinel mode monitoring the
// master at masterAddr under masterName (quorum 1), and returns the
// sentinel's address. It is stopped at cleanup.
func StartRedisSentinel(t testing.TB, masterName, masterAddr string) string {
	t.Helper()
	return StartRedisSentinelDownAfter(t, masterName, masterAddr, 5*time.Second)
}

// StartRedisSentinelDownAfter is StartRedisSentinel with the time after
// which an unreachable master is considered down (and, with a replica to
// promote, failed over).
func StartRedisSentinelDownAfter(t testing.TB, masterName, masterAddr string, downAfter time.Duration) string {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		unavailable(t, "redis-server (Debian package redis-server)", err)
	}
	host, port, err := net.SplitHostPort(masterAddr)
	if err != nil {
		t.Fatalf("bad master address %q: %v", masterAddr, err)
	}
	sentinelPort := FreePort(t)
	dir := t.TempDir()
	conf := filepath.Join(dir, "sentinel.conf")
	// Sentinel rewrites its config file, so it lives in the test's own
	// directory.
	body := fmt.Sprintf("port %d\nbind 127.0.0.1\nprotected-mode no\ndir %s\n"+
		"sentinel monitor %s %s %s 1\nsentinel down-after-milliseconds %s %d\n",
		sentinelPort, dir, masterName, host, port, masterName, downAfter.Milliseconds())
	if err := os.WriteFile(conf, []byte(body), 0o600); err != nil {
		t.Fatalf("failed to write sentinel config: %v", err)
	}
	var out bytes.Buffer
	cmd := exec.Command("redis-server", conf, "--sentinel", "--loglevel", "warning")
	cmd.Dir = dir
	cmd.Stdout = &out
	cmd.Stderr = &out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatalf("failed to start redis sentinel: %v", err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-done
	})
	addr := fmt.Sprintf("127.0.0.1:%d", sentinelPort)
	if err := WaitForTCP(addr, 10*time.Second); err != nil {
		t.Fatalf("redis sentinel did not start: %v; output: %s", err, out.String())
	}
	return addr
}
