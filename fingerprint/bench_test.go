package fingerprint_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/fingerprint"
)

// benchBody has ten bound fields of the usual kinds plus unbound noise.
const benchBody = `{
  "amount": "1234.50",
  "currency": "EUR",
  "payee": {"account_id": "DE89370400440532013000", "name": "Zoë Müller", "bic": "COBADEFFXXX"},
  "payer": {"account_id": "FR1420041010050500013M02606"},
  "reference": "INV-2026-000123",
  "execute_on": "2026-03-01",
  "fee": 1.25,
  "items": [{"sku": "A-1", "qty": 2}, {"sku": "B-2", "qty": 1}],
  "purpose": "SUPP",
  "urgent": false,
  "memo": "thanks for the coffee",
  "client_ts": "2026-02-27T10:11:12Z",
  "ui": {"theme": "dark", "button": "confirm"}
}`

var benchParams = []fingerprint.Param{
	{Path: "amount", Decimal: true},
	{Path: "currency"},
	{Path: "payee.account_id"},
	{Path: "payee.name"},
	{Path: "payer.account_id"},
	{Path: "reference"},
	{Path: "execute_on"},
	{Path: "fee", Decimal: true},
	{Path: "items"},
	{Path: "path.transfer_id"},
}

var benchVars = map[string]string{"transfer_id": "tr_0123456789"}

func BenchmarkParseJSON(b *testing.B) {
	body := []byte(benchBody)
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		if _, err := fingerprint.ParseJSON(body, 0); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkSelect10Fields(b *testing.B) {
	sel := mustSelector(b, benchParams, fingerprint.Limits{})
	doc, err := fingerprint.ParseJSON([]byte(benchBody), 0)
	require.NoError(b, err)
	p, err := sel.Select(doc, benchVars)
	require.NoError(b, err)
	require.Len(b, p.Fields, 10)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := sel.Select(doc, benchVars); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkParseAndSelect10Fields is the whole confirm-side cost of "p".
func BenchmarkParseAndSelect10Fields(b *testing.B) {
	sel := mustSelector(b, benchParams, fingerprint.Limits{})
	body := []byte(benchBody)
	b.ReportAllocs()
	for b.Loop() {
		doc, err := fingerprint.ParseJSON(body, 0)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := sel.Select(doc, benchVars); err != nil {
			b.Fatal(err)
		}
	}
}

func benchFixture(b *testing.B) (*fingerprint.KeyRing, fingerprint.Params) {
	ring, err := fingerprint.NewKeyRing("k2", map[string][]byte{"k1": testKey(1), "k2": testKey(2)})
	require.NoError(b, err)
	sel := mustSelector(b, benchParams, fingerprint.Limits{})
	doc, err := fingerprint.ParseJSON([]byte(benchBody), 0)
	require.NoError(b, err)
	p, err := sel.Select(doc, benchVars)
	require.NoError(b, err)
	return ring, p
}

func BenchmarkSign(b *testing.B) {
	ring, p := benchFixture(b)
	req := fingerprint.SignRequest{Subject: testSubject, Scope: testScope, Params: p, Nonce: testNonce, Expiry: testExpiry}
	b.ReportAllocs()
	for b.Loop() {
		if _, _, err := ring.Sign(req); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkVerify(b *testing.B) {
	ring, p := benchFixture(b)
	tok, _, err := ring.Sign(fingerprint.SignRequest{Subject: testSubject, Scope: testScope, Params: p, Nonce: testNonce, Expiry: testExpiry})
	require.NoError(b, err)
	want := fingerprint.Expect{Subject: testSubject, Scope: testScope, Params: &p}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := ring.Verify(tok, want, testExpiry); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkVerifyParamsChanged is the rejection path that also computes
// changed_fields.
func BenchmarkVerifyParamsChanged(b *testing.B) {
	ring, p := benchFixture(b)
	tok, _, err := ring.Sign(fingerprint.SignRequest{Subject: testSubject, Scope: testScope, Params: p, Nonce: testNonce, Expiry: testExpiry})
	require.NoError(b, err)
	sel := mustSelector(b, benchParams, fingerprint.Limits{})
	doc, err := fingerprint.ParseJSON([]byte(`{"amount":"1"}`), 0)
	require.NoError(b, err)
	other, err := sel.Select(doc, nil)
	require.NoError(b, err)
	want := fingerprint.Expect{Subject: testSubject, Scope: testScope, Params: &other}
	b.ReportAllocs()
	for b.Loop() {
		_, err := ring.Verify(tok, want, testExpiry)
		if reason, _ := fingerprint.ReasonOf(err); reason != fingerprint.ReasonParamsChanged {
			b.Fatal(err)
		}
	}
}

// BenchmarkSignToken is what a preview response costs: the token alone.
func BenchmarkSignToken(b *testing.B) {
	ring, p := benchFixture(b)
	req := fingerprint.SignRequest{Subject: testSubject, Scope: testScope, Params: p, Nonce: testNonce, Expiry: testExpiry}
	b.ReportAllocs()
	for b.Loop() {
		if _, _, err := ring.SignToken(req); err != nil {
			b.Fatal(err)
		}
	}
}
