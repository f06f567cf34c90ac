package mcp

import (
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/idemgate/idemgate/internal/jsonx"
)

// MCP request headers (lower case, as Envoy hands them over). Protocol
// 2026-07-28 mirrors method and params.name into Mcp-Method and Mcp-Name
// (basic/transports/streamable-http, "Request Metadata").
const (
	HeaderProtocol = "mcp-protocol-version"
	HeaderMethod   = "mcp-method"
	HeaderName     = "mcp-name"
)

// HeaderVersion is the first protocol version that sends Mcp-Method and
// Mcp-Name and requires servers to check them against the body. Versions
// are dates, so they compare as strings.
const HeaderVersion = "2026-07-28"

// DecodeNameHeader decodes a Mcp-Name value: plain visible ASCII, or the
// "=?base64?…?=" sentinel form for anything else (streamable-http, "Value
// Encoding").
func DecodeNameHeader(v string) (string, bool) {
	if s, ok := strings.CutPrefix(v, "=?base64?"); ok {
		s, ok = strings.CutSuffix(s, "?=")
		if !ok {
			return "", false
		}
		b, err := base64.StdEncoding.DecodeString(s)
		if err != nil || !utf8.Valid(b) {
			return "", false
		}
		return string(b), true
	}
	for i := 0; i < len(v); i++ {
		if c := v[i]; (c < 0x20 && c != '\t') || c > 0x7e {
			return "", false
		}
	}
	return v, true
}

// Request is what routing reads of one JSON-RPC message (not a batch).
type Request struct {
	// Body is the message, surrounding whitespace trimmed.
	Body []byte
	// ID is the raw id (nil for a notification).
	ID                []byte
	Method, Name      string
	HasName           bool
	Params, Arguments []byte
	// Refused is set for a guarded tools/call (a request with an id) that
	// is well-formed JSON but not strict (a duplicate name, invalid UTF-8,
	// a lone surrogate) or nests deeper than the limit: it is answered as
	// invalid params with a security event and never forwarded. Method,
	// Name and ID were then read only to word that answer.
	Refused error
	// The message read once: its members and params' (for ForwardBody).
	msg jsonx.Nested
}

var errAmbiguous = &Fault{400, InvalidRequest, "Invalid Request: a member appears twice, or in two spellings that differ only in case"}

// ParseRequest reads a JSON-RPC message for routing, in one pass and as
// strictly as the binding rule reads a body: a message that is not strict
// JSON is never routed. Either it is no JSON at all (a parse error), or it
// is a guarded call (Refused, see Request), or an invalid request. guarded
// says whether a tool name is one of the endpoint's; maxDepth is the
// body's nesting limit, applied to guarded calls (their arguments are the
// body the binding rule reads).
func ParseRequest(body []byte, guarded func(name string) bool, maxDepth int) (Request, *Fault) {
	req := Request{Body: bytes.TrimSpace(body)}
	msg, err := jsonx.ReadNested(req.Body, "params")
	if err != nil {
		if errors.Is(err, jsonx.ErrNotObject) || !jsonx.Lax(req.Body) {
			return Request{}, &Fault{400, ParseError, "Parse error: the body is not one JSON object"}
		}
		// Well-formed to a lax parser, which an upstream may be: read
		// laxly, only to word the refusal.
		msg = jsonx.LaxNested(req.Body, "params")
	}
	if fault := req.read(msg); fault != nil {
		return req, fault
	}
	if req.Method == "tools/call" && guarded(req.Name) && req.ID != nil {
		if err == nil && msg.Depth > maxDepth {
			err = fmt.Errorf("%w: %w (limit %d)", jsonx.ErrInvalid, jsonx.ErrTooDeep, maxDepth)
		}
		req.Refused = err
		return req, nil
	}
	if err != nil {
		return req, &Fault{400, InvalidRequest, "Invalid Request: " + err.Error()}
	}
	return req, nil
}

