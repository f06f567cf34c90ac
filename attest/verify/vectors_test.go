package verify

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
)

// The golden vectors are idemgate's (fingerprint/testdata/vectors.json):
// the verifier's canonical form must be byte for byte the fingerprint
// package's, or legitimate confirms would be refused.
type goldenVectors struct {
	Numbers []struct {
		In    string `json:"in"`
		Out   string `json:"out"`
		Error string `json:"error"`
	} `json:"numbers"`
	Canonical []struct {
		Name string `json:"name"`
		In   string `json:"in"`
		Out  string `json:"out"`
	} `json:"canonical"`
	Tokens []struct {
		Name     string            `json:"name"`
		Params   []Param           `json:"params"`
		Body     string            `json:"body"`
		PathVars map[string]string `json:"path_vars"`
		Expected struct {
			Canonical string `json:"canonical"`
			Hash      string `json:"hash"`
		} `json:"expected"`
	} `json:"tokens"`
}

func loadVectors(t *testing.T) goldenVectors {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "..", "fingerprint", "testdata", "vectors.json"))
	if err != nil {
		t.Fatal(err)
	}
	var v goldenVectors
	if err := json.Unmarshal(data, &v); err != nil {
		t.Fatal(err)
	}
	if len(v.Numbers) == 0 || len(v.Canonical) == 0 || len(v.Tokens) == 0 {
		t.Fatal("vectors.json has an empty section")
	}
	return v
}

func TestGoldenNumbers(t *testing.T) {
	for _, n := range loadVectors(t).Numbers {
		got, err := CanonicalDecimal(n.In)
		switch {
		case n.Error == "out_of_range" && err != errOutOfRange,
			n.Error == "invalid" && err != errDecimal,
			n.Error == "" && (err != nil || got != n.Out):
			t.Errorf("CanonicalDecimal(%q) = %q, %v; want %q / error %q", n.In, got, err, n.Out, n.Error)
		}
	}
}

func TestGoldenCanonical(t *testing.T) {
	for _, c := range loadVectors(t).Canonical {
		doc, err := parseJSON([]byte(c.In))
		if err != nil {
			t.Errorf("%s: %v", c.Name, err)
			continue
		}
		got, err := appendCanonical(nil, doc, nil)
		if err != nil || string(got) != c.Out {
			t.Errorf("%s: got %s, %v; want %s", c.Name, got, err, c.Out)
		}
	}
}

// nfcForVectors is enough NFC for the vectors' one decomposed character
// (e + U+0301): the package has no NFC of its own (Options.NFC).
func nfcForVectors(s string) string {
	out := []rune{}
	for _, r := range s {
		if r == 0x301 && len(out) > 0 && out[len(out)-1] == 'e' {
			out[len(out)-1] = 'é'
			continue
		}
		out = append(out, r)
	}
	return string(out)
}

func TestGoldenParamHashes(t *testing.T) {
	for _, tok := range loadVectors(t).Tokens {
		doc, err := parseJSON([]byte(tok.Body))
		if err != nil {
			t.Errorf("%s: %v", tok.Name, err)
			continue
		}
		canon, err := CanonicalParams(tok.Params, doc, tok.PathVars, nfcForVectors)
		if err != nil || string(canon) != tok.Expected.Canonical {
			t.Errorf("%s: canonical %s, %v; want %s", tok.Name, canon, err, tok.Expected.Canonical)
		}
		hash, err := ParamHash(tok.Params, doc, tok.PathVars, nfcForVectors)
		if err != nil || hash != tok.Expected.Hash {
			t.Errorf("%s: hash %s, %v; want %s", tok.Name, hash, err, tok.Expected.Hash)
		}
	}
}

func TestNFCParamWithoutNormaliserIsRefused(t *testing.T) {
	doc, _ := parseJSON([]byte(`{"name":"x"}`))
	if _, err := ParamHash([]Param{{Path: "name", Normalize: "nfc"}}, doc, nil, nil); err == nil {
		t.Fatal("a normalize: nfc param hashed without a normaliser")
	}
}

func TestStrictJSON(t *testing.T) {
	for _, bad := range []string{
		`{"a":1,"a":2}`, "\ufeff{}", `{} x`, `{"a":"\ud800"}`, `{"a":"\udc00\ud800"}`, "{\"a\":\"\xff\"}",
		`{"a":01}`, `{"a":NaN}`, `{"a":1,}`, `[1,]`, `{'a':1}`, `{"a":"` + "\x01" + `"}`,
	} {
		if _, err := parseJSON([]byte(bad)); err == nil {
			t.Errorf("parseJSON(%q) accepted", bad)
		}
	}
	if _, err := parseJSON([]byte(`{"a":"\ud83d\ude00","b":[1.5e-3,-0,true,false,null],"c":{}}`)); err != nil {
		t.Errorf("a valid body refused: %v", err)
	}
}
