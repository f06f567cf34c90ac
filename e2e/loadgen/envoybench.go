package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	goredis "github.com/redis/go-redis/v9"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/idemgate/idemgate/e2e/demoauth"
	"github.com/idemgate/idemgate/e2e/loadgen/report"
	"github.com/idemgate/idemgate/envoy/envoytest"
)

// headerAuthSubject is the subject the header-only stand-in sets.
const headerAuthSubject = "bench-user"

// The columns of the through-Envoy table, in the order of the report.
const (
	evPlain = "envoy"
	// The attach cost: a path of the API that is no operation, through
	// Envoy alone and through the Envoy that carries idemgate.
	evPlainOther    = "envoy other-path"
	evAttachedOther = "envoy+idemgate other-path"
	evNoop          = "envoy+noop"
	// evAnswer is the floor with a replay's message count (2).
	evAnswer = "envoy+noop-answer"
	// evNoopReplay is that floor sending idemgate's own replay answer: the
	// same 2 messages with the same bytes (the same-answer floor of a replay).
	evNoopReplay = "envoy+noop-replay"
	evIO         = "envoy+io-floor"
	evPreview    = "envoy+preview"
	evConfirm    = "envoy+confirm-tiered"
	evReplay     = "envoy+replay"
	// The replay again on an idemgate that keeps no terminal records in
	// memory (limits.terminal_cache_bytes: 0): every replay reads the store.
	evReplayStore = "envoy+replay store-read"
	// The preview again, with the ext_proc channel private as docs/design.md
	// §12 asks: mutual TLS to a grpc_tls idemgate, and a unix socket (each
	// its own idemgate and Envoy), beside evPreview's plaintext loopback.
	evPreviewMTLS = "envoy+preview mtls"
	evPreviewUnix = "envoy+preview unix"
	// The preview with its fingerprint in the body only
	// (preview.fingerprint_header: false: 3 ext_proc messages), its own
	// idemgate and Envoy, and the no-op floor with the same 3 messages.
	evNoopBodyOnly    = "envoy+noop bodyonly"
	evPreviewBodyOnly = "envoy+preview bodyonly"
	// The same-answer floor: the no-op server's messages, its answer to the
	// response body the mutations of idemgate's signed preview (fixed
	// values, no work), over HTTP and over MCP.
	evNoopEdit    = "envoy+noop-edit"
	evNoopEditMCP = "envoy+noop-edit mcp"
	// Authentication as cheap as a header filter: jwt_authn replaced by a
	// header_mutation that sets the subject (envoytest.Edits.HeaderAuth),
	// Envoy alone and with idemgate (both preview variants).
	evPlainHeaderAuth           = "envoy header-auth"
	evPreviewHeaderAuth         = "envoy+preview header-auth"
	evPreviewBodyOnlyHeaderAuth = "envoy+preview bodyonly header-auth"
	// The attach cost again with the header-only stand-in: the other path
	// through those two Envoys (Envoy alone, the Envoy that carries
	// idemgate).
	evPlainOtherHeaderAuth    = "envoy other-path header-auth"
	evAttachedOtherHeaderAuth = "envoy+idemgate other-path header-auth"

	// The same over MCP (operations[transfer_mcp]): tools/call requests of
	// a 2026-07-28 client to /mcp.
	evNoopMCP      = "envoy+noop mcp"
	evMCPUnguarded = "envoy+mcp-unguarded"
	evMCPPreview   = "envoy+mcp-preview"
	evMCPConfirm   = "envoy+mcp-confirm-tiered"
	evMCPReplay    = "envoy+mcp-replay"
	// The MCP preview with mcp.preview_response_headers: false (3
	// messages) on the body-only preview's idemgate and Envoy, and the
	// 3-message no-op floor over MCP.
	evNoopMCPBodyOnly    = "envoy+noop mcp bodyonly"
	evMCPPreviewBodyOnly = "envoy+mcp-preview bodyonly"
	// The same-answer floor of that 3-message MCP preview.
	evNoopEditMCPBodyOnly = "envoy+noop-edit mcp bodyonly"
)

var envoyColumnDescriptions = map[string]string{
	evPlain:                     "(a) Envoy routing to the upstream with no ext_proc: the shipped envoy.yaml with the ext_proc filter taken out of the chain (header_mutation and jwt_authn stay). Preview requests.",
	evPlainOther:                "(a) as envoy, POST " + otherPath + " (a path no operation guards; the upstream answers it like a preview).",
	evAttachedOther:             "(c) the Envoy that carries idemgate (the shipped envoy.yaml: ext_proc delegated to by a composite filter on its path matcher), POST " + otherPath + ": the matcher selects nothing, no ext_proc filter is created and no stream is opened. What attaching idemgate costs the rest of an API.",
	evNoop:                      "(b) Envoy + a no-op ext_proc server (this tool with -serve noop, on idemgate's gRPC transport: extproc.TransportOptions) answering every message with an empty CONTINUE; the shipped filter config and body modes (4 messages per request). Preview requests.",
	evIO:                        "(b) plus the naive store round trips: Envoy + the I/O floor server (CONTINUE to everything, plus per request an acquire-like EVALSHA and a PostgreSQL INSERT at the request body, an UPDATE and a complete-like EVALSHA at the response body) on the same Redis and PostgreSQL as idemgate. Preview requests.",
	evPreview:                   "(c) Envoy + idemgate, preview: idemgate signs a fingerprint into the upstream's quote (no store call). Expected: 200 with Idempotency-Fingerprint.",
	evConfirm:                   "(c) Envoy + idemgate, first-time confirm on the tiered store (Redis + PostgreSQL): verify, acquire, the upstream called with Idempotency-Key, complete. Each request carries a distinct fingerprint minted with idemgate's key for the JWT's subject. Expected: 200 with the upstream's mark that it saw the key.",
	evPreviewMTLS:               "(c) as envoy+preview, the ext_proc channel over mutual TLS: idemgate serves grpc_tls (TLS 1.2+, client certificate required and its SAN checked), Envoy's idemgate cluster carries the UpstreamTlsContext `idemgate envoy-config` writes (client certificate, idemgate's CA and SAN, ALPN h2). Envoy keeps its HTTP/2 connections, so the handshake is paid once per connection, not per request.",
	evPreviewUnix:               "(c) as envoy+preview, the ext_proc channel over a unix socket (grpc_listen: unix:///…, Envoy's cluster on a pipe address): the sidecar shape of k8s/envoy-gateway.",
	evAnswer:                    "(b) Envoy + the answering no-op server (this tool with -serve answer, on idemgate's gRPC transport): CONTINUE to the request headers, then to the request body an immediate response of its own (200, a fixed JSON body, Idempotent-Replayed: true), as idemgate answers a replay: 2 messages per request, no store call, the upstream not called. Sent the confirms of envoy+replay (the same pool, round-robin). Expected: 200 with Idempotent-Replayed: true.",
	evNoopReplay:                "(b) the same-answer floor of a replay: the answering no-op server (-serve answer) sending, instead of its own short answer, idemgate's answer to one replay of the pool captured through Envoy at setup (status, the headers idemgate sets, the envelope with the stored result, the details), its own Envoy: the same 2 messages with the bytes idemgate sends, none of idemgate's work (no parsing, verifying, lookup or rendering). Sent the confirms of envoy+replay. Expected: 200 with Idempotent-Replayed: true.",
	evNoopBodyOnly:              "(b) as envoy+noop, the no-op server (-serve noop-bodyonly) switching the response headers off in its reply to the request headers, as idemgate does for a body-only preview: 3 messages per request; Envoy's ext_proc filter also asks for response_attributes: [response.code]. Preview requests.",
	evPlainHeaderAuth:           "(a) as envoy, with jwt_authn replaced by a header-only stand-in (a header_mutation filter setting x-idemgate-subject): Envoy alone when authentication costs as little as one header filter. Preview requests.",
	evPreviewHeaderAuth:         "(c) as envoy+preview, with the header-only stand-in for jwt_authn.",
	evPlainOtherHeaderAuth:      "(a) as envoy other-path (POST " + otherPath + "), with the header-only stand-in for jwt_authn: the Envoy of envoy header-auth.",
	evAttachedOtherHeaderAuth:   "(c) as envoy+idemgate other-path (POST " + otherPath + ": no ext_proc filter, no stream), with the header-only stand-in for jwt_authn: the Envoy of envoy+preview header-auth. What attaching idemgate costs the rest of an API when authentication costs Envoy almost nothing.",
	evPreviewBodyOnlyHeaderAuth: "(c) as envoy+preview bodyonly, with the header-only stand-in for jwt_authn.",
	evPreviewBodyOnly:           "(c) Envoy + idemgate, preview with preview.fingerprint_header: false (its own idemgate and Envoy, the filter with response_attributes: [response.code] as idemgate envoy-config writes it then): 3 messages, the status read from response.code, the fingerprint signed into the quote only. Expected: 200 with the fingerprint in the body.",
	evReplay:                    "(c) Envoy + idemgate, replay: confirms of fingerprints already DONE (a pool confirmed through Envoy beforehand, reused round-robin): idemgate answers from the record after the request body, the upstream is not called. After the first replay of each fingerprint (in the warm-up) the record comes from idemgate's memory of terminal records (limits.terminal_cache_bytes), not from Redis. Expected: 200 with Idempotent-Replayed: true.",
	evReplayStore:               "(c) as envoy+replay, on an idemgate of its own with limits.terminal_cache_bytes: 0 (same Redis and PostgreSQL, same pool): every replay reads the record from Redis, as the first replay of a fingerprint on a replica does.",

	evNoopMCP:             "(b) over MCP: Envoy + the no-op ext_proc server, tools/call of " + mcpUnguardedTool + " (a tool no operation guards) to /mcp with Mcp-Method/Mcp-Name headers; the upstream answers it exactly like the preview tool (the quote as structuredContent plus a text block, JSON). 4 messages per request.",
	evMCPUnguarded:        "(c) Envoy + idemgate, the same unguarded tools/call: idemgate reads the body (mcp.trust_upstream_headers is off, the default: the body must agree with Mcp-Method/Mcp-Name), lets it pass and switches the response phases off (3 messages). Expected: a JSON-RPC result for the request's id.",
	evMCPPreview:          "(c) Envoy + idemgate, tools/call " + mcpPreviewTool + ": idemgate buffers the call, hashes the arguments, and signs a fingerprint into the result's structuredContent and a text block. Expected: a result for the request's id with the fingerprint.",
	evMCPConfirm:          "(c) Envoy + idemgate, tools/call " + mcpConfirmTool + " with a distinct minted fingerprint in the arguments, tiered store: verify, acquire, the fingerprint taken out of the arguments, the upstream called with Idempotency-Key, complete. Expected: a result for the request's id, the upstream's mark that it saw the key.",
	evNoopEdit:            "(b) the same-answer floor: Envoy (the filter config of envoy+noop) + a no-op-like server (-serve noop-edit, on idemgate's gRPC transport) that sends the mutations of idemgate's signed preview with none of its work (no JSON parsing, hashing, signing or store): CONTINUE to the request headers and body and the response headers, and to the response body the upstream's quote with the fingerprint and fingerprint_expires_at members inserted before its closing brace (a byte operation), Idempotency-Fingerprint and the new content-length set; then it ends the stream itself, as idemgate does (the no-op server waits for Envoy to close it). Its fixed token and expiry are minted with idemgate's key at setup, so its answers have the sizes of idemgate's. Preview requests. Expected: 200 with Idempotency-Fingerprint.",
	evNoopEditMCP:         "(b) the same-answer floor over MCP: the noop-edit server on the tools/call " + mcpPreviewTool + " requests of envoy+mcp-preview (the upstream answers the quote): to the response body the result with the two members inserted at the end of structuredContent and idemgate's text block (rendered with extproc/envelope and extproc/mcp around the floor's token) appended to content, by byte operations on the upstream's layout, content-length set. Expected: a result for the request's id with the fingerprint.",
	evNoopMCPBodyOnly:     "(b) as envoy+noop mcp, the no-op server of envoy+noop bodyonly (the response headers switched off in its reply to the request headers) and its Envoy (response_attributes: [response.code]): 3 messages per request.",
	evMCPPreviewBodyOnly:  "(c) as envoy+mcp-preview, with mcp.preview_response_headers: false (the idemgate and Envoy of envoy+preview bodyonly): the call's Mcp-Name names the preview tool, so its response headers are switched off at the request headers; 3 messages, the status read from response.code, the framing from the body, the rewritten result sent chunked. Expected: a result for the request's id with the fingerprint.",
	evNoopEditMCPBodyOnly: "(b) the same-answer floor of envoy+mcp-preview bodyonly: the noop-edit server of envoy+noop-edit mcp (-serve noop-edit -edit-bodyonly, a process of its own) switching the response headers off in its reply to the request headers as idemgate does, and answering the response body with the same rewritten result and no header (Envoy sends it chunked); its Envoy asks for response_attributes: [response.code]. 3 messages per request. Expected: a result for the request's id with the fingerprint.",
	evMCPReplay:           "(c) Envoy + idemgate, replay over MCP: confirm tool calls of fingerprints already DONE (a pool confirmed beforehand, reused round-robin), each with a new JSON-RPC id: idemgate answers the stored result with the current id, the upstream is not called. Expected: a result for the request's id with Idempotent-Replayed: true.",
}

