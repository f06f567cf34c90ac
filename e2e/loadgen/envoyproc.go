package main

import (
	"context"
	"errors"
	"fmt"
	"github.com/idemgate/idemgate/envoy/envoytest"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// findEnvoy returns the pinned Envoy's absolute path: the -envoy flag or
// ENVOY_BIN or the repo-local install (envoytest.FindEnvoy, which checks the
// version against .envoy-version), else what .ci/envoy.sh prints, which
// installs it into .envoy/ when missing.
func findEnvoy(ctx context.Context, root, flagged string) (path, version string, err error) {
	want, err := envoytest.PinnedVersion()
	if err != nil {
		return "", "", err
	}
	if flagged != "" {
		got, err := envoytest.EnvoyVersion(flagged)
		if err != nil {
			return "", "", err
		}
		if got != want {
			return "", "", fmt.Errorf("%s is Envoy %s, .envoy-version pins %s", flagged, got, want)
		}
		return flagged, want, nil
	}
	if path, err := envoytest.FindEnvoy(); err == nil {
		return path, want, nil
	} else if os.Getenv(envoytest.EnvoyBinEnv) != "" {
		return "", "", err
	}
	cmd := exec.CommandContext(ctx, filepath.Join(root, ".ci", "envoy.sh"))
	cmd.Stderr = os.Stderr // its progress line while it downloads
	out, err := cmd.Output()
	if err != nil {
		return "", "", fmt.Errorf("no Envoy: .ci/envoy.sh failed (%v); install it with `make envoy` or set ENVOY_BIN", err)
	}
	return strings.TrimSpace(string(out)), want, nil
}

// envoyProcess is one running Envoy and where it listens.
type envoyProcess struct {
	*child
	listen, admin string
	accessLog     string
}

// startEnvoy runs bin with the edited shipped bootstrap. Two worker threads
// (the machine's cores), no hot restart (no shared memory to collide with
// other Envoys on the machine), warnings only on stderr; the access log
// (stdout) goes to a file. Ready means the admin's /ready says LIVE.
func startEnvoy(ctx context.Context, bin, dir, name string, e envoyEdits) (*envoyProcess, error) {
	for _, p := range []*string{&e.listen, &e.admin} {
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		*p = fmt.Sprintf("127.0.0.1:%d", port)
	}
	cfg, err := renderEnvoyConfig(e)
	if err != nil {
		return nil, err
	}
	path := filepath.Join(dir, name+".envoy.yaml")
	if err := os.WriteFile(path, cfg, 0o600); err != nil {
		return nil, fmt.Errorf("failed to write %s: %w", path, err)
	}
	p := &envoyProcess{listen: e.listen, admin: e.admin, accessLog: filepath.Join(dir, name+".access.log")}
	ready := func() error {
		c := http.Client{Timeout: time.Second}
		resp, err := c.Get("http://" + p.admin + "/ready")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return errors.New(resp.Status)
		}
		return tcpProbe(p.listen)()
	}
	p.child, err = startChild(ctx, childSpec{
		name:       "envoy (" + name + ")",
		path:       bin,
		args:       []string{"-c", path, "--concurrency", "2", "--disable-hot-restart", "--log-level", "warning"},
		probe:      ready,
		timeout:    60 * time.Second,
		stdoutFile: p.accessLog,
	})
	if err != nil {
		return nil, err
	}
	return p, nil
}
