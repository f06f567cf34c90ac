package main

import (
	"bytes"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/idemgate/idemgate/fingerprint"

	"github.com/idemgate/idemgate/internal/extprocdriver"
)

// The operation as the benchmark config declares it (idemgateConfig).
const (
	previewPath = "/v1/transfers/preview"
	confirmPath = "/v1/transfers/confirm"
	// otherPath is a path of the same API that no operation guards: the
	// upstream answers it like a preview, and the attached Envoy must not
	// open an ext_proc stream for it.
	otherPath    = "/v1/quotes"
	scope        = "payments.transfer"
	subjectCount = 256
	jwtNamespace = "envoy.filters.http.jwt_authn"
)

// operationParams are the bound params of the transfer operation, as in
// envoy/idemgate.yaml.
var operationParams = []fingerprint.Param{{Path: "amount", Decimal: true}, {Path: "currency"}, {Path: "payee.account_id"}}

// previewBody is what an agent's transfer_preview tool call sends.
const previewBody = `{"amount":"1250.00","currency":"EUR","payee":{"account_id":"DE89370400440532013000","name":"Müller Logistik GmbH","country":"DE"},` +
	`"memo":"Invoice 2026-0412, April freight Hamburg to Lyon","reference":"INV-2026-0412","requested_execution_date":"2026-05-04",` +
	`"client_request_time":"2026-05-01T09:12:44Z","source_account":"acct_01HZX4Q8W2"}`

// quoteBody is the payments API's answer to a preview.
const quoteBody = `{"quote_id":"qt_7Hk2mP9xL4vR","amount":"1250.00","currency":"EUR","fee":"0.35","total":"1250.35",` +
	`"payee":{"account_id":"DE89370400440532013000","name":"Müller Logistik GmbH","bank":"Commerzbank","country":"DE"},` +
	`"fx_rate":null,"expected_arrival":"2026-05-04","quote_valid_until":"2026-05-01T09:27:44Z","warnings":[]}`

// transferBody is the payments API's answer to a confirm.
const transferBody = `{"transfer_id":"tr_01HZX5B3K7M2","status":"executed","amount":"1250.00","currency":"EUR","fee":"0.35",` +
	`"payee":{"account_id":"DE89370400440532013000","name":"Müller Logistik GmbH"},"executed_at":"2026-05-01T09:13:02Z"}`

func hv(k, v string) *corev3.HeaderValue { return &corev3.HeaderValue{Key: k, RawValue: []byte(v)} }

// route is the fixed part of every request to one path: shared header
// values and the upstream's response (messages are only read once built).
type route struct {
	method, path, authority, scheme, contentType, forwardedProto *corev3.HeaderValue
	subjects                                                     []*corev3.HeaderValue
	metadata                                                     []*corev3.Metadata
	respHeaders                                                  []*corev3.HeaderValue
	respBody                                                     []byte
}

func newRoute(path string, respBody string) *route {
	r := &route{
		method:         hv(":method", "POST"),
		path:           hv(":path", path),
		authority:      hv(":authority", "api.payments.example"),
		scheme:         hv(":scheme", "https"),
		contentType:    hv("content-type", "application/json"),
		forwardedProto: hv("x-forwarded-proto", "https"),
		respBody:       []byte(respBody),
		respHeaders: []*corev3.HeaderValue{
			hv(":status", "200"),
			hv("content-type", "application/json"),
			hv("content-length", strconv.Itoa(len(respBody))),
			hv("x-envoy-upstream-service-time", "3"),
		},
	}
	now := time.Now().Unix()
	for i := 0; i < subjectCount; i++ {
		sub := subjectName(i)
		r.subjects = append(r.subjects, hv("x-idemgate-subject", sub))
		// What jwt_authn (payload_in_metadata: jwt_payload) forwards on
		// every message in the shipped Envoy config.
		payload, _ := structpb.NewStruct(map[string]any{
			"iss": "https://auth.demo.idemgate.invalid", "aud": "idemgate-demo", "sub": sub,
			"iat": float64(now), "exp": float64(now + 3600),
		})
		r.metadata = append(r.metadata, &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{
			jwtNamespace: {Fields: map[string]*structpb.Value{"jwt_payload": structpb.NewStructValue(payload)}},
		}})
	}
	return r
}

