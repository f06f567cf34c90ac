package fingerprint_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/big"
	"strings"
	"testing"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/stretchr/testify/require"
	"golang.org/x/text/unicode/norm"

	"github.com/idemgate/idemgate/fingerprint"
)

// The binding rule, checked against real parsers: FuzzBinding mutates the
// confirm body of a previewed transfer and asserts that whenever idemgate
// would accept the mutated body for the previewed fingerprint (same param
// hash, nothing refused), Go's encoding/json — decoding into the demo
// upstream's request struct as the demo upstream does, and into
// map[string]any — reads exactly the previewed bound values.
// TestBindingDifferential (binding_differential_test.go) holds the same
// property for Python's json and Node's JSON.parse over the committed corpus.

// previewedBody is the confirm body of the previewed transfer, fingerprint
// field included (its value is opaque here).
// The account id holds an "é" (U+00E9) so that its NFD spelling is another
// account to the upstream (the NFD row of docs/binding-rule.md's table).
const previewedBody = `{"amount":"250.00","currency":"EUR","payee":{"account_id":"acc_caf\u00e9","name":"Alice"},"memo":"rent","fingerprint":"fp.token"}`

// demoParams are the demo operation's params (cmd/idemgate's demo config).
var demoParams = []fingerprint.Param{{Path: "amount", Decimal: true}, {Path: "currency"}, {Path: "payee.account_id"}}

// demoTransferRequest mirrors the demo upstream's request struct
// (e2e/payments transferRequest, unexported there): the same fields, types
// and tags, so encoding/json binds the body exactly as the upstream does.
type demoTransferRequest struct {
	Amount   json.RawMessage `json:"amount"`
	Currency string          `json:"currency"`
	Payee    *struct {
		AccountID string `json:"account_id"`
		Name      string `json:"name,omitempty"`
	} `json:"payee"`
}

// boundValues is what an upstream reads for the bound params: amount as an
// exact decimal (nil when absent), the strings and whether they are present.
type boundValues struct {
	Amount      *big.Rat
	Currency    *string
	AccountID   *string
	AmountText  string
	Unreadable  string // why the amount could not be read as a decimal
	PayeeAbsent bool
}

func (b boundValues) String() string {
	s := func(p *string) string {
		if p == nil {
			return "<absent>"
		}
		return fmt.Sprintf("%q", *p)
	}
	a := "<absent>"
	if b.Amount != nil {
		a = b.Amount.RatString()
	}
	return fmt.Sprintf("amount=%s (%s%s) currency=%s account_id=%s", a, b.AmountText, b.Unreadable, s(b.Currency), s(b.AccountID))
}

func (b boundValues) equal(o boundValues) bool {
	eqs := func(x, y *string) bool { return (x == nil) == (y == nil) && (x == nil || *x == *y) }
	eqr := func(x, y *big.Rat) bool { return (x == nil) == (y == nil) && (x == nil || x.Cmp(y) == 0) }
	return eqr(b.Amount, o.Amount) && eqs(b.Currency, o.Currency) && eqs(b.AccountID, o.AccountID) && b.Unreadable == o.Unreadable
}

// decimalOf reads a JSON number literal or the text of a decimal string.
func decimalOf(text string) (*big.Rat, string) {
	r, ok := new(big.Rat).SetString(text)
	if !ok {
		return nil, "unreadable"
	}
	return r, ""
}

// readStruct decodes body as the demo upstream does (a Decoder with
// UseNumber into its struct). ok is false when it refuses the body.
func readStruct(body []byte) (boundValues, bool) {
	var req demoTransferRequest
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	if err := dec.Decode(&req); err != nil {
		return boundValues{}, false
	}
	var v boundValues
	if len(req.Amount) > 0 && string(req.Amount) != "null" {
		text := string(req.Amount)
		if req.Amount[0] == '"' {
			if err := json.Unmarshal(req.Amount, &text); err != nil {
				return boundValues{}, false
			}
		}
		v.AmountText = text
		v.Amount, v.Unreadable = decimalOf(text)
	}
	// A JSON null leaves a string field empty, as absence does: both are
	// "no value" to this upstream.
	if req.Currency != "" {
		v.Currency = &req.Currency
	}
	if req.Payee != nil && req.Payee.AccountID != "" {
		v.AccountID = &req.Payee.AccountID
	}
	return v, true
}

