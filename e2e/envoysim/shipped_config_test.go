package envoysim

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/e2e/demoauth"
	"github.com/idemgate/idemgate/e2e/payments"
	"github.com/idemgate/idemgate/envoy"
)

func TestFromBootstrapAcceptsTheShippedEnvoyYAML(t *testing.T) {
	cfg, err := FromBootstrap(envoy.BootstrapYAML(), map[string]string{"idemgate": "127.0.0.1:1", "payments": "127.0.0.1:2"}, "127.0.0.1:0")
	require.NoError(t, err)
	_, err = New(cfg)
	require.NoError(t, err)

	require.Equal(t, []HeaderMutationOp{{Remove: "x-idemgate-subject"}}, cfg.HeaderMutation.RequestMutations)
	require.JSONEq(t, string(demoauth.JWKS()), string(cfg.JWTAuthn.Providers["demo"].LocalJWKS))
	require.Equal(t, ProcessingMode{
		RequestHeaderMode: HeaderSend, ResponseHeaderMode: HeaderSend,
		RequestBodyMode: BodyBuffered, ResponseBodyMode: BodyBuffered,
		RequestTrailerMode: HeaderSkip, ResponseTrailerMode: HeaderSkip,
	}, cfg.ExtProc.ProcessingMode)
	require.True(t, cfg.ExtProc.AllowModeOverride)
	require.False(t, cfg.ExtProc.FailureModeAllow)
	require.Equal(t, time.Second, *cfg.ExtProc.MessageTimeout)
	require.True(t, cfg.Clusters["idemgate"].HTTP2)

	byName := map[string]Route{}
	for _, r := range cfg.VirtualHosts[0].Routes {
		byName[r.Name] = r
	}
	require.Equal(t, []string{"reset,connect-failure"}, byName["transfer_confirm"].RetryPolicy.RetryOn)
	require.Nil(t, byName["transfer_confirm"].ExtProcPerRoute)
	require.True(t, byName["catch_all"].ExtProcPerRoute.Disabled)
}

// shippedEnv runs envoy/envoy.yaml with a scripted idemgate and the demo
// payments upstream.
type shippedEnv struct {
	url      string
	fp       *fakeProcessor
	payments *payments.Server
	proxy    *Proxy
}

func requireShippedEnv(t *testing.T, sc script) *shippedEnv {
	t.Helper()
	return requireShippedEnvWith(t, sc, nil)
}

func requireShippedEnvWith(t *testing.T, sc script, mutate func(*Config)) *shippedEnv {
	t.Helper()
	fp := requireFakeProcessor(t, sc)
	pay := payments.New(payments.Options{})
	up := httptest.NewServer(pay)
	t.Cleanup(up.Close)
	cfg, err := FromBootstrap(envoy.BootstrapYAML(), map[string]string{
		"idemgate": fp.addr, "payments": up.Listener.Addr().String(),
	}, "127.0.0.1:0")
	require.NoError(t, err)
	if mutate != nil {
		mutate(&cfg)
	}
	p, err := New(cfg)
	require.NoError(t, err)
	require.NoError(t, p.Start(""))
	t.Cleanup(func() { require.NoError(t, p.Close()) })
	return &shippedEnv{url: "http://" + p.Addr(), fp: fp, payments: pay, proxy: p}
}

// idemgateLike answers like idemgate on a confirm: Idempotency-Key set in the
// request body reply, response passed through unchanged.
func idemgateLike(req *extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse {
	if isRequestBody(req) {
		return bodyReply(dirRequest, &extprocv3.CommonResponse{HeaderMutation: &extprocv3.HeaderMutation{
			SetHeaders: []*corev3.HeaderValueOption{setHeader("idempotency-key", "n-0123456789abcdef")},
		}})
	}
	return nil
}

func TestShippedConfigConfirmWithAResetIsRetriedAndExecutedOnce(t *testing.T) {
	env := requireShippedEnv(t, replyAll(idemgateLike))
	env.payments.SetFaults(payments.Faults{ResetAfterExecute: true, Times: 1})

	tok, err := demoauth.Mint("alice", time.Minute, time.Now())
	require.NoError(t, err)
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, env.url+"/v1/transfers/confirm",
		strings.NewReader(`{"amount":"25.00","currency":"EUR","payee":{"account_id":"acc_bob"}}`))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+tok)
	req.Header.Set("X-Idemgate-Subject", "mallory")
	req.Header.Set("X-Request-Id", "client-id")
	res := doRequest(req)
	require.NoError(t, res.err)
	require.Equal(t, 200, res.status, res.body)
	require.Contains(t, res.body, `"transfer_id":"tr_000001"`)

	st := env.payments.Stats()
	require.Equal(t, 1, st.Executions, "executed once although the upstream was called twice")
	require.Equal(t, 1, st.Replays)
	require.Equal(t, map[string]int{"n-0123456789abcdef": 1}, st.ExecutionsByKey)
	require.Equal(t, int64(1), env.proxy.Stats().UpstreamRetries)

	rec := env.fp.nextStream(t)
	rec.waitDone(t)
	hm := rec.messages()[0].GetRequestHeaders().GetHeaders()
	var subjects []string
	for _, e := range headerValues(hm) {
		if e[0] == subjectHeader {
			subjects = append(subjects, e[1])
		}
	}
	require.Equal(t, []string{"alice"}, subjects)
	id, _ := headerGet(hm, "x-request-id")
	require.NotEqual(t, "client-id", id, "use_remote_address: an external request id is replaced")
	xff, _ := headerGet(hm, "x-forwarded-for")
	require.Equal(t, "127.0.0.1", xff)
	require.Equal(t, "alice", rec.messages()[0].GetMetadataContext().GetFilterMetadata()[JWTAuthnMetadataNamespace].
		GetFields()["jwt_payload"].GetStructValue().GetFields()["sub"].GetStringValue())
}

