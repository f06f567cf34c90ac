package extproc

import (
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/idemgate/idemgate/fingerprint"
	"github.com/idemgate/idemgate/state"
)

func passThroughRequest(path string) *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{
		Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
			Headers: headerMap([]header{{":method", "GET"}, {":path", path}}), EndOfStream: true,
		}},
	}
}

func reqHeaders(hs []header, eos bool) *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: headerMap(hs), EndOfStream: eos}}}
}

func reqBody(b []byte) *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: b, EndOfStream: true}}}
}

func respHeaders(status int, eos bool) *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{
		Headers: headerMap([]header{{":status", fmt.Sprint(status)}, {"content-type", "application/json"}}), EndOfStream: eos,
	}}}
}

func respBody(b []byte) *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{Body: b, EndOfStream: true}}}
}

func confirmHeaders(path, subject string) []header {
	return []header{{":method", "POST"}, {":path", path}, {"x-idemgate-subject", subject}, {"x-request-id", "r1"}}
}

func exchangeOne(t *testing.T, c clientStream, req *extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse {
	t.Helper()
	require.NoError(t, c.Send(req))
	resp, err := c.Recv()
	require.NoError(t, err)
	return resp
}

// The phase machine over the channel-based fake stream: the whole suite.
func TestPhaseMachineFakeStream(t *testing.T) {
	e := newEnv(t, nil, nil)
	runSuite(t, e, fakeDialer{srv: e.srv})
	require.Eventually(t, func() bool { return metricNow(e.metrics.openStreams) == 0 }, 5*time.Second, 10*time.Millisecond)
}

func TestBodyOverLimitWithoutContentLength(t *testing.T) {
	e := newEnv(t, nil, nil)
	c := fakeDialer{srv: e.srv}.openFake(t)
	resp := exchangeOne(t, c, reqHeaders(confirmHeaders("/v1/transfers/confirm", "alice"), false))
	require.NotNil(t, resp.GetRequestHeaders())
	resp = exchangeOne(t, c, reqBody([]byte(`{"memo":"`+strings.Repeat("x", 5000)+`"}`)))
	require.Equal(t, 413, int(resp.GetImmediateResponse().GetStatus().GetCode()))
	require.NoError(t, c.wait(t))
	require.Zero(t, e.store.Total())
}

func TestBodyModesNotBufferedAreRefused(t *testing.T) {
	e := newEnv(t, nil, nil)
	c := fakeDialer{srv: e.srv}.openFake(t)
	req := reqHeaders(confirmHeaders("/v1/transfers/confirm", "alice"), false)
	req.ProtocolConfig = &extprocv3.ProtocolConfiguration{RequestBodyMode: filterv3.ProcessingMode_STREAMED, ResponseBodyMode: filterv3.ProcessingMode_BUFFERED}
	resp := exchangeOne(t, c, req)
	im := resp.GetImmediateResponse()
	require.Equal(t, 500, int(im.GetStatus().GetCode()))
	require.Contains(t, string(im.GetBody()), `"status":"internal_error"`)
	require.Contains(t, e.logs.String(), "BUFFERED")
}

func TestTrailersAreAnswered(t *testing.T) {
	e := newEnv(t, nil, nil)
	c := fakeDialer{srv: e.srv}.openFake(t)
	resp := exchangeOne(t, c, reqHeaders(confirmHeaders("/v1/transfers/preview", "alice"), false))
	require.NotNil(t, resp.GetRequestHeaders())
	resp = exchangeOne(t, c, &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestTrailers{RequestTrailers: &extprocv3.HttpTrailers{}}})
	require.NotNil(t, resp.GetRequestTrailers())
	resp = exchangeOne(t, c, &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseTrailers{ResponseTrailers: &extprocv3.HttpTrailers{}}})
	require.NotNil(t, resp.GetResponseTrailers())
}

func TestPanicIsRecoveredIntoInternalError(t *testing.T) {
	e := newEnv(t, nil, nil)
	d := fakeDialer{srv: e.srv}
	fp := preview(t, d, "alice", `1`)
	e.store.panics.Store(true)
	res := do(t, d, post("/v1/transfers/confirm", "alice", transferBody(`1`, "EUR", "DE89", fp)), neverCalled(t))
	e.store.panics.Store(false)
	body := requireEnvelope(t, res, 500, "internal_error", false)
	require.Contains(t, body["instruction"], "transfer_status")
	require.Equal(t, float64(1), metricValue(t, e.metrics.panics))
	require.Contains(t, e.logs.String(), "recovered panic")
	// The process keeps serving.
	p := newPayments()
	res = do(t, d, post("/v1/transfers/confirm", "alice", transferBody(`1`, "EUR", "DE89", fp)), p.handle)
	require.Equal(t, 201, res.status)
}

