package fingerprint

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// SignToken must issue byte for byte the token Sign issues: checked on every
// golden vector and on generated requests with many paths in any order,
// escaped characters and non-ASCII text, and for every validation error.
func TestSignTokenEqualsSign(t *testing.T) {
	raw, err := os.ReadFile(vectorsFile)
	require.NoError(t, err)
	var vf vectorFile
	require.NoError(t, json.NewDecoder(bytes.NewReader(raw)).Decode(&vf))
	for i := range vf.Tokens {
		v := &vf.Tokens[i]
		t.Run(v.Name, func(t *testing.T) {
			ring, req := vectorRequest(t, v)
			want, claims, err := ring.Sign(req)
			require.NoError(t, err)
			got, exp, err := ring.SignToken(req)
			require.NoError(t, err)
			require.Equal(t, want, got)
			require.Equal(t, v.Expected.Token, got, "the golden token")
			require.Equal(t, claims.ExpiresAt(), exp)
		})
	}

	ring, err := NewKeyRing("k1", map[string][]byte{"k1": bytes.Repeat([]byte{7}, 32)})
	require.NoError(t, err)
	rng := rand.New(rand.NewPCG(1, 2))
	names := []string{"amount", "a", "b.c", "zeta", "\u00e9t\u00e9", "quote\"d", "back\\slash", "tab\tx", "items.0.sku", "Z", "aa", "a.b", "ctl\u0001"}
	for i := 0; i < 300; i++ {
		n := rng.IntN(len(names) + 8)
		var fields []Field
		for j := 0; j < n; j++ {
			p := names[rng.IntN(len(names))]
			if j >= len(names) || rng.IntN(3) == 0 {
				p = fmt.Sprintf("f%d", rng.IntN(40))
			}
			fields = append(fields, Field{Path: p, Canonical: []byte(fmt.Sprintf(`"v%d"`, rng.IntN(1000)))})
		}
		req := SignRequest{
			Subject: fmt.Sprintf("user-%d", rng.IntN(50)), Scope: "payments.transfer",
			Params: Params{Hash: fmt.Sprintf("%064x", rng.Uint64()), Fields: fields},
			Nonce:  fmt.Sprintf("%032x", rng.Uint64()), Expiry: time.Unix(1_900_000_000+rng.Int64N(1000), 0),
		}
		want, _, wantErr := ring.Sign(req)
		got, _, gotErr := ring.SignToken(req)
		if wantErr != nil {
			require.EqualError(t, gotErr, wantErr.Error(), "case %d", i)
			continue
		}
		require.NoError(t, gotErr, "case %d", i)
		require.Equal(t, want, got, "case %d", i)
	}

	bad := []SignRequest{
		{},
		{Subject: "s"},
		{Subject: "s", Scope: "x", Nonce: "short"},
		{Subject: "s", Scope: "x", Nonce: fmt.Sprintf("%032x", 1), Params: Params{Hash: "x"}},
		{Subject: "s", Scope: "x", Nonce: fmt.Sprintf("%032x", 1), Params: Params{Hash: fmt.Sprintf("%064x", 1)}},
		{Subject: "s", Scope: "x", Nonce: fmt.Sprintf("%032x", 1), Params: Params{Hash: fmt.Sprintf("%064x", 1),
			Fields: []Field{{Path: "a"}, {Path: ""}}}, Expiry: time.Unix(1, 0)},
		{Subject: "s", Scope: "x", Nonce: fmt.Sprintf("%032x", 1), Params: Params{Hash: fmt.Sprintf("%064x", 1),
			Fields: []Field{{Path: "a"}, {Path: "b"}, {Path: "a"}, {Path: "\xff"}}}, Expiry: time.Unix(1, 0)},
	}
	for i, req := range bad {
		_, _, wantErr := ring.Sign(req)
		require.Error(t, wantErr, "case %d", i)
		_, _, gotErr := ring.SignToken(req)
		require.EqualError(t, gotErr, wantErr.Error(), "case %d", i)
	}
	var nilRing *KeyRing
	_, _, err = nilRing.SignToken(SignRequest{})
	require.Error(t, err)
}

func vectorRequest(t *testing.T, v *tokenVector) (*KeyRing, SignRequest) {
	t.Helper()
	keys := make(map[string][]byte, len(v.Keys))
	for id, enc := range v.Keys {
		k, err := ParseKey(enc)
		require.NoError(t, err)
		keys[id] = k
	}
	ring, err := NewKeyRing(v.ActiveKey, keys)
	require.NoError(t, err)
	sel, err := NewSelector(vectorParams(v.Params), Limits{})
	require.NoError(t, err)
	doc, err := ParseJSON([]byte(v.Body), 0)
	require.NoError(t, err)
	selected, err := sel.Select(doc, v.PathVars)
	require.NoError(t, err)
	return ring, SignRequest{Subject: v.Subject, Scope: v.Scope, Params: selected, Nonce: v.Nonce, Expiry: time.Unix(v.Exp, 0)}
}
