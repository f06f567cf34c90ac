package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/idemgate/idemgate/envoy"
	"github.com/idemgate/idemgate/envoy/envoytest"
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

// stopper is a process of the through-Envoy table (a child or an Envoy):
// checked before each cell, stopped at the end.
type stopper interface {
	checkAlive() error
	stop(grace time.Duration)
}

// envoyProcess is one running Envoy of the benchmark.
type envoyProcess struct {
	*envoytest.Envoy
	name string
}

func (p *envoyProcess) stop(grace time.Duration) { _ = p.Stop(grace) }

func (p *envoyProcess) checkAlive() error {
	select {
	case <-p.Done():
		return fmt.Errorf("envoy (%s) %w (%v): %s", p.name, errNotRunning, p.Err(), p.Tail())
	default:
		return nil
	}
}

// startEnvoy runs bin on the shipped bootstrap with e applied, the listener
// and admin on loopback ports the kernel picks. Two worker threads (the
// machine's cores), no hot restart, warnings only; the access log (stdout)
// goes to the file <name>.access.log in dir.
func startEnvoy(ctx context.Context, bin, dir, name string, e envoytest.Edits) (*envoyProcess, error) {
	e.Listen, e.Admin = "127.0.0.1:0", "127.0.0.1:0"
	cfg, err := envoytest.RenderBootstrap(envoy.BootstrapYAML(), e)
	if err != nil {
		return nil, err
	}
	accessLog, err := os.Create(filepath.Join(dir, name+".access.log"))
	if err != nil {
		return nil, err
	}
	// Envoy holds its own descriptor once started.
	defer accessLog.Close()
	p, err := envoytest.Start(ctx, envoytest.Options{
		Bin: bin, Bootstrap: cfg, Dir: dir, Name: name,
		Concurrency: 2, Listener: envoytest.IngressListener, Stdout: accessLog,
	})
	if err != nil {
		return nil, fmt.Errorf("envoy (%s): %w", name, err)
	}
	return &envoyProcess{Envoy: p, name: name}, nil
}
