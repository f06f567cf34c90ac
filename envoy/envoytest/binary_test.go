package envoytest

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// fakeEnvoy writes a script that answers --version like Envoy does.
func fakeEnvoy(t *testing.T, version string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "envoy")
	script := "#!/bin/sh\necho 'envoy  version: 9e5580933739775e8bce696a57a2e1bc99368f23/" + version + "/Clean/RELEASE/BoringSSL'\n"
	require.NoError(t, os.WriteFile(path, []byte(script), 0o755))
	return path
}

func TestFindEnvoyChecksThePin(t *testing.T) {
	pin, err := PinnedVersion()
	require.NoError(t, err)

	t.Setenv(EnvoyBinEnv, fakeEnvoy(t, pin))
	bin, err := findEnvoy()
	require.NoError(t, err)
	require.Equal(t, os.Getenv(EnvoyBinEnv), bin)

	t.Setenv(EnvoyBinEnv, fakeEnvoy(t, "1.2.3"))
	_, err = findEnvoy()
	require.ErrorContains(t, err, "is Envoy 1.2.3, the pin (.envoy-version) is "+pin)
	require.ErrorContains(t, err, "make envoy")

	t.Setenv(EnvoyBinEnv, "envoy")
	_, err = findEnvoy()
	require.ErrorContains(t, err, "ENVOY_BIN=envoy is not an absolute path")
}

func TestEnvoyVersionPattern(t *testing.T) {
	m := envoyVersionRE.FindStringSubmatch("envoy  version: 6b9db09c69965d5bfb37bdd29693f8b7f9e9e9ec/1.40.0/Clean/RELEASE/BoringSSL")
	if len(m) != 2 || m[1] != "1.40.0" {
		t.Fatalf("got %q", m)
	}
}
