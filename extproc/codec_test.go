package extproc

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/stretchr/testify/require"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
)

func randomRequest(rng *rand.Rand) *extprocv3.ProcessingRequest {
	req := &extprocv3.ProcessingRequest{}
	switch rng.IntN(4) {
	case 0:
		req.Request = &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
			Headers: headerMap([]header{{":path", fmt.Sprintf("/p/%d", rng.IntN(100))}, {"x-a", strings.Repeat("v", rng.IntN(40))}}), EndOfStream: rng.IntN(2) == 0,
		}}
	case 1:
		req.Request = &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: []byte(strings.Repeat("b", rng.IntN(3000))), EndOfStream: true}}
	case 2:
		req.Request = &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{Headers: headerMap([]header{{":status", "200"}})}}
	default:
		req.Request = &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{Body: []byte(`{"x":1}`)}}
	}
	if rng.IntN(3) > 0 {
		payload, _ := structpb.NewStruct(map[string]any{"sub": fmt.Sprintf("user-%d", rng.IntN(9)), "exp": float64(rng.IntN(1e9))})
		req.MetadataContext = &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{
			"envoy.filters.http.jwt_authn": {Fields: map[string]*structpb.Value{"jwt_payload": structpb.NewStructValue(payload)}},
		}}
	}
	if rng.IntN(3) == 0 {
		req.Attributes = map[string]*structpb.Struct{"envoy.filters.http.ext_proc": {Fields: map[string]*structpb.Value{"request.path": structpb.NewStringValue("/x")}}}
	}
	if rng.IntN(2) == 0 {
		req.ProtocolConfig = &extprocv3.ProtocolConfiguration{RequestBodyMode: filterv3.ProcessingMode_BUFFERED, ResponseBodyMode: filterv3.ProcessingMode_BUFFERED}
	}
	req.ObservabilityMode = rng.IntN(5) == 0
	return req
}

// The codec decodes exactly what proto.Unmarshal decodes, minus the skipped
// fields, whatever the fields' order on the wire (and keeps fields it does
// not know, as proto.Unmarshal does).
func TestRequestCodecDecodesAllButTheSkippedFields(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	for _, keep := range []struct{ metadata, attributes bool }{{false, false}, {true, false}, {false, true}} {
		keepMetadata := keep.metadata
		c := newRequestCodec(keepMetadata, keep.attributes)
		for i := 0; i < 500; i++ {
			want := randomRequest(rng)
			wire, err := proto.MarshalOptions{Deterministic: true}.Marshal(want)
			require.NoError(t, err)
			if i%3 == 0 {
				// Envoy writes fields in number order; nothing requires it.
				wire = reorderFields(t, wire, rng)
			}
			if i%7 == 0 {
				wire = protowire.AppendTag(wire, 99, protowire.BytesType)
				wire = protowire.AppendBytes(wire, []byte("future field"))
				require.NoError(t, proto.Unmarshal(wire, want))
			}
			got := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestTrailers{}}
			require.NoError(t, c.Unmarshal(mem.BufferSlice{mem.SliceBuffer(wire)}, got))
			if !keep.attributes {
				want.Attributes = nil
			}
			if !keepMetadata {
				want.MetadataContext = nil
			}
			require.True(t, proto.Equal(want, got), "case %d keep=%v:\nwant %v\ngot  %v", i, keepMetadata, want, got)
		}
	}
}

func reorderFields(t *testing.T, b []byte, rng *rand.Rand) []byte {
	t.Helper()
	var fields [][]byte
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		require.Positive(t, n)
		m := protowire.ConsumeFieldValue(num, typ, b[n:])
		require.Positive(t, m)
		fields = append(fields, b[:n+m])
		b = b[n+m:]
	}
	rng.Shuffle(len(fields), func(i, j int) { fields[i], fields[j] = fields[j], fields[i] })
	var out []byte
	for _, f := range fields {
		out = append(out, f...)
	}
	return out
}

func TestRequestCodecRefusesBrokenInput(t *testing.T) {
	c := newRequestCodec(false, false)
	wire, err := proto.Marshal(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: []byte("abc")}}})
	require.NoError(t, err)
	for _, b := range [][]byte{wire[:len(wire)-1], {0xff}, append([]byte{0x42, 0x05}, 1)} {
		require.Error(t, c.Unmarshal(mem.BufferSlice{mem.SliceBuffer(b)}, &extprocv3.ProcessingRequest{}), "%x", b)
	}
	// Other messages (the health service) go through the proto codec.
	hw, err := proto.Marshal(&healthpb.HealthCheckRequest{Service: "x"})
	require.NoError(t, err)
	var h healthpb.HealthCheckRequest
	require.NoError(t, c.Unmarshal(mem.BufferSlice{mem.SliceBuffer(hw)}, &h))
	require.Equal(t, "x", h.GetService())
}

// Over a real gRPC connection, a subject configured to come from dynamic
// metadata is still read (the codec keeps metadata_context then).
func TestSubjectFromDynamicMetadataOverGRPC(t *testing.T) {
	e := newEnv(t, nil, nil)
	e.cfg = testConfig(t, strings.Replace(testConfigYAML, "limits:", "subject: {metadata: {namespace: envoy.filters.http.jwt_authn, path: jwt_payload.sub}}\nlimits:", 1))
	e.srv.cfg = e.cfg
	d := e.startGRPC(t)
	claims, err := structpb.NewStruct(map[string]any{"jwt_payload": map[string]any{"sub": "alice"}})
	require.NoError(t, err)
	req := post("/v1/transfers/preview", "", transferBody(`1`, "EUR", "DE89", ""))
	req.metadata = &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{"envoy.filters.http.jwt_authn": claims}}
	res := do(t, d, req, previewOK)
	require.Nil(t, res.immediate, string(res.body))
	e.claimsOf(t, res.json(t)["fingerprint"].(string), "alice", "payments.transfer")
}
