package envoytest

import (
	"bytes"
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/envoy"
)

// TestStartReadsTheBoundPortsBack runs the pinned Envoy on the shipped
// bootstrap bound to port 0 (clusters pointed at closed ports: the idemgate
// cluster's health check fails, which does not hold up readiness).
func TestStartReadsTheBoundPortsBack(t *testing.T) {
	bin := RequireEnvoy(t)
	cfg, err := RenderBootstrap(envoy.BootstrapYAML(), Edits{
		Listen: "127.0.0.1:0", Admin: "127.0.0.1:0",
		Clusters: map[string]string{IdemgateCluster: "127.0.0.1:1", PaymentsCluster: "127.0.0.1:1"},
	})
	require.NoError(t, err)
	var log bytes.Buffer
	e, err := Start(t.Context(), Options{Bin: bin, Bootstrap: cfg, Dir: t.TempDir(), Listener: IngressListener, Stderr: &log, FlushInterval: 20 * time.Millisecond})
	require.NoError(t, err)
	defer e.Kill()
	for _, addr := range []string{e.ListenAddr, e.AdminAddr} {
		_, port, err := net.SplitHostPort(addr)
		require.NoError(t, err)
		require.NotEqual(t, "0", port)
	}
	n, err := e.Stat("server.live")
	require.NoError(t, err)
	require.Equal(t, int64(1), n)
	require.NoError(t, e.Stop(10*time.Second), "SIGTERM is a clean exit")
	<-e.Done()
}

func TestStartReportsAnEnvoyThatDies(t *testing.T) {
	bin := RequireEnvoy(t)
	_, err := Start(context.Background(), Options{Bin: bin, Bootstrap: []byte("static_resources: {listeners: [{name: x}]}\n"), Dir: t.TempDir()})
	require.ErrorContains(t, err, "envoy exited during start-up")
	require.True(t, strings.Contains(err.Error(), "its last lines"), err.Error())
}

func TestTailKeepsTheLastLines(t *testing.T) {
	var tl tail
	require.Equal(t, "(no output)", tl.String())
	for i := 0; i < tailLines+5; i++ {
		_, _ = tl.Write([]byte("line\n"))
	}
	_, _ = tl.Write([]byte("par"))
	_, _ = tl.Write([]byte("tial"))
	lines := strings.Split(tl.String(), "\n")
	require.Len(t, lines, tailLines+1)
	require.Equal(t, "partial", lines[len(lines)-1])
}
