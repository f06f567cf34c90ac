package envoy

import (
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/cmd/idemgate/settings"
	"github.com/idemgate/idemgate/envoy/envoytest"
	"github.com/idemgate/idemgate/extproc/config"
)

// TestIdemgateYAMLIsAcceptedByTheLoader runs idemgate's own config loader (what
// `idemgate check-config` runs) on envoy/idemgate.yaml with the environment
// docker-compose gives it, and checks that the loose reading the Envoy
// invariants rely on agrees with what idemgate will actually run.
func TestIdemgateYAMLIsAcceptedByTheLoader(t *testing.T) {
	env := loadCompose(t).Services["idemgate"].Environment
	env["IDEMGATE_KEY_K1"] = newSigningKey(t) // compose takes it from the shell
	opts := config.Options{
		LookupEnv: func(name string) (string, bool) { v, ok := env[name]; return v, ok },
		ReadFile: func(p string) ([]byte, error) {
			return nil, fmt.Errorf("envoy/idemgate.yaml should read no file, read %s", p)
		},
	}
	cfg, warnings, err := settings.Parse("envoy/idemgate.yaml", readFile(t, "idemgate.yaml"), ".", opts)
	require.NoError(t, err)
	require.Empty(t, warnings)

	loose, err := envoytest.ReadIdemgateConfig(readFile(t, "idemgate.yaml"))
	require.NoError(t, err)
	requireSameConfig(t, loose, cfg)
}

func newSigningKey(t *testing.T) string {
	t.Helper()
	b := make([]byte, 32)
	_, err := rand.Read(b)
	require.NoError(t, err)
	return base64.StdEncoding.EncodeToString(b)
}

// requireSameConfig compares the values the invariants use with the loader's.
func requireSameConfig(t *testing.T, loose *envoytest.IdemgateConfig, cfg *settings.Settings) {
	rt := cfg.Runtime
	t.Helper()
	require.Equal(t, loose.GRPCListen, cfg.GRPCListen)
	require.Equal(t, loose.AdminListen, cfg.AdminListen)
	require.Equal(t, loose.Subject.Header, rt.Subject.Header)
	require.Equal(t, time.Duration(loose.Store.Timeout), rt.Store.Timeout)
	require.Equal(t, time.Duration(loose.TTL.InFlight), rt.TTL.InFlight)
	require.Equal(t, loose.Limits.MaxBodyBytes, rt.Limits.MaxBodyBytes)
	require.Equal(t, time.Duration(loose.Drain.Period), cfg.Drain.Period)
	require.Equal(t, time.Duration(loose.Drain.Timeout), cfg.Drain.Timeout)
	require.Equal(t, "tiered", cfg.Store.Backend(), "the shipped configs run Redis + PostgreSQL")
	require.Len(t, rt.Operations, len(loose.Operations))
	for i, op := range rt.Operations {
		l := loose.Operations[i]
		require.Equal(t, l.Preview.Path, op.Preview.Template.String())
		require.Equal(t, l.Confirm.Path, op.Confirm.Template.String())
		require.Equal(t, l.Status.Path, op.Status.Template.String())
		require.Equal(t, time.Duration(l.UpstreamTimeout), op.UpstreamTimeout)
		require.NotNil(t, l.UpstreamRetries)
		require.Equal(t, *l.UpstreamRetries, op.UpstreamRetries)
		require.Equal(t, "idempotency-key", op.DownstreamHeader)
	}
}
