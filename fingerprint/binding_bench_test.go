package fingerprint

import "testing"

// BenchmarkCheckBinding is the binding rule's check of a transfer body: it
// runs on every preview and confirm before anything is hashed.
func BenchmarkCheckBinding(b *testing.B) {
	sel, err := NewSelector([]Param{{Path: "amount", Decimal: true}, {Path: "currency"}, {Path: "payee.account_id"}}, Limits{})
	if err != nil {
		b.Fatal(err)
	}
	doc, err := ParseJSON([]byte(`{"amount":"100.00","currency":"EUR","memo":"rent","payee":{"account_id":"DE89","name":"Alice"},"reference":"INV-1"}`), 0)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if err := checkBinding(doc, sel.bound); err != nil {
			b.Fatal(err)
		}
	}
}
