package main

import (
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/e2e/loadgen/floor"
	"github.com/idemgate/idemgate/extproc/mcp"
	"github.com/idemgate/idemgate/fingerprint"
	"github.com/idemgate/idemgate/internal/extprocdriver"
	"github.com/idemgate/idemgate/internal/jsonx"
)

// TestEditFloorFitsTheUpstream: on the benchmark upstream's own answers
// (the quote, the preview tool's JSON-RPC result) the same-answer floor,
// configured as the through-Envoy run configures it, answers what
// idemgate's own splicing (jsonx.Splice, mcp.PreviewOf(...).Inject) makes
// of them with its values, byte for byte, and the client labels those
// answers as it labels idemgate's.
func TestEditFloorFitsTheUpstream(t *testing.T) {
	key, err := fingerprint.GenerateKey()
	require.NoError(t, err)
	m, err := newMinter(key, 15*time.Minute)
	require.NoError(t, err)
	token, expires, err := m.sample(scope)
	require.NoError(t, err)
	mcpToken, _, err := m.sample(mcpScope)
	require.NoError(t, err)
	require.Greater(t, len(mcpToken), len(token), "the MCP operation's longer scope")
	_, err = time.Parse(time.RFC3339, expires)
	require.NoError(t, err)
	block := mcpPreviewBlock(mcpToken, expires)

	srv, err := floor.NewEdit(floor.EditOptions{Token: token, MCPToken: mcpToken, Expires: expires, MCPBlock: block})
	require.NoError(t, err)
	addr, stop, err := extprocdriver.ServeLoopback(srv)
	require.NoError(t, err)
	defer stop()
	conns, err := extprocdriver.Dial(t.Context(), addr, 1)
	require.NoError(t, err)
	defer conns.Close()

	mcpAnswer := append([]byte(`{"jsonrpc":"2.0","id":3`), mcpQuoteResult...)
	msg, err := mcp.ReadMessage(mcpAnswer)
	require.NoError(t, err)
	res, ok := mcp.PreviewOf(msg)
	require.True(t, ok)
	httpWant, err := jsonx.Splice(nil, quoteBytes, jsonx.Set{Key: "fingerprint", Text: token}, jsonx.Set{Key: "fingerprint_expires_at", Text: expires})
	require.NoError(t, err)
	for _, tc := range []struct {
		path        string
		answer      []byte
		want        []byte
		fingerprint string
		label       string
	}{
		{previewPath, quoteBytes, httpWant, token, expectedLabel(evNoopEdit)},
		{mcpPath, mcpAnswer, res.AppendInjected(nil, []jsonx.Set{{Key: "fingerprint", Text: mcpToken}, {Key: "fingerprint_expires_at", Text: expires}}, block), "", expectedLabel(evNoopEditMCP)},
	} {
		req := newRoute(tc.path, string(tc.answer)).request(newRNGs(1, 1)[0], previewBytes, 0)
		out, v := extprocdriver.EnvoyFilter().Trace(t.Context(), conns.Next(), req, nil)
		require.Equal(t, 200, out.Status, tc.path)
		require.False(t, out.Local, tc.path)
		require.Equal(t, string(tc.want), string(v.Body), tc.path)
		require.Equal(t, strconv.Itoa(len(tc.want)), v.Headers["content-length"], tc.path)
		require.Equal(t, tc.fingerprint, v.Headers["idempotency-fingerprint"], tc.path)

		// The client's label of that answer.
		resp := &http.Response{StatusCode: 200, Header: http.Header{}}
		if tc.fingerprint != "" {
			resp.Header.Set("Idempotency-Fingerprint", tc.fingerprint)
		}
		label := classify(resp)
		if tc.path == mcpPath {
			label += classifyMCP(v.Body, []byte("3"))
		}
		require.Equal(t, tc.label, label, tc.path)
	}
}
