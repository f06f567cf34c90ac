package verify_test

import (
	"context"
	"testing"
	"time"

	"github.com/idemgate/idemgate/attest/verify"
)

// BenchmarkSign is idemgate's cost per forwarded confirm.
func BenchmarkSign(b *testing.B) {
	s := newSigner(b, "a1", "a1")
	c := claims()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := s.Sign(c); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkVerify is the upstream's cost per confirm: signature, claims,
// parsing the body and recomputing the param hash.
func BenchmarkVerify(b *testing.B) {
	s := newSigner(b, "a1", "a1")
	keys, _ := verify.ParseJWKS(s.JWKS())
	v, err := verify.New(verify.Options{Keys: keys, Now: func() time.Time { return time.Unix(testNow, 0) }})
	if err != nil {
		b.Fatal(err)
	}
	tok := sign(b, s, claims())
	body := []byte(transferBody)
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		doc, err := verify.ParseBody(body)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := v.Verify(ctx, verify.Request{Method: "POST", Path: "/v1/transfers/confirm", Token: tok, Doc: doc}); err != nil {
			b.Fatal(err)
		}
	}
}
