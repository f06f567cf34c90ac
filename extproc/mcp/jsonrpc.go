// Package mcp holds what idemgate knows of the Model Context Protocol as
// plain functions over bytes (docs/design.md §9): JSON-RPC framing, the
// event stream of streamable HTTP, reading a request for routing, finding
// and rewriting the response, and rendering idemgate's answers as tool
// results. It keeps no state and makes no decision about a fingerprint:
// the exchange in package extproc runs the state machine and calls these.
//
// Every message is read with internal/jsonx's strict rules, the binding
// rule's own: what routing reads is what the binding rule would read.
package mcp

import (
	"bytes"
	"strconv"

	"github.com/idemgate/idemgate/internal/jsonx"
)

// JSON-RPC error codes idemgate answers protocol faults with.
const (
	ParseError     = -32700
	InvalidRequest = -32600
	InternalError  = -32603
	HeaderMismatch = -32020 // MCP 2026-07-28 HeaderMismatch
)

// Fault is a protocol fault answered with a JSON-RPC error: no model decides
// it, so it is not a tool result.
type Fault struct {
	HTTPStatus int
	Code       int
	Message    string
}

// IDOrNull is a request's raw id as the client sent it, or null before it is
// known.
func IDOrNull(id []byte) []byte {
	if id = bytes.TrimSpace(id); len(id) > 0 {
		return id
	}
	return []byte("null")
}

// Result is a JSON-RPC response with id (raw) carrying result.
func Result(id, result []byte) []byte {
	b := make([]byte, 0, len(result)+64)
	b = append(b, `{"jsonrpc":"2.0","id":`...)
	b = append(b, IDOrNull(id)...)
	b = append(b, `,"result":`...)
	b = append(b, result...)
	return append(b, '}')
}

// Error is a JSON-RPC error response with id (raw).
func Error(id []byte, code int, message string) []byte {
	b := []byte(`{"jsonrpc":"2.0","id":`)
	b = append(b, IDOrNull(id)...)
	b = append(b, `,"error":{"code":`...)
	b = strconv.AppendInt(b, int64(code), 10)
	b = append(b, `,"message":`...)
	b = jsonx.AppendString(b, message)
	return append(b, `}}`...)
}

// SameID reports whether two raw JSON-RPC ids name the same request: equal
// strings after unescaping, or equal numbers (an upstream may re-encode the
// id it echoes; the client still matches it by value).
func SameID(a, b []byte) bool {
	a, b = bytes.TrimSpace(a), bytes.TrimSpace(b)
	if len(a) == 0 || len(b) == 0 {
		return false
	}
	if bytes.Equal(a, b) {
		return true
	}
	if a[0] == '"' || b[0] == '"' {
		sa, okA := jsonx.String(a)
		sb, okB := jsonx.String(b)
		return okA && okB && sa == sb
	}
	return isNumber(a) && isNumber(b) && jsonx.SameNumber(a, b)
}

// isNumber reports whether raw starts like a JSON number (ids are strings,
// numbers or null; strconv would also read "Inf" and "0x1p3").
func isNumber(raw []byte) bool {
	return raw[0] == '-' || '0' <= raw[0] && raw[0] <= '9'
}