// envoyColumns lists every column in report order, which is also the
// order of a rotated round (rotatedColumns).
//
// Each guarded column sits next to the floor it is compared with
// (floorPairs), from an index of at least -envoy-rounds' default on, so
// that every default rotated round measures the two back to back, seconds
// apart, rather than up to a round apart: the drift of a shared machine
// over a round then hits both alike. The header-auth other-path pair is
// adjacent likewise, Envoy alone first: it gets no rounds of its own, its
// ratio has no target.
var envoyColumns = []string{
	evPlain, evPlainOther, evAttachedOther, evPlainHeaderAuth, evPlainOtherHeaderAuth, evAttachedOtherHeaderAuth,
	evNoop, evPreview, evNoopEdit,
	evNoopBodyOnly, evPreviewBodyOnly,
	evAnswer, evNoopReplay, evReplay, evReplayStore,
	evIO, evConfirm,
	evPreviewHeaderAuth, evPreviewBodyOnlyHeaderAuth, evPreviewMTLS, evPreviewUnix,
	evMCPUnguarded, evNoopMCP, evMCPPreview, evNoopEditMCP,
	evNoopMCPBodyOnly, evMCPPreviewBodyOnly, evNoopEditMCPBodyOnly,
	evMCPConfirm, evMCPReplay,
}

// floorPairs are the columns compared by a ratio to a same-message floor
// (the no-op floors, the same-answer floors), each pair next to each other
// in envoyColumns, in that order.
var floorPairs = [][2]string{
	{evNoop, evPreview}, {evPreview, evNoopEdit},
	{evNoopBodyOnly, evPreviewBodyOnly},
	{evNoopReplay, evReplay},
	{evMCPUnguarded, evNoopMCP}, {evNoopMCP, evMCPPreview}, {evMCPPreview, evNoopEditMCP},
	{evNoopMCPBodyOnly, evMCPPreviewBodyOnly}, {evMCPPreviewBodyOnly, evNoopEditMCPBodyOnly},
}

// idemgateColumns are the columns the first idemgate serves (the
// variants started beside it serve the others).
var idemgateColumns = []string{evPreview, evPreviewHeaderAuth, evConfirm, evReplay, evMCPUnguarded, evMCPPreview, evMCPConfirm, evMCPReplay, evAttachedOther, evAttachedOtherHeaderAuth}

// otherPathColumn reports whether a column sends POST otherPath (a path no
// operation guards).
func otherPathColumn(column string) bool {
	switch column {
	case evPlainOther, evAttachedOther, evPlainOtherHeaderAuth, evAttachedOtherHeaderAuth:
		return true
	}
	return false
}

// envoyBench is one through-Envoy run: the upstream, the ext_proc servers,
// one Envoy per ext_proc target and the JWTs.
type envoyBench struct {
	b        *bench
	bin      string
	version  string
	dir      string
	redis    string // address of the shared Redis
	rdb      *goredis.Client
	prefix   string // of every Redis key this run writes there
	db       *benchDatabase
	upstream string // upstream address
	children []stopper
	envoys   map[string]*envoyProcess // by column
	idem     *idemgateProcess
	// idemMTLS and idemUnix serve the private-channel preview columns.
	idemMTLS, idemUnix *idemgateProcess
	// idemBodyOnly serves envoy+preview bodyonly (preview.fingerprint_header: false).
	idemBodyOnly *idemgateProcess
	// idemStoreRead serves envoy+replay store-read (limits.terminal_cache_bytes: 0).
	idemStoreRead *idemgateProcess
	tokens        []string // bearer JWT per subject index
	replay        []confirmItem
	// mcpReplay are confirm tool arguments already executed over MCP.
	mcpReplay []confirmItem

	table      *report.EnvoyTable
	results    map[string]map[int]*httpResult
	violations []string // upstream counter checks that failed

	// Per column, the processes whose CPU time is split per request.
	extProcPid map[string]int // 0: no ext_proc server
	// idemgateOf is the idemgate serving each column idemgate serves (for
	// -cpuprofile and -memprofile).
	idemgateOf map[string]*idemgateProcess
	upPid      int
	cpu        map[string]map[int]*cpuUse
	// roundRates are each round's ok req/s per column and concurrency.
	roundRates map[string]map[int][]float64
}

// cpuRoleCount is len(cpuRoles).
const cpuRoleCount = 6

// cpuRoles name the processes of a cell whose CPU is measured.
var cpuRoles = [cpuRoleCount]string{"Envoy", "ext_proc server", "upstream", "load client", "Redis (whole server)", "PostgreSQL (whole server)"}

// cpuUse is the CPU time each role used over a column's cells (warm-up
// included) and the requests those cells completed.
type cpuUse struct {
	requests uint64
	seconds  [cpuRoleCount]float64
}

