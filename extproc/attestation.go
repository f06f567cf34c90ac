package extproc

import (
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	"github.com/idemgate/idemgate/attest/verify"
	"github.com/idemgate/idemgate/fingerprint"
)

// forwardHeaders are the headers set on a confirm idemgate lets through
// after ACQUIRED (a first send or a takeover's re-send): the nonce as the
// downstream's idempotency key (overwriting whatever the client sent: the
// nonce is the only key the upstream may see, and Envoy's retries keep
// it), and the attestation of docs/design.md §11 that lets the upstream
// refuse a confirm that went around idemgate. The attestation is kept on
// the exchange for the MCP body (params._meta). nil without either.
func (ex *exchange) forwardHeaders(claims fingerprint.Claims, fence int64) (*extprocv3.HeaderMutation, error) {
	var set []*corev3.HeaderValueOption
	if h := ex.op.DownstreamHeader; h != "" {
		set = append(set, setHeader(h, []byte(claims.Nonce)))
	}
	if a := ex.srv.cfg.Attestation; a != nil {
		tok, err := a.Signer.Sign(ex.attestationClaims(claims, fence))
		if err != nil {
			return nil, err
		}
		ex.attestation = tok
		set = append(set, setHeader(a.Header, []byte(tok)))
	}
	if len(set) == 0 {
		return nil, nil
	}
	return &extprocv3.HeaderMutation{SetHeaders: set}, nil
}

// attestationClaims binds this attempt: the request line as Envoy will
// forward it (:method and :path as received; a route that rewrites the
// path makes the verifier refuse, which fails closed), the params and how
// to read them, and the attempt's owner and fence.
func (ex *exchange) attestationClaims(claims fingerprint.Claims, fence int64) *verify.Claims {
	now := ex.srv.now()
	c := &verify.Claims{
		Version: verify.Version, Issuer: verify.Issuer,
		Key: claims.Nonce, Scope: ex.op.Scope, ParamHash: claims.ParamHash,
		Params: make([]verify.Param, 0, len(ex.op.Params)),
		Method: ex.method, Path: ex.path,
		Subject: claims.SubjectTag, Owner: ex.claim.Owner, Fence: fence,
		IssuedAt: now.Unix(), Expiry: now.Add(ex.srv.cfg.Attestation.TTL).Unix(),
	}
	for _, p := range ex.op.Params {
		vp := verify.Param{Path: p.Path}
		if p.Decimal {
			vp.Type = "decimal"
		}
		if p.NFC {
			vp.Normalize = "nfc"
		}
		c.Params = append(c.Params, vp)
		if name, isVar := strings.CutPrefix(p.Path, "path."); isVar {
			if v, ok := ex.vars[name]; ok {
				if c.PathVars == nil {
					c.PathVars = map[string]string{}
				}
				c.PathVars[name] = v
			}
		}
	}
	if ex.op.MCP != nil {
		c.MCPTool = ex.op.MCP.ConfirmTool
	}
	return c
}
