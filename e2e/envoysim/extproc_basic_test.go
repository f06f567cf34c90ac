package envoysim

import (
	"net/http"
	"strings"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/structpb"
)

func TestDefaultModesSendHeadersOnly(t *testing.T) {
	env := requireEnv(t, replyAll(), nil)
	res := env.do(t, http.MethodPost, "/pay?x=1", `{"a":1}`, map[string]string{"Content-Type": "application/json"})
	require.NoError(t, res.err)
	require.Equal(t, 200, res.status)
	require.Equal(t, "upstream-ok", res.body)

	rec := env.fp.nextStream(t)
	rec.waitDone(t)
	msgs := rec.messages()
	require.Len(t, msgs, 2, "defaults: headers SEND, bodies NONE, trailers SKIP")
	require.True(t, isRequestHeaders(msgs[0]))
	require.True(t, isResponseHeaders(msgs[1]))
	require.False(t, msgs[0].GetRequestHeaders().GetEndOfStream())

	// protocol_config on the first message only; metadata_context always.
	require.NotNil(t, msgs[0].GetProtocolConfig())
	require.Equal(t, BodyNone, msgs[0].GetProtocolConfig().GetRequestBodyMode())
	require.Equal(t, BodyNone, msgs[0].GetProtocolConfig().GetResponseBodyMode())
	require.Nil(t, msgs[1].GetProtocolConfig())
	for _, m := range msgs {
		require.NotNil(t, m.GetMetadataContext())
		require.Nil(t, m.GetAttributes())
	}
	require.Equal(t, int64(1), env.proxy.Stats().StreamsOpened)
}

func TestOneStreamPerRequestNeverReused(t *testing.T) {
	env := requireEnv(t, replyAll(), nil)
	for range 3 {
		res := env.do(t, http.MethodGet, "/", "", nil)
		require.NoError(t, res.err)
		require.Equal(t, 200, res.status)
	}
	require.Equal(t, 3, env.fp.streamCount())
	require.Equal(t, int64(3), env.proxy.Stats().StreamsOpened)
	for range 3 {
		rec := env.fp.nextStream(t)
		rec.waitDone(t)
		require.Len(t, rec.messages(), 2)
		require.True(t, isRequestHeaders(rec.messages()[0]))
	}
}

func TestNoStreamWhenEveryPhaseIsOff(t *testing.T) {
	env := requireEnv(t, replyAll(), func(c *Config) {
		c.ExtProc.ProcessingMode = ProcessingMode{RequestHeaderMode: HeaderSkip, ResponseHeaderMode: HeaderSkip}
	})
	res := env.do(t, http.MethodPost, "/", "body", nil)
	require.NoError(t, res.err)
	require.Equal(t, 200, res.status)
	require.Equal(t, 0, env.fp.streamCount())
	require.Equal(t, int64(0), env.proxy.Stats().StreamsOpened)
	require.False(t, env.waitLogs(t, 1)[0].ExtProcStreamOpened)
}

func TestPerRouteDisabledOpensNoStream(t *testing.T) {
	env := requireEnv(t, replyAll(), func(c *Config) {
		c.ExtProc.ProcessingMode.RequestBodyMode = BodyBuffered
		c.VirtualHosts[0].Routes = []Route{
			{Name: "health", Match: RouteMatch{Path: "/healthz"}, Cluster: "app", ExtProcPerRoute: &ExtProcPerRoute{Disabled: true}},
			{Name: "rest", Match: RouteMatch{Prefix: "/"}, Cluster: "app"},
		}
	})
	res := env.do(t, http.MethodPost, "/healthz?probe=1", "x", nil)
	require.NoError(t, res.err)
	require.Equal(t, 200, res.status)
	require.Equal(t, 0, env.fp.streamCount())

	res = env.do(t, http.MethodPost, "/other", "x", nil)
	require.NoError(t, res.err)
	require.Equal(t, 1, env.fp.streamCount())
}

