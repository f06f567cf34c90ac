package fingerprint

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

// ErrInvalidParam is returned by NewSelector for a param it cannot use.
var ErrInvalidParam = errors.New("invalid param")

// pathVarPrefix marks a param read from the route's path template.
const pathVarPrefix = "path."

// DefaultMaxCanonicalBytes is the canonical size limit used when Limits
// leaves it zero.
const DefaultMaxCanonicalBytes = 64 << 10

// Param is one bound parameter of an operation.
type Param struct {
	// Path is either a dotted body path ("amount", "payee.account_id",
	// "items.0.sku": all-digit segments index arrays) or "path.<name>", the
	// {name} segment of the route's path template. It is also the key of the
	// field in the canonical object and in changed_fields, exactly as written.
	Path string
	// Decimal (`type: decimal`) lets a JSON string holding a decimal hash
	// exactly like the number it spells: "100.00" == 100.
	Decimal bool
	// NFC (`normalize: nfc`) NFC-normalises the param's strings before
	// hashing, so "caf\u00e9" and "cafe\u0301" hash equal. Off by default:
	// it is an equivalence only idemgate would make unless the upstream
	// itself NFC-normalises the field, and then two byte-different values
	// (two account ids) would confirm as one (the binding rule).
	NFC bool
}

// Limits bound the work Select does on hostile bodies. Zero fields take the
// defaults.
type Limits struct {
	// MaxDepth limits how deeply a selected value may nest (DefaultMaxDepth).
	MaxDepth int
	// MaxCanonicalBytes limits the size of Params.Canonical
	// (DefaultMaxCanonicalBytes).
	MaxCanonicalBytes int
}

// Selector picks an operation's bound params out of a parsed body and path
// variables and hashes their canonical form. It is immutable and safe for
// concurrent use.
type Selector struct {
	params []compiledParam // configured order
	byKey  []int           // indices of params, sorted by Path (byte order)
	paths  []string        // configured order; shared with every Params
	limits Limits
	bound  *bindNode // tree of the body paths, for the binding check
}

type compiledParam struct {
	Param
	pathVar  string   // name of the path variable, or ""
	segments []string // body path segments
	indexes  []int    // segments[i] as an array index, or -1
	key      []byte   // Path as a quoted JSON string
}