// runEnvoy measures the through-Envoy table and attaches it to the report.
// A failure is reported in the table rather than losing the ext_proc one.
func (b *bench) runEnvoy(ctx context.Context) error {
	o := b.opts
	e := &envoyBench{b: b, redis: o.envoyRedis, envoys: map[string]*envoyProcess{}, results: map[string]map[int]*httpResult{},
		extProcPid: map[string]int{}, idemgateOf: map[string]*idemgateProcess{}, cpu: map[string]map[int]*cpuUse{}, roundRates: map[string]map[int][]float64{}}
	e.table = &report.EnvoyTable{Concurrencies: o.concurrencies}
	b.rep.Envoy = e.table
	defer e.cleanup()
	if err := e.setup(ctx); err != nil {
		e.table.Notes = append(e.table.Notes, "not measured: "+err.Error())
		return err
	}
	err := e.measure(ctx)
	e.finish()
	return err
}

func (e *envoyBench) setup(ctx context.Context) error {
	b, o := e.b, e.b.opts
	root, err := moduleRoot(ctx)
	if err != nil {
		return err
	}
	if e.bin, e.version, err = findEnvoy(ctx, root, o.envoyBin); err != nil {
		return err
	}
	e.table.Version = e.version
	b.rep.Machine.Envoy = e.version + " (.envoy-version)"
	if b.bin == "" {
		if b.bin, err = b.idemgateBinary(ctx); err != nil {
			return err
		}
	}
	if e.dir, err = os.MkdirTemp(b.tmp, "envoy-"); err != nil {
		return fmt.Errorf("failed to create a directory: %w", err)
	}
	var r [4]byte
	if _, err := rand.Read(r[:]); err != nil {
		return fmt.Errorf("failed to make a key prefix: %w", err)
	}
	e.prefix = fmt.Sprintf("idemgate-envoybench-%d-%s:", os.Getpid(), hex.EncodeToString(r[:]))
	if err := e.pingRedis(ctx); err != nil {
		return err
	}
	if e.db, err = createBenchDatabase(ctx, o.pgAdminDSN, "idemgate_envoybench_"); err != nil {
		return err
	}
	if b.rep.Machine.Postgres == "" {
		b.rep.Machine.Postgres = e.db.version
	}

	up, upAddr, err := b.startFloor(ctx, "upstream")
	if err != nil {
		return err
	}
	e.children = append(e.children, up)
	e.upstream, e.upPid = upAddr, up.pid()
	noop, noopAddr, err := b.startFloor(ctx, "noop")
	if err != nil {
		return err
	}
	e.children = append(e.children, noop)
	e.extProcPid[evNoop] = noop.pid()
	noopBodyOnly, noopBodyOnlyAddr, err := b.startFloor(ctx, "noop-bodyonly")
	if err != nil {
		return err
	}
	e.children = append(e.children, noopBodyOnly)
	e.extProcPid[evNoopBodyOnly], e.extProcPid[evNoopMCPBodyOnly] = noopBodyOnly.pid(), noopBodyOnly.pid()
	answer, answerAddr, err := b.startFloor(ctx, "answer")
	if err != nil {
		return err
	}
	e.children = append(e.children, answer)
	e.extProcPid[evAnswer] = answer.pid()
	edit, editAddr, err := e.startEditFloor(ctx, false)
	if err != nil {
		return err
	}
	e.children = append(e.children, edit)
	e.extProcPid[evNoopEdit], e.extProcPid[evNoopEditMCP] = edit.pid(), edit.pid()
	editBodyOnly, editBodyOnlyAddr, err := e.startEditFloor(ctx, true)
	if err != nil {
		return err
	}
	e.children = append(e.children, editBodyOnly)
	e.extProcPid[evNoopEditMCPBodyOnly] = editBodyOnly.pid()
	ioArgs := []string{"-redis-addr", e.redis, "-redis-prefix", e.prefix + "iofloor:", "-pg-dsn", e.db.dsn}
	settings := idemgateSettings{RedisAddr: e.redis, KeyPrefix: e.prefix, PostgresDSN: e.db.dsn}
	if o.envoyLenientStores {
		// Still below the 1 s message_timeout.
		ioArgs = append(ioArgs, "-store-timeout", "700ms")
		settings.StoreTimeout, settings.RedisTimeout = "700ms", "300ms"
	}
	iof, ioAddr, err := b.startFloor(ctx, "iofloor", ioArgs...)
	if err != nil {
		return err
	}
	e.children = append(e.children, iof)
	e.extProcPid[evIO] = iof.pid()
	e.idem, err = startIdemgate(ctx, idemgateSpec{bin: b.bin, dir: e.dir, name: "envoy", key: b.key, settings: settings, pprof: b.profiling()})
	if err != nil {
		return err
	}
	e.children = append(e.children, e.idem.child)
	for _, c := range idemgateColumns {
		e.extProcPid[c], e.idemgateOf[c] = e.idem.pid(), e.idem
	}
	e.extProcPid[evNoopMCP] = noop.pid()
	certs, err := writeBenchTLS(e.dir)
	if err != nil {
		return err
	}
	// variant starts one more idemgate on its own settings for columns.
	variant := func(name string, s idemgateSettings, unixSocket bool, columns ...string) (*idemgateProcess, error) {
		p, err := startIdemgate(ctx, idemgateSpec{bin: b.bin, dir: e.dir, name: name, key: b.key, settings: s, unixSocket: unixSocket, pprof: b.profiling()})
		if err != nil {
			return nil, err
		}
		e.children = append(e.children, p.child)
		for _, c := range columns {
			e.extProcPid[c], e.idemgateOf[c] = p.pid(), p
		}
		return p, nil
	}
	mtls := settings
	mtls.GRPCTLS, mtls.ClientSANs = certs, []string{benchClientSAN}
	if e.idemMTLS, err = variant("envoy-mtls", mtls, false, evPreviewMTLS); err != nil {
		return err
	}
	if e.idemUnix, err = variant("envoy-unix", settings, true, evPreviewUnix); err != nil {
		return err
	}
	bodyOnly := settings
	bodyOnly.PreviewBodyOnly = true
	if e.idemBodyOnly, err = variant("envoy-bodyonly", bodyOnly, false, evPreviewBodyOnly, evPreviewBodyOnlyHeaderAuth, evMCPPreviewBodyOnly); err != nil {
		return err
	}
	storeRead := settings
	storeRead.NoTerminalCache = true
	if e.idemStoreRead, err = variant("envoy-storeread", storeRead, false, evReplayStore); err != nil {
		return err
	}
	mtlsCluster := map[string]*tlsv3.UpstreamTlsContext{
		envoytest.IdemgateCluster: envoytest.IdemgateUpstreamTLS(certs.ClientCert, certs.ClientKey, certs.CAFile, benchServerSAN),
	}

	// One Envoy per ext_proc target; the no-ext_proc one keeps its idemgate
	// cluster (health-checked, never used) pointed at the no-op server.
	clusters := func(extProc string) map[string]string {
		return map[string]string{envoytest.IdemgateCluster: extProc, envoytest.PaymentsCluster: upAddr}
	}
	// idemgate's header-auth columns have an Envoy of their own.
	jwtIdemgateColumns := slices.DeleteFunc(slices.Clone(idemgateColumns), func(c string) bool {
		return c == evPreviewHeaderAuth || c == evAttachedOtherHeaderAuth
	})
	for _, s := range []struct {
		columns []string
		edits   envoytest.Edits
	}{
		{[]string{evPlain, evPlainOther}, envoytest.Edits{Clusters: clusters(noopAddr), DropExtProc: true}},
		{[]string{evNoop, evNoopMCP}, envoytest.Edits{Clusters: clusters(noopAddr)}},
		{[]string{evNoopEdit, evNoopEditMCP}, envoytest.Edits{Clusters: clusters(editAddr)}},
		{[]string{evIO}, envoytest.Edits{Clusters: clusters(ioAddr)}},
		{[]string{evAnswer}, envoytest.Edits{Clusters: clusters(answerAddr)}},
		{jwtIdemgateColumns, envoytest.Edits{Clusters: clusters(e.idem.grpcAddr)}},
		{[]string{evPreviewMTLS}, envoytest.Edits{Clusters: clusters(e.idemMTLS.grpcAddr), ClusterTLS: mtlsCluster}},
		{[]string{evPreviewUnix}, envoytest.Edits{Clusters: clusters(e.idemUnix.grpcAddr)}},
		{[]string{evNoopBodyOnly, evNoopMCPBodyOnly}, envoytest.Edits{Clusters: clusters(noopBodyOnlyAddr), ResponseCode: true}},
		{[]string{evPreviewBodyOnly, evMCPPreviewBodyOnly}, envoytest.Edits{Clusters: clusters(e.idemBodyOnly.grpcAddr), ResponseCode: true}},
		{[]string{evNoopEditMCPBodyOnly}, envoytest.Edits{Clusters: clusters(editBodyOnlyAddr), ResponseCode: true}},
		{[]string{evReplayStore}, envoytest.Edits{Clusters: clusters(e.idemStoreRead.grpcAddr)}},
		{[]string{evPlainHeaderAuth, evPlainOtherHeaderAuth}, envoytest.Edits{Clusters: clusters(noopAddr), DropExtProc: true, HeaderAuth: headerAuthSubject}},
		{[]string{evPreviewHeaderAuth, evAttachedOtherHeaderAuth}, envoytest.Edits{Clusters: clusters(e.idem.grpcAddr), HeaderAuth: headerAuthSubject}},
		{[]string{evPreviewBodyOnlyHeaderAuth}, envoytest.Edits{Clusters: clusters(e.idemBodyOnly.grpcAddr), ResponseCode: true, HeaderAuth: headerAuthSubject}},
	} {
		p, err := startEnvoy(ctx, e.bin, e.dir, s.columns[0], s.edits)
		if err != nil {
			return err
		}
		e.children = append(e.children, p)
		for _, c := range s.columns {
			if e.envoys[c] != nil {
				return fmt.Errorf("column %s given two Envoys", c)
			}
			e.envoys[c] = p
		}
	}

	now := time.Now()
	for i := 0; i < subjectCount; i++ {
		tok, err := demoauth.Mint(subjectName(i), 2*time.Hour, now)
		if err != nil {
			return err
		}
		e.tokens = append(e.tokens, "Bearer "+tok)
	}
	if err := e.compareEditAnswers(ctx); err != nil {
		return err
	}
	if err := e.fillReplayPool(ctx); err != nil {
		return err
	}
	if err := e.startSameAnswerFloor(ctx, clusters(noopAddr)); err != nil {
		return err
	}
	return e.fillMCPReplayPool(ctx)
}

