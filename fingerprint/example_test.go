package fingerprint_test

import (
	"fmt"
	"time"

	"github.com/idemgate/idemgate/fingerprint"
)

// Example shows the preview/confirm round trip as idemgate's ext_proc server
// runs it.
func Example() {
	// Start-up: keys from IDEMGATE_KEY_* (base64), params from the operation.
	k1, _ := fingerprint.ParseKey("AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=")
	ring, _ := fingerprint.NewKeyRing("k1", map[string][]byte{"k1": k1})
	sel, _ := fingerprint.NewSelector([]fingerprint.Param{
		{Path: "amount", Decimal: true}, {Path: "currency"}, {Path: "payee.account_id"},
	}, fingerprint.Limits{})
	now := time.Unix(1_753_499_100, 0)

	// Preview: bind the params, subject and scope into a fingerprint.
	doc, _ := fingerprint.ParseJSON([]byte(`{"amount":"100.00","currency":"EUR","payee":{"account_id":"DE89"},"memo":"rent"}`), 0)
	params, _ := sel.Select(doc, nil)
	token, _, _ := ring.Sign(fingerprint.SignRequest{
		Subject: "user-42", Scope: "payments.transfer", Params: params,
		Nonce: "00112233445566778899aabbccddeeff", Expiry: now.Add(15 * time.Minute),
	})
	fmt.Println(string(params.Canonical))

	// Confirm with the same params spelled differently: accepted.
	doc, _ = fingerprint.ParseJSON([]byte(`{"amount":100,"currency":"EUR","payee":{"account_id":"DE89"},"memo":"changed"}`), 0)
	same, _ := sel.Select(doc, nil)
	claims, err := ring.Verify(token, fingerprint.Expect{Subject: "user-42", Scope: "payments.transfer", Params: &same}, now)
	fmt.Println(claims.Nonce, err)

	// Confirm with a bigger amount: rejected, naming the field.
	doc, _ = fingerprint.ParseJSON([]byte(`{"amount":"1000.00","currency":"EUR","payee":{"account_id":"DE89"}}`), 0)
	changed, _ := sel.Select(doc, nil)
	_, err = ring.Verify(token, fingerprint.Expect{Subject: "user-42", Scope: "payments.transfer", Params: &changed}, now)
	fmt.Println(err)

	// Output:
	// {"amount":100,"currency":"EUR","payee.account_id":"DE89"}
	// 00112233445566778899aabbccddeeff <nil>
	// fingerprint rejected: params_changed (changed: amount)
}
