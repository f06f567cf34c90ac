package e2e

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/idemgate/idemgate/e2e/internal/stack"
	"github.com/idemgate/idemgate/internal/testutil"
)

// The identities of the ext_proc channel (docs/design.md §12): idemgate's
// server name, and the one client SAN the tests allow.
const (
	idemgateServerName = "idemgate.payments.svc"
	envoySPIFFE        = "spiffe://cluster.local/ns/payments/sa/envoy"
)

// meshPKI is the test's certificates on disk: the mesh CA that signs
// idemgate's server certificate and Envoy's client certificate.
type meshPKI struct {
	dir   string
	ca    *testutil.CA
	opts  *stack.GRPCTLS
	envoy testutil.Issued
}

func newMeshPKI(t *testing.T) *meshPKI {
	dir := t.TempDir()
	p := &meshPKI{dir: dir, ca: testutil.NewCA(t, "mesh CA")}
	server := p.ca.Issue(t, testutil.Leaf{Name: "idemgate", DNS: []string{idemgateServerName}, IPs: []net.IP{net.IPv4(127, 0, 0, 1)}})
	p.envoy = p.ca.Issue(t, testutil.Leaf{Name: "envoy", Client: true, URIs: []string{envoySPIFFE}})
	p.opts = &stack.GRPCTLS{
		ServerCertFile: p.file(t, "server.pem", server.CertPEM), ServerKeyFile: p.file(t, "server-key.pem", server.KeyPEM),
		ClientCAFile: p.file(t, "client-ca.pem", p.ca.PEM), ClientSANs: []string{envoySPIFFE},
		EnvoyCertFile: p.file(t, "envoy.pem", p.envoy.CertPEM), EnvoyKeyFile: p.file(t, "envoy-key.pem", p.envoy.KeyPEM),
		EnvoyTrustedCAFile: p.file(t, "envoy-trusted-ca.pem", p.ca.PEM), ServerSAN: idemgateServerName,
	}
	return p
}

func (p *meshPKI) file(t *testing.T, name string, data []byte) string {
	path := filepath.Join(p.dir, name)
	testutil.WriteFile(t, path, data)
	return path
}

// TestMTLSEnvoyDrivesPreviewConfirmReplay: with grpc_tls, the pinned Envoy
// presenting its client certificate (cluster transport_socket with an
// UpstreamTlsContext that verifies idemgate's certificate and SAN) drives
// preview, confirm and the replay of the confirm; no peer was refused.
func TestMTLSEnvoyDrivesPreviewConfirmReplay(t *testing.T) {
	pki := newMeshPKI(t)
	s := startStack(t, stack.Options{GRPCTLS: pki.opts})
	requireChannelWorks(t, s, s.Agent("alice"), true)

	for _, reason := range []string{"no_certificate", "untrusted_certificate", "san_not_allowed", "handshake_failed"} {
		requireMetric(t, s, `idemgate_grpc_peers_refused_total{reason="`+reason+`"}`, 0)
	}
	requireMetric(t, s, `idemgate_security_events_total{reason="peer_refused"}`, 0)
	requireMetric(t, s, `idemgate_listener_plaintext_remote{listener="grpc"}`, 0)
	server, err := tls.LoadX509KeyPair(pki.opts.ServerCertFile, pki.opts.ServerKeyFile)
	require.NoError(t, err)
	requireMetric(t, s, `idemgate_tls_certificate_expiry_timestamp_seconds{file="cert",listener="grpc"}`, float64(server.Leaf.NotAfter.Unix()))
	requireMetric(t, s, `idemgate_tls_certificate_expiry_timestamp_seconds{file="client_ca",listener="grpc"}`, float64(pki.ca.Cert.NotAfter.Unix()))
	ssl, err := s.Envoy.Stat("cluster.idemgate.ssl.handshake")
	require.NoError(t, err)
	require.Positive(t, ssl, "Envoy reached idemgate over TLS")
}

// requireChannelWorks drives preview, confirm and the replay of the confirm
// through a's Envoy; alone says nothing else executes meanwhile.
func requireChannelWorks(t *testing.T, s *stack.Stack, a *stack.Agent, alone bool) {
	t.Helper()
	executions := s.Payments.Executions()
	p := preview(t, a, transfer("25.00", "acct_bob", "private channel"))
	first := confirm(t, a, p.ConfirmBody())
	requireExecuted(t, first)
	again := confirm(t, a, p.ConfirmBody())
	if a.Base() == s.URL() {
		requireReplay(t, s, again, p.Nonce, first.Body)
	} else {
		// requireReplay finds the request in the stack's own Envoy's log.
		require.Equal(t, http.StatusOK, again.StatusCode, "%s", again)
		require.NotNil(t, again.Envelope, "%s", again)
		require.Equal(t, "already_completed", again.Envelope.Status)
		require.True(t, again.Replayed())
		require.Equal(t, string(first.Body), string(again.Envelope.Result), "the replay carries the first execution's result")
	}
	if alone {
		require.Equal(t, executions+1, s.Payments.Executions(), "executed once")
	}
}

