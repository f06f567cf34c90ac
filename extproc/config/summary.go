package config

import (
	"fmt"
	"io"
	"sort"
	"strings"
)

// WriteSummary prints a one-screen overview of rt for check-config: listen
// addresses, store, keys by id and source (never material), TTLs, limits and
// every operation's routes, params and replay settings.
func (rt *Runtime) WriteSummary(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "config OK: %s\n", rt.Source)
	fmt.Fprintf(&b, "listen:     grpc %s, admin %s\n", rt.GRPCListen, rt.AdminListen)
	fmt.Fprintf(&b, "store:      %s\n", rt.storeSummary())
	ids := make([]string, 0, len(rt.KeySources))
	for id := range rt.KeySources {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	var keys []string
	for _, id := range ids {
		k := id + " (" + rt.KeySources[id] + ")"
		if rt.Keys != nil && id == rt.Keys.ActiveKeyID() {
			k += " active"
		}
		keys = append(keys, k)
	}
	fmt.Fprintf(&b, "keys:       %s\n", strings.Join(keys, ", "))
	if rt.Subject.Header != "" {
		fmt.Fprintf(&b, "subject:    header %s\n", rt.Subject.Header)
	} else {
		fmt.Fprintf(&b, "subject:    metadata %s %s\n", rt.Subject.MetadataNamespace, strings.Join(rt.Subject.MetadataPath, "."))
	}
	fmt.Fprintf(&b, "ttl:        fingerprint %s, in_flight %s, terminal %s\n", rt.TTL.Fingerprint, rt.TTL.InFlight, rt.TTL.Terminal)
	fmt.Fprintf(&b, "limits:     body %d bytes, JSON depth %d; messages %s; log %s %s\n",
		rt.Limits.MaxBodyBytes, rt.Limits.MaxJSONDepth, rt.Language, strings.ToLower(rt.Log.Level.String()), rt.Log.Format)
	webhook := "off"
	if rt.Webhook.URL != "" {
		webhook = fmt.Sprintf("%s (timeout %s, queue %d)", rt.Webhook.URL, rt.Webhook.Timeout, rt.Webhook.QueueSize)
	}
	fmt.Fprintf(&b, "webhook:    %s; drain %s then stop within %s\n", webhook, rt.Drain.Period, rt.Drain.Timeout)
	fmt.Fprintf(&b, "tracing:    %s\n", rt.Tracing.summary())
	fmt.Fprintf(&b, "operations: %d\n", len(rt.Operations))
	for _, op := range rt.Operations {
		fmt.Fprintf(&b, "  %s (scope %s)\n", op.Name, op.Scope)
		downstream := "downstream ignores keys"
		if op.HonoursKeys() {
			downstream = "sends " + op.DownstreamHeader
		}
		if op.MCP != nil {
			writeMCPSummary(&b, op, downstream)
		} else {
			fmt.Fprintf(&b, "    preview  %s %s  tool %s\n", op.Preview.Method, op.Preview.Template, op.PreviewTool)
			fmt.Fprintf(&b, "    confirm  %s %s  %s, replay %s\n", op.Confirm.Method, op.Confirm.Template, downstream, op.Replay)
			fmt.Fprintf(&b, "    status   %s %s  tool %s, poll after %s\n", op.Status.Method, op.Status.Template, op.StatusTool, op.PollAfter)
		}
		var params []string
		for _, prm := range op.Params {
			s := prm.Path
			if prm.Decimal {
				s += " (decimal)"
			}
			if prm.NFC {
				s += " (nfc: safe only if the upstream NFC-normalises it)"
			}
			params = append(params, s)
		}
		ref := "the nonce"
		if op.ResultRefPath != "" {
			ref = op.ResultRefPath
		}
		fmt.Fprintf(&b, "    params   %s; field %s; result_ref %s", strings.Join(params, ", "), op.FingerprintField, ref)
		if op.UpstreamTimeout > 0 {
			fmt.Fprintf(&b, "; upstream %s × %d", op.UpstreamTimeout, 1+op.UpstreamRetries)
		}
		if o := op.Outcomes.Overrides(); len(o) > 0 {
			fmt.Fprintf(&b, "; outcomes %s", strings.Join(o, ", "))
		}
		if len(op.Overrides) > 0 {
			fmt.Fprintf(&b, "; %d message override(s)", len(op.Overrides))
		}
		b.WriteByte('\n')
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func (rt *Runtime) storeSummary() string {
	s := rt.Store
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
		parts = append(parts, fmt.Sprintf("postgres (DSN %s, %s)", pg.DSNSource, conns))
	}
	parts = append(parts, "timeout "+s.Timeout.String())
	return strings.Join(parts, "; ")
}
