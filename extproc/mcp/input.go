package mcp

import (
	"github.com/idemgate/idemgate/internal/jsonx"
)

// MCP 2026-07-28 multi-round-trip requests (SEP-2322, "input requests"): a
// tools/call may be answered with resultType "input_required", carrying
// inputRequests (here one URL-mode elicitation: the approval page) and an
// opaque requestState; the client fulfils the requests and retries the
// same call with params.inputResponses (keyed like the requests) and the
// requestState byte for byte. A client declares what it can fulfil in
// params._meta[ClientCapabilitiesMeta] of each request (there is no
// initialize under 2026-07-28).
const (
	// ClientCapabilitiesMeta is the _meta key of the request's client
	// capabilities.
	ClientCapabilitiesMeta = "io.modelcontextprotocol/clientCapabilities"
	// ApprovalInputKey is idemgate's key in inputRequests and
	// inputResponses.
	ApprovalInputKey = "io.idemgate/approval"
	// InvalidParams is JSON-RPC's invalid params: idemgate's answer to a
	// requestState or inputResponses it does not accept (as the official
	// SDKs' servers answer an invalid requestState).
	InvalidParams = -32602
)

// Members of params a retry carries, stripped before the upstream sees the
// call when they were idemgate's.
const (
	memberInputResponses = "inputResponses"
	memberRequestState   = "requestState"
)

// InputRound is what a tools/call says of input requests.
type InputRound struct {
	// URLElicitation: the client declared elicitation.url in this
	// request's client capabilities.
	URLElicitation bool
	// State is params.requestState (HasState when present).
	State    string
	HasState bool
	// Responses are the members of params.inputResponses (HasResponses
	// when present).
	Responses    []jsonx.Member
	HasResponses bool
}

// OnlyApprovalResponse reports whether the responses hold nothing but
// idemgate's key (or nothing at all).
func (in InputRound) OnlyApprovalResponse() bool {
	for _, m := range in.Responses {
		if string(m.Name) != ApprovalInputKey {
			return false
		}
	}
	return true
}

// HasApprovalResponse reports whether the responses hold idemgate's key.
func (in InputRound) HasApprovalResponse() bool {
	return jsonx.Lookup(in.Responses, ApprovalInputKey) != nil
}

// Input reads the input-request members of a tools/call ParseRequest
// accepted (strict JSON). A requestState that is not a string, an
// inputResponses that is not an object, and a member in two spellings
// that differ only in case are faults: two readers could disagree on them.
func (req Request) Input() (InputRound, *Fault) {
	var in InputRound
	inner := req.msg.Inner
	if AmbiguousKey(inner, memberInputResponses, memberRequestState) {
		return in, &Fault{400, InvalidParams, "Invalid params: inputResponses or requestState appears twice, or in two spellings"}
	}
	if raw := jsonx.Lookup(inner, memberRequestState); raw != nil {
		s, ok := jsonx.String(raw)
		if !ok {
			return in, &Fault{400, InvalidParams, "Invalid params: requestState must be a string"}
		}
		in.State, in.HasState = s, true
	}
	if raw := jsonx.Lookup(inner, memberInputResponses); raw != nil && !jsonx.IsNull(raw) {
		ms, err := jsonx.Members(raw)
		if err != nil {
			return in, &Fault{400, InvalidParams, "Invalid params: inputResponses must be an object"}
		}
		in.Responses, in.HasResponses = ms, true
	}
	meta, _ := jsonx.Members(jsonx.Lookup(inner, "_meta"))
	caps, _ := jsonx.Members(jsonx.Lookup(meta, ClientCapabilitiesMeta))
	elicitation, _ := jsonx.Members(jsonx.Lookup(caps, "elicitation"))
	in.URLElicitation = jsonx.IsObject(jsonx.Lookup(elicitation, "url"))
	return in, nil
}

// InputRequired is the result asking the client to show the person url
// (one URL-mode elicitation under ApprovalInputKey) and retry with state.
func InputRequired(url, message, state string) []byte {
	b := make([]byte, 0, 256+len(url)+len(message)+len(state))
	b = append(b, `{"resultType":"input_required","inputRequests":{`...)
	b = jsonx.AppendString(b, ApprovalInputKey)
	b = append(b, `:{"method":"elicitation/create","params":{"mode":"url","url":`...)
	b = jsonx.AppendString(b, url)
	b = append(b, `,"message":`...)
	b = jsonx.AppendString(b, message)
	b = append(b, `}}},"requestState":`...)
	b = jsonx.AppendString(b, state)
	return append(b, '}')
}