func TestPerRouteOverridesReplaceTheWholeMode(t *testing.T) {
	env := requireEnv(t, replyAll(), func(c *Config) {
		c.ExtProc.ProcessingMode = ProcessingMode{ResponseHeaderMode: HeaderSkip}
		c.VirtualHosts[0].Routes[0].ExtProcPerRoute = &ExtProcPerRoute{
			ProcessingMode: &ProcessingMode{RequestBodyMode: BodyBuffered},
		}
	})
	res := env.do(t, http.MethodPost, "/", "hello", nil)
	require.NoError(t, res.err)
	rec := env.fp.nextStream(t)
	rec.waitDone(t)
	msgs := rec.messages()
	// The override replaced the whole mode: response headers are SEND again.
	require.Len(t, msgs, 3)
	require.True(t, isRequestHeaders(msgs[0]))
	require.Equal(t, BodyBuffered, msgs[0].GetProtocolConfig().GetRequestBodyMode())
	require.Equal(t, "hello", string(msgs[1].GetRequestBody().GetBody()))
	require.True(t, isResponseHeaders(msgs[2]))
}

func TestRequestHeadersAreEncodedLikeEnvoy(t *testing.T) {
	env := requireEnv(t, replyAll(), nil)
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, env.url+"/v1/x?q=1", strings.NewReader("abc"))
	require.NoError(t, err)
	req.Host = "api.example.test:8080"
	req.Header.Set("Content-Type", "application/json")
	req.Header.Add("X-Dup", "one")
	req.Header.Add("X-Dup", "two")
	req.Header.Add("X-Forwarded-For", "10.0.0.1")
	req.Header.Add("X-Forwarded-For", "10.0.0.2")
	res := doRequest(req)
	require.NoError(t, res.err)

	rec := env.fp.nextStream(t)
	rec.waitDone(t)
	hm := rec.messages()[0].GetRequestHeaders().GetHeaders()
	entries := headerValues(hm)
	require.Equal(t, [][2]string{
		{":authority", "api.example.test:8080"}, {":path", "/v1/x?q=1"}, {":method", "POST"}, {":scheme", "http"},
	}, entries[:4], "pseudo-headers first, :authority instead of host")
	for _, h := range hm.GetHeaders() {
		require.Empty(t, h.GetValue(), "value is never set, only raw_value")
		require.Equal(t, strings.ToLower(h.GetKey()), h.GetKey())
		require.NotEqual(t, "host", h.GetKey())
	}
	var dups []string
	for _, e := range entries {
		if e[0] == "x-dup" {
			dups = append(dups, e[1])
		}
	}
	require.Equal(t, []string{"one", "two"}, dups, "duplicates are separate entries")
	xff, _ := headerGet(hm, "x-forwarded-for")
	require.Equal(t, "10.0.0.1,10.0.0.2", xff, "inline headers are comma-joined")
	cl, ok := headerGet(hm, "content-length")
	require.True(t, ok)
	require.Equal(t, "3", cl)
	proto, _ := headerGet(hm, "x-forwarded-proto")
	require.Equal(t, "http", proto)
	id, ok := headerGet(hm, "x-request-id")
	require.True(t, ok)
	require.Regexp(t, `^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`, id)
	require.Equal(t, id, env.upstream.requests()[0].header.Get("X-Request-Id"), "the same id goes upstream")
}

func TestExistingRequestIDIsKept(t *testing.T) {
	env := requireEnv(t, replyAll(), nil)
	res := env.do(t, http.MethodGet, "/", "", map[string]string{"X-Request-Id": "client-chosen"})
	require.NoError(t, res.err)
	rec := env.fp.nextStream(t)
	rec.waitDone(t)
	id, _ := headerGet(rec.messages()[0].GetRequestHeaders().GetHeaders(), "x-request-id")
	require.Equal(t, "client-chosen", id)
}

func TestResponseHeadersCarryStatusAndServiceTime(t *testing.T) {
	env := requireEnv(t, replyAll(), nil)
	env.upstream.setHandler(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("X-Up", "1")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte("made"))
	})
	res := env.do(t, http.MethodGet, "/", "", nil)
	require.NoError(t, res.err)
	require.Equal(t, 201, res.status)
	require.Equal(t, "envoy", res.header.Get("Server"))
	require.NotEmpty(t, res.header.Get("X-Envoy-Upstream-Service-Time"))

	rec := env.fp.nextStream(t)
	rec.waitDone(t)
	hm := rec.messages()[1].GetResponseHeaders().GetHeaders()
	require.Equal(t, ":status", hm.GetHeaders()[0].GetKey())
	require.Equal(t, "201", string(hm.GetHeaders()[0].GetRawValue()))
	_, ok := headerGet(hm, "x-envoy-upstream-service-time")
	require.True(t, ok)
	_, ok = headerGet(hm, "server")
	require.False(t, ok, "server (like Envoy's own date) is added by the codec after the filters")
}

