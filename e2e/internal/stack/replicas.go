package stack

import (
	"testing"
	"time"

	"github.com/idemgate/idemgate/envoy"
	"github.com/idemgate/idemgate/envoy/envoytest"
)

// This file exports the pieces of a stack that a multi-replica topology
// (e2e/chaos) assembles itself: several idemgate processes sharing stores,
// each behind its own Envoy. Start keeps building the one-replica stack.

// ReplicaConfig is what RenderIdemgateConfig changes in the shipped
// envoy/idemgate.yaml (see idemgateConfig).
type ReplicaConfig struct {
	GRPCAddr, AdminAddr string
	// RedisAddr is written as the single store.redis.addrs entry; a caller
	// that runs Sentinel edits mode, addrs and master_name afterwards.
	RedisAddr       string
	FingerprintTTL  time.Duration
	InFlightTTL     time.Duration
	IgnoreKeys      bool
	UpstreamTimeout time.Duration
}

// RenderIdemgateConfig derives an idemgate.yaml from the shipped one, with the
// widened store deadlines every stack uses.
func RenderIdemgateConfig(c ReplicaConfig) ([]byte, error) {
	return idemgateConfig{
		grpcAddr: c.GRPCAddr, adminAddr: c.AdminAddr, redisAddr: c.RedisAddr,
		fingerprintTTL: c.FingerprintTTL, inFlightTTL: c.InFlightTTL,
		ignoreKeys: c.IgnoreKeys, upstreamTimeout: c.UpstreamTimeout,
	}.render()
}

// NewSigningKey returns a fresh signing key as `idemgate keygen` prints it.
func NewSigningKey() (string, error) { return newSigningKey() }

// IdemgateSpec is an idemgate child process to run.
type IdemgateSpec struct {
	Bin        string
	ConfigPath string // the config it serves
	// SigningKey and DSN (PostgreSQL's) are put in its environment, as the
	// shipped config reads them.
	SigningKey, DSN string
	// GRPCAddr and AdminAddr are where the config has it listen.
	GRPCAddr, AdminAddr string
}

// NewIdemgate returns the idemgate child process of spec, not started.
func NewIdemgate(spec IdemgateSpec) *Idemgate {
	return &Idemgate{
		bin: spec.Bin, configPath: spec.ConfigPath, env: childEnv(spec.SigningKey, spec.DSN),
		GRPCAddr: spec.GRPCAddr, AdminAddr: spec.AdminAddr, log: &LogBuffer{},
	}
}

// StartProcess runs the server and waits for its `ready` line only, not for
// /readyz: a replica restarted while a store is down must still take
// streams (docs/design.md §7).
func (g *Idemgate) StartProcess() error { return g.startProcess() }

// BootstrapOptions are RenderBootstrap's changes beyond the addresses.
type BootstrapOptions struct {
	// ConfirmRouteTimeout replaces the confirm route's timeout when > 0.
	ConfirmRouteTimeout time.Duration
	// ConfirmRetryOn replaces the confirm route's retry_policy.retry_on
	// when set: a downstream that ignores Idempotency-Key must not get a
	// request retried after it may have arrived (see e2e/chaos).
	ConfirmRetryOn string
}

// RenderBootstrap returns the shipped envoy.yaml bound to loopback port 0
// (listener and admin), its idemgate and payments clusters pointed at the
// given addresses, the stacks' ext_proc message timeout, and o applied.
func RenderBootstrap(idemgateAddr, paymentsAddr string, o BootstrapOptions) ([]byte, error) {
	return envoytest.RenderBootstrap(envoy.BootstrapYAML(), envoytest.Edits{
		Listen: "127.0.0.1:0", Admin: "127.0.0.1:0",
		Clusters:            map[string]string{envoytest.IdemgateCluster: idemgateAddr, envoytest.PaymentsCluster: paymentsAddr},
		ConfirmRouteTimeout: o.ConfirmRouteTimeout,
		ConfirmRetryOn:      o.ConfirmRetryOn,
		MessageTimeout:      extProcMessageTimeout,
	})
}

// StartEnvoy runs the pinned Envoy binary on bootstrap and waits until it is
// ready; the caller closes it.
func StartEnvoy(t testing.TB, bin string, bootstrap []byte) (*Envoy, error) {
	return startEnvoy(t, bin, bootstrap)
}
