package mainlib

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/internal/testutil"
)

// listenerConfig is a memory-store config with extra top-level lines.
func listenerConfig(t *testing.T, extra string) string {
	t.Helper()
	t.Setenv("IDEMGATE_KEY_K1", testKey)
	path := filepath.Join(t.TempDir(), "idemgate.yaml")
	require.NoError(t, os.WriteFile(path, []byte(`signing: {active_key: k1, keys: {k1: {env: IDEMGATE_KEY_K1}}}
drain: {period: 0s, timeout: 2s}
`+extra+`
operations:
  - name: transfer
    scope: payments.transfer
    preview: {method: POST, path: /v1/transfers/preview}
    confirm: {method: POST, path: /v1/transfers/confirm}
    status:  {method: POST, path: /v1/transfers/status}
    preview_tool: transfer_preview
    status_tool: transfer_status
    params: [{path: amount, type: decimal}]
`), 0o600))
	return path
}

// runServe runs serve with args until it returns or ctx ends.
func runServe(ctx context.Context, stderr io.Writer, args ...string) error {
	return Main(ctx, append([]string{"serve"}, args...), io.Discard, stderr)
}

// TestServeRefusesPprofUnlessAdminIsLoopback: the profiler exposes process
// internals; serve refuses --pprof on a routable admin_listen (the
// default :9090 included) before it listens on anything.
func TestServeRefusesPprofUnlessAdminIsLoopback(t *testing.T) {
	path := listenerConfig(t, "")
	for _, admin := range []string{"", "0.0.0.0:0", ":0", "10.0.0.1:9090"} {
		args := []string{"--config", path, "--grpc-listen", "127.0.0.1:0", "--pprof"}
		if admin != "" {
			args = append(args, "--admin-listen", admin)
		}
		err := runServe(t.Context(), io.Discard, args...)
		require.Error(t, err, "admin %q", admin)
		require.Contains(t, err.Error(), "--pprof needs a loopback admin_listen")
	}
}

// TestServeGRPCListenOverrideObeysTheRule: --grpc-listen cannot open the
// ext_proc listener to the network unless the config allows it; with
// grpc_plaintext_remote: true serve starts, warns, and exports the gauge.
func TestServeGRPCListenOverrideObeysTheRule(t *testing.T) {
	err := runServe(t.Context(), io.Discard, "--config", listenerConfig(t, ""), "--grpc-listen", "0.0.0.0:0", "--admin-listen", "127.0.0.1:0")
	require.Error(t, err)
	require.Contains(t, err.Error(), `--grpc-listen: "0.0.0.0:0" is a routable address served in plaintext`)

	err = runServe(t.Context(), io.Discard, "--config", listenerConfig(t, ""), "--grpc-listen", "unix://relative.sock", "--admin-listen", "127.0.0.1:0")
	require.ErrorContains(t, err, "invalid unix socket address")

	path := listenerConfig(t, "grpc_listen: \"0.0.0.0:0\"\ngrpc_plaintext_remote: true")
	ctx, cancel := context.WithCancel(t.Context())
	run := goServe(ctx, "--config", path, "--admin-listen", "127.0.0.1:0")
	_, adminAddr := run.awaitReady(t)
	require.Contains(t, run.stderr.String(), "PLAINTEXT ON A ROUTABLE ADDRESS: grpc_plaintext_remote is true")
	metrics := httpGet(t, http.DefaultClient, "http://"+adminAddr+"/metrics")
	require.Contains(t, metrics, `idemgate_listener_plaintext_remote{listener="grpc"} 1`)
	require.Contains(t, metrics, `idemgate_listener_plaintext_remote{listener="approval"} 0`)
	require.Contains(t, metrics, `idemgate_security_events_total{reason="peer_refused"} 0`)
	cancel()
	require.NoError(t, run.wait())
}

