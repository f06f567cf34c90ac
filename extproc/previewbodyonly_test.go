package extproc

import (
	"strings"
	"testing"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/idemgate/idemgate/internal/extprocdriver"
)

// bodyOnlyEnv is the test server with the transfer preview's fingerprint
// in the body only (preview.fingerprint_header: false).
func bodyOnlyEnv(t testing.TB) *env {
	t.Helper()
	e := newEnv(t, nil, nil)
	yaml := strings.Replace(testConfigYAML, "preview: {method: POST, path: /v1/transfers/preview}",
		"preview: {method: POST, path: /v1/transfers/preview, fingerprint_header: false}", 1)
	require.NotEqual(t, testConfigYAML, yaml)
	e.cfg = testConfig(t, yaml)
	e.useStore(t, newMemoryStore(e.clock))
	return e
}

// responseCodeFilter is testFilter with response_attributes:
// [response.code], as idemgate envoy-config writes it.
var responseCodeFilter = func() extprocdriver.Filter {
	f := testFilter
	f.ResponseCode = true
	return f
}()

// A body-only preview costs 3 messages: its response headers are switched
// off at the request headers, the status comes as response.code on the
// response body, the fingerprint goes into the body, and it confirms.
func TestPreviewBodyOnlySkipsTheResponseHeaders(t *testing.T) {
	e := bodyOnlyEnv(t)
	d := fakeDialer{srv: e.srv}
	res := doWith(t, responseCodeFilter, d, post("/v1/transfers/preview", "alice", transferBody(`7`, "EUR", "DE89", "")), previewOK)
	require.Nil(t, res.immediate)
	require.Equal(t, 3, res.replies, "request headers, request body, response body")
	require.NotZero(t, res.marks&extprocdriver.MarkModeOverride)
	require.Zero(t, res.marks&extprocdriver.MarkDroppedHeaderMutation, "no header is set that Envoy would drop")
	require.NotContains(t, res.headers, "idempotency-fingerprint")
	fp, _ := res.json(t)["fingerprint"].(string)
	require.NotEmpty(t, fp)
	require.Equal(t, 1.0, metricValue(t, e.metrics.decisions.WithLabelValues("transfer", "preview", "signed")))

	p := newPayments()
	require.Equal(t, 201, do(t, d, post("/v1/transfers/confirm", "alice", transferBody(`7`, "EUR", "DE89", fp)), p.handle).status)
	require.Equal(t, 1, p.Executions())

	// The default keeps all four messages and the header.
	res = doWith(t, responseCodeFilter, fakeDialer{srv: newEnv(t, nil, nil).srv}, post("/v1/transfers/preview", "alice", transferBody(`7`, "EUR", "DE89", "")), previewOK)
	require.Equal(t, 4, res.replies)
	require.NotEmpty(t, res.headers["idempotency-fingerprint"])
}

// Without a 2xx response.code nothing is signed: a non-2xx answer passes,
// and a filter without the attribute (an attachment that lacks
// response_attributes) gets no fingerprint, logged: no confirm can follow.
func TestPreviewBodyOnlySignsOnlyA2xxItCanSee(t *testing.T) {
	e := bodyOnlyEnv(t)
	d := fakeDialer{srv: e.srv}
	notFound := func(map[string]string, []byte) upstreamReply {
		return upstreamReply{status: 404, headers: []header{{"content-type", "application/json"}}, body: []byte(`{"error":"no such payee"}`)}
	}
	res := doWith(t, responseCodeFilter, d, post("/v1/transfers/preview", "alice", transferBody(`7`, "EUR", "DE89", "")), notFound)
	require.Equal(t, 404, res.status)
	require.JSONEq(t, `{"error":"no such payee"}`, string(res.body))

	res = doWith(t, testFilter, d, post("/v1/transfers/preview", "alice", transferBody(`7`, "EUR", "DE89", "")), previewOK)
	require.Equal(t, 200, res.status)
	require.JSONEq(t, `{"quote":{"fee":"0.50"},"amount":"100.00"}`, string(res.body), "passed through unsigned")
	require.Equal(t, 1.0, metricValue(t, e.metrics.decisions.WithLabelValues("transfer", "preview", "status_unknown")))
	require.Contains(t, e.logs.String(), "response_attributes: [response.code]")

	notJSON := func(map[string]string, []byte) upstreamReply {
		return upstreamReply{status: 200, headers: []header{{"content-type", "text/plain"}}, body: []byte(`quote: 0.50`)}
	}
	res = doWith(t, responseCodeFilter, d, post("/v1/transfers/preview", "alice", transferBody(`7`, "EUR", "DE89", "")), notJSON)
	require.Equal(t, "quote: 0.50", string(res.body))
	require.NotContains(t, res.headers, "idempotency-fingerprint")
	require.Equal(t, 1.0, metricValue(t, e.metrics.decisions.WithLabelValues("transfer", "preview", "unsigned_not_json")))
}

