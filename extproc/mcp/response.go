package mcp

import (
	"bytes"
	"slices"

	"github.com/idemgate/idemgate/internal/jsonx"
)

// Message is a JSON-RPC message read once: its members and, when its
// result is an object, the result's. A response is read when it is found
// and then classified or rewritten from these, never parsed again.
type Message struct {
	// Raw is the message's bytes.
	Raw             []byte
	members, result []jsonx.Member
}

// ReadMessage reads a strict JSON object as a message (Final does, for the
// message it finds).
func ReadMessage(raw []byte) (Message, error) {
	n, err := jsonx.ReadInner(raw, "result")
	if err != nil {
		return Message{}, err
	}
	return Message{Raw: raw, members: n.Members, result: n.Inner}, nil
}

// Final finds the JSON-RPC response to the request with id in a response
// body: the body itself (application/json) or, in an event stream, the
// event whose message has the id and a result or error (notifications
// before it pass untouched). ev is the event (nil for JSON). A message that
// is not strict JSON is not the response: it passes unchanged, and an
// acquired confirm's outcome is then unknown.
func Final(body []byte, sse bool, id []byte) (msg Message, ev *Event, found bool) {
	response := func(raw []byte) (Message, bool) {
		m, err := ReadMessage(raw)
		if err != nil || !SameID(jsonx.Lookup(m.members, "id"), id) {
			return Message{}, false
		}
		return m, jsonx.Lookup(m.members, "result") != nil || jsonx.Lookup(m.members, "error") != nil
	}
	if !sse {
		m, ok := response(bytes.TrimSpace(body))
		return m, nil, ok
	}
	events := ParseSSE(body)
	for i := range events {
		if m, ok := response(events[i].Data); ok {
			return m, &events[i], true
		}
	}
	return Message{}, nil, false
}

// Replace puts newMsg in place of the final response msg found by Final in
// body: the whole body for JSON, the event's data (compacted onto one line)
// in a stream.
func Replace(body []byte, ev *Event, newMsg []byte) []byte {
	if ev == nil {
		return newMsg
	}
	return ReplaceEvent(body, *ev, jsonx.Compact(newMsg))
}

// Outcome is what a tools/call response says of the call.
type Outcome uint8

const (
	// Done: a result whose isError is not true, or a task handle.
	Done Outcome = iota
	// Failed: isError true, or the definite errors -32602 (invalid params)
	// and -32601 (no such method).
	Failed
	// Ambiguous: any other error, or an answer asking for input (MRTR:
	// the call is not finished).
	Ambiguous
)

// OutcomeOf classifies a JSON-RPC response to tools/call (a message Final
// found); why says what made it ambiguous.
func OutcomeOf(msg Message) (o Outcome, why string) {
	ms := msg.members
	if result := jsonx.Lookup(ms, "result"); result != nil {
		rm := msg.result
		rt, _ := jsonx.String(jsonx.Lookup(rm, "resultType"))
		switch {
		case rt == "task":
			return Done, ""
		case rt == "input_required":
			return Ambiguous, "the upstream asked for more input (input_required)"
		case jsonx.IsTrue(jsonx.Lookup(rm, "isError")):
			return Failed, ""
		}
		return Done, ""
	}
	code := string(bytes.TrimSpace(jsonx.MemberOf(jsonx.Lookup(ms, "error"), "code")))
	switch code {
	case "-32602", "-32601":
		return Failed, ""
	}
	return Ambiguous, "the upstream answered JSON-RPC error " + code
}

// PreviewResult is a successful preview's result, ready for a fingerprint.
type PreviewResult struct {
	msg    Message
	result jsonx.Member // the message's result member, an object
}

