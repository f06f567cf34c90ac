package config

import (
	"fmt"
	"io"
	"sort"
	"strings"
)

// ProcessSummary is the process settings' part of the check-config
// overview, as text, from the binary's settings package; a field left empty
// leaves its line (or its part of a line) out.
type ProcessSummary struct {
	Listen  string // listen:  the gRPC and admin listeners
	Store   string // store:   backends and timeouts
	Log     string // on the limits line: level and format
	Drain   string // on the webhook line: the SIGTERM sequence
	Tracing string // tracing: the exporter
}

// WriteSummary prints a one-screen overview of the file rt was compiled
// from for check-config: listen addresses, store, keys by id and source
// (never material), TTLs, limits and every operation's routes, params and
// replay settings; proc adds the process settings where they belong.
func (rt *Runtime) WriteSummary(w io.Writer, proc ProcessSummary) error {
	var b strings.Builder
	fmt.Fprintf(&b, "config OK: %s\n", rt.Source)
	if proc.Listen != "" {
		fmt.Fprintf(&b, "listen:     %s\n", proc.Listen)
	}
	store := proc.Store
	if store == "" {
		store = "timeout " + rt.Store.Timeout.String()
	}
	fmt.Fprintf(&b, "store:      %s\n", store)
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
	fmt.Fprintf(&b, "attest:     %s\n", rt.Attestation.summary())
	if rt.Subject.Header != "" {
		fmt.Fprintf(&b, "subject:    header %s\n", rt.Subject.Header)
	} else {
		fmt.Fprintf(&b, "subject:    metadata %s %s\n", rt.Subject.MetadataNamespace, strings.Join(rt.Subject.MetadataPath, "."))
	}
	fmt.Fprintf(&b, "ttl:        fingerprint %s, in_flight %s, terminal %s, replay_cache %s (Redis under a tiered store)\n", rt.TTL.Fingerprint, rt.TTL.InFlight, rt.TTL.Terminal, rt.TTL.ReplayCache)
	fmt.Fprintf(&b, "limits:     body %d bytes, JSON depth %d; messages %s", rt.Limits.MaxBodyBytes, rt.Limits.MaxJSONDepth, rt.Language)
	if proc.Log != "" {
		fmt.Fprintf(&b, "; log %s", proc.Log)
	}
	b.WriteByte('\n')
	webhook := "off"
	if rt.Webhook.URL != "" {
		webhook = fmt.Sprintf("%s (timeout %s, queue %d)", rt.Webhook.URL, rt.Webhook.Timeout, rt.Webhook.QueueSize)
	}
	fmt.Fprintf(&b, "webhook:    %s", webhook)
	if proc.Drain != "" {
		fmt.Fprintf(&b, "; drain %s", proc.Drain)
	}
	b.WriteByte('\n')
	if proc.Tracing != "" {
		fmt.Fprintf(&b, "tracing:    %s\n", proc.Tracing)
	}
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