// NewSelector validates params and limits. A Path must be valid UTF-8 in NFC
// form without control characters, with no empty dotted segment; "path.<name>"
// must name exactly one segment. Duplicate paths are rejected. Every problem
// is reported, joined.
func NewSelector(params []Param, lim Limits) (*Selector, error) {
	var errs []error
	switch {
	case lim.MaxDepth < 0:
		errs = append(errs, fmt.Errorf("%w: negative max depth %d", ErrInvalidParam, lim.MaxDepth))
	case lim.MaxDepth == 0:
		lim.MaxDepth = DefaultMaxDepth
	case lim.MaxDepth > HardMaxDepth:
		lim.MaxDepth = HardMaxDepth
	}
	switch {
	case lim.MaxCanonicalBytes < 0:
		errs = append(errs, fmt.Errorf("%w: negative max canonical bytes %d", ErrInvalidParam, lim.MaxCanonicalBytes))
	case lim.MaxCanonicalBytes == 0:
		lim.MaxCanonicalBytes = DefaultMaxCanonicalBytes
	}

	s := &Selector{limits: lim}
	seen := make(map[string]bool, len(params))
	for _, p := range params {
		cp, err := compileParam(p)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if seen[p.Path] {
			errs = append(errs, fmt.Errorf("%w %q: listed twice", ErrInvalidParam, p.Path))
			continue
		}
		seen[p.Path] = true
		s.params = append(s.params, cp)
		s.paths = append(s.paths, p.Path)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	s.bound = &bindNode{}
	for _, p := range s.params {
		if p.pathVar != "" {
			continue
		}
		n := s.bound
		for _, seg := range p.segments {
			n = n.child(seg)
		}
		n.bound = true
	}
	s.byKey = make([]int, len(s.params))
	for i := range s.byKey {
		s.byKey[i] = i
	}
	slices.SortFunc(s.byKey, func(a, b int) int { return strings.Compare(s.params[a].Path, s.params[b].Path) })
	return s, nil
}

func compileParam(p Param) (compiledParam, error) {
	bad := func(why string) (compiledParam, error) {
		return compiledParam{}, fmt.Errorf("%w %q: %s", ErrInvalidParam, p.Path, why)
	}
	switch {
	case p.Path == "":
		return bad("empty path")
	case !utf8.ValidString(p.Path):
		return bad("not valid UTF-8")
	case !norm.NFC.IsNormalString(p.Path):
		return bad("not in Unicode NFC form")
	case strings.ContainsFunc(p.Path, func(r rune) bool { return r < 0x20 || r == 0x7f }):
		return bad("contains a control character")
	}
	segments := strings.Split(p.Path, ".")
	if slices.Contains(segments, "") {
		return bad("empty path segment")
	}
	cp := compiledParam{Param: p, key: AppendJSONString(nil, p.Path)}
	if strings.HasPrefix(p.Path, pathVarPrefix) {
		if len(segments) != 2 {
			return bad(`"path.<name>" takes a single variable name`)
		}
		cp.pathVar = segments[1]
		return cp, nil
	}
	cp.segments = segments
	cp.indexes = make([]int, len(segments))
	for i, seg := range segments {
		cp.indexes[i] = arrayIndex(seg)
	}
	return cp, nil
}

// arrayIndex returns seg as an array index if it is all digits in canonical
// form ("0", "12", not "012"), else -1.
func arrayIndex(seg string) int {
	if seg == "" || len(seg) > 9 || (len(seg) > 1 && seg[0] == '0') {
		return -1
	}
	n := 0
	for i := 0; i < len(seg); i++ {
		if !isDigit(seg[i]) {
			return -1
		}
		n = n*10 + int(seg[i]-'0')
	}
	return n
}

// lookup returns the selected value and whether it is present. Walking into
// anything that is not an object or array, a missing key, or an index out of
// range means absent.
func (p *compiledParam) lookup(doc any, pathVars map[string]string) (any, bool) {
	if p.pathVar != "" {
		v, ok := pathVars[p.pathVar]
		return v, ok
	}
	cur := doc
	for i, seg := range p.segments {
		switch node := cur.(type) {
		case map[string]any:
			v, ok := node[seg]
			if !ok {
				return nil, false
			}
			cur = v
		case []any:
			idx := p.indexes[i]
			if idx < 0 || idx >= len(node) {
				return nil, false
			}
			cur = node[idx]
		default:
			return nil, false
		}
	}
	return cur, true
}

// Paths returns the configured param paths in configured order.
func (s *Selector) Paths() []string { return slices.Clone(s.paths) }

// Params returns the configured params in configured order.
func (s *Selector) Params() []Param {
	out := make([]Param, len(s.params))
	for i, p := range s.params {
		out[i] = p.Param
	}
	return out
}

// Field is the canonical JSON of one selected, present param.
type Field struct {
	Path      string
	Canonical []byte
}

// Params is the result of Select: what the "p" and "f" claims are made from.
type Params struct {
	// Hash is the lower-case hex SHA-256 of Canonical (the "p" claim).
	Hash string
	// Canonical is the compact canonical JSON object of the present params,
	// keyed by Param.Path as written, keys in byte order.
	Canonical []byte
	// Fields holds the present params in the Selector's configured order.
	// Field.Canonical shares memory with an internal buffer; treat it as
	// read-only.
	Fields []Field

	// order is the Selector's configured path order, so Verify can list
	// changed fields (absent ones included) in configured order.
	order []string
}

// Select extracts the configured params from d (from ParseJSON; the zero
// Document when there is no body) and pathVars, and canonicalises and hashes them.
// Absent and null params are left out. Errors name the param's path.
//
// Before anything is hashed, the binding rule is checked: a body in which a
// bound field could be read two ways is refused with an *AmbiguousKeyError
// (ErrAmbiguousKey), and a bound value that parsers read differently with
// ErrAmbiguousValue. Both are security-relevant: the caller should report
// them, not just answer invalid_params.
func (s *Selector) Select(d Document, pathVars map[string]string) (Params, error) {
	if err := checkBinding(d.root, s.bound); err != nil {
		return Params{}, err
	}
	return s.selectValues(d.root, pathVars)
}

// selectValues is Select after the binding check. It is a function of its
// own so that its large frame (the value spans, the canonicaliser) is not
// on the stack while the binding check recurses through the body.
func (s *Selector) selectValues(doc any, pathVars map[string]string) (Params, error) {
	type span struct{ start, end int }
	var spanBuf [16]span
	spans := spanBuf[:0]
	if len(s.params) > len(spanBuf) {
		spans = make([]span, 0, len(s.params))
	}

	c := canonicalizer{buf: make([]byte, 0, 256), limit: s.limits.MaxCanonicalBytes, maxDepth: s.limits.MaxDepth, bound: true}
	present := 0
	keyBytes := 0
	for i := range s.params {
		p := &s.params[i]
		v, ok := p.lookup(doc, pathVars)
		if !ok || v == nil {
			spans = append(spans, span{-1, -1})
			continue
		}
		start := len(c.buf)
		c.nfc = p.NFC
		var err error
		if p.Decimal {
			err = c.decimalValue(v)
		} else {
			err = c.value(v, 0)
		}
		if err != nil {
			return Params{}, fmt.Errorf("param %q: %w", p.Path, err)
		}
		spans = append(spans, span{start, len(c.buf)})
		present++
		keyBytes += len(p.key) + 2 // key, ':' and ','
	}

	// The canonical object is written after the canonical values when
	// their buffer has room (the values are capped slices, so this cannot
	// overwrite them): one allocation for both on a typical body.
	need := len(c.buf) + keyBytes + 2
	var out []byte
	if cap(c.buf)-len(c.buf) >= need {
		out = c.buf[len(c.buf):len(c.buf):cap(c.buf)]
	} else {
		out = make([]byte, 0, need)
	}
	out = append(out, '{')
	first := true
	for _, i := range s.byKey {
		sp := spans[i]
		if sp.start < 0 {
			continue
		}
		if !first {
			out = append(out, ',')
		}
		first = false
		out = append(out, s.params[i].key...)
		out = append(out, ':')
		out = append(out, c.buf[sp.start:sp.end]...)
	}
	out = append(out, '}')
	if len(out) > s.limits.MaxCanonicalBytes {
		return Params{}, fmt.Errorf("%w (limit %d bytes)", ErrTooLarge, s.limits.MaxCanonicalBytes)
	}

	fields := make([]Field, 0, present)
	for i, sp := range spans {
		if sp.start < 0 {
			continue
		}
		fields = append(fields, Field{Path: s.params[i].Path, Canonical: c.buf[sp.start:sp.end:sp.end]})
	}
	sum := sha256.Sum256(out)
	var hash [2 * sha256.Size]byte
	hex.Encode(hash[:], sum[:])
	return Params{Hash: string(hash[:]), Canonical: out, Fields: fields, order: s.paths}, nil
}
