package main

import (
	"fmt"
	"net"
	"sync"

	"github.com/goccy/go-yaml"

	"github.com/idemgate/idemgate/attest"
	"github.com/idemgate/idemgate/cmd/idemgate/settings"
	"github.com/idemgate/idemgate/envoy"
	"github.com/idemgate/idemgate/extproc/config"
	"github.com/idemgate/idemgate/fingerprint"
)

const (
	// demoKeyEnv is the variable envoy/idemgate.yaml reads the signing key
	// from; the demo generates a key when it is not set.
	demoKeyEnv = "IDEMGATE_KEY_K1"
	// demoAttestKeyEnv holds the demo's attestation key (docs/design.md
	// §11); generated for the run when it is not set.
	demoAttestKeyEnv = "IDEMGATE_ATTEST_KEY_A1"
	// demoConfigName names the derived config in problems.
	demoConfigName = "envoy/idemgate.yaml (demo: memory store, text logs)"
)

// demoConfigYAML derives the demo's idemgate config from the shipped
// envoy/idemgate.yaml: the same operations, subject, TTLs and limits, with
// the store section removed (the embedded memory store), text logs at info
// (a person reads them, and the demo reads serve's start-up line), no
// drain wait (Envoy, the only client, is stopped first), and, unless the
// shipped file has one, an attestation key, so that the demo's payments API
// can refuse what did not pass idemgate. The transfer operations (HTTP and
// MCP) also need a person's approval from demoApprovalThreshold up, decided
// on the approvers' API and page (approval_listen on a free loopback port,
// which is also approval.public_url) with tokens verified by the JWKS in
// approversJWKS, so the demo can walk through docs/design.md §10 (HTTP:
// four eyes) and §13 (MCP: the requester approves with step-up).
func demoConfigYAML(approversJWKS string) ([]byte, error) {
	approvalAddr, err := freeLoopbackAddr()
	if err != nil {
		return nil, err
	}
	var shipped yaml.MapSlice
	if err := yaml.UnmarshalWithOptions(envoy.IdemgateYAML(), &shipped, yaml.UseOrderedMap()); err != nil {
		return nil, fmt.Errorf("failed to read envoy/idemgate.yaml: %w", err)
	}
	derived := make(yaml.MapSlice, 0, len(shipped)+3)
	attested := false
	for _, item := range shipped {
		switch item.Key {
		case "store", "log", "drain":
			continue
		case "attestation":
			attested = true
		case "operations":
			ops, err := withDemoApproval(item.Value, approversJWKS, "http://"+approvalAddr)
			if err != nil {
				return nil, err
			}
			item.Value = ops
		}
		derived = append(derived, item)
	}
	if !attested {
		derived = append(derived, yaml.MapItem{Key: "attestation", Value: yaml.MapSlice{
			{Key: "active_key", Value: "a1"},
			{Key: "keys", Value: yaml.MapSlice{{Key: "a1", Value: yaml.MapSlice{{Key: "env", Value: demoAttestKeyEnv}}}}},
		}})
	}
	derived = append(derived,
		yaml.MapItem{Key: "log", Value: yaml.MapSlice{{Key: "level", Value: "info"}, {Key: "format", Value: "text"}}},
		yaml.MapItem{Key: "drain", Value: yaml.MapSlice{{Key: "period", Value: "0s"}, {Key: "timeout", Value: "5s"}}},
		// A port picked now, because approval.public_url names it; serve
		// logs the address it bound, which the demo reads.
		yaml.MapItem{Key: "approval_listen", Value: approvalAddr},
	)
	out, err := yaml.Marshal(derived)
	if err != nil {
		return nil, fmt.Errorf("failed to write the demo config: %w", err)
	}
	return out, nil
}

// demoApprovedOperations are the shipped operations the demo gates, with
// whether the requester may approve with step-up (the MCP one: the person
// at the agent's keyboard approves their own payment, docs/design.md §13;
// the HTTP one keeps four eyes).
var demoApprovedOperations = map[string]bool{"transfer": false, "transfer_mcp": true}

// freeLoopbackAddr is a loopback host:port that was free a moment ago.
func freeLoopbackAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("failed to find a free port for the approvers' API: %w", err)
	}
	addr := ln.Addr().String()
	return addr, ln.Close()
}