// A confirm whose lease ran out and was taken over completes too late: the
// store refuses (NOT_OWNER), it is counted and logged, and its client still
// receives the upstream answer unchanged.
func TestLateCompletionIsNotOwner(t *testing.T) {
	e := newEnv(t, nil, nil)
	d := fakeDialer{srv: e.srv}
	fp := preview(t, d, "alice", `2`)
	body := transferBody(`2`, "EUR", "DE89", fp)

	slow := d.openFake(t)
	resp := exchangeOne(t, slow, reqHeaders(confirmHeaders("/v1/transfers/confirm", "alice"), false))
	require.NotNil(t, resp.GetRequestHeaders())
	resp = exchangeOne(t, slow, reqBody(body))
	require.NotNil(t, resp.GetRequestBody(), "ACQUIRED")

	e.clock.Advance(3 * time.Minute) // past ttl.in_flight
	p := newPayments()
	res := do(t, d, post("/v1/transfers/confirm", "alice", body), p.handle)
	require.Equal(t, 201, res.status, "the retry took over the expired lease")

	resp = exchangeOne(t, slow, respHeaders(201, false))
	require.NotNil(t, resp.GetResponseHeaders())
	resp = exchangeOne(t, slow, respBody([]byte(`{"transfer_id":"late"}`)))
	require.Nil(t, resp.GetResponseBody().GetResponse().GetBodyMutation(), "the late client gets its answer unchanged")
	require.NoError(t, slow.wait(t))
	require.Equal(t, float64(1), metricValue(t, e.metrics.notOwner.WithLabelValues("transfer")))
	rec, _ := e.record(t, e.claimsOf(t, fp, "alice", "payments.transfer").Nonce)
	require.Equal(t, `{"transfer_id":"tr_1","state":"executed"}`, string(rec.Result.Body), "the record keeps the new owner's result")
}

// A gateway that died holding a record: the lease runs out, the next confirm
// takes over (downstream honours keys) or marks it UNKNOWN (it does not).
func TestExpiredLeaseOfACrashedGateway(t *testing.T) {
	e := newEnv(t, nil, nil)
	d := fakeDialer{srv: e.srv}

	fp := preview(t, d, "alice", `3`)
	c := e.claimsOf(t, fp, "alice", "payments.transfer")
	e.holdRecord(t, c, "payments.transfer", 2*time.Minute)
	e.clock.Advance(2*time.Minute + time.Second)
	p := newPayments()
	res := do(t, d, post("/v1/transfers/confirm", "alice", transferBody(`3`, "EUR", "DE89", fp)), p.handle)
	require.Equal(t, 201, res.status)
	require.Equal(t, c.Nonce, res.upstreamHdrs["idempotency-key"])
	rec, _ := e.record(t, c.Nonce)
	require.Equal(t, state.Done, rec.State)
	require.Equal(t, int64(2), rec.Fence, "taken over: fence+1")

	res = do(t, d, post("/v1/accounts/z/payouts/preview", "alice", []byte(`{"amount":3}`)), previewOK)
	fp = res.json(t)["fingerprint"].(string)
	c = e.claimsOf(t, fp, "alice", "payments.payout")
	e.holdRecord(t, c, "payments.payout", 2*time.Minute)
	e.clock.Advance(2*time.Minute + time.Second)
	// The status tool derives the answer without writing anything.
	res = do(t, d, post("/v1/accounts/z/payouts/status", "alice", []byte(fmt.Sprintf(`{"fingerprint":%q}`, fp))), neverCalled(t))
	requireEnvelope(t, res, 200, "needs_reconciliation", false)
	res = do(t, d, post("/v1/accounts/z/payouts/confirm", "alice", []byte(fmt.Sprintf(`{"amount":3,"fingerprint":%q}`, fp))), neverCalled(t))
	requireEnvelope(t, res, 409, "needs_reconciliation", false)
	rec, _ = e.record(t, c.Nonce)
	require.Equal(t, state.Unknown, rec.State)
}

