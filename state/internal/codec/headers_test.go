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

func TestCacheDecodesLikeDecodeHeaders(t *testing.T) {
	var c Cache
	sets := [][]state.Header{
		nil,
		{{Name: "Content-Type", Value: "application/json"}},
		{{Name: "X-Bin", Value: "a\xff\x00b"}, {Name: "Location", Value: "/t/1"}},
	}
	for round := 0; round < 3; round++ {
		for _, in := range sets {
			b, err := EncodeHeaders(in)
			require.NoError(t, err)
			out, err := c.Decode(b)
			require.NoError(t, err)
			require.Equal(t, in, out)
			out2, err := c.DecodeString(string(b))
			require.NoError(t, err)
			require.Equal(t, in, out2)
			if len(out) > 0 {
				// Callers own what they get: changing it changes no later answer.
				out[0].Value = "changed"
			}
		}
	}
	_, err := c.Decode([]byte("{not json"))
	require.Error(t, err)
	_, err = c.DecodeString("{not json")
	require.Error(t, err)

	for i := 0; i < 2*maxCachedHeaderSets; i++ {
		b, err := EncodeHeaders([]state.Header{{Name: "X-N", Value: string(rune('a'+i%26)) + string(rune(i))}})
		require.NoError(t, err)
		_, err = c.Decode(b)
		require.NoError(t, err)
	}
	require.LessOrEqual(t, len(c.sets), maxCachedHeaderSets, "the cache is bounded")
}
