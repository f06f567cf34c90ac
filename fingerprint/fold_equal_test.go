package fingerprint

import "testing"

// foldEqual is foldKey's equality without the keys: the two must agree on
// every pair, the awkward runes included.
func TestFoldEqualAgreesWithFoldKey(t *testing.T) {
	keys := []string{
		"", "a", "A", "amount", "AMOUNT", "Amount", "amount_", "a_mount", "a-mount", "amoun",
		"account_id", "Account_Id", "accountId", "account-id", "ACCOUNTID", "accountid", "account__id",
		"k", "K", "\u212a", "s", "S", "\u017f", "i", "I", "\u0131", "\u0130", "\u00e9", "\u00c9", "e\u0301",
		"\u03c3", "\u03c2", "\u03a3", "ß", "SS", "x\u0000", "x", "_", "-", "__", "é_", "\U0001d400",
		"pay\u212aee", "PAYKEE", "payee", "PAYEE", "\xff", "\xfe",
	}
	for _, a := range keys {
		for _, b := range keys {
			if got, want := foldEqual(a, b), foldKey(a) == foldKey(b); got != want {
				t.Errorf("foldEqual(%q, %q) = %v, foldKey says %v", a, b, got, want)
			}
		}
	}
}

func FuzzFoldEqual(f *testing.F) {
	f.Add("account_id", "AccountId")
	f.Add("\u212a", "k")
	f.Fuzz(func(t *testing.T, a, b string) {
		if got, want := foldEqual(a, b), foldKey(a) == foldKey(b); got != want {
			t.Fatalf("foldEqual(%q, %q) = %v, foldKey says %v", a, b, got, want)
		}
	})
}