// startEditFloor starts the same-answer floor (-serve noop-edit) with
// fixed values of the sizes idemgate's answers carry: a fingerprint of the
// preview's params minted with idemgate's key for each operation's scope
// (the MCP operation's is longer), its expiry, and the text block idemgate
// appends to an MCP preview rendered around the MCP one. bodyOnly starts
// its 3-message variant (-edit-bodyonly).
func (e *envoyBench) startEditFloor(ctx context.Context, bodyOnly bool) (*child, string, error) {
	token, expires, err := e.b.minter.sample(scope)
	if err != nil {
		return nil, "", err
	}
	mcpToken, _, err := e.b.minter.sample(mcpScope)
	if err != nil {
		return nil, "", err
	}
	args := []string{"-edit-token", token, "-edit-mcp-token", mcpToken, "-edit-expires", expires, "-edit-mcp-block", string(mcpPreviewBlock(mcpToken, expires))}
	if bodyOnly {
		args = append(args, "-edit-bodyonly")
	}
	return e.b.startFloor(ctx, "noop-edit", args...)
}

// compareEditAnswers sends one preview and one MCP preview call through
// idemgate and through the same-answer floor and says in a note whether
// the floor's answers had the sizes of idemgate's (body, content-length,
// Idempotency-Fingerprint): the floor prices the same bytes only if so.
func (e *envoyBench) compareEditAnswers(ctx context.Context) error {
	type answer struct {
		body, header  int
		contentLength string
	}
	get := func(column string, r *httpRequest) (answer, error) {
		resp, err := e.send(ctx, column, r)
		if err != nil {
			return answer{}, err
		}
		if resp.status != http.StatusOK {
			return answer{}, fmt.Errorf("%s answered %d: %s", column, resp.status, resp.body)
		}
		return answer{body: len(resp.body), header: len(resp.header.Get("Idempotency-Fingerprint")), contentLength: resp.header.Get("Content-Length")}, nil
	}
	preview := &httpRequest{path: previewPath, auth: e.tokens[0], body: previewBytes}
	call := &httpRequest{path: mcpPath, auth: e.tokens[0], body: mcpCallBody(1, mcpPreviewTool, previewBytes), headers: mcpHeaders(mcpPreviewTool)}
	var same, differ []string
	for _, p := range []struct {
		idemgate, floor string
		req             *httpRequest
	}{{evPreview, evNoopEdit, preview}, {evMCPPreview, evNoopEditMCP, call}, {evMCPPreviewBodyOnly, evNoopEditMCPBodyOnly, call}} {
		want, err := get(p.idemgate, p.req)
		if err != nil {
			return err
		}
		got, err := get(p.floor, p.req)
		if err != nil {
			return err
		}
		what := fmt.Sprintf("%s body %d bytes (content-length %s), Idempotency-Fingerprint %d bytes", p.floor, got.body, got.contentLength, got.header)
		if got == want {
			same = append(same, what)
		} else {
			differ = append(differ, fmt.Sprintf("%s; %s: body %d bytes (content-length %s), Idempotency-Fingerprint %d bytes", what, p.idemgate, want.body, want.contentLength, want.header))
		}
	}
	if len(differ) > 0 {
		e.table.Notes = append(e.table.Notes, "The same-answer floor's answers did NOT have the sizes of idemgate's: "+strings.Join(differ, " | ")+".")
		return nil
	}
	e.table.Notes = append(e.table.Notes, "The same-answer floor's answers had the sizes of idemgate's, checked on one request each at setup: "+strings.Join(same, "; ")+".")
	return nil
}

// sentAnswer is what one request sent through a column's Envoy received.
type sentAnswer struct {
	status int
	header http.Header
	body   []byte
}

// send sends one request through a column's Envoy on a connection of its own.
func (e *envoyBench) send(ctx context.Context, column string, r *httpRequest) (sentAnswer, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+e.envoys[column].ListenAddr+r.path, bytes.NewReader(r.body))
	if err != nil {
		return sentAnswer{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", r.auth)
	for i := 0; i+1 < len(r.headers); i += 2 {
		req.Header.Set(r.headers[i], r.headers[i+1])
	}
	c := http.Client{Timeout: 15 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := c.Do(req)
	if err != nil {
		return sentAnswer{}, fmt.Errorf("%s: %w", column, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return sentAnswer{}, fmt.Errorf("%s: %w", column, err)
	}
	return sentAnswer{status: resp.StatusCode, header: resp.Header, body: body}, nil
}

// replayAnswerHeaders are the headers idemgate sets on a replay's envelope
// (extproc's envelopeReply and replay); Envoy adds the others to every
// local reply alike.
var replayAnswerHeaders = []string{"content-type", "retry-after", "idempotent-replayed", "idempotency-key"}

// startSameAnswerFloor starts the same-answer floor of a replay and its
// Envoy: one confirm of the replay pool is replayed through idemgate, and
// -serve answer sends that answer (status, the headers idemgate set, body,
// and the details idemgate gives Envoy) to every request body. Later
// replays differ from it only in values of the same length (the nonce, the
// trace id), so the floor prices the bytes idemgate sends. A note says so,
// with one answer of each compared.
func (e *envoyBench) startSameAnswerFloor(ctx context.Context, clusters map[string]string) error {
	if len(e.replay) == 0 {
		return errors.New("the same-answer replay floor needs a replay pool")
	}
	r := e.confirmRequest(e.replay[0])
	idem, err := e.send(ctx, evReplay, r)
	if err != nil {
		return err
	}
	var envelope struct {
		Status string `json:"status"`
	}
	if idem.status != http.StatusOK || idem.header.Get("Idempotent-Replayed") != "true" || json.Unmarshal(idem.body, &envelope) != nil || envelope.Status == "" {
		return fmt.Errorf("%s: a replay answered %d %s", evReplay, idem.status, idem.body)
	}
	immediate := &extprocv3.ImmediateResponse{
		Status:  &typev3.HttpStatus{Code: typev3.StatusCode(idem.status)},
		Headers: &extprocv3.HeaderMutation{},
		Body:    idem.body,
		Details: "idemgate_" + envelope.Status,
	}
	for _, name := range replayAnswerHeaders {
		if v := idem.header.Get(name); v != "" {
			immediate.Headers.SetHeaders = append(immediate.Headers.SetHeaders,
				&corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: name, RawValue: []byte(v)}})
		}
	}
	reply, err := protojson.Marshal(immediate)
	if err != nil {
		return err
	}
	srv, addr, err := e.b.startFloor(ctx, "answer", "-answer-reply", string(reply))
	if err != nil {
		return err
	}
	e.children = append(e.children, srv)
	e.extProcPid[evNoopReplay] = srv.pid()
	clusters[envoytest.IdemgateCluster] = addr
	p, err := startEnvoy(ctx, e.bin, e.dir, evNoopReplay, envoytest.Edits{Clusters: clusters})
	if err != nil {
		return err
	}
	e.children = append(e.children, p)
	e.envoys[evNoopReplay] = p

	again, err := e.send(ctx, evReplay, e.confirmRequest(e.replay[len(e.replay)-1]))
	if err != nil {
		return err
	}
	floor, err := e.send(ctx, evNoopReplay, r)
	if err != nil {
		return err
	}
	describe := func(a sentAnswer) string {
		var hs []string
		for _, name := range replayAnswerHeaders {
			if v := a.header.Get(name); v != "" {
				hs = append(hs, fmt.Sprintf("%s %d bytes", name, len(v)))
			}
		}
		return fmt.Sprintf("%d, body %d bytes, %s", a.status, len(a.body), strings.Join(hs, ", "))
	}
	if describe(floor) != describe(again) {
		e.table.Notes = append(e.table.Notes, fmt.Sprintf("The same-answer replay floor's answer did NOT have the sizes of idemgate's: %s: %s; %s: %s.",
			evNoopReplay, describe(floor), evReplay, describe(again)))
		return nil
	}
	e.table.Notes = append(e.table.Notes, fmt.Sprintf("The same-answer replay floor (%s) sends idemgate's replay answer captured at setup; checked against another replay: %s.",
		evNoopReplay, describe(floor)))
	return nil
}

func (e *envoyBench) pingRedis(ctx context.Context) error {
	e.rdb = goredis.NewClient(&goredis.Options{Addr: e.redis})
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := e.rdb.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("the Redis at %s does not answer (make services starts it): %w", e.redis, err)
	}
	return nil
}