func TestBodilessUpstreamAnswerCompletesAtHeaders(t *testing.T) {
	e := newEnv(t, nil, nil)
	d := fakeDialer{srv: e.srv}
	fp := preview(t, d, "alice", `4`)
	res := do(t, d, post("/v1/transfers/confirm", "alice", transferBody(`4`, "EUR", "DE89", fp)), func(map[string]string, []byte) upstreamReply {
		return upstreamReply{status: 204}
	})
	require.Equal(t, 204, res.status)
	require.Equal(t, 3, res.replies)
	rec, _ := e.record(t, e.claimsOf(t, fp, "alice", "payments.transfer").Nonce)
	require.Equal(t, state.Done, rec.State)
	require.Equal(t, 204, rec.Result.Status)
}

func TestStreamCancelledBeforeAcquireTouchesNothing(t *testing.T) {
	e := newEnv(t, nil, nil)
	c := fakeDialer{srv: e.srv}.openFake(t)
	resp := exchangeOne(t, c, reqHeaders(confirmHeaders("/v1/transfers/confirm", "alice"), false))
	require.NotNil(t, resp.GetRequestHeaders())
	c.Close()
	require.NoError(t, c.wait(t), "Canceled is a normal end")
	require.Zero(t, e.store.Total())
}

func TestSubjectFromDynamicMetadata(t *testing.T) {
	e := newEnv(t, nil, nil)
	e.cfg = testConfig(t, strings.Replace(testConfigYAML, "limits:", "subject: {metadata: {namespace: envoy.filters.http.jwt_authn, path: jwt_payload.sub}}\nlimits:", 1))
	e.srv.cfg = e.cfg
	d := fakeDialer{srv: e.srv}
	claims, err := structpb.NewStruct(map[string]any{"jwt_payload": map[string]any{"sub": "alice"}})
	require.NoError(t, err)
	md := &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{"envoy.filters.http.jwt_authn": claims}}
	req := post("/v1/transfers/preview", "", transferBody(`1`, "EUR", "DE89", ""))
	req.metadata = md
	res := do(t, d, req, previewOK)
	require.Nil(t, res.immediate, string(res.body))
	e.claimsOf(t, res.json(t)["fingerprint"].(string), "alice", "payments.transfer")
	// The header is ignored when metadata is configured.
	res = do(t, d, post("/v1/transfers/preview", "alice", transferBody(`1`, "EUR", "DE89", "")), neverCalled(t))
	requireEnvelope(t, res, 401, "subject_required", false)
}

func TestChineseCatalogue(t *testing.T) {
	e := newEnv(t, nil, nil)
	e.cfg = testConfig(t, "messages: {language: zh}\n"+testConfigYAML)
	e.srv.cfg = e.cfg
	res := do(t, fakeDialer{srv: e.srv}, post("/v1/transfers/confirm", "alice", transferBody(`1`, "EUR", "DE89", "")), neverCalled(t))
	body := requireEnvelope(t, res, 400, "fingerprint_required", false)
	require.Contains(t, body["instruction"], "先调用 transfer_preview")
}

func TestMetrics(t *testing.T) {
	e := newEnv(t, nil, nil)
	d := fakeDialer{srv: e.srv}
	fp := preview(t, d, "alice", `5`)
	do(t, d, post("/v1/transfers/confirm", "alice", transferBody(`5`, "EUR", "DE89", fp)), newPayments().handle)
	do(t, d, post("/v1/transfers/confirm", "alice", transferBody(`5`, "EUR", "DE89", fp)), neverCalled(t))
	do(t, d, post("/v1/transfers/confirm", "mallory", transferBody(`5`, "EUR", "DE89", fp)), neverCalled(t))
	s := d.open(t)
	require.NoError(t, s.Send(passThroughRequest("/other")))
	_, err := s.Recv()
	require.NoError(t, err)
	s.Close()

	require.Equal(t, float64(1), metricValue(t, e.metrics.decisions.WithLabelValues("transfer", "preview", "signed")))
	require.Equal(t, float64(1), metricValue(t, e.metrics.decisions.WithLabelValues("transfer", "confirm", "acquired")))
	require.Equal(t, float64(1), metricValue(t, e.metrics.decisions.WithLabelValues("transfer", "confirm", "already_completed")))
	require.Equal(t, float64(1), metricValue(t, e.metrics.settlements.WithLabelValues("transfer", "done")))
	require.Equal(t, float64(1), metricValue(t, e.metrics.securityEvents.WithLabelValues("fingerprint_subject_mismatch")))
	require.Equal(t, float64(1), metricValue(t, e.metrics.passthrough))
	families, err := e.reg.Gather()
	require.NoError(t, err)
	names := map[string]bool{}
	for _, f := range families {
		names[f.GetName()] = true
	}
	for _, want := range []string{"idemgate_decisions_total", "idemgate_open_streams", "idemgate_security_events_total", "idemgate_settlements_total", "idemgate_passthrough_streams_total"} {
		require.True(t, names[want], want)
	}
}