// TestServeApprovalTLS: approval_tls serves the approvers' API over TLS on
// a routable approval_listen (plain HTTP gets no answer from it), and a
// replaced certificate is served to new connections without a restart; a
// routable approval_listen without approval_tls is refused.
func TestServeApprovalTLS(t *testing.T) {
	err := runServe(t.Context(), io.Discard, "--config", listenerConfig(t, `approval_listen: ":0"`), "--grpc-listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0")
	require.ErrorContains(t, err, `approval_listen: ":0" is a routable address served in plaintext`)

	dir := t.TempDir()
	ca := testutil.NewCA(t, "approvals CA")
	first := ca.Issue(t, testutil.Leaf{Name: "approvals", DNS: []string{"approvals.example"}})
	certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	testutil.WriteFile(t, certFile, first.CertPEM)
	testutil.WriteFile(t, keyFile, first.KeyPEM)
	port := testutil.FreePort(t)
	path := listenerConfig(t, fmt.Sprintf("approval_listen: \"0.0.0.0:%d\"\napproval_tls: {cert_file: %s, key_file: %s}", port, certFile, keyFile))
	ctx, cancel := context.WithCancel(t.Context())
	run := goServe(ctx, "--config", path, "--grpc-listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0")
	_, adminAddr := run.awaitReady(t)

	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	// Each request on a new connection: a new handshake.
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: roots, ServerName: "approvals.example", MinVersion: tls.VersionTLS12}, DisableKeepAlives: true,
	}}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	served := func() *x509.Certificate {
		resp, err := client.Get("https://" + addr + "/v1/approvals/unknown")
		require.NoError(t, err)
		defer resp.Body.Close()
		require.Equal(t, http.StatusUnauthorized, resp.StatusCode, "the approvers' API answers over TLS (no token: 401)")
		return resp.TLS.PeerCertificates[0]
	}
	require.Equal(t, first.Serial, served().SerialNumber)
	plain, err := http.Get("http://" + addr + "/v1/approvals/unknown")
	if err == nil {
		require.Equal(t, http.StatusBadRequest, plain.StatusCode, "plain HTTP is not served")
		plain.Body.Close()
	}

	second := ca.Issue(t, testutil.Leaf{Name: "approvals (renewed)", DNS: []string{"approvals.example"}})
	testutil.WriteFile(t, keyFile, second.KeyPEM)
	testutil.WriteFile(t, certFile, second.CertPEM)
	require.Eventually(t, func() bool { return served().SerialNumber.Cmp(second.Serial) == 0 }, 10*time.Second, 100*time.Millisecond)
	metrics := httpGet(t, http.DefaultClient, "http://"+adminAddr+"/metrics")
	require.Contains(t, metrics, `idemgate_tls_reloads_total{listener="approval",result="ok"} 1`)
	require.Equal(t, float64(second.Cert.NotAfter.Unix()), sampleValue(t, metrics, `idemgate_tls_certificate_expiry_timestamp_seconds{file="cert",listener="approval"}`))
	cancel()
	require.NoError(t, run.wait())
}

func httpGet(t *testing.T, c *http.Client, url string) string {
	t.Helper()
	resp, err := c.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return string(b)
}

// sampleValue is the value of one sample of a /metrics page.
func sampleValue(t *testing.T, metrics, sample string) float64 {
	t.Helper()
	for _, line := range strings.Split(metrics, "\n") {
		if v, ok := strings.CutPrefix(line, sample+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			require.NoError(t, err)
			return f
		}
	}
	t.Fatalf("no sample %s", sample)
	return 0
}

// TestServeApprovalsOnUnixSocket: approval_listen may be a unix socket
// (the SSO proxy beside idemgate): mode 0660, the approvers' API answers
// on it, and it is removed when serve stops.
func TestServeApprovalsOnUnixSocket(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "approvals.sock")
	path := listenerConfig(t, fmt.Sprintf("approval_listen: \"unix://%s\"", sock))
	ctx, cancel := context.WithCancel(t.Context())
	run := goServe(ctx, "--config", path, "--grpc-listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0")
	run.awaitReady(t)
	fi, err := os.Stat(sock)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o660), fi.Mode().Perm())
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", sock)
		},
	}}
	resp, err := client.Get("http://approvals/v1/approvals/unknown")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusUnauthorized, resp.StatusCode, "the approvers' API answers (no token: 401)")
	cancel()
	require.NoError(t, run.wait())
	_, err = os.Stat(sock)
	require.ErrorIs(t, err, os.ErrNotExist, "removed when serve stops")
}