// readMap decodes body into map[string]any and reads the bound paths by
// exact key, as a dynamic upstream does.
func readMap(body []byte) (boundValues, bool) {
	var m map[string]any
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	if err := dec.Decode(&m); err != nil || m == nil {
		return boundValues{}, false
	}
	var v boundValues
	switch a := m["amount"].(type) {
	case string:
		v.AmountText = a
		v.Amount, v.Unreadable = decimalOf(a)
	case json.Number:
		v.AmountText = string(a)
		v.Amount, v.Unreadable = decimalOf(string(a))
	case nil:
	default:
		v.Unreadable = fmt.Sprintf("amount is %T", a)
	}
	if c, ok := m["currency"].(string); ok {
		v.Currency = &c
	} else if m["currency"] != nil {
		return boundValues{}, false
	}
	if p, ok := m["payee"].(map[string]any); ok {
		if id, ok := p["account_id"].(string); ok {
			v.AccountID = &id
		}
	}
	return v, true
}

// bindingFixture is the previewed transfer: its selector, param hash and
// the bound values every parser must read from an accepted body.
type bindingFixture struct {
	sel  *fingerprint.Selector
	hash string
	want boundValues
}

func newBindingFixture(t testing.TB) bindingFixture {
	sel, err := fingerprint.NewSelector(demoParams, fingerprint.Limits{})
	require.NoError(t, err)
	doc, err := fingerprint.ParseJSON([]byte(previewedBody), 0)
	require.NoError(t, err)
	p, err := sel.Select(doc, nil)
	require.NoError(t, err)
	want, ok := readStruct([]byte(previewedBody))
	require.True(t, ok)
	return bindingFixture{sel: sel, hash: p.Hash, want: want}
}

// accepts reports whether idemgate would confirm body for the previewed
// fingerprint: the checks of the confirm route that read the body (JSON,
// an object, the fingerprint field unambiguous, params bound and equal).
func (fx bindingFixture) accepts(body []byte) bool {
	if len(body) > 1<<20 {
		return false
	}
	doc, err := fingerprint.ParseJSON(body, 0)
	if err != nil {
		return false
	}
	if _, ok := doc.Value().(map[string]any); !ok {
		return false
	}
	if fingerprint.CheckKey(doc, "fingerprint") != nil {
		return false
	}
	p, err := fx.sel.Select(doc, nil)
	return err == nil && p.Hash == fx.hash
}

// checkBody asserts the property for one body.
func (fx bindingFixture) checkBody(t *testing.T, body []byte) {
	if !fx.accepts(body) {
		return
	}
	got, ok := readStruct(body)
	if ok {
		require.True(t, fx.want.equal(got), "idemgate accepted %q, the demo upstream's struct reads %v, previewed %v", body, got, fx.want)
	}
	got, ok = readMap(body)
	if ok {
		require.True(t, fx.want.equal(got), "idemgate accepted %q, map[string]any reads %v, previewed %v", body, got, fx.want)
	}
}

// bindingSeed is one fuzz input: a body and a mutation program.
type bindingSeed struct{ body, ops []byte }

