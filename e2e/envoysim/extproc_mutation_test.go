package envoysim

import (
	"net/http"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// requestMutationResult runs one request whose request_headers reply carries
// mut and returns the client result and what the upstream saw.
func requestMutationResult(t *testing.T, mut *extprocv3.HeaderMutation, rules MutationRules, reqHeaders map[string]string) (result, []upstreamRecord, *testEnv) {
	t.Helper()
	env := requireEnv(t, replyAll(func(req *extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse {
		if isRequestHeaders(req) {
			return headersReply(dirRequest, &extprocv3.CommonResponse{HeaderMutation: mut})
		}
		return nil
	}), func(c *Config) {
		c.ExtProc.ProcessingMode.ResponseHeaderMode = HeaderSkip
		c.ExtProc.MutationRules = rules
	})
	res := env.do(t, http.MethodGet, "/orig", "", reqHeaders)
	require.NoError(t, res.err)
	return res, env.upstream.requests(), env
}

func TestServerSettingValueInsteadOfRawValueGetsAnEmptyHeader(t *testing.T) {
	res, up, _ := requestMutationResult(t, &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{
		{Header: &corev3.HeaderValue{Key: "x-set-with-value", Value: "lost"}},
	}}, MutationRules{}, nil)
	require.Equal(t, 200, res.status)
	require.Len(t, up, 1)
	require.Contains(t, up[0].header, "X-Set-With-Value")
	require.Equal(t, []string{""}, up[0].header["X-Set-With-Value"])
}

func TestValueAndRawValueBothSetIs500(t *testing.T) {
	res, up, env := requestMutationResult(t, &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{
		{Header: &corev3.HeaderValue{Key: "x-both", Value: "a", RawValue: []byte("b")}},
	}}, MutationRules{}, nil)
	require.Equal(t, 500, res.status)
	require.Empty(t, up)
	require.Equal(t, "Only_one_of_value_or_raw_value_in_the_HeaderValue_message_should_be_set.", env.waitLogs(t, 1)[0].ResponseCodeDetails)
}

func TestInvalidHeaderCharactersAre500(t *testing.T) {
	for _, tc := range []struct {
		name string
		mut  *extprocv3.HeaderMutation
	}{
		{"CR LF in a value", &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{setHeader("x-bad", "a\r\nx-injected: 1")}}},
		{"space in a name", &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{setHeader("x bad", "v")}}},
		{"invalid remove name", &extprocv3.HeaderMutation{RemoveHeaders: []string{"x\nbad"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, up, _ := requestMutationResult(t, tc.mut, MutationRules{}, nil)
			require.Equal(t, 500, res.status)
			require.Empty(t, up)
		})
	}
}

func TestHeaderMutationRules(t *testing.T) {
	for _, tc := range []struct {
		name    string
		mut     *extprocv3.HeaderMutation
		rules   MutationRules
		headers map[string]string
		check   func(t *testing.T, up upstreamRecord)
	}{
		{
			name: "removes happen before sets",
			mut: &extprocv3.HeaderMutation{
				RemoveHeaders: []string{"x-a"},
				SetHeaders:    []*corev3.HeaderValueOption{setHeader("x-a", "new")},
			},
			headers: map[string]string{"X-A": "old"},
			check:   func(t *testing.T, up upstreamRecord) { require.Equal(t, []string{"new"}, up.header["X-A"]) },
		},
		{
			name:    "default is overwrite; append BoolValue adds",
			mut:     &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{setHeader("x-o", "1"), appendHeader("x-p", "2")}},
			headers: map[string]string{"X-O": "0", "X-P": "0"},
			check: func(t *testing.T, up upstreamRecord) {
				require.Equal(t, []string{"1"}, up.header["X-O"])
				require.Equal(t, []string{"0", "2"}, up.header["X-P"])
			},
		},
		{
			name: "append_action is ignored",
			mut: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{{
				Header:       &corev3.HeaderValue{Key: "x-q", RawValue: []byte("added?")},
				AppendAction: corev3.HeaderValueOption_APPEND_IF_EXISTS_OR_ADD,
			}}},
			headers: map[string]string{"X-Q": "orig"},
			check:   func(t *testing.T, up upstreamRecord) { require.Equal(t, []string{"added?"}, up.header["X-Q"]) },
		},
		{
			name: "routing and x-envoy headers are ignored by the default checker",
			mut: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{
				setHeader("host", "evil.test"), setHeader(":authority", "evil.test"), setHeader(":method", "DELETE"),
				setHeader(":scheme", "https"), setHeader("x-envoy-retry-on", "5xx"), setHeader("x-ok", "1"),
			}},
			check: func(t *testing.T, up upstreamRecord) {
				require.NotEqual(t, "evil.test", up.host)
				require.Equal(t, http.MethodGet, up.method)
				require.Empty(t, up.header.Get("X-Envoy-Retry-On"))
				require.Equal(t, "1", up.header.Get("X-Ok"))
			},
		},
		{
			name: ":path may be set; ':' headers and host cannot be removed; no append to ':' headers",
			mut: &extprocv3.HeaderMutation{
				RemoveHeaders: []string{":path", "host", ":authority"},
				SetHeaders:    []*corev3.HeaderValueOption{setHeader(":path", "/rewritten"), appendHeader(":path", "/twice")},
			},
			check: func(t *testing.T, up upstreamRecord) {
				require.Equal(t, "/rewritten", up.path)
				require.NotEmpty(t, up.host)
			},
		},
		{
			name:  "allow_all_routing lifts the routing ban",
			mut:   &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{setHeader(":method", "PATCH")}},
			rules: MutationRules{AllowAllRouting: true},
			check: func(t *testing.T, up upstreamRecord) { require.Equal(t, http.MethodPatch, up.method) },
		},
		{
			name:  "allow_envoy lifts the x-envoy ban",
			mut:   &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{setHeader("x-envoy-custom", "1")}},
			rules: MutationRules{AllowEnvoy: true},
			check: func(t *testing.T, up upstreamRecord) { require.Equal(t, "1", up.header.Get("X-Envoy-Custom")) },
		},
		{
			name:  "disallow_expression wins over allow_expression",
			mut:   &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{setHeader("x-blocked", "1"), setHeader("x-allowed", "1")}},
			rules: MutationRules{DisallowAll: true, AllowExpression: "x-.*", DisallowExpression: "x-blocked"},
			check: func(t *testing.T, up upstreamRecord) {
				require.Empty(t, up.header.Get("X-Blocked"))
				require.Equal(t, "1", up.header.Get("X-Allowed"))
			},
		},
		{
			name: "a set_headers entry without header is skipped",
			mut:  &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{{Append: wrapperspb.Bool(true)}, setHeader("x-after", "1")}},
			check: func(t *testing.T, up upstreamRecord) {
				require.Equal(t, "1", up.header.Get("X-After"))
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, up, _ := requestMutationResult(t, tc.mut, tc.rules, tc.headers)
			require.Equal(t, 200, res.status)
			require.Len(t, up, 1)
			tc.check(t, up[0])
		})
	}
}

