package main

import (
	"errors"
	"fmt"
	"time"

	"github.com/idemgate/idemgate/e2e/demoauth"
)

const (
	// The approvers' tokens have an issuer and audience of their own, as
	// an SSO proxy in front of approval_listen would issue them: a token
	// an agent holds for the payments API (demoauth's) is not one.
	demoApproverIssuer   = "https://approvers.demo.idemgate.invalid"
	demoApproverAudience = "idemgate-approvals"
	// demoApprovalThreshold is the demo's at_least rule on transfer's
	// amount: a transfer of this much or more waits for a person.
	demoApprovalThreshold = "1000.00"
	// demoApprovalTTL is the demo's approval.ttl (the life of an approval
	// and of the fingerprint of a previewed transfer that needs one).
	demoApprovalTTL = time.Hour
	// demoStepUpACR is the authentication context the MCP transfer's
	// requester_step_up asks for (a stand-in for a PSD2 strong customer
	// authentication), and demoMaxAuthAge how recent it must be: the
	// longest config allows, so that a pasted script still works a while.
	demoStepUpACR  = "urn:idemgate:demo:sca"
	demoMaxAuthAge = time.Hour
)

// approverKey signs the demo approvers' bearer tokens. It is generated for
// each run and never leaves the process but as its public JWKS (the file
// idemgate's approvers.jwt reads) and the tokens the script prints: the
// demo ships no approver key, and the idemgate binary knows none.
type approverKey struct {
	key *demoauth.ApproverKey
}

func newApproverKey() (*approverKey, error) {
	k, err := demoauth.NewApproverKey("demo-approvers")
	if err != nil {
		return nil, fmt.Errorf("failed to generate the demo approvers' key: %w", err)
	}
	return &approverKey{key: k}, nil
}

// jwks is the public key set idemgate verifies approver tokens with.
func (k *approverKey) jwks() []byte { return k.key.JWKS() }

// mint signs an EdDSA JWT for the approver sub, valid from now for ttl.
func (k *approverKey) mint(sub string, ttl time.Duration, now time.Time) (string, error) {
	return k.mintClaims(sub, ttl, now, nil)
}

// mintSteppedUp is mint for a person who just authenticated strongly: acr
// demoStepUpACR, amr hwk, auth_time now (docs/design.md §13).
func (k *approverKey) mintSteppedUp(sub string, ttl time.Duration, now time.Time) (string, error) {
	return k.mintClaims(sub, ttl, now, map[string]any{"acr": demoStepUpACR, "amr": []string{"hwk"}, "auth_time": now.Unix()})
}

func (k *approverKey) mintClaims(sub string, ttl time.Duration, now time.Time, extra map[string]any) (string, error) {
	if sub == "" {
		return "", errors.New("failed to mint an approver token: empty subject")
	}
	c := map[string]any{
		"iss": demoApproverIssuer, "aud": demoApproverAudience, "sub": sub,
		"iat": now.Unix(), "exp": now.Add(ttl).Unix(),
	}
	for key, v := range extra {
		c[key] = v
	}
	return k.key.Mint(c)
}