// bindingSeeds are FuzzBinding's seeds (the committed corpus adds to them):
// every mutation with a few arguments, and the four bodies that once
// confirmed another operation (docs/design.md §2).
func bindingSeeds() []bindingSeed {
	seeds := []bindingSeed{{[]byte(previewedBody), []byte{}}, {[]byte(withFillers(previewedBody, 17)), []byte{}}}
	for op := range byte(opCount) {
		for _, arg := range []byte{0, 1, 2, 3, 5, 7, 11, 200} {
			seeds = append(seeds, bindingSeed{[]byte(previewedBody), []byte{op, arg, arg + 1, arg + 2}})
		}
	}
	for _, b := range []string{
		`{"amount":250,"currency":"EUR","payee":{"account_id":"acc_caf\u00e9"}}`,
		`{"amount":"250.00","AMOUNT":"2500.00","currency":"EUR","payee":{"account_id":"acc_caf\u00e9"}}`,
		`{"AMOUNT":"2500.00","amount":"250.00","currency":"EUR","payee":{"account_id":"acc_caf\u00e9"}}`,
		`{"amount":"250.00","currency":"EUR","payee":{"account_id":"acc_caf\u00e9","Account_Id":"acc_EVIL"}}`,
		`{"amount":"250.00","currency":"EUR","payee":{"account_id":"acc_caf\u00e9"},"PAYEE":{"account_id":"acc_EVIL2"}}`,
		`{"amount":"250.00","currency":"EUR","payee":{"account_id":"acc_cafe\u0301"}}`,
		`{"amount":"250.00","amount":"2500.00","currency":"EUR","payee":{"account_id":"acc_caf\u00e9"}}`,
		`{"amount":2.5e2,"currency":"\u0045UR","payee":{"account_id":"acc\u005fcaf\u00e9"}}`,
	} {
		// Each also with 17 filler keys in every object: past the size up
		// to which keys are compared pairwise.
		seeds = append(seeds, bindingSeed{[]byte(b), []byte{}}, bindingSeed{[]byte(withFillers(b, 17)), []byte{}})
	}
	seeds = append(seeds,
		bindingSeed{[]byte(previewedBody), []byte{opKeyEscape, 1, opRespellAmount, 3}},
		bindingSeed{[]byte(previewedBody), []byte{opCaseVariant, 9, opNFD, 1}},
		bindingSeed{[]byte(previewedBody), []byte{opEscapes, 15, opWhitespace, 2, opReorder, 0, 1}},
	)
	return seeds
}

func FuzzBinding(f *testing.F) {
	fx := newBindingFixture(f)
	for _, s := range bindingSeeds() {
		f.Add(s.body, s.ops)
	}
	f.Fuzz(func(t *testing.T, body []byte, ops []byte) {
		for _, b := range bindingBodies(body, ops) {
			fx.checkBody(t, b)
		}
	})
}

// bindingBodies are the bodies one fuzz input stands for: the body itself,
// the previewed body mutated by ops, and the body mutated by ops.
func bindingBodies(body, ops []byte) [][]byte {
	return [][]byte{body, mutateBody(previewedBody, ops), mutateBody(string(body), ops)}
}

// --- a mutator that knows JSON -------------------------------------------

// jnode is a JSON value that may hold what parsers disagree on: members in
// any order, duplicate and case-variant keys.
type jnode struct {
	kind    byte // 'o' object, 'a' array, 's' string, 'n' number, 'l' literal
	members []jmember
	elems   []*jnode
	text    string // string value (decoded), number or literal text
}

type jmember struct {
	key string
	val *jnode
}

// fromAny converts a ParseJSON tree (members in key order).
func fromAny(v any) *jnode {
	switch v := v.(type) {
	case map[string]any:
		n := &jnode{kind: 'o'}
		for _, k := range sortedKeys(v) {
			n.members = append(n.members, jmember{k, fromAny(v[k])})
		}
		return n
	case []any:
		n := &jnode{kind: 'a'}
		for _, e := range v {
			n.elems = append(n.elems, fromAny(e))
		}
		return n
	case string:
		return &jnode{kind: 's', text: v}
	case json.Number:
		return &jnode{kind: 'n', text: string(v)}
	case bool:
		return &jnode{kind: 'l', text: fmt.Sprint(v)}
	default:
		return &jnode{kind: 'l', text: "null"}
	}
}

