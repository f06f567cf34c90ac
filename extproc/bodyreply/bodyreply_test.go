package bodyreply

import (
	"testing"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
)

// TestReply: the message is CONTINUE with the headers set as raw values
// and the body replaced only when asked; Reset lets the same value build
// the next reply without the previous headers or body.
func TestReply(t *testing.T) {
	var r Reply
	r.SetHeader("idempotency-fingerprint", []byte("tok"))
	r.SetContentLength(17)
	msg := r.Message([]byte(`{"a":1}`), true)
	common := msg.GetResponseBody().GetResponse()
	require.Equal(t, extprocv3.CommonResponse_CONTINUE, common.GetStatus())
	set := common.GetHeaderMutation().GetSetHeaders()
	require.Len(t, set, 2)
	require.Equal(t, "idempotency-fingerprint", set[0].GetHeader().GetKey())
	require.Equal(t, []byte("tok"), set[0].GetHeader().GetRawValue())
	require.Empty(t, set[0].GetHeader().GetValue(), "Envoy reads raw_value")
	require.Equal(t, "content-length", set[1].GetHeader().GetKey())
	require.Equal(t, []byte("17"), set[1].GetHeader().GetRawValue())
	require.Equal(t, []byte(`{"a":1}`), common.GetBodyMutation().GetBody())
	// The message survives the wire as built.
	wire, err := proto.Marshal(msg)
	require.NoError(t, err)
	var back extprocv3.ProcessingResponse
	require.NoError(t, proto.Unmarshal(wire, &back))
	require.True(t, proto.Equal(msg, &back))

	r.Reset()
	r.SetContentLength(3)
	msg = r.Message(nil, false)
	common = msg.GetResponseBody().GetResponse()
	require.Len(t, common.GetHeaderMutation().GetSetHeaders(), 1)
	require.Nil(t, common.GetBodyMutation(), "no body mutation unless asked")
}
