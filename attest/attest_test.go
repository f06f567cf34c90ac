package attest

import (
	"crypto/ed25519"
	"fmt"
	"strings"
	"testing"
)

func TestParseSeed(t *testing.T) {
	gen, err := GenerateSeed()
	if err != nil {
		t.Fatal(err)
	}
	for _, ok := range []string{gen, strings.TrimRight(gen, "="), " " + gen + "\n",
		strings.NewReplacer("+", "-", "/", "_").Replace(strings.TrimRight(gen, "="))} {
		if _, err := ParseSeed(ok); err != nil {
			t.Errorf("ParseSeed(%q): %v", ok, err)
		}
	}
	for _, bad := range []string{"", "c2hvcnQ=", "not base64!", "ab+c-d", strings.Repeat("A", 60)} {
		_, err := ParseSeed(bad)
		if err == nil {
			t.Errorf("ParseSeed(%q) accepted", bad)
			continue
		}
		if bad != "" && strings.Contains(err.Error(), bad) {
			t.Errorf("the error echoes the key: %v", err)
		}
	}
}

func TestSignerNeverPrintsKeys(t *testing.T) {
	seed := []byte("0123456789abcdef0123456789abcdef")
	s, err := NewSigner("a1", map[string]ed25519.PrivateKey{"a1": ed25519.NewKeyFromSeed(seed)})
	if err != nil {
		t.Fatal(err)
	}
	for _, text := range []string{fmt.Sprint(s), fmt.Sprintf("%#v", s), fmt.Sprintf("%+v", s), s.LogValue().String()} {
		if !strings.Contains(text, "a1") || strings.Contains(text, "0123456789") {
			t.Errorf("printed %q", text)
		}
	}
	if _, err := NewSigner("a2", map[string]ed25519.PrivateKey{"a1": ed25519.NewKeyFromSeed(seed)}); err == nil {
		t.Error("an active key outside the set was accepted")
	}
}