func sortedKeys(m map[string]any) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	// A fixed order, so a corpus entry means the same body every run.
	for i := 1; i < len(keys); i++ {
		for j := i; j > 0 && keys[j] < keys[j-1]; j-- {
			keys[j], keys[j-1] = keys[j-1], keys[j]
		}
	}
	return keys
}

// objects lists every object in the tree, depth first.
func (n *jnode) objects(out []*jnode) []*jnode {
	if n.kind == 'o' {
		out = append(out, n)
		for _, m := range n.members {
			out = m.val.objects(out)
		}
	}
	for _, e := range n.elems {
		out = e.objects(out)
	}
	return out
}

func (n *jnode) strings(out []*jnode) []*jnode {
	if n.kind == 's' {
		out = append(out, n)
	}
	for _, m := range n.members {
		out = m.val.strings(out)
	}
	for _, e := range n.elems {
		out = e.strings(out)
	}
	return out
}

func (n *jnode) clone() *jnode {
	c := &jnode{kind: n.kind, text: n.text}
	for _, m := range n.members {
		c.members = append(c.members, jmember{m.key, m.val.clone()})
	}
	for _, e := range n.elems {
		c.elems = append(c.elems, e.clone())
	}
	return c
}

// The mutation operations; each reads its arguments from the op stream.
const (
	opCaseVariant      = iota // add a case or fold variant of a key, with an evil value
	opDuplicate               // repeat a member with another value
	opReorder                 // rotate an object's members
	opNest                    // wrap a value in an array or object
	opRespellAmount           // amount in another number or string spelling
	opEscapes                 // string and key escape style
	opInvalidUTF8             // invalid UTF-8 in a string or key
	opBOM                     // a byte-order mark in front
	opWhitespace              // whitespace style
	opNFD                     // a string in NFD, NFC or with a combining mark
	opKeyEscape               // keys \u-escaped
	opNull                    // a member set to null
	opDelete                  // a member removed
	opLookalike               // a string replaced by a near value
	opTrailing                // data after the value
	opNumberEverywhere        // a number member in odd spellings
	opCount
)

var (
	evilStrings = []string{"2500.00", "acc_EVIL", "acc_cafe\u0301", "acc_caf\u00e9", "acc_CAF\u00c9", "acc_7731", "", "USD", "250.00", "acc_7731\x00", "ACC_7731", "acc_7731 ", "acc_7731" + loneSurrogate}
	// foldVariants spell a key other ways that Go's encoding/json (or .NET,
	// Java) match ignoring case.
	foldVariants = []func(string) string{
		strings.ToUpper,
		func(s string) string {
			if s == "" {
				return "\x00"
			}
			return strings.ToUpper(s[:1]) + s[1:]
		},
		func(s string) string { return strings.ReplaceAll(s, "k", "\u212a") },
		func(s string) string { return strings.ReplaceAll(s, "s", "\u017f") },
		func(s string) string { return strings.ReplaceAll(s, "i", "\u0131") },
		func(s string) string { return strings.ReplaceAll(strings.ToUpper(s), "I", "\u0130") },
		func(s string) string { return strings.ReplaceAll(s, "_", "-") },
		func(s string) string { return s + "\x00" },
		func(s string) string { return strings.ToLower(s) },
		func(s string) string { return strings.ReplaceAll(s, "a", "\u0430") }, // Cyrillic a: not a fold
	}
	amountSpellings = []string{`250`, `250.0`, `250.000`, `2.5e2`, `2.50E+2`, `25000e-2`, `0.25e3`, `"250"`, `"2.5e2"`, `"250.0"`,
		`-0`, `1E400`, `2500`, `"2500.00"`, `250.001`, `9007199254740993.0`, `-250`, `"+250"`, `" 250"`, `250e0`, `"0250"`, `true`, `null`, `[250]`}
)

// loneSurrogate is a private-use rune that writeString writes as the
// escape \ud800 (no Go string can hold a lone surrogate).
const loneSurrogate = "\ue000"

