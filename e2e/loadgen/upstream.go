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
}

type upstream struct {
	previews, confirms, withKey, other atomic.Uint64
	quoteLen, transferLen              string
}

func newUpstream() *upstream {
	return &upstream{quoteLen: strconv.Itoa(len(quoteBody)), transferLen: strconv.Itoa(len(transferBody))}
}

var (
	quoteBytes    = []byte(quoteBody)
	transferBytes = []byte(transferBody)
)

func (u *upstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	// Read the whole request as a real API would before answering.
	_, _ = io.Copy(io.Discard, r.Body)
	h := w.Header()
	switch {
	case r.Method == http.MethodPost && r.URL.Path == previewPath:
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
	return upstreamStats{Previews: u.previews.Load(), Confirms: u.confirms.Load(), ConfirmsWithKey: u.withKey.Load(), Other: u.other.Load()}
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
