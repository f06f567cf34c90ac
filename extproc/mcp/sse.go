package mcp

import (
	"bytes"
)

// Event is one dispatched Server-Sent Event of a buffered response body
// (WHATWG HTML, "Interpreting an event stream"): the byte span of its lines
// in the body (terminating blank line included) and its data, the data
// fields joined by line feeds.
type Event struct {
	Start, End int
	Data       []byte
	// other holds the event's lines that are not data fields (id, event,
	// retry, comments), so a rewritten event keeps them.
	other [][]byte
}

// SniffEventStream tells an event stream from a JSON body when the
// content type was not seen: a JSON-RPC response is a JSON object, so a body
// whose first byte after white space is '{' is JSON, anything else is read
// as events. A body whose content type says otherwise is one the client
// cannot read as a response either way, whatever goes into it.
func SniffEventStream(body []byte) bool {
	trimmed := bytes.TrimLeft(body, " \t\r\n")
	return len(trimmed) == 0 || trimmed[0] != '{'
}

// ParseSSE splits body into events. Lines end in CRLF, LF or CR; an event
// is dispatched at a blank line, so trailing lines without one (a stream cut
// mid-event) form no event, exactly as a client discards them.
func ParseSSE(body []byte) []Event {
	var (
		events  []Event
		cur     Event
		hasData bool
		inEvent bool
	)
	i := 0
	if bytes.HasPrefix(body, []byte("\xEF\xBB\xBF")) {
		i = 3 // a leading BOM is ignored
	}
	cur.Start = i
	for i < len(body) {
		j := i
		for j < len(body) && body[j] != '\n' && body[j] != '\r' {
			j++
		}
		line := body[i:j]
		next := j
		if next < len(body) {
			if body[next] == '\r' && next+1 < len(body) && body[next+1] == '\n' {
				next += 2
			} else {
				next++
			}
		} else {
			// The last line has no end: the stream stopped mid-line.
			break
		}
		if len(line) == 0 {
			if inEvent {
				cur.End = next
				if hasData {
					cur.Data = bytes.TrimSuffix(cur.Data, []byte("\n"))
					events = append(events, cur)
				}
			}
			cur, hasData, inEvent = Event{Start: next}, false, false
			i = next
			continue
		}
		inEvent = true
		name, value := line, []byte(nil)
		if k := bytes.IndexByte(line, ':'); k >= 0 {
			name, value = line[:k], line[k+1:]
			value = bytes.TrimPrefix(value, []byte(" "))
		}
		if string(name) == "data" && len(line) > 0 && line[0] != ':' {
			cur.Data = append(append(cur.Data, value...), '\n')
			hasData = true
		} else {
			cur.other = append(cur.other, line)
		}
		i = next
	}
	return events
}

// ReplaceEvent returns body with event ev's data replaced by data (one data
// line; data must hold no line break), its other lines kept.
func ReplaceEvent(body []byte, ev Event, data []byte) []byte {
	out := make([]byte, 0, len(body)-(ev.End-ev.Start)+len(data)+64)
	out = append(out, body[:ev.Start]...)
	for _, l := range ev.other {
		out = append(append(out, l...), '\n')
	}
	out = append(out, "data: "...)
	out = append(out, data...)
	out = append(out, "\n\n"...)
	return append(out, body[ev.End:]...)
}