type style struct {
	escapeAll, escapeNonASCII, upperHex, slash, bom, spaces bool
	trailing                                                string
}

// mutateBody parses base (or the previewed body when base is not JSON),
// applies ops and writes the tree back in the chosen style.
func mutateBody(base string, ops []byte) []byte {
	doc, err := fingerprint.ParseJSON([]byte(base), 0)
	if err != nil {
		doc, _ = fingerprint.ParseJSON([]byte(previewedBody), 0)
	}
	root := fromAny(doc.Value())
	var st style
	var extraBytes []string
	arg := func(i *int) int {
		*i++
		if *i < len(ops) {
			return int(ops[*i])
		}
		return 0
	}
	for i := 0; i < len(ops) && i < 64; i++ {
		objs := root.objects(nil)
		op := ops[i] % opCount
		switch op {
		case opCaseVariant:
			if o := pickObject(objs, arg(&i)); o != nil && len(o.members) > 0 {
				m := o.members[arg(&i)%len(o.members)]
				key := foldVariants[arg(&i)%len(foldVariants)](m.key)
				val := &jnode{kind: 's', text: evilStrings[arg(&i)%len(evilStrings)]}
				if m.val.kind == 'o' {
					val = m.val.clone()
					for j := range val.members {
						val.members[j].val = &jnode{kind: 's', text: "acc_EVIL"}
					}
				}
				o.members = insertAt(o.members, jmember{key, val}, arg(&i))
			}
		case opDuplicate:
			if o := pickObject(objs, arg(&i)); o != nil && len(o.members) > 0 {
				m := o.members[arg(&i)%len(o.members)]
				o.members = insertAt(o.members, jmember{m.key, &jnode{kind: 's', text: evilStrings[arg(&i)%len(evilStrings)]}}, arg(&i))
			}
		case opReorder:
			if o := pickObject(objs, arg(&i)); o != nil && len(o.members) > 1 {
				k := arg(&i) % len(o.members)
				o.members = append(o.members[k:], o.members[:k]...)
			}
		case opNest:
			if o := pickObject(objs, arg(&i)); o != nil && len(o.members) > 0 {
				j := arg(&i) % len(o.members)
				if arg(&i)%2 == 0 {
					o.members[j].val = &jnode{kind: 'a', elems: []*jnode{o.members[j].val}}
				} else {
					o.members[j].val = &jnode{kind: 'o', members: []jmember{{o.members[j].key, o.members[j].val}}}
				}
			}
		case opRespellAmount, opNumberEverywhere:
			text := amountSpellings[arg(&i)%len(amountSpellings)]
			v := fromText(text)
			o := root
			if op == opNumberEverywhere {
				o = pickObject(objs, arg(&i))
			}
			if o != nil && o.kind == 'o' {
				set := false
				for j := range o.members {
					if o.members[j].key == "amount" {
						o.members[j].val, set = v, true
					}
				}
				if !set {
					o.members = append(o.members, jmember{"amount", v})
				}
			}
		case opEscapes:
			a := arg(&i)
			st.escapeAll, st.escapeNonASCII, st.upperHex, st.slash = a&1 != 0, a&2 != 0, a&4 != 0, a&8 != 0
		case opInvalidUTF8:
			ss := root.strings(nil)
			if len(ss) > 0 {
				s := ss[arg(&i)%len(ss)]
				bad := []string{"\xff", "\xc3", "\xed\xa0\x80", "\xef\xbf\xbd", "\xc0\xaf", loneSurrogate}[arg(&i)%6]
				s.text += bad
			}
		case opBOM:
			st.bom = true
		case opWhitespace:
			st.spaces = true
			extraBytes = append(extraBytes, []string{" ", "\t", "\r\n", "\u00a0", "\u2028", "\x0b"}[arg(&i)%6])
		case opNFD:
			ss := root.strings(nil)
			if len(ss) > 0 {
				s := ss[arg(&i)%len(ss)]
				s.text = []string{norm.NFD.String(s.text), norm.NFKC.String(s.text), s.text + "\u0301", strings.ReplaceAll(s.text, "a", "\u00e1"), "acc_caf\u00e9", "acc_cafe\u0301"}[arg(&i)%6]
			}
		case opKeyEscape:
			st.escapeAll = true
		case opNull:
			if o := pickObject(objs, arg(&i)); o != nil && len(o.members) > 0 {
				o.members[arg(&i)%len(o.members)].val = &jnode{kind: 'l', text: "null"}
			}
		case opDelete:
			if o := pickObject(objs, arg(&i)); o != nil && len(o.members) > 0 {
				j := arg(&i) % len(o.members)
				o.members = append(o.members[:j], o.members[j+1:]...)
			}
		case opLookalike:
			ss := root.strings(nil)
			if len(ss) > 0 {
				ss[arg(&i)%len(ss)].text = evilStrings[arg(&i)%len(evilStrings)]
			}
		case opTrailing:
			st.trailing = []string{`{"amount":"2500.00"}`, ` `, `x`, "\x00", `,{}`}[arg(&i)%5]
		}
	}
	var b strings.Builder
	if st.bom {
		b.WriteString("\ufeff")
	}
	writeNode(&b, root, st, extraBytes)
	b.WriteString(st.trailing)
	return []byte(b.String())
}