// An attachment whose filter lacks response_attributes: [response.code]
// fails closed: the body-only preview costs its 3 messages and reaches the
// agent unsigned (no fingerprint in the body, no header), so no confirm can
// follow: the agent holds no fingerprint, and a confirm without one is
// refused before payments.
func TestPreviewBodyOnlyWithoutResponseCodeSignsNothing(t *testing.T) {
	e := bodyOnlyEnv(t)
	d := fakeDialer{srv: e.srv}
	res := doWith(t, testFilter, d, post("/v1/transfers/preview", "alice", transferBody(`7`, "EUR", "DE89", "")), previewOK)
	require.Nil(t, res.immediate)
	require.Equal(t, 200, res.status)
	require.Equal(t, 3, res.replies, "the response headers are still skipped")
	require.NotContains(t, res.headers, "idempotency-fingerprint")
	require.NotContains(t, res.json(t), "fingerprint")
	require.NotContains(t, res.json(t), "fingerprint_expires_at")
	require.Equal(t, 1.0, metricValue(t, e.metrics.decisions.WithLabelValues("transfer", "preview", "status_unknown")))
	require.Zero(t, metricValue(t, e.metrics.decisions.WithLabelValues("transfer", "preview", "signed")))

	p := newPayments()
	requireEnvelope(t, do(t, d, post("/v1/transfers/confirm", "alice", transferBody(`7`, "EUR", "DE89", "")), p.handle), 400, "fingerprint_required", false)
	require.Zero(t, p.Executions())
}

// Only a whole HTTP status under ext_proc's namespace counts as
// response.code; anything else reads as missing (0), and the preview is
// not signed.
func TestResponseCodeAttribute(t *testing.T) {
	req := func(ns string, v *structpb.Value) *extprocv3.ProcessingRequest {
		return &extprocv3.ProcessingRequest{Attributes: map[string]*structpb.Struct{ns: {Fields: map[string]*structpb.Value{"response.code": v}}}}
	}
	require.Equal(t, 200, responseCodeAttribute(req("envoy.filters.http.ext_proc", structpb.NewNumberValue(200))))
	require.Equal(t, 503, responseCodeAttribute(req("envoy.filters.http.ext_proc", structpb.NewNumberValue(503))))
	for name, r := range map[string]*extprocv3.ProcessingRequest{
		"no attributes":     {},
		"another namespace": req("envoy.filters.http.other", structpb.NewNumberValue(200)),
		"a string":          req("envoy.filters.http.ext_proc", structpb.NewStringValue("200")),
		"a fraction":        req("envoy.filters.http.ext_proc", structpb.NewNumberValue(200.5)),
		"below 100":         req("envoy.filters.http.ext_proc", structpb.NewNumberValue(99)),
		"above 599":         req("envoy.filters.http.ext_proc", structpb.NewNumberValue(600)),
		"null":              req("envoy.filters.http.ext_proc", structpb.NewNullValue()),
	} {
		require.Zero(t, responseCodeAttribute(r), name)
	}
}