func TestShippedConfigRoutesOutsideIdemgateOpenNoStream(t *testing.T) {
	env := requireShippedEnv(t, replyAll())
	for _, tc := range []struct {
		path   string
		status int
		body   string
	}{
		{"/healthz", 200, "ok\n"},
		{"/v1/transfers/CONFIRM", 404, "not found: use the exact operation path\n"},
		{"/v1/transfers/confirm/", 404, "not found: use the exact operation path\n"},
		{"/_admin/stats", 200, ""},
	} {
		res := doRequest(mustRequest(t, http.MethodGet, env.url+tc.path))
		require.NoError(t, res.err)
		require.Equal(t, tc.status, res.status, tc.path)
		if tc.body != "" {
			require.Equal(t, tc.body, res.body)
		}
	}
	require.Equal(t, 0, env.fp.streamCount())
}

func TestShippedConfigNormalisesPathsBeforeRouting(t *testing.T) {
	env := requireShippedEnv(t, replyAll())
	res := doRequest(mustRequest(t, http.MethodPost, env.url+"/v1/transfers%2Fconfirm"))
	require.NoError(t, res.err)
	require.Equal(t, 307, res.status)
	require.Equal(t, "/v1/transfers/confirm", res.header.Get("Location"))

	// Dot segments and doubled slashes resolve to the guarded route, which
	// then requires a JWT.
	res = doRequest(mustRequest(t, http.MethodPost, env.url+"/v1/x/..//transfers/./confirm"))
	require.NoError(t, res.err)
	require.Equal(t, 401, res.status)
	require.Equal(t, "Jwt is missing", res.body)

	req := mustRequest(t, http.MethodGet, env.url+"/healthz")
	req.Header.Set("X_Idemgate_Subject", "mallory")
	res = doRequest(req)
	require.NoError(t, res.err)
	require.Equal(t, 400, res.status, "headers with underscores are rejected")
}

func mustRequest(t *testing.T, method, url string) *http.Request {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, url, nil)
	require.NoError(t, err)
	return req
}

func TestShippedConfigUnderConcurrency(t *testing.T) {
	// The shipped 1 s message_timeout is a deadline for a real idemgate; on a
	// loaded test machine a fake one can miss it, and this test is about
	// concurrency, not speed.
	env := requireShippedEnvWith(t, replyAll(idemgateLike), func(c *Config) {
		d := 30 * time.Second
		c.ExtProc.MessageTimeout = &d
	})
	tok, err := demoauth.Mint("alice", time.Minute, time.Now())
	require.NoError(t, err)
	const n = 100
	results := make([]result, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, env.url+"/v1/transfers/confirm",
				strings.NewReader(`{"amount":"1","currency":"EUR","payee":{"account_id":"acc"}}`))
			if err != nil {
				results[i] = result{err: err}
				return
			}
			req.Header.Set("Authorization", "Bearer "+tok)
			results[i] = doRequest(req)
		})
	}
	wg.Wait()
	for _, r := range results {
		require.NoError(t, r.err)
		require.Equal(t, 200, r.status)
		require.Equal(t, results[0].body, r.body)
	}
	require.Equal(t, 1, env.payments.Executions())
	require.Equal(t, int64(n), env.proxy.Stats().StreamsOpened)
	require.Equal(t, n, env.fp.streamCount())
}