func TestEndOfStreamFlags(t *testing.T) {
	for _, tc := range []struct {
		name        string
		method      string
		body        string
		chunked     bool
		headersEOS  bool
		bodyMessage bool
	}{
		{name: "GET has no body message", method: http.MethodGet, headersEOS: true},
		{name: "POST content-length 0", method: http.MethodPost, headersEOS: true},
		{name: "POST with body", method: http.MethodPost, body: "payload", bodyMessage: true},
		{name: "chunked empty body gives an empty body message", method: http.MethodPost, chunked: true, bodyMessage: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := requireEnv(t, replyAll(), func(c *Config) {
				c.ExtProc.ProcessingMode = ProcessingMode{RequestBodyMode: BodyBuffered, ResponseHeaderMode: HeaderSkip}
			})
			req, err := http.NewRequestWithContext(t.Context(), tc.method, env.url+"/", strings.NewReader(tc.body))
			require.NoError(t, err)
			if tc.chunked {
				req.ContentLength = -1
				req.TransferEncoding = []string{"chunked"}
			}
			if tc.method == http.MethodGet {
				req.Body, req.ContentLength = http.NoBody, 0
			}
			res := doRequest(req)
			require.NoError(t, res.err)
			require.Equal(t, 200, res.status)
			rec := env.fp.nextStream(t)
			rec.waitDone(t)
			msgs := rec.messages()
			require.Equal(t, tc.headersEOS, msgs[0].GetRequestHeaders().GetEndOfStream())
			if !tc.bodyMessage {
				require.Len(t, msgs, 1)
				return
			}
			require.Len(t, msgs, 2)
			require.True(t, msgs[1].GetRequestBody().GetEndOfStream())
			require.Equal(t, tc.body, string(msgs[1].GetRequestBody().GetBody()))
			if tc.chunked {
				te, _ := headerGet(msgs[0].GetRequestHeaders().GetHeaders(), "transfer-encoding")
				require.Equal(t, "chunked", te)
			}
		})
	}
}

func TestAttributesOnFirstMessageOfEachDirection(t *testing.T) {
	env := requireEnv(t, replyAll(), func(c *Config) {
		c.ExtProc.ProcessingMode = ProcessingMode{RequestBodyMode: BodyBuffered}
		c.ExtProc.RequestAttributes = []string{"request.path", "request.method", "request.size", "source.port", "connection.mtls", "request.headers['x-a']", "no.such.attribute"}
		c.ExtProc.ResponseAttributes = []string{"response.code", "xds.route_name"}
	})
	res := env.do(t, http.MethodPost, "/attr?z=1", "12345", map[string]string{"X-A": "va"})
	require.NoError(t, res.err)
	rec := env.fp.nextStream(t)
	rec.waitDone(t)
	msgs := rec.messages()
	require.Len(t, msgs, 3)

	attrs := msgs[0].GetAttributes()[attributesKey].GetFields()
	require.Equal(t, "/attr?z=1", attrs["request.path"].GetStringValue())
	require.Equal(t, "POST", attrs["request.method"].GetStringValue())
	require.Equal(t, float64(5), attrs["request.size"].GetNumberValue())
	require.IsType(t, &structpb.Value_NumberValue{}, attrs["source.port"].GetKind())
	require.IsType(t, &structpb.Value_BoolValue{}, attrs["connection.mtls"].GetKind())
	require.Equal(t, "va", attrs["request.headers['x-a']"].GetStringValue())
	require.NotContains(t, attrs, "no.such.attribute", "failing expressions are omitted")

	require.Nil(t, msgs[1].GetAttributes(), "request attributes only once")
	resp := msgs[2].GetAttributes()[attributesKey].GetFields()
	require.Equal(t, float64(200), resp["response.code"].GetNumberValue())
	require.Equal(t, "catch-all", resp["xds.route_name"].GetStringValue())
}