func subjectName(i int) string { return fmt.Sprintf("user-%04d", i%subjectCount) }

// request builds one stream's request. Header order follows what Envoy hands
// over: pseudo-headers first, then the rest, x-request-id generated per request.
func (r *route) request(rng *rand.Rand, body []byte, subject int) *extprocdriver.Request {
	return &extprocdriver.Request{
		Headers: []*corev3.HeaderValue{
			r.authority, r.path, r.method, r.scheme,
			r.contentType,
			{Key: "content-length", RawValue: strconv.AppendInt(nil, int64(len(body)), 10)},
			r.forwardedProto,
			{Key: "x-request-id", RawValue: requestID(rng)},
			r.subjects[subject%subjectCount],
		},
		Body:            body,
		UpstreamStatus:  200,
		ResponseHeaders: r.respHeaders,
		ResponseBody:    r.respBody,
		Metadata:        r.metadata[subject%subjectCount],
	}
}

// requestID is a version-4 UUID, as Envoy generates for x-request-id.
func requestID(rng *rand.Rand) []byte {
	var b [16]byte
	for i := 0; i < 16; i += 8 {
		v := rng.Uint64()
		for j := 0; j < 8; j++ {
			b[i+j] = byte(v >> (8 * j))
		}
	}
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	out := make([]byte, 36)
	hex.Encode(out[0:8], b[0:4])
	out[8] = '-'
	hex.Encode(out[9:13], b[4:6])
	out[13] = '-'
	hex.Encode(out[14:18], b[6:8])
	out[18] = '-'
	hex.Encode(out[19:23], b[8:10])
	out[23] = '-'
	hex.Encode(out[24:], b[10:])
	return out
}

// rngs holds one random source per worker (each worker touches only its own).
type rngs []*rand.Rand

func newRNGs(n int, seed uint64) rngs {
	out := make(rngs, n)
	for i := range out {
		out[i] = rand.New(rand.NewPCG(seed, uint64(i)))
	}
	return out
}

// fixedBodySource sends the same body on every stream (preview, floor),
// subjects round-robin, at most limit streams.
type fixedBodySource struct {
	route *route
	body  []byte
	rng   rngs
	n     atomic.Uint64
	limit uint64
}

func newFixedBodySource(r *route, body []byte, workers int, limit uint64) *fixedBodySource {
	return &fixedBodySource{route: r, body: body, rng: newRNGs(workers, 1), limit: limit}
}

func (s *fixedBodySource) Next(w int) *extprocdriver.Request {
	i := s.n.Add(1)
	if s.limit > 0 && i > s.limit {
		return nil
	}
	return s.route.request(s.rng[w], s.body, int(i))
}

// confirmItem is one minted confirm: its body (with the fingerprint field)
// and the subject the fingerprint was signed for.
type confirmItem struct {
	body    []byte
	subject int
}

// poolSource hands out minted confirms: each once (cycle false: a
// first-time confirm must never repeat) or round-robin up to limit (replay).
type poolSource struct {
	route *route
	items []confirmItem
	rng   rngs
	n     atomic.Uint64
	cycle bool
	limit uint64
}

func (s *poolSource) Next(w int) *extprocdriver.Request {
	i := s.n.Add(1) - 1
	if !s.cycle && i >= uint64(len(s.items)) || s.limit > 0 && i >= s.limit {
		return nil
	}
	it := s.items[i%uint64(len(s.items))]
	return s.route.request(s.rng[w], it.body, it.subject)
}

// minter signs confirm fingerprints exactly as idemgate's preview would,
// with the key idemgate is given.
type minter struct {
	ring   *fingerprint.KeyRing
	params fingerprint.Params
	ttl    time.Duration
}

