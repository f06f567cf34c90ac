package settings

import (
	"fmt"
	"io"
	"strings"

	"github.com/idemgate/idemgate/extproc/config"
)

// WriteSummary prints check-config's one-screen overview of the whole file:
// the ext_proc part's (config.Runtime.WriteSummary) with the process
// settings where they belong.
func (s *Settings) WriteSummary(w io.Writer) error {
	return s.Runtime.WriteSummary(w, config.ProcessSummary{
		Listen:  "grpc " + s.GRPCListen + listenerSummary(s.GRPCListen, s.GRPCTLS, s.GRPCPlaintextRemote) + ", admin " + s.AdminListen + s.approvalSummary(),
		Store:   s.Store.summary(),
		Log:     strings.ToLower(s.Log.Level.String()) + " " + s.Log.Format,
		Drain:   fmt.Sprintf("%s then stop within %s", s.Drain.Period, s.Drain.Timeout),
		Tracing: s.Tracing.summary(),
	})
}

func (s StoreSettings) summary() string {
	var parts []string
	switch s.Backend() {
	case "memory":
		return fmt.Sprintf("memory (embedded: one process only, records lost on restart), timeout %s", s.Timeout)
	case "tiered":
		parts = append(parts, "tiered (Redis fast path, PostgreSQL truth)")
	default:
		parts = append(parts, s.Backend())
	}
	if r := s.Redis; r != nil {
		pw := ""
		if !r.Password.IsZero() {
			pw = ", password set"
		}
		if r.TLS != nil {
			pw += ", " + r.TLS.Summary
		}
		parts = append(parts, fmt.Sprintf("redis %s %s prefix %q db %d timeout %s%s", r.Mode, strings.Join(r.Addrs, ","), r.KeyPrefix, r.DB, r.Timeout, pw))
	}
	if pg := s.Postgres; pg != nil {
		conns := "sized by idemgate"
		if pg.MaxConns > 0 {
			conns = fmt.Sprintf("max %d conns", pg.MaxConns)
		}
		if pg.TransactionPooler {
			conns += ", through a transaction pooler"
		}
		parts = append(parts, fmt.Sprintf("postgres (DSN %s, %s)", pg.DSNSource, conns))
	}
	parts = append(parts, "timeout "+s.Timeout.String())
	return strings.Join(parts, "; ")
}

// summary is the check-config line for tracing.
func (s TracingSettings) summary() string {
	if !s.Enabled {
		return "off (no tracing.otlp)"
	}
	tls := "TLS"
	if s.Insecure {
		tls = "plaintext"
	}
	return fmt.Sprintf("OTLP/gRPC %s (%s, timeout %s), sample ratio %v for new traces (a sampled traceparent is always followed), service %s",
		s.Endpoint, tls, s.Timeout, s.SampleRatio, s.ServiceName)
}

// approvalSummary is the approvers' API on the listen line, when served.
func (s *Settings) approvalSummary() string {
	if s.ApprovalListen == "" {
		return ""
	}
	return ", approvals " + s.ApprovalListen + listenerSummary(s.ApprovalListen, s.ApprovalTLS, s.ApprovalPlaintextRemote)
}

// listenerSummary says who can reach a listener: its TLS, or plaintext
// on a routable address by the explicit switch.
func listenerSummary(listen string, t *ListenerTLS, plaintextRemote bool) string {
	switch {
	case t != nil && len(t.ClientSANs) > 0:
		return " (mTLS, clients " + strings.Join(t.ClientSANs, " ") + ")"
	case t != nil:
		return " (TLS)"
	case PlaintextRemote(listen, t, plaintextRemote):
		return " (PLAINTEXT on a routable address: plaintext_remote switch)"
	}
	return ""
}