func requireMetric(t *testing.T, s *stack.Stack, sample string, want float64) {
	t.Helper()
	got, err := s.Idemgate.Metric(sample)
	require.NoError(t, err)
	require.Equal(t, want, got, sample)
}

// extProcClient is a real gRPC client of idemgate's ext_proc service.
type extProcClient struct {
	name  string
	creds credentials.TransportCredentials
}

// tryStream opens an ext_proc stream and asks about a request no
// operation matches (the passthrough answer needs no store): nil means
// idemgate answered.
func (c extProcClient) tryStream(target string) error {
	conn, err := grpc.NewClient(target, grpc.WithTransportCredentials(c.creds))
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stream, err := extprocv3.NewExternalProcessorClient(conn).Process(ctx, grpc.WaitForReady(false))
	if err != nil {
		return err
	}
	err = stream.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{
		RequestHeaders: &extprocv3.HttpHeaders{Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
			{Key: ":method", RawValue: []byte("GET")}, {Key: ":path", RawValue: []byte("/not-guarded")},
			{Key: ":authority", RawValue: []byte("payments")}, {Key: "x-idemgate-subject", RawValue: []byte("mallory")},
		}}, EndOfStream: true},
	}})
	if err != nil {
		return err
	}
	_, err = stream.Recv()
	return err
}

// tlsClient is a gRPC client that trusts the mesh CA and presents certs.
func tlsClient(name string, ca *testutil.CA, certs ...tls.Certificate) extProcClient {
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	return extProcClient{name: name, creds: credentials.NewTLS(&tls.Config{
		RootCAs: roots, ServerName: idemgateServerName, Certificates: certs, MinVersion: tls.VersionTLS12,
	})}
}

// TestMTLSRefusesPeers: real gRPC clients without a certificate, with
// another CA's, or with a SAN not in client_sans open no stream: the RPC
// fails, idemgate ran no Process (no decision, no passthrough), and each
// is a security_alert with the peer's address and presented SAN plus the
// counter with its reason. A plaintext client fails the handshake and is
// counted. The same client with the right certificate is answered, so the
// refusals are for identity alone.
func TestMTLSRefusesPeers(t *testing.T) {
	pki := newMeshPKI(t)
	s := startStack(t, stack.Options{GRPCTLS: pki.opts})
	target := s.Idemgate.GRPCAddr
	other := testutil.NewCA(t, "another CA")
	foreign := other.Issue(t, testutil.Leaf{Name: "foreign", Client: true, URIs: []string{envoySPIFFE}})
	unlisted := pki.ca.Issue(t, testutil.Leaf{Name: "unlisted", Client: true, URIs: []string{"spiffe://cluster.local/ns/other/sa/job"}, DNS: []string{"job.other.svc"}})
	serverCert := pki.ca.Issue(t, testutil.Leaf{Name: "server as client", DNS: []string{envoySPIFFE[len("spiffe://"):]}}) // serverAuth only

	before := map[string]float64{}
	for _, name := range []string{"idemgate_decisions_total", "idemgate_passthrough_streams_total", "idemgate_open_streams"} {
		v, err := s.Idemgate.MetricSum(name)
		require.NoError(t, err)
		before[name] = v
	}

	for _, tc := range []struct {
		client    extProcClient
		reason    string
		presented string
	}{
		{tlsClient("no certificate", pki.ca), "no_certificate", "none"},
		{tlsClient("another CA's certificate", pki.ca, foreign.KeyPair), "untrusted_certificate", envoySPIFFE},
		{tlsClient("a server certificate", pki.ca, serverCert.KeyPair), "untrusted_certificate", "cluster.local/ns/payments/sa/envoy"},
		{tlsClient("an unlisted SAN", pki.ca, unlisted.KeyPair), "san_not_allowed", "spiffe://cluster.local/ns/other/sa/job,job.other.svc"},
	} {
		t.Run(tc.client.name, func(t *testing.T) {
			refusedBefore, err := s.Idemgate.Metric(`idemgate_grpc_peers_refused_total{reason="` + tc.reason + `"}`)
			require.NoError(t, err)
			alertsBefore := len(s.Idemgate.LogLines("event=security_alert", "reason=peer_refused", "refusal="+tc.reason))
			err = tc.client.tryStream(target)
			require.Error(t, err, "a refused peer gets no stream")
			t.Logf("refused as expected: %v", err)
			requireMetric(t, s, `idemgate_grpc_peers_refused_total{reason="`+tc.reason+`"}`, refusedBefore+1)
			require.Eventually(t, func() bool {
				return len(s.Idemgate.LogLines("event=security_alert", "reason=peer_refused", "refusal="+tc.reason)) == alertsBefore+1
			}, 5*time.Second, 20*time.Millisecond)
			lines := s.Idemgate.LogLines("event=security_alert", "reason=peer_refused", "refusal="+tc.reason)
			line := lines[len(lines)-1]
			require.Contains(t, line, "listener=grpc")
			require.Regexp(t, `peer=127\.0\.0\.1:\d+`, line)
			require.Contains(t, line, fmt.Sprintf("presented_san=%s ", quoteIfNeeded(tc.presented)))
		})
	}

	requireMetric(t, s, `idemgate_grpc_peers_refused_total{reason="handshake_failed"}`, 0)
	t.Run("plaintext", func(t *testing.T) {
		err := extProcClient{name: "plaintext", creds: insecure.NewCredentials()}.tryStream(target)
		require.Error(t, err)
		require.Eventually(t, func() bool {
			v, err := s.Idemgate.Metric(`idemgate_grpc_peers_refused_total{reason="handshake_failed"}`)
			return err == nil && v >= 1
		}, 5*time.Second, 20*time.Millisecond)
	})

	requireMetric(t, s, `idemgate_security_events_total{reason="peer_refused"}`, 4)
	for name, v := range before {
		after, err := s.Idemgate.MetricSum(name)
		require.NoError(t, err)
		require.Equal(t, v, after, "%s: a refused peer ran no Process", name)
	}
	require.Zero(t, s.Payments.Stats().Previews)

	// The control: the right certificate is answered (a passthrough).
	require.NoError(t, tlsClient("envoy's identity", pki.ca, pki.envoy.KeyPair).tryStream(target))
	pass, err := s.Idemgate.MetricSum("idemgate_passthrough_streams_total")
	require.NoError(t, err)
	require.Equal(t, before["idemgate_passthrough_streams_total"]+1, pass)
}