// withDemoApproval adds the demo's approval block to the transfer
// operations of the shipped operations list (which has none: approvers are
// a deployment's own identity provider).
func withDemoApproval(v any, approversJWKS, publicURL string) (any, error) {
	ops, ok := v.([]any)
	if !ok {
		return nil, fmt.Errorf("envoy/idemgate.yaml: operations is %T, not a list", v)
	}
	found := 0
	for i, o := range ops {
		op, ok := o.(yaml.MapSlice)
		if !ok {
			continue
		}
		name := ""
		for _, f := range op {
			if f.Key == "name" {
				name, _ = f.Value.(string)
			}
		}
		stepUp, gated := demoApprovedOperations[name]
		if !gated {
			continue
		}
		for _, f := range op {
			if f.Key == "approval" {
				return nil, fmt.Errorf("envoy/idemgate.yaml: operation %s already has an approval block; the demo adds its own", name)
			}
		}
		found++
		approvers := yaml.MapSlice{
			{Key: "jwt", Value: yaml.MapSlice{
				{Key: "issuer", Value: demoApproverIssuer},
				{Key: "audience", Value: demoApproverAudience},
				{Key: "jwks_file", Value: approversJWKS},
			}},
			{Key: "distinct_from_requester", Value: true},
			{Key: "required", Value: 1},
		}
		if stepUp {
			approvers = append(approvers, yaml.MapItem{Key: "requester_step_up", Value: yaml.MapSlice{
				{Key: "acr", Value: []any{demoStepUpACR}},
				{Key: "max_auth_age", Value: demoMaxAuthAge.String()},
			}})
		}
		ops[i] = append(append(yaml.MapSlice{}, op...), yaml.MapItem{Key: "approval", Value: yaml.MapSlice{
			{Key: "rules", Value: []any{yaml.MapSlice{{Key: "param", Value: "amount"}, {Key: "at_least", Value: demoApprovalThreshold}}}},
			{Key: "approvers", Value: approvers},
			{Key: "ttl", Value: demoApprovalTTL.String()},
			{Key: "public_url", Value: publicURL},
		}})
	}
	if found != len(demoApprovedOperations) {
		return nil, fmt.Errorf("envoy/idemgate.yaml lacks an operation of %v for the demo's approval walkthrough", demoApprovedOperations)
	}
	return ops, nil
}

// demoConfig is the derived config, its signing key and where the key came
// from: IDEMGATE_KEY_K1 when it is set, else generated for this run. The
// demo compiles the config itself too (idemgate compiles it again): to stop
// with every problem listed before starting anything, and to sign the
// printed expired fingerprint with the key idemgate verifies with.
func demoConfig(lookupEnv func(string) (string, bool), approversJWKS string) (data []byte, cfg *settings.Settings, warns []*config.Problem, key, keySource string, err error) {
	data, err = demoConfigYAML(approversJWKS)
	if err != nil {
		return nil, nil, nil, "", "", err
	}
	key, set := lookupEnv(demoKeyEnv)
	keySource = "from " + demoKeyEnv
	if !set {
		if key, err = fingerprint.GenerateKey(); err != nil {
			return nil, nil, nil, "", "", err
		}
		keySource = "generated for this run (set " + demoKeyEnv + " to choose it)"
	}
	lookup := func(name string) (string, bool) {
		switch name {
		case demoKeyEnv:
			return key, true
		case demoAttestKeyEnv:
			return attestationKey(lookupEnv), true
		}
		return lookupEnv(name)
	}
	cfg, warns, err = settings.Parse(demoConfigName, data, ".", config.Options{LookupEnv: lookup})
	if err != nil {
		return nil, nil, warns, "", "", fmt.Errorf("invalid config %s:\n%w", demoConfigName, err)
	}
	return data, cfg, warns, key, keySource, nil
}

// generatedAttestationKey is this run's attestation key when
// IDEMGATE_ATTEST_KEY_A1 is not set.
var generatedAttestationKey = sync.OnceValue(func() string {
	k, err := attest.GenerateSeed()
	if err != nil {
		panic(err) // crypto/rand does not fail on Linux
	}
	return k
})

// attestationKey is the demo's attestation key: IDEMGATE_ATTEST_KEY_A1, else
// the one generated for this run (idemgate is started with it).
func attestationKey(lookupEnv func(string) (string, bool)) string {
	if k, ok := lookupEnv(demoAttestKeyEnv); ok {
		return k
	}
	return generatedAttestationKey()
}