func TestForwardRulesFilterHeaderEntries(t *testing.T) {
	env := requireEnv(t, replyAll(), func(c *Config) {
		c.ExtProc.ForwardRules = ForwardRules{
			AllowedHeaders:    []StringMatcher{{Prefix: "x-"}, {Exact: ":method"}},
			DisallowedHeaders: []StringMatcher{{Exact: "x-secret", IgnoreCase: true}},
		}
	})
	res := env.do(t, http.MethodGet, "/", "", map[string]string{"X-Keep": "1", "X-Secret": "2", "Accept": "*/*"})
	require.NoError(t, res.err)
	rec := env.fp.nextStream(t)
	rec.waitDone(t)
	var keys []string
	for _, e := range headerValues(rec.messages()[0].GetRequestHeaders().GetHeaders()) {
		keys = append(keys, e[0])
	}
	require.Contains(t, keys, ":method")
	require.Contains(t, keys, "x-keep")
	require.NotContains(t, keys, ":path", "an allow-list without :path hides the path")
	require.NotContains(t, keys, "x-secret")
	require.NotContains(t, keys, "accept")
}

func TestDynamicMetadataReceivingAndForwarding(t *testing.T) {
	env := requireEnv(t, replyAll(func(req *extprocv3.ProcessingRequest) *extprocv3.ProcessingResponse {
		if !isRequestHeaders(req) {
			return nil
		}
		resp := continueReply(req)
		resp.DynamicMetadata = &structpb.Struct{Fields: map[string]*structpb.Value{
			"idemgate":  structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{"k": structpb.NewStringValue("v")}}),
			"forbidden": structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{"k": structpb.NewStringValue("x")}}),
		}}
		return resp
	}), func(c *Config) {
		c.ExtProc.MetadataOptions = MetadataOptions{
			ForwardingNamespaces: []string{"idemgate", "forbidden", "absent"},
			ReceivingNamespaces:  []string{"idemgate"},
		}
	})
	res := env.do(t, http.MethodGet, "/", "", nil)
	require.NoError(t, res.err)
	rec := env.fp.nextStream(t)
	rec.waitDone(t)
	msgs := rec.messages()
	require.Empty(t, msgs[0].GetMetadataContext().GetFilterMetadata(), "nothing is there yet")
	fm := msgs[1].GetMetadataContext().GetFilterMetadata()
	require.Equal(t, "v", fm["idemgate"].GetFields()["k"].GetStringValue(), "looked up at send time")
	require.NotContains(t, fm, "forbidden", "only receiving namespaces are written")
	require.NotContains(t, fm, "absent")
}

func TestInitialMetadataAndPerRouteMerge(t *testing.T) {
	env := requireEnv(t, replyAll(), func(c *Config) {
		c.ExtProc.GRPCService.InitialMetadata = []HeaderKV{{Key: "x-a", Value: "filter"}, {Key: "x-b", Value: "filter"}}
		c.VirtualHosts[0].Routes[0].ExtProcPerRoute = &ExtProcPerRoute{GRPCInitialMetadata: []HeaderKV{{Key: "x-b", Value: "route"}}}
	})
	require.NoError(t, env.do(t, http.MethodGet, "/", "", nil).err)
	rec := env.fp.nextStream(t)
	require.Equal(t, []string{"filter"}, rec.md.Get("x-a"))
	require.Equal(t, []string{"route"}, rec.md.Get("x-b"))
}

func TestOverrideMessageTimeoutExtendsTheTimer(t *testing.T) {
	env := requireEnv(t, func(s *fakeStream) error {
		req := s.recv()
		s.send(&extprocv3.ProcessingResponse{OverrideMessageTimeout: durationOf(time.Second)})
		time.Sleep(400 * time.Millisecond) // past message_timeout, within the override
		s.send(continueReply(req))
		s.drain()
		return nil
	}, func(c *Config) {
		d := 200 * time.Millisecond
		c.ExtProc.MessageTimeout = &d
		c.ExtProc.MaxMessageTimeout = 2 * time.Second
		c.ExtProc.ProcessingMode.ResponseHeaderMode = HeaderSkip
	})
	res := env.do(t, http.MethodGet, "/", "", nil)
	require.NoError(t, res.err)
	require.Equal(t, 200, res.status)
}

func TestOverrideMessageTimeoutIgnoredWithoutMax(t *testing.T) {
	env := requireEnv(t, func(s *fakeStream) error {
		req := s.recv()
		s.send(&extprocv3.ProcessingResponse{OverrideMessageTimeout: durationOf(time.Second)})
		time.Sleep(500 * time.Millisecond)
		s.send(continueReply(req))
		s.drain()
		return nil
	}, func(c *Config) {
		d := 150 * time.Millisecond
		c.ExtProc.MessageTimeout = &d
	})
	res := env.do(t, http.MethodGet, "/", "", nil)
	require.NoError(t, res.err)
	require.Equal(t, 504, res.status)
}
