package stack

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
)

// What the attestation tests (e2e/attestation_test.go) need from a stack:
//
//   - Options.WrapUpstream puts a test's own API where Envoy routes to (it
//     gets the payments recorder to call on, or to ignore);
//   - Options.EditBootstrap edits the rendered envoy.yaml (a deliberately
//     broken route table);
//   - Idemgate.ConfigPath and Agent.Send below.

// ConfigPath is the idemgate.yaml the process serves; a test may rewrite
// it between a Stop and a Start (a key rotation).
func (g *Idemgate) ConfigPath() string { return g.configPath }

// Send sends one request through Envoy with the agent's bearer token,
// method and target as given (Go's client keeps a target like
// /V1/Transfers/Confirm/ as written).
func (a *Agent) Send(method, target string, body []byte) (*Response, error) {
	ua := fmt.Sprintf("idemgate-e2e/%d", agentUserAgents.Add(1))
	req, err := http.NewRequest(method, a.base+target, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", ua)
	if a.token != "" {
		req.Header.Set("Authorization", "Bearer "+a.token)
	}
	resp, err := a.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", method, target, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	return newResponse(resp, b, ua)
}

// UpstreamAddr is where the upstream listens: a request sent there goes
// around Envoy and idemgate.
func (s *Stack) UpstreamAddr() string { return s.upstreamAddr }