// PreviewOf returns the result of a preview response that a fingerprint is
// signed into: a complete result object that is not an error (ok=false for
// an error, isError, a task or input request, or a result that is not an
// object and so no CallToolResult).
func PreviewOf(msg Message) (PreviewResult, bool) {
	result, _ := jsonx.Find(msg.members, "result")
	if len(result.Value) == 0 || result.Value[0] != '{' || jsonx.IsTrue(jsonx.Lookup(msg.result, "isError")) {
		return PreviewResult{}, false
	}
	if rt, _ := jsonx.String(jsonx.Lookup(msg.result, "resultType")); rt != "" && rt != "complete" {
		return PreviewResult{}, false
	}
	return PreviewResult{msg: msg, result: result}, true
}

// AppendInjected appends to dst the response with fields set in
// structuredContent (when that is an object, or absent or null: then it is
// made of fields alone) and block appended to content, for clients that
// give the model only content. Every other byte of the upstream's message
// is kept: only those two values are rewritten in place (or added before
// the result's closing brace), so the answer is written once, into dst.
func (p PreviewResult) AppendInjected(dst []byte, fields []jsonx.Set, block []byte) []byte {
	raw := p.msg.Raw
	sc, hasSC := jsonx.Find(p.msg.result, "structuredContent")
	content, hasContent := jsonx.Find(p.msg.result, "content")
	// The values rewritten in place, in the order they appear in raw.
	present := make([]jsonx.Member, 0, 2)
	if hasSC {
		present = append(present, sc)
	}
	if hasContent {
		present = append(present, content)
	}
	slices.SortFunc(present, func(a, b jsonx.Member) int { return spanStart(a) - spanStart(b) })
	at := 0
	for _, m := range present {
		start, end := m.ValueSpan()
		dst = append(dst, raw[at:start]...)
		if string(m.Name) == "structuredContent" {
			dst = appendStructured(dst, m.Value, fields)
		} else {
			dst = jsonx.AppendElementsTo(dst, m.Value, block)
		}
		at = end
	}
	// The members the result lacks go in before its closing brace.
	_, resultEnd := p.result.ValueSpan()
	closeAt := resultEnd - 1
	dst = append(dst, raw[at:closeAt]...)
	members := len(p.msg.result)
	if !hasSC {
		dst = appendSeparator(dst, members)
		dst = jsonx.AppendString(dst, "structuredContent")
		dst = jsonx.AppendEdited(append(dst, ':'), nil, nil, fields...)
		members++
	}
	if !hasContent {
		dst = appendSeparator(dst, members)
		dst = jsonx.AppendString(dst, "content")
		dst = jsonx.AppendElementsTo(append(dst, ':'), nil, block)
	}
	return append(dst, raw[closeAt:]...)
}

// appendStructured writes structuredContent with fields set: spliced into
// an object, an object of fields alone for null. An array or scalar has no
// room for members and is kept: the text block carries the fingerprint.
func appendStructured(dst, sc []byte, fields []jsonx.Set) []byte {
	if jsonx.IsNull(sc) {
		return jsonx.AppendEdited(dst, nil, nil, fields...)
	}
	if out, err := jsonx.AppendSpliced(dst, sc, fields...); err == nil {
		return out
	}
	return append(dst, sc...)
}

func spanStart(m jsonx.Member) int {
	start, _ := m.ValueSpan()
	return start
}

func appendSeparator(dst []byte, members int) []byte {
	if members > 0 {
		return append(dst, ',')
	}
	return dst
}

// ToolList is a tools/list result.
type ToolList struct {
	msg Message
	// Tools are the raw tool definitions.
	Tools [][]byte
	// LastPage: no nextCursor, so the list ends on this page.
	LastPage bool
}

// ToolListOf reads a tools/list response (ok=false when it has no result
// with a tools array).
func ToolListOf(msg Message) (ToolList, bool) {
	result := jsonx.Lookup(msg.members, "result")
	tools, err := jsonx.Elements(jsonx.Lookup(msg.result, "tools"))
	if result == nil || err != nil {
		return ToolList{}, false
	}
	return ToolList{msg: msg, Tools: tools, LastPage: jsonx.IsNull(jsonx.Lookup(msg.result, "nextCursor"))}, true
}