func pickObject(objs []*jnode, a int) *jnode {
	if len(objs) == 0 {
		return nil
	}
	return objs[a%len(objs)]
}

func insertAt(ms []jmember, m jmember, at int) []jmember {
	at %= len(ms) + 1
	ms = append(ms, jmember{})
	copy(ms[at+1:], ms[at:])
	ms[at] = m
	return ms
}

func fromText(text string) *jnode {
	v, err := fingerprint.ParseJSON([]byte(text), 0)
	if err != nil {
		return &jnode{kind: 'l', text: "null"}
	}
	if n, ok := v.Value().(json.Number); ok {
		return &jnode{kind: 'n', text: string(n)}
	}
	return fromAny(v.Value())
}

func writeNode(b *strings.Builder, n *jnode, st style, ws []string) {
	space := func() {
		if st.spaces {
			for _, w := range ws {
				b.WriteString(w)
			}
		}
	}
	switch n.kind {
	case 'o':
		b.WriteByte('{')
		for i, m := range n.members {
			if i > 0 {
				b.WriteByte(',')
			}
			space()
			writeString(b, m.key, st)
			space()
			b.WriteByte(':')
			space()
			writeNode(b, m.val, st, ws)
		}
		space()
		b.WriteByte('}')
	case 'a':
		b.WriteByte('[')
		for i, e := range n.elems {
			if i > 0 {
				b.WriteByte(',')
			}
			writeNode(b, e, st, ws)
		}
		b.WriteByte(']')
	case 's':
		writeString(b, n.text, st)
	default:
		b.WriteString(n.text)
	}
}

// writeString writes s as a JSON string in the given escape style; bytes
// that are not UTF-8 are written raw, as a hostile client would.
func writeString(b *strings.Builder, s string, st style) {
	hex := "%04x"
	if st.upperHex {
		hex = "%04X"
	}
	b.WriteByte('"')
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size <= 1 {
			b.WriteByte(s[i])
			i++
			continue
		}
		i += size
		switch {
		case r == []rune(loneSurrogate)[0]:
			b.WriteString(`\ud800`)
		case r == '"' || r == '\\':
			b.WriteByte('\\')
			b.WriteRune(r)
		case r == '/' && st.slash:
			b.WriteString(`\/`)
		case r < 0x20 || st.escapeAll || (r >= 0x80 && st.escapeNonASCII):
			if r > 0xFFFF {
				hi, lo := utf16.EncodeRune(r)
				fmt.Fprintf(b, `\u`+hex+`\u`+hex, hi, lo)
			} else {
				fmt.Fprintf(b, `\u`+hex, r)
			}
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte('"')
}
