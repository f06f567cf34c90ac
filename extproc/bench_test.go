package extproc

import (
	"strings"
	"testing"

	"github.com/idemgate/idemgate/state/memory"
)

// Benchmarks of one whole HTTP exchange through Process over the in-process
// stream (server work plus the fake transport), for comparison with a
// no-op ext_proc server in the load benchmark.

func BenchmarkPassThrough(b *testing.B) {
	e := newEnv(b, nil, nil)
	d := fakeDialer{srv: e.srv, shareReplies: true}
	b.ReportAllocs()
	for b.Loop() {
		s := d.open(b)
		_ = s.Send(passThroughRequest("/v1/other"))
		_, _ = s.Recv()
		s.Close()
	}
}

func BenchmarkPreview(b *testing.B) {
	e := newEnv(b, nil, nil)
	d := fakeDialer{srv: e.srv, shareReplies: true}
	req := post("/v1/transfers/preview", "alice", transferBody(`"100.00"`, "EUR", "DE89", ""))
	b.ReportAllocs()
	for b.Loop() {
		do(b, d, req, previewOK)
	}
}

// BenchmarkPreviewBodyOnly is BenchmarkPreview with
// preview.fingerprint_header: false: 3 messages, the status read from the
// response.code attribute.
func BenchmarkPreviewBodyOnly(b *testing.B) {
	e := bodyOnlyEnv(b)
	d := fakeDialer{srv: e.srv, shareReplies: true}
	req := post("/v1/transfers/preview", "alice", transferBody(`"100.00"`, "EUR", "DE89", ""))
	b.ReportAllocs()
	for b.Loop() {
		doWith(b, responseCodeFilter, d, req, previewOK)
	}
}

func BenchmarkConfirmReplay(b *testing.B) {
	e := newEnv(b, nil, nil)
	d := fakeDialer{srv: e.srv, shareReplies: true}
	fp := preview(b, d, "alice", `1`)
	req := post("/v1/transfers/confirm", "alice", transferBody(`1`, "EUR", "DE89", fp))
	do(b, d, req, newPayments().handle)
	b.ReportAllocs()
	for b.Loop() {
		do(b, d, req, neverCalled(b))
	}
}

func BenchmarkMCPPreview(b *testing.B) {
	e := newMCPEnv(b, "")
	d := fakeDialer{srv: e.srv, shareReplies: true}
	up := newMCPServer(false)
	req := mcpPost("alice", rpc(`1`, "tools/call", callParams("transfer_preview", transferArgs(`"100.00"`, ""))), modern("tools/call", "transfer_preview")...)
	b.ReportAllocs()
	for b.Loop() {
		do(b, d, req, up.handle)
	}
}

// BenchmarkMCPPreviewBodyOnly is BenchmarkMCPPreview with
// mcp.preview_response_headers: false: 3 messages, the status read from the
// response.code attribute, the framing from the body.
func BenchmarkMCPPreviewBodyOnly(b *testing.B) {
	e := mcpBodyOnlyEnv(b)
	d := fakeDialer{srv: e.srv, shareReplies: true}
	up := newMCPServer(false)
	req := transferPreviewCall(`"100.00"`)
	b.ReportAllocs()
	for b.Loop() {
		doWith(b, responseCodeFilter, d, req, up.handle)
	}
}

// BenchmarkMCPUnguarded is a 2026-07-28 tools/call of a tool no operation
// guards, read from its body (the default) and decided from its headers
// (mcp.trust_upstream_headers).
func BenchmarkMCPUnguarded(b *testing.B) {
	for _, bc := range []struct {
		name string
		cfg  string
	}{
		{"body", mcpConfigYAML},
		{"trusted-headers", strings.ReplaceAll(mcpConfigYAML, "mcp: {endpoint: /mcp,", "mcp: {trust_upstream_headers: true, endpoint: /mcp,")},
	} {
		b.Run(bc.name, func(b *testing.B) {
			e := newEnv(b, nil, nil)
			e.cfg = testConfig(b, bc.cfg)
			e.useStore(b, memory.New(memory.Options{Now: e.clock.Now}))
			d := fakeDialer{srv: e.srv, shareReplies: true}
			up := newMCPServer(false)
			req := mcpPost("alice", rpc(`1`, "tools/call", callParams("weather", `{"city":"Berlin"}`)), modern("tools/call", "weather")...)
			b.ReportAllocs()
			for b.Loop() {
				do(b, d, req, up.handle)
			}
		})
	}
}

// BenchmarkMCPConfirmReplay is a retried MCP confirm answered from the
// record (already_completed as a tool result, the original content after
// the envelope's text).
func BenchmarkMCPConfirmReplay(b *testing.B) {
	e := newMCPEnv(b, "")
	d := fakeDialer{srv: e.srv, shareReplies: true}
	up := newMCPServer(false)
	fp := mcpPreview(b, d, up, "alice", `"100.00"`)
	req := mcpPost("alice", rpc(`2`, "tools/call", callParams("transfer_confirm", transferArgs(`"100.00"`, fp))), modern("tools/call", "transfer_confirm")...)
	do(b, d, req, up.handle)
	b.ReportAllocs()
	for b.Loop() {
		do(b, d, req, up.handle)
	}
	if up.Executions() != 1 {
		b.Fatalf("executed %d times", up.Executions())
	}
}