// metricValue reads a counter or gauge without the testutil package.
// metricNow is metricValue for a require.Eventually condition (it never
// calls require): NaN when the metric cannot be read.
func metricNow(m prometheus.Metric) float64 {
	var d dto.Metric
	if err := m.Write(&d); err != nil {
		return math.NaN()
	}
	if d.Counter != nil {
		return d.Counter.GetValue()
	}
	return d.Gauge.GetValue()
}

func metricValue(t testing.TB, m prometheus.Metric) float64 {
	t.Helper()
	var d dto.Metric
	require.NoError(t, m.Write(&d))
	if d.Counter != nil {
		return d.Counter.GetValue()
	}
	return d.Gauge.GetValue()
}

// A token whose MAC verifies but whose nonce the store holds under other
// params (a leaked signing key, or a bug) never runs: params_changed and a
// security event.
func TestStoreParamMismatchIsASecurityEvent(t *testing.T) {
	e := newEnv(t, nil, nil)
	d := fakeDialer{srv: e.srv}
	fp := preview(t, d, "alice", `1`)
	c := e.claimsOf(t, fp, "alice", "payments.transfer")
	res := do(t, d, post("/v1/transfers/confirm", "alice", transferBody(`1`, "EUR", "DE89", fp)), newPayments().handle)
	require.Equal(t, 201, res.status)

	doc, err := fingerprint.ParseJSON(transferBody(`1000`, "EUR", "DE89", ""), 32)
	require.NoError(t, err)
	params, err := e.cfg.Operations[0].Selector.Select(doc, nil)
	require.NoError(t, err)
	forged, _, err := e.cfg.Keys.Sign(fingerprint.SignRequest{Subject: "alice", Scope: "payments.transfer", Params: params, Nonce: c.Nonce, Expiry: e.clock.Now().Add(time.Minute)})
	require.NoError(t, err)
	res = do(t, d, post("/v1/transfers/confirm", "alice", transferBody(`1000`, "EUR", "DE89", forged)), neverCalled(t))
	requireEnvelope(t, res, 422, "params_changed", false)
	require.Contains(t, e.logs.String(), "event=security_alert reason=store_param_mismatch operation=transfer nonce="+c.Nonce)
	require.Equal(t, float64(1), metricValue(t, e.metrics.securityEvents.WithLabelValues("store_param_mismatch")))
}

func TestUnknownKeyIsASecurityEvent(t *testing.T) {
	e := newEnv(t, nil, nil)
	d := fakeDialer{srv: e.srv}
	other, err := fingerprint.NewKeyRing("k9", map[string][]byte{"k9": []byte("another-key-not-configured-32byte")})
	require.NoError(t, err)
	doc, err := fingerprint.ParseJSON(transferBody(`1`, "EUR", "DE89", ""), 32)
	require.NoError(t, err)
	params, err := e.cfg.Operations[0].Selector.Select(doc, nil)
	require.NoError(t, err)
	nonce, err := fingerprint.NewNonce()
	require.NoError(t, err)
	token, _, err := other.Sign(fingerprint.SignRequest{Subject: "alice", Scope: "payments.transfer", Params: params, Nonce: nonce, Expiry: e.clock.Now().Add(time.Minute)})
	require.NoError(t, err)
	res := do(t, d, post("/v1/transfers/confirm", "alice", transferBody(`1`, "EUR", "DE89", token)), neverCalled(t))
	requireEnvelope(t, res, 400, "fingerprint_invalid", false)
	require.Contains(t, e.logs.String(), "event=security_alert reason=unknown_key operation=transfer nonce=\"\" subject_tag=")
	require.Equal(t, float64(1), metricValue(t, e.metrics.securityEvents.WithLabelValues("unknown_key")))
}
