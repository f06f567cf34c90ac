package floor

import (
	"strings"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/jackc/pgx/v5/pgxpool"
	goredis "github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/internal/testutil"

	"github.com/idemgate/idemgate/internal/extprocdriver"
)

func serve(t *testing.T, srv extprocv3.ExternalProcessorServer) *extprocdriver.Conns {
	t.Helper()
	addr, stop, err := extprocdriver.ServeLoopback(srv)
	require.NoError(t, err)
	t.Cleanup(stop)
	conns, err := extprocdriver.Dial(t.Context(), addr, 1)
	require.NoError(t, err)
	t.Cleanup(conns.Close)
	return conns
}

func hv(k, v string) *corev3.HeaderValue { return &corev3.HeaderValue{Key: k, RawValue: []byte(v)} }

func confirmRequest() *extprocdriver.Request {
	return &extprocdriver.Request{
		Headers: []*corev3.HeaderValue{
			hv(":authority", "payments.local"), hv(":path", "/v1/transfers/confirm"), hv(":method", "POST"),
			hv(":scheme", "http"), hv("content-type", "application/json"), hv("content-length", "2"),
		},
		Body:            []byte(`{}`),
		UpstreamStatus:  200,
		ResponseHeaders: []*corev3.HeaderValue{hv(":status", "200"), hv("content-length", "22")},
		ResponseBody:    []byte(`{"transfer_id":"tr_1"}`),
	}
}

func TestNoopContinuesEveryPhase(t *testing.T) {
	conns := serve(t, Noop{})
	for i := 0; i < 3; i++ {
		require.Equal(t, extprocdriver.Outcome{Status: 200}, extprocdriver.EnvoyFilter().Do(t.Context(), conns.Next(), confirmRequest(), nil))
	}
}

// TestAnswerRepliesAfterTheRequestBody: two messages, the second answered
// with a 200 replay, and the upstream never called (a replay's shape).
func TestAnswerRepliesAfterTheRequestBody(t *testing.T) {
	conns := serve(t, Answer{})
	for i := 0; i < 3; i++ {
		out, v := extprocdriver.EnvoyFilter().Trace(t.Context(), conns.Next(), confirmRequest(), nil)
		require.Equal(t, extprocdriver.Outcome{Status: 200, Local: true}, out)
		require.Equal(t, 2, v.Replies)
		require.False(t, v.UpstreamCalled)
		require.Equal(t, "true", v.Headers["idempotent-replayed"])
	}
}

// TestNewAnswerSendsTheGivenAnswer: the same-answer floor of a replay
// sends the ImmediateResponse it was given, status, headers and body.
func TestNewAnswerSendsTheGivenAnswer(t *testing.T) {
	body := `{"status":"already_completed","result":{"transfer_id":"tr_1"}}`
	conns := serve(t, NewAnswer(&extprocv3.ImmediateResponse{
		Status: &typev3.HttpStatus{Code: typev3.StatusCode_Created},
		Headers: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{
			{Header: hv("content-type", "application/json")}, {Header: hv("idempotent-replayed", "true")}, {Header: hv("idempotency-key", "n-1")},
		}},
		Body: []byte(body),
	}))
	for i := 0; i < 3; i++ {
		out, v := extprocdriver.EnvoyFilter().Trace(t.Context(), conns.Next(), confirmRequest(), nil)
		require.Equal(t, extprocdriver.Outcome{Status: 201, Local: true}, out)
		require.Equal(t, body, string(v.Body))
		require.Equal(t, 2, v.Replies)
		require.False(t, v.UpstreamCalled)
		require.Equal(t, "n-1", v.Headers["idempotency-key"])
		require.Equal(t, "true", v.Headers["idempotent-replayed"])
	}
}

func TestIOFloorMakesExactlyTheConfirmRoundTrips(t *testing.T) {
	r := testutil.StartRedis(t)
	dsn := testutil.CreateDatabase(t)
	rdb := goredis.NewClient(&goredis.Options{Addr: r.Addr})
	defer rdb.Close()
	pool, err := pgxpool.New(t.Context(), dsn)
	require.NoError(t, err)
	defer pool.Close()

	srv, err := NewIO(t.Context(), IOOptions{Redis: rdb, Postgres: pool})
	require.NoError(t, err)
	require.NoError(t, rdb.ConfigResetStat(t.Context()).Err())
	conns := serve(t, srv)

	const n = 25
	for i := 0; i < n; i++ {
		require.Equal(t, extprocdriver.Outcome{Status: 200}, extprocdriver.EnvoyFilter().Do(t.Context(), conns.Next(), confirmRequest(), nil))
	}

	var rows, done int
	require.NoError(t, pool.QueryRow(t.Context(),
		`SELECT count(*), count(*) FILTER (WHERE state = 'DONE' AND result_body = '{"transfer_id":"tr_1"}'::bytea) FROM `+Table).Scan(&rows, &done))
	require.Equal(t, n, rows, "one INSERT per request")
	require.Equal(t, n, done, "one UPDATE per request, with the response body")

	keys, err := rdb.Keys(t.Context(), "iofloor:*").Result()
	require.NoError(t, err)
	require.Len(t, keys, n)
	require.Equal(t, "DONE", rdb.HGet(t.Context(), keys[0], "state").Val())

	stats, err := rdb.Info(t.Context(), "commandstats").Result()
	require.NoError(t, err)
	calls := map[string]string{}
	for _, line := range strings.Split(stats, "\r\n") {
		if name, rest, ok := strings.Cut(line, ":"); ok && strings.HasPrefix(name, "cmdstat_") {
			calls[strings.TrimPrefix(name, "cmdstat_")] = strings.Split(strings.TrimPrefix(rest, "calls="), ",")[0]
		}
	}
	require.Equal(t, "50", calls["evalsha"], "two EVALSHA per request: %v", calls)
	require.NotContains(t, calls, "eval", "scripts were preloaded, no EVAL fallback")
}
