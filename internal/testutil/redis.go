package testutil

import (
	"bytes"
	"fmt"
	"net"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"
)

// RedisServer is a redis-server process owned by one test, on a free loopback
// port, keeping nothing on disk. It may be flushed, killed and restarted.
type RedisServer struct {
	t       testing.TB
	Addr    string
	port    int
	dir     string
	args    []string
	mu      sync.Mutex
	cmd     *exec.Cmd
	waitErr chan error
}

// StartRedis starts a redis-server for this test and stops it at cleanup.
// Extra arguments are passed to redis-server (e.g. "--cluster-enabled", "yes").
func StartRedis(t testing.TB, extra ...string) *RedisServer {
	t.Helper()
	return startRedis(t, func(port int) []string {
		return append([]string{"--port", strconv.Itoa(port)}, extra...)
	})
}

// startRedis runs redis-server with the common arguments plus listen(port),
// which says how to listen on the free port it picked.
func startRedis(t testing.TB, listen func(port int) []string) *RedisServer {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		unavailable(t, "redis-server (Debian package redis-server)", err)
	}
	port := FreePort(t)
	dir := t.TempDir()
	r := &RedisServer{
		t:    t,
		Addr: fmt.Sprintf("127.0.0.1:%d", port),
		port: port,
		dir:  dir,
		args: append([]string{
			"--bind", "127.0.0.1",
			"--save", "", "--appendonly", "no", "--dir", dir,
			"--protected-mode", "no", "--loglevel", "warning",
		}, listen(port)...),
	}
	if err := r.start(); err != nil {
		t.Fatalf("failed to start redis-server: %v", err)
	}
	t.Cleanup(r.Kill)
	return r
}

func (r *RedisServer) start() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out bytes.Buffer
	cmd := exec.Command("redis-server", r.args...)
	cmd.Dir = r.dir
	cmd.Stdout = &out
	cmd.Stderr = &out
	// Own process group, so a test's kill never reaches anything else.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return err
	}
	r.cmd = cmd
	r.waitErr = make(chan error, 1)
	go func() { r.waitErr <- cmd.Wait() }()
	if err := WaitForTCP(r.Addr, 10*time.Second); err != nil {
		_ = cmd.Process.Kill()
		return fmt.Errorf("%w; output: %s", err, out.String())
	}
	return nil
}

// Kill stops the server with SIGKILL (a crash, nothing flushed) and waits for it.
func (r *RedisServer) Kill() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cmd == nil {
		return
	}
	_ = r.cmd.Process.Kill()
	<-r.waitErr
	r.cmd = nil
}

// Restart starts the server again on the same port after Kill. Its data is
// gone, as after a failover to an empty replica.
func (r *RedisServer) Restart() {
	r.t.Helper()
	if err := r.start(); err != nil {
		r.t.Fatalf("failed to restart redis-server: %v", err)
	}
}

// Dir is the server's working directory (cluster config files live there).
func (r *RedisServer) Dir() string { return r.dir }

// StartRedisCluster starts n cluster-enabled redis-servers, joins them into a
// cluster with every slot covered (no replicas), waits until the cluster is
// ok, and returns their addresses. Needs redis-cli.
func StartRedisCluster(t testing.TB, n int) []string {
	t.Helper()
	if _, err := exec.LookPath("redis-cli"); err != nil {
		unavailable(t, "redis-cli (Debian package redis-tools)", err)
	}
	addrs := make([]string, 0, n)
	for i := 0; i < n; i++ {
		dir := t.TempDir()
		s := StartRedis(t, "--cluster-enabled", "yes",
			"--cluster-config-file", filepath.Join(dir, "nodes.conf"),
			"--cluster-node-timeout", "2000")
		addrs = append(addrs, s.Addr)
	}
	args := append([]string{"--cluster", "create"}, addrs...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	out, err := exec.Command("redis-cli", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("failed to create redis cluster: %v\n%s", err, out)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		ok := true
		for _, a := range addrs {
			host, port, _ := net.SplitHostPort(a)
			info, err := exec.Command("redis-cli", "-h", host, "-p", port, "cluster", "info").Output()
			if err != nil || !bytes.Contains(info, []byte("cluster_state:ok")) {
				ok = false
				break
			}
		}
		if ok {
			return addrs
		}
		if time.Now().After(deadline) {
			t.Fatalf("redis cluster did not become ok within 20s")
		}
		time.Sleep(100 * time.Millisecond)
	}
}
