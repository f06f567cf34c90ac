package codec

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/state"
)

func TestHeadersRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   []state.Header
	}{
		{name: "empty", in: nil},
		{name: "order and duplicates kept", in: []state.Header{
			{Name: "Content-Type", Value: "application/json"},
			{Name: "X-B", Value: "2"},
			{Name: "X-A", Value: "1"},
			{Name: "X-A", Value: "1b"},
		}},
		{name: "invalid utf-8 and NUL", in: []state.Header{
			{Name: "X-Bin", Value: "a\xff\x00b"},
			{Name: "X-\xfe", Value: ""},
			{Name: "X-Uni", Value: "héllo ✓"},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := EncodeHeaders(tc.in)
			require.NoError(t, err)
			out, err := DecodeHeaders(b)
			require.NoError(t, err)
			require.Equal(t, tc.in, out)
		})
	}
}

func TestDecodeHeadersRejectsGarbage(t *testing.T) {
	_, err := DecodeHeaders([]byte("{not json"))
	require.Error(t, err)
	_, err = DecodeHeaders([]byte(`[{"name":"x","value":"","value_b64":"!!"}]`))
	require.Error(t, err)
}
