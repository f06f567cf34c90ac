package stack

// What the attestation tests (e2e/attestation_test.go) need from a stack:
//
//   - Options.WrapUpstream puts a test's own API where Envoy routes to (it
//     gets the payments recorder to call on, or to ignore);
//   - Options.EditBootstrap edits the rendered envoy.yaml (a deliberately
//     broken route table);
//   - Idemgate.ConfigPath below, and Agent.Send (raw.go).

// ConfigPath is the idemgate.yaml the process serves; a test may rewrite
// it between a Stop and a Start (a key rotation).
func (g *Idemgate) ConfigPath() string { return g.configPath }

// UpstreamAddr is where the upstream listens: a request sent there goes
// around Envoy and idemgate.
func (s *Stack) UpstreamAddr() string { return s.upstreamAddr }