// read fills the routing fields from the message's members.
func (req *Request) read(msg jsonx.Nested) *Fault {
	req.msg = msg
	req.ID = memberID(msg.Members)
	req.Method, _ = jsonx.String(jsonx.Lookup(msg.Members, "method"))
	req.Params = jsonx.Lookup(msg.Members, "params")
	req.Name, req.HasName = jsonx.String(jsonx.Lookup(msg.Inner, "name"))
	req.Arguments = jsonx.Lookup(msg.Inner, "arguments")
	if AmbiguousKey(msg.Members, "id", "method", "params") || AmbiguousKey(msg.Inner, "name", "arguments", "_meta") {
		// Two readers could disagree on which member counts: idemgate would
		// route by one, the upstream execute the other.
		return errAmbiguous
	}
	return nil
}

// ArgumentsObject reports whether params.arguments is an object (a request
// ParseRequest read without refusing it: its bytes are strict JSON).
func (req Request) ArgumentsObject() bool {
	a := bytes.TrimSpace(req.Arguments)
	return len(a) > 0 && a[0] == '{'
}

// memberID is the raw id, when it is itself strict JSON (an id read laxly
// is not echoed).
func memberID(members []jsonx.Member) []byte {
	id := jsonx.Lookup(members, "id")
	if id != nil && jsonx.Check(id) != nil {
		return nil
	}
	return id
}

// AmbiguousKey reports whether members hold one of keys twice, or a key
// equal to one of them only under case folding (Go's encoding/json matches
// member names that way, last one winning).
func AmbiguousKey(members []jsonx.Member, keys ...string) bool {
	var seen [4]bool
	for _, mb := range members {
		for i, k := range keys {
			switch {
			case string(mb.Name) == k && seen[i]:
				return true
			case string(mb.Name) == k:
				seen[i] = true
			case strings.EqualFold(string(mb.Name), k):
				return true
			}
		}
	}
	return false
}

// CheckBatch refuses a JSON-RPC batch that holds a guarded call: one HTTP
// request would carry several decisions, and the answer to a guarded call
// must be a tool result of its own. A batch that is not strict JSON is
// refused as well, since its calls could not be read for certain.
func CheckBatch(body []byte, guarded func(name string) bool) *Fault {
	elems, err := jsonx.Elements(body)
	if err != nil {
		if errors.Is(err, jsonx.ErrNotArray) || !jsonx.Lax(body) {
			return &Fault{400, ParseError, "Parse error: the body is not valid JSON"}
		}
		return &Fault{400, InvalidRequest, "Invalid Request: " + err.Error()}
	}
	for _, e := range elems {
		em, _ := jsonx.Members(e)
		pm, _ := jsonx.Members(jsonx.Lookup(em, "params"))
		if AmbiguousKey(em, "method", "params") || AmbiguousKey(pm, "name") {
			return &Fault{400, InvalidRequest, "Invalid Request: a batch element has a member twice, or in two spellings that differ only in case"}
		}
		method, _ := jsonx.String(jsonx.Lookup(em, "method"))
		name, _ := jsonx.String(jsonx.Lookup(pm, "name"))
		if method == "tools/call" && guarded(name) {
			return &Fault{400, InvalidRequest, "Invalid Request: " + name + " cannot be called in a JSON-RPC batch; send it as a request of its own"}
		}
	}
	return nil
}

// ForwardBody is the request body of an acquired confirm for the upstream:
// the fingerprint field leaves the arguments (a strict upstream schema
// would refuse the unknown argument), meta members are set in
// params._meta and, when stripInput, idemgate's own inputResponses and
// requestState leave params (docs/design.md §13: the upstream never sees
// them). Every other byte of the message keeps its place.
func ForwardBody(req Request, args []byte, fingerprintField string, stripInput bool, meta ...jsonx.Set) []byte {
	set := []jsonx.Set{{Key: "arguments", Raw: jsonx.Edit(args, []string{fingerprintField})}}
	if len(meta) > 0 {
		m := jsonx.Lookup(req.msg.Inner, "_meta")
		if !jsonx.IsObject(m) {
			m = []byte("{}")
		}
		set = append(set, jsonx.Set{Key: "_meta", Raw: jsonx.Edit(m, nil, meta...)})
	}
	var remove []string
	if stripInput {
		remove = []string{memberInputResponses, memberRequestState}
	}
	return jsonx.EditMembers(req.msg.Members, nil, jsonx.Set{Key: "params", Raw: jsonx.EditMembers(req.msg.Inner, remove, set...)})
}
