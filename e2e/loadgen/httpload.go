package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemgate/idemgate/e2e/loadgen/hist"
)

// The HTTP load client of the through-Envoy benchmark: c workers, each with
// its own keep-alive HTTP/1.1 connection (its own http.Transport limited to
// one connection), each sending its next request when the previous answer
// has been read — a closed loop like the ext_proc driver's. A Go client
// rather than wrk: every request needs its own body (a distinct minted
// fingerprint for first-time confirms), and every answer is classified by
// status and idemgate's headers, which wrk would need Lua for; its cost per
// request is the same in every column.

// httpRequest is one HTTP request to Envoy.
type httpRequest struct {
	path string
	auth string // Authorization header value
	body []byte
	// headers are extra request headers, name value pairs (an MCP call's).
	headers []string
}

// httpSource hands out requests; nil means exhausted. Called concurrently,
// each worker w from one goroutine.
type httpSource interface {
	Next(w int) *httpRequest
}

// Outcome labels: the status plus what the headers show.
const (
	markSigned = "signed" // Idempotency-Fingerprint set: idemgate signed a preview
	// markSignedBody: a fingerprint member in a JSON body without the header
	// (preview.fingerprint_header: false; the benchmark's upstream writes none).
	markSignedBody = "signed-body"
	markReplayed   = "replayed" // Idempotent-Replayed: true: idemgate answered from the record
	markKey        = "key"      // the upstream saw an Idempotency-Key: idemgate acquired
	// An MCP answer is also read: "rpc" when it is a JSON-RPC response to
	// the request's id carrying a result, and "signed" when that result
	// holds a fingerprint (idemgate injects it into structuredContent).
	markRPC = "rpc"
)

// fingerprintMember is how a fingerprint idemgate spliced into a JSON body
// starts.
var fingerprintMember = []byte(`"fingerprint":"`)

// classify labels an answer, e.g. "200", "200 signed", "503".
func classify(resp *http.Response) string {
	label := strconv.Itoa(resp.StatusCode)
	if resp.Header.Get("Idempotency-Fingerprint") != "" {
		label += " " + markSigned
	}
	if resp.Header.Get("Idempotent-Replayed") == "true" {
		label += " " + markReplayed
	}
	if resp.Header.Get(upstreamSawKeyHeader) != "" {
		label += " " + markKey
	}
	return label
}

// httpRun is one closed-loop measurement against one Envoy.
type httpRun struct {
	addr        string
	source      httpSource
	concurrency int
	warmup      time.Duration
	duration    time.Duration
	expect      string // the outcome label every request should get
	timeout     time.Duration
	// windowStarted, if set, is called when the measured window opens.
	windowStarted func()
}

// httpResult is what a run (or several, merged) measured inside the window.
type httpResult struct {
	requests, unexpected uint64
	elapsed              time.Duration
	latency              *hist.Histogram
	outcomes             map[string]uint64
	// all counts every answer by outcome, warm-up and the requests that
	// ended after the window included: what the upstream's counters see.
	all       map[string]uint64
	exhausted bool
}

func newHTTPResult() *httpResult {
	return &httpResult{latency: hist.New(), outcomes: map[string]uint64{}, all: map[string]uint64{}}
}

// merge adds another round's figures: the rate over all rounds is the sum
// of requests over the sum of windows.
func (r *httpResult) merge(o *httpResult) {
	r.requests += o.requests
	r.unexpected += o.unexpected
	r.elapsed += o.elapsed
	r.latency.Merge(o.latency)
	for k, v := range o.outcomes {
		r.outcomes[k] += v
	}
	for k, v := range o.all {
		r.all[k] += v
	}
	r.exhausted = r.exhausted || o.exhausted
}

type httpWorker struct {
	client   *http.Client
	latency  *hist.Histogram
	outcomes map[string]uint64
	all      map[string]uint64
	last     time.Time
	body     bytes.Buffer // an MCP answer, read to be classified
}

// newHTTPWorker is a worker with its own single keep-alive connection.
func newHTTPWorker(timeout time.Duration) *httpWorker {
	tr := &http.Transport{MaxConnsPerHost: 1, MaxIdleConnsPerHost: 1, DisableCompression: true, IdleConnTimeout: time.Minute}
	return &httpWorker{client: &http.Client{Transport: tr, Timeout: timeout}, latency: hist.New(),
		outcomes: map[string]uint64{}, all: map[string]uint64{}}
}

// close closes the worker's connection.
func (w *httpWorker) close() { w.client.CloseIdleConnections() }

