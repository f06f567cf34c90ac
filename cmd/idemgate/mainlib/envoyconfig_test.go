package mainlib

import (
	"bytes"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestEnvoyConfigCommand: `idemgate envoy-config` prints
// envoy/ext_proc-filter.yaml for the shipped config (the cluster address from
// its grpc_listen), needs no secret, takes the address and cluster from
// flags, and refuses bad input.
func TestEnvoyConfigCommand(t *testing.T) {
	t.Setenv("IDEMGATE_KEY_K1", "")
	os.Unsetenv("IDEMGATE_KEY_K1")
	var out, errOut bytes.Buffer
	require.NoError(t, Main(t.Context(), []string{"envoy-config", "--config", "../../../envoy/idemgate.yaml"}, &out, &errOut), errOut.String())
	want, err := os.ReadFile("../../../envoy/ext_proc-filter.yaml")
	require.NoError(t, err)
	require.Equal(t, strings.Replace(string(want), "--config envoy/idemgate.yaml", "--config ../../../envoy/idemgate.yaml", 1), out.String())

	out.Reset()
	require.NoError(t, Main(t.Context(), []string{"envoy-config", "--config", "../../../envoy/idemgate.yaml", "--idemgate-address", "idemgate.payments.svc:9000", "--upstream-cluster", "api"}, &out, &errOut))
	require.Contains(t, out.String(), "socket_address: {address: idemgate.payments.svc, port_value: 9000}")
	require.Contains(t, out.String(), "type: STRICT_DNS", "a name needs DNS resolution")
	require.Contains(t, out.String(), "cluster: api\n")

	for _, args := range [][]string{{"envoy-config"}, {"envoy-config", "--bogus"}} {
		out.Reset()
		require.ErrorIs(t, Main(t.Context(), args, &out, &errOut), ErrUsage, "%v", args)
		require.Empty(t, out.String())
	}
	require.Error(t, Main(t.Context(), []string{"envoy-config", "--config", "../../../envoy/idemgate.yaml", "--idemgate-address", "nope"}, &out, &errOut))
}