// fillReplayPool confirms -replay-pool fingerprints once through Envoy, 4
// at a time, and keeps those that were executed.
func (e *envoyBench) fillReplayPool(ctx context.Context) error {
	items, err := e.b.minter.mint(e.b.opts.replayPool, []byte(previewBody))
	if err != nil {
		return err
	}
	e.replay, err = e.executeOnce(ctx, "replay pool", items, e.confirmRequest, "200 "+markKey)
	return err
}

// fillMCPReplayPool is fillReplayPool for the confirm tool.
func (e *envoyBench) fillMCPReplayPool(ctx context.Context) error {
	items, err := e.b.minter.mintWith(e.b.opts.replayPool, mcpScope, func(_ int, token string) []byte {
		return confirmBody([]byte(previewBody), token)
	})
	if err != nil {
		return err
	}
	request := func(it confirmItem) *httpRequest {
		return &httpRequest{path: mcpPath, auth: e.tokens[it.subject%subjectCount],
			body: mcpCallBody(it.subject, mcpConfirmTool, it.body), headers: mcpHeaders(mcpConfirmTool)}
	}
	e.mcpReplay, err = e.executeOnce(ctx, "MCP replay pool", items, request, expectedLabel(evMCPConfirm))
	return err
}

// executeOnce sends each item's request once through the idemgate Envoy, 4
// at a time, and returns the items whose answer was want (at least 9 in 10
// must be).
func (e *envoyBench) executeOnce(ctx context.Context, pool string, items []confirmItem, request func(confirmItem) *httpRequest, want string) ([]confirmItem, error) {
	labels := make([]string, len(items))
	var next atomic.Int64
	var wg sync.WaitGroup
	for w := 0; w < 4; w++ {
		wk := newHTTPWorker(15 * time.Second)
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer wk.close()
			for i := int(next.Add(1) - 1); i < len(items) && ctx.Err() == nil; i = int(next.Add(1) - 1) {
				labels[i] = wk.do(ctx, "http://"+e.envoys[evConfirm].ListenAddr, request(items[i]))
			}
		}()
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var kept []confirmItem
	bad := map[string]uint64{}
	for i, it := range items {
		if labels[i] == want {
			kept = append(kept, it)
		} else {
			bad[labels[i]]++
		}
	}
	if len(kept) < len(items)*9/10 {
		return nil, fmt.Errorf("%s: only %d of %d first confirms through Envoy executed (%s); idemgate: %s",
			pool, len(kept), len(items), describeOutcomes(bad), e.idem.lastLines())
	}
	if len(bad) > 0 {
		e.table.Notes = append(e.table.Notes, fmt.Sprintf("%s: %d of %d first confirms did not execute and were left out (%s).",
			pool, len(items)-len(kept), len(items), describeOutcomes(bad)))
	}
	return kept, nil
}

func (e *envoyBench) confirmRequest(it confirmItem) *httpRequest {
	return &httpRequest{path: confirmPath, auth: e.tokens[it.subject%subjectCount], body: it.body}
}

// expected is the outcome label each column must produce.
func expectedLabel(column string) string {
	switch column {
	case evPreview, evPreviewMTLS, evPreviewUnix, evPreviewHeaderAuth, evNoopEdit:
		return "200 " + markSigned
	case evPreviewBodyOnly, evPreviewBodyOnlyHeaderAuth:
		return "200 " + markSignedBody
	case evConfirm:
		return "200 " + markKey
	case evReplay, evReplayStore, evAnswer, evNoopReplay:
		return "200 " + markReplayed
	case evNoopMCP, evMCPUnguarded, evNoopMCPBodyOnly:
		return "200 " + markRPC
	case evMCPPreview, evNoopEditMCP, evMCPPreviewBodyOnly, evNoopEditMCPBodyOnly:
		return "200 " + markSigned + " " + markRPC
	case evMCPConfirm:
		return "200 " + markKey + " " + markRPC
	case evMCPReplay:
		return "200 " + markReplayed + " " + markRPC
	}
	return "200"
}

// source returns the requests of one cell of a column.
func (e *envoyBench) source(column string, c int) (httpSource, error) {
	o := e.b.opts
	cell := (o.envoyWarmup + o.envoyDuration).Seconds()
	switch column {
	case evConfirm:
		// A distinct fingerprint per request: enough for a rate well above
		// what two cores give, minted before the cell starts.
		n := int(math.Ceil(float64(o.envoyConfirmRate) * cell))
		items, err := e.b.minter.mint(n, []byte(previewBody))
		if err != nil {
			return nil, err
		}
		return &confirmHTTPSource{e: e, items: items}, nil
	case evReplay, evReplayStore, evAnswer, evNoopReplay:
		return &confirmHTTPSource{e: e, items: e.replay, cycle: true, limit: uint64(float64(o.budgetRate) * cell)}, nil
	case evNoopMCP, evMCPUnguarded, evNoopMCPBodyOnly:
		return &mcpSource{tool: mcpUnguardedTool, tokens: e.tokens, args: previewBytes, limit: uint64(float64(o.budgetRate) * cell)}, nil
	case evMCPPreview, evNoopEditMCP, evMCPPreviewBodyOnly, evNoopEditMCPBodyOnly:
		return &mcpSource{tool: mcpPreviewTool, tokens: e.tokens, args: previewBytes, limit: uint64(float64(o.budgetRate) * cell)}, nil
	case evMCPConfirm:
		n := int(math.Ceil(float64(o.envoyConfirmRate) * cell))
		items, err := e.b.minter.mintWith(n, mcpScope, func(_ int, token string) []byte { return confirmBody(previewBytes, token) })
		if err != nil {
			return nil, err
		}
		return &mcpSource{tool: mcpConfirmTool, tokens: e.tokens, items: items}, nil
	case evMCPReplay:
		return &mcpSource{tool: mcpConfirmTool, tokens: e.tokens, items: e.mcpReplay, cycle: true, limit: uint64(float64(o.budgetRate) * cell)}, nil
	}
	path := previewPath
	if otherPathColumn(column) {
		path = otherPath
	}
	return &previewHTTPSource{path: path, tokens: e.tokens, limit: uint64(float64(o.budgetRate) * cell)}, nil
}

// previewHTTPSource sends the preview body, subjects round-robin.
type previewHTTPSource struct {
	path   string
	tokens []string
	n      atomic.Uint64
	limit  uint64
}

var previewBytes = []byte(previewBody)

func (s *previewHTTPSource) Next(int) *httpRequest {
	i := s.n.Add(1)
	if i > s.limit {
		return nil
	}
	return &httpRequest{path: s.path, auth: s.tokens[i%uint64(len(s.tokens))], body: previewBytes}
}

// confirmHTTPSource hands out confirms: each once, or round-robin up to limit.
type confirmHTTPSource struct {
	e     *envoyBench
	items []confirmItem
	n     atomic.Uint64
	cycle bool
	limit uint64
}

func (s *confirmHTTPSource) Next(int) *httpRequest {
	i := s.n.Add(1) - 1
	if !s.cycle && i >= uint64(len(s.items)) || s.limit > 0 && i >= s.limit {
		return nil
	}
	return s.e.confirmRequest(s.items[i%uint64(len(s.items))])
}

// measure runs the rounds: for each concurrency, every column once per
// round, the order rotated each round, so drift on a shared machine hits
// every column alike. Then the attach pair's own rounds (attachPairRounds).
func (e *envoyBench) measure(ctx context.Context) error {
	o := e.b.opts
	for _, c := range o.concurrencies {
		for round := 0; round < o.envoyRounds; round++ {
			for _, column := range rotatedColumns(round) {
				if err := e.measureCell(ctx, column, c, round); err != nil {
					return fmt.Errorf("%s at concurrency %d, round %d: %w", column, c, round+1, err)
				}
			}
		}
		if c != targetConcurrency(o.concurrencies) {
			continue
		}
		for i, pair := range attachPairRounds(o.envoyAttachRounds) {
			round := o.envoyRounds + i
			for _, column := range pair {
				if err := e.measureCell(ctx, column, c, round); err != nil {
					return fmt.Errorf("%s at concurrency %d, attach round %d: %w", column, c, i+1, err)
				}
			}
		}
	}
	for _, c := range o.concurrencies {
		for _, column := range envoyColumns {
			r := e.results[column][c]
			e.b.log.Info("measured through Envoy", "column", column, "c", c, "req_per_s", math.Round(float64(r.requests-r.unexpected)/r.elapsed.Seconds()),
				"p50", r.latency.Quantile(0.5), "p99", r.latency.Quantile(0.99), "errors", r.unexpected)
		}
	}
	return nil
}

// rotatedColumns is the column order of a rotated round: envoyColumns
// rotated by one each round.
func rotatedColumns(round int) []string {
	k := round % len(envoyColumns)
	return append(slices.Clone(envoyColumns[k:]), envoyColumns[:k]...)
}

