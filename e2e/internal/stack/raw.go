package stack

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"
)

// RawPost sends body as JSON in one HTTP/1.1 POST to Envoy over a fresh TCP
// connection, with target written on the request line byte for byte: Go's
// http.Client normalises some paths before they leave (it would never send
// `/./` or a lone `%6F`), and the point is what Envoy does with them. extra
// headers are written as given ("Name: value"), after the agent's own.
func (a *Agent) RawPost(target string, body map[string]any, extra ...string) (*Response, error) {
	raw, err := json.Marshal(body)
	if err != nil {
		return nil, fmt.Errorf("failed to encode the body: %w", err)
	}
	return a.Raw(target, raw, WithLength, extra...)
}

// Framing is how Raw delimits the body.
type Framing uint8

const (
	WithLength Framing = iota // a content-length
	Chunked                   // chunked: nobody knows the size before the last chunk
)

// Raw sends body (JSON) in one HTTP/1.1 POST over a fresh connection,
// framed as f says.
func (a *Agent) Raw(target string, body []byte, f Framing, extra ...string) (*Response, error) {
	return a.Send("POST", target, body, f, extra...)
}

// Send is Raw with any method; a nil body sends no body and no framing
// headers at all.
func (a *Agent) Send(method, target string, body []byte, f Framing, extra ...string) (*Response, error) {
	ua := fmt.Sprintf("idemgate-e2e/%d", agentUserAgents.Add(1))
	host := strings.TrimPrefix(a.base, "http://")
	var req bytes.Buffer
	fmt.Fprintf(&req, "%s %s HTTP/1.1\r\nHost: %s\r\nUser-Agent: %s\r\nConnection: close\r\n", method, target, host, ua)
	chunked := f == Chunked
	switch {
	case body == nil:
	case chunked:
		req.WriteString("Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n")
	default:
		fmt.Fprintf(&req, "Content-Type: application/json\r\nContent-Length: %d\r\n", len(body))
	}
	if a.token != "" {
		fmt.Fprintf(&req, "Authorization: Bearer %s\r\n", a.token)
	}
	for _, h := range extra {
		req.WriteString(h + "\r\n")
	}
	req.WriteString("\r\n")
	if chunked && body != nil {
		for rest := body; len(rest) > 0; {
			n := min(len(rest), 64<<10)
			fmt.Fprintf(&req, "%x\r\n", n)
			req.Write(rest[:n])
			req.WriteString("\r\n")
			rest = rest[n:]
		}
		req.WriteString("0\r\n\r\n")
	} else {
		req.Write(body)
	}

	c, err := net.DialTimeout("tcp", host, 5*time.Second)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(60 * time.Second))
	// Written from a goroutine: Envoy may answer (413) before it read
	// everything, and stop reading.
	go func() { _, _ = c.Write(req.Bytes()) }()
	resp, err := http.ReadResponse(bufio.NewReader(c), &http.Request{Method: method})
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", method, target, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("%s %s: failed to read the answer: %w", method, target, err)
	}
	return newResponse(resp, b, ua)
}
