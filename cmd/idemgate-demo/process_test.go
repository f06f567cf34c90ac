package main

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestLineWriterSplitsWritesIntoLines(t *testing.T) {
	var got []string
	w := &lineWriter{emit: func(s string) { got = append(got, s) }}
	for _, chunk := range []string{"first li", "ne\nsecond\r\nthi", "rd\n\nlast without newline"} {
		n, err := w.Write([]byte(chunk))
		require.NoError(t, err)
		require.Equal(t, len(chunk), n)
	}
	require.Equal(t, []string{"first line", "second", "third", ""}, got)
	w.flush()
	require.Equal(t, []string{"first line", "second", "third", "", "last without newline"}, got)
	w.flush()
	require.Len(t, got, 5, "flush emits the partial line once")
}