// quoteIfNeeded is how slog's text handler writes a value.
func quoteIfNeeded(s string) string {
	if strings.ContainsAny(s, " =\"") {
		return fmt.Sprintf("%q", s)
	}
	return s
}

// TestMTLSRotationUnderLoad: while Envoy drives preview and confirm
// continuously, the client CA bundle gains a new CA, then idemgate's
// certificate and key are replaced by ones the new CA signed, without a
// restart: no request fails, a client with a certificate of the new CA is
// refused before the bundle change and admitted after (the client
// switches), new handshakes present the new server certificate, and a new
// Envoy (new connections) drives the flow against it.
func TestMTLSRotationUnderLoad(t *testing.T) {
	pki := newMeshPKI(t)
	next := testutil.NewCA(t, "next mesh CA")
	// Envoy's trust is static in its bootstrap: it trusts both CAs from
	// the start (its own rotation is its control plane's business).
	testutil.WriteFile(t, pki.opts.EnvoyTrustedCAFile, append(append([]byte{}, pki.ca.PEM...), next.PEM...))
	s := startStack(t, stack.Options{GRPCTLS: pki.opts})
	target := s.Idemgate.GRPCAddr
	nextID := next.Issue(t, testutil.Leaf{Name: "envoy (next CA)", Client: true, URIs: []string{envoySPIFFE}})
	nextClient := extProcClient{name: "next CA's client", creds: credentials.NewTLS(&tls.Config{
		RootCAs: pool(pki.ca, next), ServerName: idemgateServerName, MinVersion: tls.VersionTLS12,
		Certificates: []tls.Certificate{nextID.KeyPair},
	})}
	require.Error(t, nextClient.tryStream(target), "the next CA is not trusted yet")

	var ok, failed atomic.Int64
	var failures sync.Map
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			a := s.Agent(fmt.Sprintf("load%d", i))
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				p, err := a.Preview(transfer("10.00", "acct_bob", fmt.Sprintf("rotation %d/%d", i, n)))
				if err == nil {
					var r *stack.Response
					r, err = a.Confirm(p.ConfirmBody())
					if err == nil && (r.StatusCode != http.StatusOK || r.Envelope != nil) {
						err = fmt.Errorf("confirm answered %s", r)
					}
				}
				if err != nil {
					failed.Add(1)
					failures.Store(err.Error(), true)
					continue
				}
				ok.Add(1)
			}
		}()
	}
	waitForMore := func(from int64) {
		t.Helper()
		require.Eventually(t, func() bool { return ok.Load() >= from+5 }, 60*time.Second, 10*time.Millisecond, "the load is not running")
	}
	waitForMore(0)

	// 1. The client CA bundle gains the next CA.
	testutil.WriteFile(t, pki.opts.ClientCAFile, append(append([]byte{}, pki.ca.PEM...), next.PEM...))
	waitReloads(t, s, 1)
	waitForMore(ok.Load())
	require.NoError(t, nextClient.tryStream(target), "the client switched to the next CA's certificate")

	// 2. idemgate's certificate and key, as a certificate tool replaces
	// them: one file, then the other.
	server := next.Issue(t, testutil.Leaf{Name: "idemgate (next CA)", DNS: []string{idemgateServerName}, IPs: []net.IP{net.IPv4(127, 0, 0, 1)}})
	testutil.WriteFile(t, pki.opts.ServerKeyFile, server.KeyPEM)
	testutil.WriteFile(t, pki.opts.ServerCertFile, server.CertPEM)
	waitReloads(t, s, 2)
	waitForMore(ok.Load())

	conn, err := tls.Dial("tcp", target, &tls.Config{
		RootCAs: pool(pki.ca, next), ServerName: idemgateServerName, MinVersion: tls.VersionTLS12,
		Certificates: []tls.Certificate{nextID.KeyPair}, NextProtos: []string{"h2"},
	})
	require.NoError(t, err)
	require.Equal(t, server.Serial, conn.ConnectionState().PeerCertificates[0].SerialNumber, "a new handshake presents the new certificate")
	require.NoError(t, conn.Close())
	requireMetric(t, s, `idemgate_tls_certificate_expiry_timestamp_seconds{file="cert",listener="grpc"}`, float64(server.Cert.NotAfter.Unix()))

	// A new Envoy: new connections, new handshakes, the new certificate.
	extra := s.StartExtraEnvoy(env.EnvoyBin)
	requireChannelWorks(t, s, s.AgentVia(extra, "carol"), false)

	waitForMore(ok.Load())
	close(stop)
	wg.Wait()
	var errs []string
	failures.Range(func(k, _ any) bool { errs = append(errs, k.(string)); return true })
	require.Zero(t, failed.Load(), "requests failed during the rotation: %v", errs)
	t.Logf("%d preview+confirm pairs during the rotation, none failed", ok.Load())
	requireMetric(t, s, `idemgate_tls_reloads_total{listener="grpc",result="error"}`, 0)
	sslErrors, err := s.Envoy.Stat("cluster.idemgate.ssl.connection_error")
	require.NoError(t, err)
	require.Zero(t, sslErrors)
}