// execute runs the measurement; it returns once the window has closed and
// every worker's last request has ended.
func (r httpRun) execute(ctx context.Context) (*httpResult, error) {
	if r.concurrency < 1 || r.duration <= 0 || r.source == nil {
		return nil, errors.New("an HTTP run needs concurrency >= 1, a duration and a source")
	}
	if r.timeout <= 0 {
		r.timeout = 15 * time.Second
	}
	url := "http://" + r.addr
	start := time.Now()
	windowStart := start.Add(r.warmup)
	windowEnd := windowStart.Add(r.duration)
	var (
		stop        atomic.Bool
		exhaustedAt atomic.Int64
		wg          sync.WaitGroup
	)
	workers := make([]*httpWorker, r.concurrency)
	for i := range workers {
		w := newHTTPWorker(r.timeout)
		workers[i] = w
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer w.close()
			for !stop.Load() && ctx.Err() == nil {
				req := r.source.Next(i)
				if req == nil {
					exhaustedAt.CompareAndSwap(0, time.Now().UnixNano())
					return
				}
				t0 := time.Now()
				label := w.do(ctx, url, req)
				t1 := time.Now()
				if ctx.Err() != nil {
					return
				}
				w.all[label]++
				if !t1.Before(windowEnd) {
					stop.Store(true)
					return
				}
				if t1.Before(windowStart) {
					continue
				}
				w.latency.Record(t1.Sub(t0))
				w.outcomes[label]++
				w.last = t1
			}
		}()
	}
	if r.windowStarted != nil {
		go func() {
			t := time.NewTimer(time.Until(windowStart))
			defer t.Stop()
			select {
			case <-t.C:
				r.windowStarted()
			case <-ctx.Done():
			}
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	t := time.NewTimer(time.Until(windowEnd))
	select {
	case <-t.C:
		stop.Store(true)
		<-done
	case <-done:
		t.Stop()
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	res := newHTTPResult()
	res.elapsed = r.duration
	var last time.Time
	for _, w := range workers {
		res.latency.Merge(w.latency)
		for k, n := range w.all {
			res.all[k] += n
		}
		for k, n := range w.outcomes {
			res.outcomes[k] += n
			res.requests += n
			if k != r.expect {
				res.unexpected += n
			}
		}
		if w.last.After(last) {
			last = w.last
		}
	}
	if ns := exhaustedAt.Load(); ns != 0 {
		at := time.Unix(0, ns)
		if !at.After(windowStart) {
			return nil, errors.New("the request source ran out during the warm-up")
		}
		if at.Before(windowEnd) {
			res.exhausted = true
			res.elapsed = time.Duration(math.Max(float64(last.Sub(windowStart)), float64(time.Millisecond)))
		}
	}
	return res, nil
}

// do sends one request and labels its answer; a transport failure is
// "error" (the body is read to the end so the connection is reused).
func (w *httpWorker) do(ctx context.Context, url string, r *httpRequest) string {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+r.path, bytes.NewReader(r.body))
	if err != nil {
		return "error"
	}
	req.Header["Content-Type"] = []string{"application/json"}
	req.Header["Authorization"] = []string{r.auth}
	for i := 0; i+1 < len(r.headers); i += 2 {
		req.Header[r.headers[i]] = []string{r.headers[i+1]}
	}
	resp, err := w.client.Do(req)
	if err != nil {
		return "error"
	}
	id := mcpRequestID(r.body)
	w.body.Reset()
	_, err = w.body.ReadFrom(resp.Body)
	resp.Body.Close()
	if err != nil {
		return "error"
	}
	label := classify(resp)
	if id == nil && resp.Header.Get("Idempotency-Fingerprint") == "" && bytes.Contains(w.body.Bytes(), fingerprintMember) {
		label += " " + markSignedBody
	}
	if id != nil {
		label += classifyMCP(w.body.Bytes(), id)
	}
	return label
}

// classifyMCP adds the marks of an MCP answer's body for the request id.
func classifyMCP(body, id []byte) string {
	prefix := append([]byte(`{"jsonrpc":"2.0","id":`), id...)
	if !bytes.HasPrefix(body, append(prefix, `,"result":`...)) {
		return ""
	}
	label := " " + markRPC
	// Cheap enough for every answer: the benchmark's own upstream writes no
	// fingerprint member, so one after structuredContent is idemgate's.
	if sc := bytes.Index(body, []byte(`"structuredContent":{`)); sc >= 0 && bytes.Contains(body[sc:], []byte(`"fingerprint":"`)) {
		label = " " + markSigned + label
	}
	return label
}

// describeOutcomes renders outcome counts, most frequent first.
func describeOutcomes(m map[string]uint64) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if m[keys[i]] != m[keys[j]] {
			return m[keys[i]] > m[keys[j]]
		}
		return keys[i] < keys[j]
	})
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s ×%d", k, m[k])
	}
	return strings.Join(parts, ", ")
}