func newMinter(keyB64 string, ttl time.Duration) (*minter, error) {
	key, err := fingerprint.ParseKey(keyB64)
	if err != nil {
		return nil, fmt.Errorf("failed to parse the signing key: %w", err)
	}
	ring, err := fingerprint.NewKeyRing("k1", map[string][]byte{"k1": key})
	if err != nil {
		return nil, fmt.Errorf("failed to build the key ring: %w", err)
	}
	sel, err := fingerprint.NewSelector(operationParams, fingerprint.Limits{})
	if err != nil {
		return nil, fmt.Errorf("failed to build the param selector: %w", err)
	}
	doc, err := fingerprint.ParseJSON([]byte(previewBody), 0)
	if err != nil {
		return nil, fmt.Errorf("failed to parse the preview body: %w", err)
	}
	params, err := sel.Select(doc, nil)
	if err != nil {
		return nil, fmt.Errorf("failed to select the params: %w", err)
	}
	return &minter{ring: ring, params: params, ttl: ttl}, nil
}

// sample signs one fingerprint of the preview body's params for scope,
// as idemgate's preview would (a fresh nonce, the TTL from now, the first
// subject), and returns it with its expiry as idemgate writes it (RFC
// 3339, UTC): the fixed values of the same-answer floor, of the sizes
// idemgate's answers carry.
func (m *minter) sample(scope string) (token, expires string, err error) {
	nonce, err := fingerprint.NewNonce()
	if err != nil {
		return "", "", fmt.Errorf("failed to make a nonce: %w", err)
	}
	token, exp, err := m.ring.SignToken(fingerprint.SignRequest{
		Subject: subjectName(0), Scope: scope, Params: m.params, Nonce: nonce, Expiry: time.Now().Add(m.ttl),
	})
	if err != nil {
		return "", "", fmt.Errorf("failed to sign a fingerprint: %w", err)
	}
	return token, exp.Format(time.RFC3339), nil
}

// confirmBody is base with the fingerprint field added at the end.
func confirmBody(base []byte, token string) []byte {
	i := bytes.LastIndexByte(base, '}')
	out := make([]byte, 0, len(base)+len(token)+20)
	out = append(out, base[:i]...)
	out = append(out, `,"fingerprint":"`...)
	out = append(out, token...)
	out = append(out, `"}`...)
	return out
}

// mint signs n fingerprints (fresh nonces, subjects round-robin) into
// confirm bodies built from base, using every core.
func (m *minter) mint(n int, base []byte) ([]confirmItem, error) {
	return m.mintWith(n, scope, func(_ int, token string) []byte { return confirmBody(base, token) })
}

// mintWith is mint for any operation scope and request shape: body builds
// request i around its token.
func (m *minter) mintWith(n int, scope string, body func(i int, token string) []byte) ([]confirmItem, error) {
	items := make([]confirmItem, n)
	exp := time.Now().Add(m.ttl)
	workers := runtime.GOMAXPROCS(0)
	var (
		wg       sync.WaitGroup
		firstErr error
		once     sync.Once
	)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < n; i += workers {
				nonce, err := fingerprint.NewNonce()
				if err == nil {
					var token string
					token, _, err = m.ring.Sign(fingerprint.SignRequest{
						Subject: subjectName(i), Scope: scope, Params: m.params, Nonce: nonce, Expiry: exp,
					})
					items[i] = confirmItem{body: body(i, token), subject: i}
				}
				if err != nil {
					once.Do(func() { firstErr = fmt.Errorf("failed to mint a fingerprint: %w", err) })
					return
				}
			}
		}()
	}
	wg.Wait()
	return items, firstErr
}

// paddedBody returns base grown to size bytes (if larger) by lengthening
// its memo, which no param binds: a bigger body of the same meaning.
func paddedBody(base string, size int) []byte {
	b := []byte(base)
	if size <= len(b) {
		return b
	}
	const marker = `"memo":"`
	i := bytes.Index(b, []byte(marker)) + len(marker)
	pad := bytes.Repeat([]byte("x"), size-len(b))
	out := make([]byte, 0, size)
	out = append(out, b[:i]...)
	out = append(out, pad...)
	return append(out, b[i:]...)
}