func TestDisallowIsErrorTurnsRefusalsInto500(t *testing.T) {
	res, up, env := requestMutationResult(t, &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{setHeader("host", "evil.test")}},
		MutationRules{DisallowIsError: true}, nil)
	require.Equal(t, 500, res.status)
	require.Empty(t, up)
	require.Equal(t, "Invalid_attempt_to_modify_host", env.waitLogs(t, 1)[0].ResponseCodeDetails)
	require.Positive(t, env.proxy.Stats().RejectedHeaderMutations)
}

func TestTooManyMutationsAre500(t *testing.T) {
	var sets []*corev3.HeaderValueOption
	for i := range 101 {
		sets = append(sets, setHeader("x-h"+string(rune('a'+i%26))+string(rune('a'+i/26)), "v"))
	}
	res, up, _ := requestMutationResult(t, &extprocv3.HeaderMutation{SetHeaders: sets}, MutationRules{}, nil)
	require.Equal(t, 500, res.status)
	require.Empty(t, up)
}

func TestResponseStatusMutation(t *testing.T) {
	for _, tc := range []struct {
		status string
		want   int
	}{
		{"201", 201},
		{"100", 200}, // :status below 200 is ignored
		{"abc", 200},
	} {
		t.Run(tc.status, func(t *testing.T) {
			env := requireEnv(t, replyAll(func(req *extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse {
				if isResponseHeaders(req) {
					return headersReply(dirResponse, &extprocv3.CommonResponse{HeaderMutation: &extprocv3.HeaderMutation{
						SetHeaders: []*corev3.HeaderValueOption{setHeader(":status", tc.status)},
					}})
				}
				return nil
			}), nil)
			res := env.do(t, http.MethodGet, "/", "", nil)
			require.NoError(t, res.err)
			require.Equal(t, tc.want, res.status)
		})
	}
}

func TestRouteIsRecomputedOnlyWithClearRouteCache(t *testing.T) {
	for _, tc := range []struct {
		name        string
		clear       bool
		wantCluster string
	}{
		{"without clear_route_cache the old route stands", false, "app"},
		{"with clear_route_cache the new path re-routes", true, "other"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			other := requireFakeUpstream(t)
			env := requireEnv(t, replyAll(func(req *extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse {
				if isRequestHeaders(req) {
					return headersReply(dirRequest, &extprocv3.CommonResponse{
						HeaderMutation:  &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{setHeader(":path", "/other/x")}},
						ClearRouteCache: tc.clear,
					})
				}
				return nil
			}), func(c *Config) {
				c.Clusters["other"] = Cluster{Address: other.srv.Listener.Addr().String()}
				c.VirtualHosts[0].Routes = []Route{
					{Name: "other", Match: RouteMatch{Prefix: "/other"}, Cluster: "other"},
					{Name: "rest", Match: RouteMatch{Prefix: "/"}, Cluster: "app"},
				}
			})
			res := env.do(t, http.MethodGet, "/start", "", nil)
			require.NoError(t, res.err)
			require.Equal(t, 200, res.status)
			if tc.wantCluster == "other" {
				require.Len(t, other.requests(), 1)
				require.Empty(t, env.upstream.requests())
			} else {
				require.Empty(t, other.requests())
				require.Equal(t, "/other/x", env.upstream.requests()[0].path)
			}
		})
	}
}
