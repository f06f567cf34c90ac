package demoauth_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/e2e/demoauth"
	"github.com/idemgate/idemgate/extproc/approver"
)

// TestApproverKeyTokensVerify: idemgate's own approver verifier, given the
// key's JWKS, accepts what it mints (with and without a kid) and refuses a
// token of another key that claims the same kid.
func TestApproverKeyTokensVerify(t *testing.T) {
	now := time.Now()
	for _, kid := range []string{"", "a1"} {
		key, err := demoauth.NewApproverKey(kid)
		require.NoError(t, err)
		keys, err := approver.ParseJWKS(key.JWKS())
		require.NoError(t, err)
		v := &approver.Verifier{Issuer: "https://idp.example", Audience: "idemgate-approvals", Keys: keys, Now: func() time.Time { return now }}

		tok, err := key.Mint(map[string]any{"iss": "https://idp.example", "aud": "idemgate-approvals", "sub": "bob", "exp": now.Add(time.Minute).Unix()})
		require.NoError(t, err)
		claims, err := v.Verify(tok)
		require.NoError(t, err, "kid %q", kid)
		require.Equal(t, "bob", claims.Subject)

		other, err := demoauth.NewApproverKey(kid)
		require.NoError(t, err)
		forged, err := other.Mint(map[string]any{"iss": "https://idp.example", "aud": "idemgate-approvals", "sub": "bob", "exp": now.Add(time.Minute).Unix()})
		require.NoError(t, err)
		_, err = v.Verify(forged)
		require.ErrorIs(t, err, approver.ErrInvalidToken, "kid %q", kid)
	}
}
