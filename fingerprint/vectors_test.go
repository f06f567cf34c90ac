package fingerprint

import (
	"bytes"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

var update = flag.Bool("update", false, "rewrite the expected values in testdata/vectors.json from this implementation")

const vectorsFile = "testdata/vectors.json"

// vectorFile is the layout of testdata/vectors.json. Inputs are written by
// hand; everything under "expected"/"out"/"error" is what this implementation
// computes, and is only ever rewritten with -update.
type vectorFile struct {
	Comment   []string          `json:"comment"`
	Numbers   []numberVector    `json:"numbers"`
	Canonical []canonicalVector `json:"canonical"`
	Tokens    []tokenVector     `json:"tokens"`
}

// bindingVectorsFile holds the bodies the binding rule refuses; a file of its
// own, since readers of vectors.json refuse members they do not know.
const bindingVectorsFile = "testdata/binding_vectors.json"

type bindingVectorFile struct {
	Comment []string        `json:"comment"`
	Refused []refusedVector `json:"refused"`
}

// refusedVector is a body Select must refuse (the binding rule): error is
// "ambiguous_key" or "ambiguous_value".
type refusedVector struct {
	Name   string        `json:"name"`
	Params []paramVector `json:"params"`
	Body   string        `json:"body"`
	Error  string        `json:"error"`
}

type numberVector struct {
	In    string `json:"in"`
	Out   string `json:"out,omitempty"`
	Error string `json:"error,omitempty"` // "invalid" or "out_of_range"
}

type canonicalVector struct {
	Name string `json:"name"`
	In   string `json:"in"` // raw JSON text
	Out  string `json:"out"`
}

type paramVector struct {
	Path      string `json:"path"`
	Type      string `json:"type,omitempty"`      // "" or "decimal"
	Normalize string `json:"normalize,omitempty"` // "" or "nfc"
}

func vectorParams(in []paramVector) []Param {
	params := make([]Param, 0, len(in))
	for _, p := range in {
		params = append(params, Param{Path: p.Path, Decimal: p.Type == "decimal", NFC: p.Normalize == "nfc"})
	}
	return params
}

type tokenVector struct {
	Name      string            `json:"name"`
	Keys      map[string]string `json:"keys"` // id -> base64 key
	ActiveKey string            `json:"active_key"`
	Nonce     string            `json:"nonce"`
	Now       int64             `json:"now"`
	Exp       int64             `json:"exp"`
	Subject   string            `json:"subject"`
	Scope     string            `json:"scope"`
	Params    []paramVector     `json:"params"`
	Body      string            `json:"body"` // raw request body
	PathVars  map[string]string `json:"path_vars,omitempty"`
	Expected  *tokenExpected    `json:"expected"`
}

type tokenExpected struct {
	SubjectKey string            `json:"subject_key_hex"` // HKDF-derived, per active key
	FieldKey   string            `json:"field_key_hex"`
	Canonical  string            `json:"canonical"`
	Hash       string            `json:"hash"`
	SubjectTag string            `json:"subject_tag"`
	FieldTags  map[string]string `json:"field_tags"`
	Payload    string            `json:"payload"`
	Token      string            `json:"token"`
}

func TestGoldenVectors(t *testing.T) {
	raw, err := os.ReadFile(vectorsFile)
	require.NoError(t, err)
	var vf vectorFile
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	require.NoError(t, dec.Decode(&vf))
	require.NotEmpty(t, vf.Numbers)
	require.NotEmpty(t, vf.Canonical)
	require.NotEmpty(t, vf.Tokens)

	for i := range vf.Numbers {
		v := &vf.Numbers[i]
		got, errName := numberVectorResult(v.In)
		if *update {
			v.Out, v.Error = got, errName
			continue
		}
		require.Equal(t, numberVector{In: v.In, Out: got, Error: errName}, *v, "number %q", v.In)
		require.True(t, v.Out != "" || v.Error != "", "number %q has no expectation", v.In)
	}

	for i := range vf.Canonical {
		v := &vf.Canonical[i]
		doc, err := ParseJSON([]byte(v.In), 0)
		require.NoError(t, err, v.Name)
		got, err := Canonicalize(doc)
		require.NoError(t, err, v.Name)
		if *update {
			v.Out = string(got)
			continue
		}
		require.NotEmpty(t, v.Out, "canonical %q has no expectation", v.Name)
		require.Equal(t, v.Out, string(got), v.Name)
	}

	for i := range vf.Tokens {
		v := &vf.Tokens[i]
		got := tokenVectorResult(t, v)
		if *update {
			v.Expected = got
			continue
		}
		require.NotNil(t, v.Expected, "token vector %q has no expectation", v.Name)
		require.Equal(t, *v.Expected, *got, v.Name)
	}

	braw, err := os.ReadFile(bindingVectorsFile)
	require.NoError(t, err)
	var bf bindingVectorFile
	bdec := json.NewDecoder(bytes.NewReader(braw))
	bdec.DisallowUnknownFields()
	require.NoError(t, bdec.Decode(&bf))
	require.NotEmpty(t, bf.Refused)
	for i := range bf.Refused {
		v := &bf.Refused[i]
		sel, err := NewSelector(vectorParams(v.Params), Limits{})
		require.NoError(t, err, v.Name)
		doc, err := ParseJSON([]byte(v.Body), 0)
		require.NoError(t, err, v.Name)
		_, err = sel.Select(doc, nil)
		got := ""
		switch {
		case errors.Is(err, ErrAmbiguousKey):
			got = "ambiguous_key"
		case errors.Is(err, ErrAmbiguousValue):
			got = "ambiguous_value"
		case err != nil:
			got = "invalid"
		}
		if *update {
			v.Error = got
			continue
		}
		require.NotEmpty(t, got, "refused vector %q was accepted", v.Name)
		require.Equal(t, v.Error, got, v.Name)
	}

	if *update {
		var buf bytes.Buffer
		enc := json.NewEncoder(&buf)
		enc.SetEscapeHTML(false)
		enc.SetIndent("", "  ")
		require.NoError(t, enc.Encode(vf))
		require.NoError(t, os.WriteFile(filepath.Clean(vectorsFile), buf.Bytes(), 0o644))
		t.Logf("rewrote %s", vectorsFile)
		buf.Reset()
		require.NoError(t, enc.Encode(bf))
		require.NoError(t, os.WriteFile(filepath.Clean(bindingVectorsFile), buf.Bytes(), 0o644))
		t.Logf("rewrote %s", bindingVectorsFile)
	}
}

func numberVectorResult(in string) (out, errName string) {
	got, err := CanonicalDecimal(in)
	switch {
	case err == nil:
		return got, ""
	case errors.Is(err, ErrNumberOutOfRange):
		return "", "out_of_range"
	default:
		return "", "invalid"
	}
}

func tokenVectorResult(t *testing.T, v *tokenVector) *tokenExpected {
	t.Helper()
	keys := make(map[string][]byte, len(v.Keys))
	for id, enc := range v.Keys {
		k, err := ParseKey(enc)
		require.NoError(t, err, v.Name)
		keys[id] = k
	}
	ring, err := NewKeyRing(v.ActiveKey, keys)
	require.NoError(t, err, v.Name)
	sel, err := NewSelector(vectorParams(v.Params), Limits{})
	require.NoError(t, err, v.Name)
	doc, err := ParseJSON([]byte(v.Body), 0)
	require.NoError(t, err, v.Name)
	selected, err := sel.Select(doc, v.PathVars)
	require.NoError(t, err, v.Name)
	token, claims, err := ring.Sign(SignRequest{
		Subject: v.Subject, Scope: v.Scope, Params: selected, Nonce: v.Nonce, Expiry: time.Unix(v.Exp, 0),
	})
	require.NoError(t, err, v.Name)

	// Every vector must also verify at "now" and expire one second after exp.
	want := Expect{Subject: v.Subject, Scope: v.Scope, Params: &selected}
	_, err = ring.Verify(token, want, time.Unix(v.Now, 0))
	require.NoError(t, err, v.Name)
	_, err = ring.Verify(token, want, time.Unix(v.Exp, 0))
	require.NoError(t, err, v.Name)
	_, err = ring.Verify(token, want, time.Unix(v.Exp+1, 0))
	reason, _ := ReasonOf(err)
	require.Equal(t, ReasonExpired, reason, v.Name)

	payload, err := base64.RawURLEncoding.DecodeString(token[:bytes.IndexByte([]byte(token), '.')])
	require.NoError(t, err)
	active := ring.keys[ring.active]
	return &tokenExpected{
		SubjectKey: hex.EncodeToString(active.subjectKey),
		FieldKey:   hex.EncodeToString(active.fieldKey),
		Canonical:  string(selected.Canonical),
		Hash:       selected.Hash,
		SubjectTag: claims.SubjectTag,
		FieldTags:  claims.FieldTags,
		Payload:    string(payload),
		Token:      token,
	}
}