// backToBack is how many of the first rounds rotated rounds measure second
// right after first (the rotation splits two adjacent columns only in the
// round that starts with the second).
func backToBack(first, second string, rounds int) int {
	n := 0
	for r := 0; r < rounds; r++ {
		order := rotatedColumns(r)
		if slices.Index(order, second) == slices.Index(order, first)+1 {
			n++
		}
	}
	return n
}

// attachPairRounds is the order of the extra rounds that measure only the
// attach pair (Envoy alone and the Envoy that carries idemgate, both on a
// path no operation guards) back to back, which of the two goes first
// alternating. The difference its target allows (5 %) is smaller than one
// rotated round's spread on a shared 2-core machine, and in the rotated
// rounds the two cells can be a whole round apart (the round that starts
// with the attached column ends with Envoy alone); these rounds compare
// cells taken seconds apart, enough of them to resolve that difference.
func attachPairRounds(n int) [][2]string {
	rounds := make([][2]string, n)
	for i := range rounds {
		rounds[i] = [2]string{evPlainOther, evAttachedOther}
		if i%2 == 1 {
			rounds[i] = [2]string{evAttachedOther, evPlainOther}
		}
	}
	return rounds
}

// floorPairNames lists floorPairs for the report.
func floorPairNames() string {
	names := make([]string, len(floorPairs))
	for i, p := range floorPairs {
		names[i] = p[0] + " then " + p[1]
	}
	return strings.Join(names, "; ")
}

// minBackToBack is the fewest of the first rounds rotated rounds in which
// one of pairs is measured back to back.
func minBackToBack(pairs [][2]string, rounds int) int {
	least := rounds
	for _, p := range pairs {
		least = min(least, backToBack(p[0], p[1], rounds))
	}
	return least
}

// targetConcurrency is the concurrency the ratio targets are set at: 64,
// or the highest one measured.
func targetConcurrency(concurrencies []int) int {
	if slices.Contains(concurrencies, 64) {
		return 64
	}
	return slices.Max(concurrencies)
}

func (e *envoyBench) measureCell(ctx context.Context, column string, c, round int) error {
	o := e.b.opts
	for _, ch := range e.children {
		if err := ch.checkAlive(); err != nil {
			return err
		}
	}
	src, err := e.source(column, c)
	if err != nil {
		return err
	}
	before, err := fetchUpstreamStats(e.upstream)
	if err != nil {
		return err
	}
	run := httpRun{addr: e.envoys[column].ListenAddr, source: src, concurrency: c,
		warmup: o.envoyWarmup, duration: o.envoyDuration, expect: expectedLabel(column)}
	if p := e.idemgateOf[column]; p != nil && !otherPathColumn(column) && round == 0 {
		prof := e.b.profiler(ctx, cellSpec{scenario: column, idemgate: p}, c)
		run.windowStarted = prof.start
		defer prof.wait()
	}
	pids := [4]int{e.envoys[column].Pid(), e.extProcPid[column], e.upPid, 0}
	cpu0, err := e.cpuNow(ctx, pids)
	if err != nil {
		return err
	}
	res, err := run.execute(ctx)
	if err != nil {
		return err
	}
	cpu1, err := e.cpuNow(ctx, pids)
	if err != nil {
		return err
	}
	e.addCPU(column, c, res, cpu0, cpu1)
	after, err := fetchUpstreamStats(e.upstream)
	if err != nil {
		return err
	}
	e.checkUpstream(column, c, round, res, before, after)
	if e.results[column] == nil {
		e.results[column] = map[int]*httpResult{}
	}
	if e.results[column][c] == nil {
		e.results[column][c] = newHTTPResult()
	}
	e.results[column][c].merge(res)
	if e.roundRates[column] == nil {
		e.roundRates[column] = map[int][]float64{}
	}
	e.roundRates[column][c] = append(e.roundRates[column][c], float64(res.requests-res.unexpected)/res.elapsed.Seconds())
	// Let the servers finish what the cell left behind.
	time.Sleep(200 * time.Millisecond)
	return nil
}

// cpuNow reads the CPU time of each role's process (pid 0 for the ext_proc
// server means none: column (a); for the load client it is this process),
// and the shared Redis's and PostgreSQL's own totals (INFO cpu; every
// postgres process), which include whatever else uses those servers
// meanwhile.
func (e *envoyBench) cpuNow(ctx context.Context, pids [4]int) ([cpuRoleCount]float64, error) {
	var out [cpuRoleCount]float64
	for i, pid := range pids {
		if pid == 0 && i != len(pids)-1 {
			continue
		}
		v, err := cpuSeconds(pid)
		if err != nil {
			return out, err
		}
		out[i] = v
	}
	info, err := e.rdb.Info(ctx, "cpu").Result()
	if err != nil {
		return out, fmt.Errorf("failed to read Redis's CPU time: %w", err)
	}
	for _, line := range strings.Split(info, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if ok && (k == "used_cpu_sys" || k == "used_cpu_user") {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				return out, fmt.Errorf("unexpected Redis INFO cpu line %q", line)
			}
			out[4] += f
		}
	}
	if out[5], err = postgresCPUSeconds(); err != nil {
		return out, err
	}
	return out, nil
}

func (e *envoyBench) addCPU(column string, c int, res *httpResult, before, after [cpuRoleCount]float64) {
	if e.cpu[column] == nil {
		e.cpu[column] = map[int]*cpuUse{}
	}
	u := e.cpu[column][c]
	if u == nil {
		u = &cpuUse{}
		e.cpu[column][c] = u
	}
	for _, n := range res.all {
		u.requests += n
	}
	for i := range u.seconds {
		u.seconds[i] += after[i] - before[i]
	}
}

// checkUpstream compares what reached the upstream during a cell (warm-up
// included) with what the client was told: no confirm ever reached it
// without an Idempotency-Key, a replay never reached it, and each executed
// confirm or passed-through preview did exactly once.
func (e *envoyBench) checkUpstream(column string, c, round int, res *httpResult, before, after upstreamStats) {
	d := upstreamStats{
		Previews: after.Previews - before.Previews, Confirms: after.Confirms - before.Confirms,
		ConfirmsWithKey: after.ConfirmsWithKey - before.ConfirmsWithKey, Other: after.Other - before.Other,
		FingerprintsForwarded: after.FingerprintsForwarded - before.FingerprintsForwarded,
	}
	var problems []string
	if d.Confirms != d.ConfirmsWithKey {
		problems = append(problems, fmt.Sprintf("%d confirms reached the upstream without an Idempotency-Key", d.Confirms-d.ConfirmsWithKey))
	}
	if d.Other != 0 {
		problems = append(problems, fmt.Sprintf("%d requests to other paths", d.Other))
	}
	if d.FingerprintsForwarded != 0 {
		problems = append(problems, fmt.Sprintf("%d MCP confirms reached the upstream with the fingerprint still in their arguments", d.FingerprintsForwarded))
	}
	switch column {
	case evConfirm, evMCPConfirm:
		if want := res.all[expectedLabel(column)]; d.ConfirmsWithKey != want || d.Previews != 0 {
			problems = append(problems, fmt.Sprintf("the upstream executed %d confirms and %d previews, the client saw %d executed", d.ConfirmsWithKey, d.Previews, want))
		}
	case evReplay, evReplayStore, evMCPReplay, evAnswer, evNoopReplay:
		if d.Confirms != 0 || d.Previews != 0 {
			problems = append(problems, fmt.Sprintf("replays reached the upstream (%d confirms, %d previews)", d.Confirms, d.Previews))
		}
	default:
		if want := res.all[expectedLabel(column)]; d.Previews != want || d.Confirms != 0 {
			problems = append(problems, fmt.Sprintf("the upstream answered %d previews and %d confirms, the client got %d previews", d.Previews, d.Confirms, want))
		}
	}
	if len(problems) > 0 {
		e.violations = append(e.violations, fmt.Sprintf("%s at c=%d round %d: %s", column, c, round+1, strings.Join(problems, "; ")))
	}
}