// waitReloads waits for the n-th successful reload of the grpc listener's
// TLS files.
func waitReloads(t *testing.T, s *stack.Stack, n float64) {
	t.Helper()
	require.Eventually(t, func() bool {
		v, err := s.Idemgate.Metric(`idemgate_tls_reloads_total{listener="grpc",result="ok"}`)
		return err == nil && v == n
	}, 15*time.Second, 20*time.Millisecond, "reload %v", n)
}

func pool(cas ...*testutil.CA) *x509.CertPool {
	p := x509.NewCertPool()
	for _, ca := range cas {
		p.AddCert(ca.Cert)
	}
	return p
}

// TestUnixSocketEnvoyDrivesPreviewConfirm: with grpc_listen on a unix
// socket, the pinned Envoy reaches idemgate through a pipe address and
// drives preview, confirm and the replay; the socket file has mode 0660
// and is gone once idemgate stopped.
func TestUnixSocketEnvoyDrivesPreviewConfirm(t *testing.T) {
	s := startStack(t, stack.Options{GRPCUnixSocket: true})
	path, ok := strings.CutPrefix(s.Idemgate.GRPCAddr, "unix://")
	require.True(t, ok, s.Idemgate.GRPCAddr)
	fi, err := os.Stat(path)
	require.NoError(t, err)
	require.Equal(t, fs.ModeSocket, fi.Mode().Type())
	require.Equal(t, fs.FileMode(0o660), fi.Mode().Perm())

	requireChannelWorks(t, s, s.Agent("alice"), true)

	s.Idemgate.Stop()
	_, err = os.Stat(path)
	require.ErrorIs(t, err, fs.ErrNotExist, "the socket is removed on exit")
}
