package attest

import (
	"crypto/ed25519"
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/idemgate/idemgate/attest/verify"
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

// TestClaimsAreWrittenAsEncodingJSONWould: appendClaims, Sign's writer,
// gives the object encoding/json gives for the struct's tags (omitempty,
// sorted pv), member for member, for claims with and without the optional
// members and with strings that need escaping.
func TestClaimsAreWrittenAsEncodingJSONWould(t *testing.T) {
	for _, c := range []*verify.Claims{
		{Version: 1, Issuer: "idemgate", Key: "k", Scope: "s", ParamHash: "h", Params: []verify.Param{{Path: "amount", Type: "decimal"}, {Path: "payee.name", Normalize: "nfc"}},
			Method: "POST", Path: "/v1/transfers/confirm?x=\"1\"&y=<2>", Subject: "tag", Owner: "r1-7", Fence: 3, IssuedAt: 1700000000, Expiry: 1700000060},
		{Version: 1, Issuer: "idemgate", Key: "k", Scope: "s", ParamHash: "h", Params: []verify.Param{{Path: "path.account"}},
			PathVars: map[string]string{"b": "2", "a": "caf\u00e9\n"}, MCPTool: "transfer_confirm", Method: "POST", Path: "/mcp", Subject: "t", Owner: "o", Fence: -1},
		{Version: 1},
	} {
		want, err := json.Marshal(c)
		if err != nil {
			t.Fatal(err)
		}
		written := appendClaims(nil, c)
		var got, expected map[string]any
		if err := json.Unmarshal(written, &got); err != nil {
			t.Fatalf("%s: %v", written, err)
		}
		if err := json.Unmarshal(want, &expected); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(expected, got) {
			t.Errorf("appendClaims wrote\n%s\nencoding/json writes\n%s", written, want)
		}
		// The same members in the same order: only string escaping differs.
		if n, m := strings.Count(string(want), `":`), strings.Count(string(written), `":`); n != m {
			t.Errorf("%d members, encoding/json writes %d", m, n)
		}
	}
}