// finish turns the merged results into the table.
func (e *envoyBench) finish() {
	o := e.b.opts
	t := e.table
	for _, column := range envoyColumns {
		t.Columns = append(t.Columns, report.Scenario{Name: column, Description: envoyColumnDescriptions[column]})
		for _, c := range o.concurrencies {
			r := e.results[column][c]
			if r == nil {
				t.Cells = append(t.Cells, report.Cell{Scenario: column, Concurrency: c, Skipped: "not measured"})
				continue
			}
			f := &report.Figures{
				RPS: float64(r.requests-r.unexpected) / r.elapsed.Seconds(),
				P50: r.latency.Quantile(0.50), P90: r.latency.Quantile(0.90), P99: r.latency.Quantile(0.99), Max: r.latency.Max(),
				Requests: r.requests, Errors: r.unexpected, Outcomes: describeOutcomes(r.outcomes),
			}
			if r.exhausted {
				f.Note = "a round's source ran out before its window closed; its rate is over the time it ran"
			}
			t.Cells = append(t.Cells, report.Cell{Scenario: column, Concurrency: c, Figures: f})
		}
	}
	at := targetConcurrency(o.concurrencies)
	t.CPURoles, t.CPUConcurrency, t.CPUBase = cpuRoles[:], at, evNoop
	for _, column := range envoyColumns {
		u := e.cpu[column][at]
		if u == nil || u.requests == 0 {
			continue
		}
		row := report.CPURow{Column: column}
		for _, sec := range u.seconds {
			row.MicrosPerRequest = append(row.MicrosPerRequest, sec*1e6/float64(u.requests))
		}
		t.CPU = append(t.CPU, row)
	}
	t.Ratios = []report.Ratio{
		{Name: "envoy+preview / envoy+noop", Num: evPreview, Den: evNoop, Target: 0.90, TargetConcurrency: at},
		{Name: "envoy+replay / envoy+noop", Num: evReplay, Den: evNoop, Target: 0.90, TargetConcurrency: at,
			Note: "a replay ends after the request body (idemgate answers; 2 ext_proc messages, no upstream call), the no-op server exchanges all 4 and Envoy calls the upstream."},
		{Name: "envoy+confirm-tiered / envoy+noop", Num: evConfirm, Den: evNoop,
			Note: "no target: a first-time confirm makes 4 store round trips the no-op server does not."},
		{Name: "envoy+confirm-tiered / envoy+io-floor", Num: evConfirm, Den: evIO,
			Note: "against (b) plus the naive store round trips (the same 4 round trips, one after the other, on the same Redis and PostgreSQL)."},
		{Name: "envoy+preview / envoy+noop-edit", Num: evPreview, Den: evNoopEdit,
			Note: "idemgate's own work: against a server sending the same mutations (the same answer sizes, no parsing, hashing, signing or store)."},
		{Name: "envoy+noop-edit / envoy+noop", Num: evNoopEdit, Den: evNoop,
			Note: "what the preview's mutations cost Envoy, the upstream and the client with a server that does nothing else."},
		{Name: "envoy+noop / envoy", Num: evNoop, Den: evPlain, Note: "what an ext_proc stream costs Envoy itself, with a server that does nothing."},
		{Name: "envoy+idemgate other-path / envoy other-path", Num: evAttachedOther, Den: evPlainOther, Target: 0.95, TargetConcurrency: at,
			Note: "what attaching idemgate costs a request it does not guard: the composite runs no ext_proc (no filter, no stream)."},
		{Name: "envoy+idemgate other-path header-auth / envoy other-path header-auth", Num: evAttachedOtherHeaderAuth, Den: evPlainOtherHeaderAuth,
			Note: "the same with the header-only stand-in for jwt_authn in both, where Envoy alone does less per request; reported, no target: measured in the rotated rounds only (no rounds of its own; see Settings)."},
		{Name: "envoy+preview / envoy", Num: evPreview, Den: evPlain, Target: 0.55, TargetConcurrency: at,
			Note: "a guarded preview against Envoy alone: 4 ext_proc messages (request headers and body, response headers and body)."},
		{Name: "envoy+preview bodyonly / envoy", Num: evPreviewBodyOnly, Den: evPlain, Target: 0.55, TargetConcurrency: at,
			Note: "a preview with preview.fingerprint_header: false against Envoy alone: 3 ext_proc messages (no response headers)."},
		{Name: "envoy+preview bodyonly / envoy+noop bodyonly", Num: evPreviewBodyOnly, Den: evNoopBodyOnly, Target: 0.90, TargetConcurrency: at,
			Note: "against the no-op floor with the same 3 messages."},
		{Name: "envoy+preview header-auth / envoy header-auth", Num: evPreviewHeaderAuth, Den: evPlainHeaderAuth, Target: 0.35, TargetConcurrency: at,
			Note: "the preview (4 messages) against Envoy alone, both with the header-only stand-in for jwt_authn."},
		{Name: "envoy+preview bodyonly header-auth / envoy header-auth", Num: evPreviewBodyOnlyHeaderAuth, Den: evPlainHeaderAuth, Target: 0.35, TargetConcurrency: at,
			Note: "the body-only preview (3 messages) against Envoy alone, both with the header-only stand-in."},
		{Name: "envoy header-auth / envoy", Num: evPlainHeaderAuth, Den: evPlain, Note: "what jwt_authn's ES256 verification costs Envoy alone, against one header filter."},
		{Name: "envoy+noop bodyonly / envoy", Num: evNoopBodyOnly, Den: evPlain, Note: "what a 3-message ext_proc stream costs Envoy itself."},
		{Name: "envoy+noop bodyonly / envoy+noop", Num: evNoopBodyOnly, Den: evNoop, Note: "what dropping the response-headers message saves Envoy with a server that does nothing."},
		{Name: "envoy+preview mtls / envoy", Num: evPreviewMTLS, Den: evPlain,
			Note: "the same with the ext_proc channel over mutual TLS (grpc_tls)."},
		{Name: "envoy+preview unix / envoy", Num: evPreviewUnix, Den: evPlain,
			Note: "the same with the ext_proc channel over a unix socket (the Envoy Gateway sidecar)."},
		{Name: "envoy+preview mtls / envoy+preview", Num: evPreviewMTLS, Den: evPreview,
			Note: "what mutual TLS on the ext_proc channel costs against plaintext loopback."},
		{Name: "envoy+preview unix / envoy+preview", Num: evPreviewUnix, Den: evPreview,
			Note: "a unix socket against TCP loopback for the ext_proc channel."},
		{Name: "envoy+replay / envoy", Num: evReplay, Den: evPlain, Target: 0.70, TargetConcurrency: at, Note: "2 ext_proc messages; idemgate answers, the upstream is not called."},
		{Name: "envoy+replay / envoy+noop-answer", Num: evReplay, Den: evAnswer, Target: 0.90, TargetConcurrency: at, Note: "against the floor with the same 2 messages and an answer of its own."},
		{Name: "envoy+replay / envoy+noop-replay", Num: evReplay, Den: evNoopReplay, Target: 0.90, TargetConcurrency: at,
			Note: "against the same-answer floor: the same 2 messages carrying the same bytes (idemgate's replay answer), none of idemgate's work."},
		{Name: "envoy+noop-replay / envoy+noop-answer", Num: evNoopReplay, Den: evAnswer,
			Note: "what idemgate's replay answer (the envelope with the stored result, Idempotency-Key) costs Envoy, the client and the server against the short fixed answer."},
		{Name: "envoy+replay store-read / envoy", Num: evReplayStore, Den: evPlain, Note: "a replay that reads its record from Redis (no memory of terminal records)."},
		{Name: "envoy+replay store-read / envoy+noop-answer", Num: evReplayStore, Den: evAnswer, Note: "the same against the floor with the same 2 messages."},
		{Name: "envoy+replay / envoy+replay store-read", Num: evReplay, Den: evReplayStore, Note: "what answering a known replay from memory saves against reading Redis."},
		{Name: "envoy+confirm-tiered / envoy", Num: evConfirm, Den: evPlain, Target: 0.30, TargetConcurrency: at, Note: "4 ext_proc messages and 4 store round trips."},
		{Name: "envoy+mcp-unguarded / envoy+noop mcp", Num: evMCPUnguarded, Den: evNoopMCP, Target: 0.95, TargetConcurrency: at,
			Note: "an MCP call no operation guards: idemgate reads its body and lets it pass with the response phases off (3 messages), the no-op server exchanges all 4."},
		{Name: "envoy+mcp-preview / envoy+noop mcp", Num: evMCPPreview, Den: evNoopMCP, Target: 0.90, TargetConcurrency: at,
			Note: "the MCP counterpart of envoy+preview / envoy+noop (the upstream does the same work in both)."},
		{Name: "envoy+mcp-preview / envoy+noop-edit mcp", Num: evMCPPreview, Den: evNoopEditMCP,
			Note: "idemgate's own work over MCP: the same tool call and answer, against a server sending the same mutations."},
		{Name: "envoy+noop-edit mcp / envoy+noop mcp", Num: evNoopEditMCP, Den: evNoopMCP,
			Note: "what the MCP preview's mutations cost with a server that does nothing else; the two call different tools (" + mcpPreviewTool + ", " + mcpUnguardedTool + "), which the upstream answers alike."},
		{Name: "envoy+mcp-preview bodyonly / envoy+noop mcp bodyonly", Num: evMCPPreviewBodyOnly, Den: evNoopMCPBodyOnly, Target: 0.90, TargetConcurrency: at,
			Note: "the MCP preview with mcp.preview_response_headers: false against the no-op floor with the same 3 messages."},
		{Name: "envoy+mcp-preview bodyonly / envoy+mcp-preview", Num: evMCPPreviewBodyOnly, Den: evMCPPreview,
			Note: "what skipping the MCP preview's response-headers message saves (3 messages against 4)."},
		{Name: "envoy+noop mcp bodyonly / envoy+noop mcp", Num: evNoopMCPBodyOnly, Den: evNoopMCP,
			Note: "the same with a server that does nothing."},
		{Name: "envoy+mcp-preview bodyonly / envoy+noop-edit mcp bodyonly", Num: evMCPPreviewBodyOnly, Den: evNoopEditMCPBodyOnly,
			Note: "idemgate's own work in the 3-message MCP preview: against a server sending the same answer in the same 3 messages."},
		{Name: "envoy+noop-edit mcp bodyonly / envoy+noop mcp bodyonly", Num: evNoopEditMCPBodyOnly, Den: evNoopMCPBodyOnly,
			Note: "what rewriting the answer costs Envoy, the upstream and the client in 3 messages, with a server that does nothing else (the rewritten body follows headers already sent)."},
		{Name: "envoy+noop-edit mcp bodyonly / envoy+noop-edit mcp", Num: evNoopEditMCPBodyOnly, Den: evNoopEditMCP,
			Note: "what skipping the response-headers message saves when the answer is rewritten, with a server that does nothing else."},
		{Name: "envoy+mcp-replay / envoy+noop mcp", Num: evMCPReplay, Den: evNoopMCP},
		{Name: "envoy+mcp-confirm-tiered / envoy+noop mcp", Num: evMCPConfirm, Den: evNoopMCP,
			Note: "no target: a first-time confirm makes 4 store round trips the no-op server does not."},
		{Name: "envoy+mcp-preview / envoy+preview", Num: evMCPPreview, Den: evPreview, Note: "MCP against HTTP for the same operation."},
		{Name: "envoy+mcp-confirm-tiered / envoy+confirm-tiered", Num: evMCPConfirm, Den: evConfirm},
		{Name: "envoy+mcp-replay / envoy+replay", Num: evMCPReplay, Den: evReplay},
	}
	for _, ra := range t.Ratios {
		rr := report.RoundRatio{Name: ra.Name, PerConcurrency: map[int][]float64{}}
		for _, c := range o.concurrencies {
			num, den := e.roundRates[ra.Num][c], e.roundRates[ra.Den][c]
			for i := 0; i < len(num) && i < len(den); i++ {
				if den[i] > 0 {
					rr.PerConcurrency[c] = append(rr.PerConcurrency[c], num[i]/den[i])
				}
			}
		}
		t.RoundRatios = append(t.RoundRatios, rr)
	}
	if n := e.storeFailures(); n != "" {
		t.Notes = append(t.Notes, n)
	}
	if len(e.violations) > 0 {
		t.Notes = append(t.Notes, "upstream check failed: "+strings.Join(e.violations, " | "))
	} else if len(e.results) > 0 {
		t.Notes = append(t.Notes, "In every cell (warm-up included) the upstream's own counters matched what the client saw: every executed confirm reached it once with an Idempotency-Key, no replay reached it, every preview passed through once.")
	}
	if l := e.b.rep.Machine.LoadAverage; l != "" {
		t.Notes = append(t.Notes, sharedMachineNote(l))
	}
	t.Intro = fmt.Sprintf("HTTP requests from a Go client to a real Envoy %s (`.envoy-version`) configured from the shipped `envoy/envoy.yaml` "+
		"with only addresses substituted (for column (a) the ext_proc filter removed): header_mutation, jwt_authn verifying an ES256 JWT "+
		"from `e2e/demoauth` on every request, ext_proc with its shipped processing modes, the router. Every column in the same run; "+
		"%d rounds per concurrency, the column order rotated each round, figures over all rounds together; at c=%d the two jwt_authn other-path columns also get %d back-to-back rounds of their own.", e.version, o.envoyRounds, at, o.envoyAttachRounds)
	t.Settings = []string{
		fmt.Sprintf("%d rounds × %s measured per cell after %s warm-up; per concurrency every column once per round, the order rotated by one each round.", o.envoyRounds, o.envoyDuration, o.envoyWarmup),
		fmt.Sprintf("The attach ratio (envoy+idemgate other-path / envoy other-path) targets a difference smaller than one round's spread, and in the rotated rounds its two cells can be a whole round apart. So at c=%d the two columns get %d more rounds of their own after the rotated ones: the two cells back to back, which goes first alternating. Their figures, CPU split and round ratios at c=%d include these rounds (%d in all).", at, o.envoyAttachRounds, at, o.envoyRounds+o.envoyAttachRounds),
		fmt.Sprintf("The same pair with the header-only stand-in (envoy other-path header-auth, envoy+idemgate other-path header-auth) has no target and no rounds of its own: the two are next to each other in the column order, so %d of the %d rotated rounds measure them back to back, Envoy alone first.", backToBack(evPlainOtherHeaderAuth, evAttachedOtherHeaderAuth, o.envoyRounds), o.envoyRounds),
		fmt.Sprintf("Each same-message floor sits next to the guarded column it is compared with in the column order (%s), so %d of the %d rotated rounds measure each such pair back to back, seconds apart.", floorPairNames(), minBackToBack(floorPairs, o.envoyRounds), o.envoyRounds),
		"Load client: c workers, each with its own keep-alive HTTP/1.1 connection to Envoy (one http.Transport limited to one connection per worker), each sending its next request when the previous answer has been read; new connections per cell, opened in the warm-up. A Go client rather than wrk because every first-time confirm needs its own body (a distinct fingerprint) and every answer is classified by its status and idemgate's headers; its cost per request is the same in every column.",
		"Upstream: a minimal fast HTTP server (this tool with -serve upstream) answering the payments API's quote and transfer JSON as fixed bytes, rather than the demo payments API, so every column pays the same small upstream cost and the differences are Envoy's, ext_proc's and idemgate's; it counts what reaches it for the checks above.",
		"Envoy: --concurrency 2 (the machine's cores), --disable-hot-restart, access log (the shipped stdout logger) to a file; one Envoy per ext_proc target, all started before the first cell.",
		fmt.Sprintf("idemgate: the tiered store on the shared Redis %s (its own key prefix idemgate-envoybench-<pid>-<random>:, the keys deleted at the end) and PostgreSQL database idemgate_envoybench_<pid> (created and dropped by the run); subject from the x-idemgate-subject header jwt_authn sets; otherwise as in the ext_proc-level settings below.", e.redis),
		fmt.Sprintf("First-time confirm cells get %d req/s × (warm-up + duration) minted fingerprints; other cells are bounded at %d req/s × (warm-up + duration) requests.", o.envoyConfirmRate, o.budgetRate),
		"ok req/s counts only answers with the column's expected outcome (outcome labels: status, then signed = Idempotency-Fingerprint set, replayed = Idempotent-Replayed: true, key = the upstream saw an Idempotency-Key; error = no HTTP answer).",
	}
}

