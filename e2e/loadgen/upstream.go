package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"
)

// The through-Envoy benchmark's upstream is a minimal fast HTTP server, not
// the demo payments API: it answers the payments API's quote and transfer
// JSON as fixed bytes (the same bodies the ext_proc-level benchmark hands
// idemgate), so every column pays the same small upstream cost and the
// differences between columns are Envoy's, ext_proc's and idemgate's. The
// demo API's JSON parsing, its per-key wait and a map of executions growing
// with every first-time confirm would be measured in every column and
// flatten the ratios.
//
// It counts what reached it, so the behaviour test can check that replays
// never did and that every first-time confirm carried an Idempotency-Key.

// upstreamSawKeyHeader is set on a confirm answer whose request carried an
// Idempotency-Key: the client sees through Envoy that idemgate acquired.
const upstreamSawKeyHeader = "X-Bench-Upstream-Saw-Key"

// upstreamStatsPath serves the counters as JSON (never through Envoy: the
// client asks the upstream directly).
const upstreamStatsPath = "/_bench/stats"

// upstreamStats are the upstream's counters.
type upstreamStats struct {
	Previews        uint64 `json:"previews"`
	Confirms        uint64 `json:"confirms"`
	ConfirmsWithKey uint64 `json:"confirms_with_key"`
	Other           uint64 `json:"other"`
	// FingerprintsForwarded counts MCP confirms whose arguments still held
	// the fingerprint (idemgate takes it out before forwarding).
	FingerprintsForwarded uint64 `json:"fingerprints_forwarded"`
}

type upstream struct {
	previews, confirms, withKey, other, forwarded atomic.Uint64
	quoteLen, transferLen                         string
}

func newUpstream() *upstream {
	return &upstream{quoteLen: strconv.Itoa(len(quoteBody)), transferLen: strconv.Itoa(len(transferBody))}
}

var (
	quoteBytes    = []byte(quoteBody)
	transferBytes = []byte(transferBody)
)

func (u *upstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodPost && r.URL.Path == mcpPath {
		u.serveMCP(w, r)
		return
	}
	// Read the whole request as a real API would before answering.
	_, _ = io.Copy(io.Discard, r.Body)
	h := w.Header()
	switch {
	case r.Method == http.MethodPost && (r.URL.Path == previewPath || r.URL.Path == otherPath):
		u.previews.Add(1)
		h["Content-Type"] = []string{"application/json"}
		h["Content-Length"] = []string{u.quoteLen}
		_, _ = w.Write(quoteBytes)
	case r.Method == http.MethodPost && r.URL.Path == confirmPath:
		u.confirms.Add(1)
		if r.Header.Get("Idempotency-Key") != "" {
			u.withKey.Add(1)
			h[upstreamSawKeyHeader] = []string{"yes"}
		}
		h["Content-Type"] = []string{"application/json"}
		h["Content-Length"] = []string{u.transferLen}
		_, _ = w.Write(transferBytes)
	case r.Method == http.MethodGet && r.URL.Path == upstreamStatsPath:
		_ = json.NewEncoder(w).Encode(u.stats())
	default:
		u.other.Add(1)
		http.NotFound(w, r)
	}
}

func (u *upstream) stats() upstreamStats {
	return upstreamStats{Previews: u.previews.Load(), Confirms: u.confirms.Load(), ConfirmsWithKey: u.withKey.Load(), Other: u.other.Load(), FingerprintsForwarded: u.forwarded.Load()}
}

// serveUpstream runs the upstream on lis until stop is closed.
func serveUpstream(lis net.Listener, stop <-chan struct{}) error {
	srv := &http.Server{Handler: newUpstream(), ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 5 * time.Minute}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(lis) }()
	select {
	case <-stop:
		_ = srv.Close()
		return nil
	case err := <-errc:
		return fmt.Errorf("failed to serve the upstream: %w", err)
	}
}

// fetchUpstreamStats asks the upstream at addr for its counters.
func fetchUpstreamStats(addr string) (upstreamStats, error) {
	var s upstreamStats
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get("http://" + addr + upstreamStatsPath)
	if err != nil {
		return s, fmt.Errorf("failed to read the upstream's counters: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return s, fmt.Errorf("the upstream's counters answered %s", resp.Status)
	}
	if err := json.NewDecoder(resp.Body).Decode(&s); err != nil {
		return s, fmt.Errorf("failed to decode the upstream's counters: %w", err)
	}
	return s, nil
}

// mcpCall is what the MCP upstream reads of a tools/call.
type mcpCall struct {
	ID     json.RawMessage `json:"id"`
	Method string          `json:"method"`
	Params struct {
		Name      string                     `json:"name"`
		Arguments map[string]json.RawMessage `json:"arguments"`
	} `json:"params"`
}

// The MCP tool results, around the HTTP API's bodies: the quote and the
// transfer as structuredContent with a text block.
var (
	mcpQuoteResult    = []byte(`,"result":{"content":[{"type":"text","text":"Quote qt_7Hk2mP9xL4vR: 1250.00 EUR to Müller Logistik GmbH, fee 0.35 EUR."}],"structuredContent":` + quoteBody + `,"isError":false}}`)
	mcpTransferResult = []byte(`,"result":{"content":[{"type":"text","text":"Transfer tr_01HZX5B3K7M2 executed."}],"structuredContent":` + transferBody + `,"isError":false}}`)
)

// serveMCP answers a tools/call of the preview, confirm or unguarded tool
// in JSON (one JSON-RPC response carrying the request's id), counting them
// like the HTTP routes: the preview and the unguarded tool as previews, the
// confirm tool as a confirm.
func (u *upstream) serveMCP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	var call mcpCall
	if err == nil {
		err = json.Unmarshal(body, &call)
	}
	if err != nil || call.Method != "tools/call" || len(call.ID) == 0 {
		u.other.Add(1)
		http.Error(w, "not a tools/call", http.StatusBadRequest)
		return
	}
	result := mcpQuoteResult
	switch call.Params.Name {
	case mcpPreviewTool, mcpUnguardedTool:
		u.previews.Add(1)
	case mcpConfirmTool:
		u.confirms.Add(1)
		if r.Header.Get("Idempotency-Key") != "" {
			u.withKey.Add(1)
			w.Header()[upstreamSawKeyHeader] = []string{"yes"}
		}
		if _, ok := call.Params.Arguments["fingerprint"]; ok {
			u.forwarded.Add(1)
		}
		result = mcpTransferResult
	default:
		u.other.Add(1)
		http.Error(w, "unknown tool", http.StatusNotFound)
		return
	}
	out := make([]byte, 0, len(result)+len(call.ID)+24)
	out = append(out, `{"jsonrpc":"2.0","id":`...)
	out = append(out, call.ID...)
	out = append(out, result...)
	h := w.Header()
	h["Content-Type"] = []string{"application/json"}
	h["Content-Length"] = []string{strconv.Itoa(len(out))}
	_, _ = w.Write(out)
}
