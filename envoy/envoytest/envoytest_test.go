package envoytest

import (
	"testing"
	"time"

	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/durationpb"
)

func TestRouteForFollowsEnvoyMatching(t *testing.T) {
	var vh routev3.VirtualHost
	require.NoError(t, UnmarshalYAML([]byte(`
name: v
domains: ["*"]
routes:
- {name: exact, match: {path: /a/b}, direct_response: {status: 200}}
- {name: nocase, match: {path: /c, case_sensitive: false}, direct_response: {status: 200}}
- {name: separated, match: {path_separated_prefix: /d}, direct_response: {status: 200}}
- {name: regex, match: {safe_regex: {regex: "/e[0-9]"}}, direct_response: {status: 200}}
- {name: prefix, match: {prefix: /}, direct_response: {status: 200}}
`), &vh))
	tests := []struct {
		path, route string
	}{
		{"/a/b", "exact"},
		{"/a/b/", "prefix"},
		{"/A/B", "prefix"},
		{"/C", "nocase"},
		{"/d", "separated"},
		{"/d/x", "separated"},
		{"/dx", "prefix"},
		{"/e1", "regex"},
		{"/e1x", "prefix"}, // safe_regex matches the whole path
		{"/", "prefix"},
	}
	for _, tt := range tests {
		t.Run(tt.path, func(t *testing.T) {
			m, err := RouteFor(&vh, tt.path)
			require.NoError(t, err)
			require.Equal(t, tt.route, m.Route.GetName())
		})
	}

	vh.Routes[0].Match.Headers = []*routev3.HeaderMatcher{{Name: "x"}}
	_, err := RouteFor(&vh, "/a/b")
	require.Error(t, err, "a route with header conditions cannot be decided from a path")
}

func TestConfirmBudget(t *testing.T) {
	tests := []struct {
		name string
		ra   *routev3.RouteAction
		want time.Duration
	}{
		{"no retries", &routev3.RouteAction{Timeout: durationpb.New(10 * time.Second)}, 10*time.Second + 2*time.Second},
		{"Envoy's default timeout", &routev3.RouteAction{}, 15*time.Second + 2*time.Second},
		{"one retry, default backoff", &routev3.RouteAction{
			Timeout:     durationpb.New(10 * time.Second),
			RetryPolicy: &routev3.RetryPolicy{RetryOn: "reset"},
		}, 20*time.Second + 250*time.Millisecond + 2*time.Second},
		{"base interval only", &routev3.RouteAction{
			Timeout:     durationpb.New(10 * time.Second),
			RetryPolicy: &routev3.RetryPolicy{RetryOn: "reset", RetryBackOff: &routev3.RetryPolicy_RetryBackOff{BaseInterval: durationpb.New(100 * time.Millisecond)}},
		}, 20*time.Second + time.Second + 2*time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.Equal(t, tt.want, ConfirmBudget(tt.ra, time.Second))
		})
	}
}

func TestReadIdemgateConfigAppliesTheSchemaDefaults(t *testing.T) {
	c, err := ReadIdemgateConfig([]byte(`
signing: {active_key: k1, keys: {k1: {env: K}}}
operations:
- name: t
  preview: {method: POST, path: /p}
  confirm: {method: POST, path: /c}
  status: {method: POST, path: /s}
`))
	require.NoError(t, err)
	require.Equal(t, "127.0.0.1:50051", c.GRPCListen)
	require.Equal(t, ":9090", c.AdminListen)
	require.Equal(t, "x-idemgate-subject", c.Subject.Header)
	require.Equal(t, 250*time.Millisecond, time.Duration(c.Store.Timeout))
	require.EqualValues(t, 1<<20, c.Limits.MaxBodyBytes)
	require.Equal(t, 2*time.Minute, time.Duration(c.TTL.InFlight))
	require.Equal(t, []string{"/p", "/c", "/s"}, c.OperationPaths())
	require.Equal(t, "Idempotency-Key", c.Operations[0].IdempotencyHeader())

	_, err = ReadIdemgateConfig([]byte(`store: {timeout: soon}`))
	require.Error(t, err)
	_, err = ReadIdemgateConfig([]byte(`grpc_listen: ":1"`))
	require.Error(t, err, "a config without operations attaches nothing")
}
