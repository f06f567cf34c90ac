package listen

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Listener names (the listener label).
const (
	GRPC     = "grpc"
	Approval = "approval"
)

// Refusal reasons of idemgate_grpc_peers_refused_total.
const (
	// RefusedNoCertificate: the client completed no certificate.
	RefusedNoCertificate = "no_certificate"
	// RefusedUntrusted: the certificate does not chain to client_ca_file
	// (another CA, expired, not for client authentication).
	RefusedUntrusted = "untrusted_certificate"
	// RefusedSAN: the certificate is trusted but none of its URI or DNS
	// SANs is in client_sans.
	RefusedSAN = "san_not_allowed"
	// RefusedHandshake: the TLS handshake failed before a certificate was
	// judged (a plaintext client, no common version or cipher).
	RefusedHandshake = "handshake_failed"
)

// Refusals lists every reason, for pre-initialising the counter.
var Refusals = []string{RefusedNoCertificate, RefusedUntrusted, RefusedSAN, RefusedHandshake}

// Metrics are the listeners' collectors. Every label value that can occur
// is created at start, so each series is exported (as 0) before the first
// event and a rate() or an alert on it sees the first increase.
type Metrics struct {
	refused         *prometheus.CounterVec
	plaintextRemote *prometheus.GaugeVec
	expiry          *prometheus.GaugeVec
	reloads         *prometheus.CounterVec
}

// NewMetrics creates the collectors and registers them on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idemgate_grpc_peers_refused_total",
			Help: "ext_proc connections refused in the TLS handshake (grpc_tls), by reason: no_certificate, untrusted_certificate, san_not_allowed, handshake_failed. A refused peer opens no stream.",
		}, []string{"reason"}),
		plaintextRemote: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "idemgate_listener_plaintext_remote",
			Help: "1 when the listener (grpc, approval) serves plaintext on a routable address because grpc_plaintext_remote or approval_plaintext_remote is true, else 0.",
		}, []string{"listener"}),
		expiry: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "idemgate_tls_certificate_expiry_timestamp_seconds",
			Help: "NotAfter (Unix seconds) of the loaded TLS material of a listener: file=cert the server certificate, file=client_ca the earliest-expiring client CA. Present only when that listener has TLS.",
		}, []string{"listener", "file"}),
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idemgate_tls_reloads_total",
			Help: "Re-reads of a listener's changed TLS files, by result: ok (new handshakes use them), error (the previous material is kept).",
		}, []string{"listener", "result"}),
	}
	for _, r := range Refusals {
		m.refused.WithLabelValues(r)
	}
	for _, l := range []string{GRPC, Approval} {
		m.plaintextRemote.WithLabelValues(l).Set(0)
		m.reloads.WithLabelValues(l, "ok")
		m.reloads.WithLabelValues(l, "error")
	}
	reg.MustRegister(m.refused, m.plaintextRemote, m.expiry, m.reloads)
	return m
}

// Refused counts a peer refused for reason.
func (m *Metrics) Refused(reason string) { m.refused.WithLabelValues(reason).Inc() }

// SetPlaintextRemote records whether listener serves plaintext on a
// routable address by the explicit switch.
func (m *Metrics) SetPlaintextRemote(listener string, on bool) {
	v := 0.0
	if on {
		v = 1
	}
	m.plaintextRemote.WithLabelValues(listener).Set(v)
}

// SetExpiry records the NotAfter of a listener's loaded file (cert or
// client_ca).
func (m *Metrics) SetExpiry(listener, file string, notAfter time.Time) {
	m.expiry.WithLabelValues(listener, file).Set(float64(notAfter.Unix()))
}

// Reloaded counts a re-read of a listener's TLS files.
func (m *Metrics) Reloaded(listener string, err error) {
	result := "ok"
	if err != nil {
		result = "error"
	}
	m.reloads.WithLabelValues(listener, result).Inc()
}