// With returns the response with its tools replaced by tools; the cursor
// and every other member pass unchanged.
func (l ToolList) With(tools [][]byte) []byte {
	return jsonx.EditMembers(l.msg.members, nil, jsonx.Set{Key: "result", Raw: jsonx.EditMembers(l.msg.result, nil, jsonx.Set{Key: "tools", Raw: jsonx.AppendElements(nil, tools...)})})
}

// ToolName is a tool definition's name.
func ToolName(tool []byte) string {
	name, _ := jsonx.String(jsonx.MemberOf(tool, "name"))
	return name
}

// FingerprintProperty is the JSON Schema of a fingerprint argument.
func FingerprintProperty(description string) []byte {
	b := append([]byte(`{"type":"string","description":`), jsonx.AppendString(nil, description)...)
	return append(b, '}')
}

// WithFingerprintArgument adds the required argument field (described by
// description) to a confirm tool's inputSchema, and drops its outputSchema:
// idemgate's replays and refusals carry the envelope as structuredContent,
// which a client validating against the upstream's schema would reject.
func WithFingerprintArgument(tool []byte, field, description string) []byte {
	schema := jsonx.MemberOf(tool, "inputSchema")
	if !jsonx.IsObject(schema) {
		schema = []byte(`{"type":"object"}`)
	}
	props := jsonx.MemberOf(schema, "properties")
	if !jsonx.IsObject(props) {
		props = []byte("{}")
	}
	props = jsonx.Edit(props, nil, jsonx.Set{Key: field, Raw: FingerprintProperty(description)})
	required, _ := jsonx.Elements(jsonx.MemberOf(schema, "required"))
	listed := false
	for _, r := range required {
		if s, _ := jsonx.String(r); s == field {
			listed = true
		}
	}
	if !listed {
		required = append(required, jsonx.AppendString(nil, field))
	}
	schema = jsonx.Edit(schema, nil, jsonx.Set{Key: "properties", Raw: props}, jsonx.Set{Key: "required", Raw: jsonx.AppendElements(nil, required...)})
	return jsonx.Edit(tool, []string{"outputSchema"}, jsonx.Set{Key: "inputSchema", Raw: schema})
}

// WithPreviewOutput declares the injected string fields in a preview tool's
// outputSchema, when it has properties (a client validating the result must
// accept them even under additionalProperties: false).
func WithPreviewOutput(tool []byte, fields ...string) []byte {
	schema := jsonx.MemberOf(tool, "outputSchema")
	props := jsonx.MemberOf(schema, "properties")
	if !jsonx.IsObject(props) {
		return tool
	}
	str := []byte(`{"type":"string"}`)
	set := make([]jsonx.Set, 0, len(fields))
	for _, f := range fields {
		set = append(set, jsonx.Set{Key: f, Raw: str})
	}
	props = jsonx.Edit(props, nil, set...)
	return jsonx.Edit(tool, nil, jsonx.Set{Key: "outputSchema", Raw: jsonx.Edit(schema, nil, jsonx.Set{Key: "properties", Raw: props})})
}

// StatusTool is the tools/list entry of a status tool, which idemgate
// answers itself.
func StatusTool(name, description, field, fieldDescription string) []byte {
	b := []byte(`{"name":`)
	b = jsonx.AppendString(b, name)
	b = append(b, `,"description":`...)
	b = jsonx.AppendString(b, description)
	b = append(b, `,"inputSchema":{"type":"object","properties":{`...)
	b = jsonx.AppendString(b, field)
	b = append(b, ':')
	b = append(b, FingerprintProperty(fieldDescription)...)
	b = append(b, `},"required":[`...)
	b = jsonx.AppendString(b, field)
	b = append(b, `]},"annotations":{"readOnlyHint":true,"idempotentHint":true}}`...)
	return b
}