// cleanup stops every process, deletes the run's Redis keys and drops its
// database.
func (e *envoyBench) cleanup() {
	for i := len(e.children) - 1; i >= 0; i-- {
		e.children[i].stop(5 * time.Second)
	}
	if e.rdb != nil {
		_ = e.rdb.Close()
	}
	if e.prefix != "" {
		if err := deleteRedisPrefix(e.redis, e.prefix); err != nil {
			e.b.log.Warn("failed to delete the run's Redis keys", "prefix", e.prefix, "error", err)
		}
	}
	if e.db != nil {
		if err := e.db.drop(); err != nil {
			e.b.log.Warn("failed to drop the through-Envoy database", "error", err)
		}
	}
}

// deleteRedisPrefix deletes the keys under prefix on a shared Redis (SCAN,
// never FLUSH: other work uses the same server).
func deleteRedisPrefix(addr, prefix string) error {
	c := goredis.NewClient(&goredis.Options{Addr: addr})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var cursor uint64
	for {
		keys, next, err := c.Scan(ctx, cursor, prefix+"*", 1000).Result()
		if err != nil {
			return err
		}
		if len(keys) > 0 {
			if err := c.Unlink(ctx, keys...).Err(); err != nil {
				return err
			}
		}
		if cursor = next; cursor == 0 {
			return nil
		}
	}
}

// sharedMachineNote says what the load average at the start means: before
// the run had started anything, a 1-minute load of 1 or more is other work
// on the machine, which takes cores from every column (the rotation spreads
// it over all of them).
func sharedMachineNote(loadavg string) string {
	f := strings.Fields(loadavg)
	if len(f) > 0 {
		if v, err := strconv.ParseFloat(f[0], 64); err == nil && v >= 1 {
			return "The machine was shared: load average " + loadavg + " when the run started, before any of its processes; absolute figures are lower and noisier than on a quiet machine, and the rotated rounds spread the other work over every column."
		}
	}
	return "Load average when the run started: " + loadavg + "."
}

// storeFailures summarises idemgate's "store call failed" warnings among
// its last log lines (they explain 503 temporarily_unavailable answers).
func (e *envoyBench) storeFailures() string {
	if e.idem == nil {
		return ""
	}
	counts := map[string]uint64{}
	for _, line := range strings.Split(e.idem.lastLines(), "\n") {
		var rec struct {
			Msg     string `json:"msg"`
			StoreOp string `json:"store_op"`
			Kind    string `json:"kind"`
		}
		if json.Unmarshal([]byte(line), &rec) != nil || !strings.HasPrefix(rec.Msg, "store call failed") {
			continue
		}
		counts["store_op="+rec.StoreOp+" kind="+rec.Kind]++
	}
	if len(counts) == 0 {
		return ""
	}
	return "idemgate's 503 answers are temporarily_unavailable (nothing executed, retry): among its last log lines, store calls that failed: " + describeOutcomes(counts) + "."
}
