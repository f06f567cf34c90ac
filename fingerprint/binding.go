package fingerprint

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"unicode/utf16"
	"unicode/utf8"
)

// ErrAmbiguousKey is returned (wrapped in an *AmbiguousKeyError) by Select
// when a bound field can be read two ways by the upstream's JSON binder: an
// object on a bound path (or inside a bound value) holds keys that are equal
// ignoring case without being byte-identical, or a key equal ignoring case to
// a bound segment, or a key containing U+0000. The binding rule (docs/design.md
// §2): what idemgate hashes must be what the upstream executes.
var ErrAmbiguousKey = errors.New("ambiguous key")

// ErrAmbiguousValue is returned by Select for a bound value that mainstream
// JSON parsers read differently (negative zero, a number beyond the range of
// IEEE doubles, an integer beyond 2^53 spelled with a fraction or exponent, a
// string holding U+0000). See the package doc.
var ErrAmbiguousValue = errors.New("ambiguous value")

// AmbiguousKeyError names the offending keys by JSON path, in byte order.
type AmbiguousKeyError struct {
	// Paths are JSON paths ($["payee"]["Account_Id"]) whose keys are JSON
	// strings with every non-ASCII or control character \u-escaped, so a
	// key cannot smuggle text (quotes, line breaks, bidi controls) into a
	// message that an agent reads.
	Paths []string
}

// maxReportedPaths bounds the paths an AmbiguousKeyError carries.
const maxReportedPaths = 8

func (e *AmbiguousKeyError) Error() string {
	return fmt.Sprintf("%v: keys a JSON parser may read as the same field: %s", ErrAmbiguousKey, strings.Join(e.Paths, ", "))
}

func (e *AmbiguousKeyError) Unwrap() error { return ErrAmbiguousKey }

// bindNode is one segment of the tree of bound body paths.
type bindNode struct {
	children map[string]*bindNode
	// segs are the keys of children in the order they were added: the
	// binding check runs through them for every object on a bound path,
	// and ranging over a slice costs a fraction of ranging over a map.
	segs   []string
	folded map[string]string // foldKey(child segment) -> segment
	// bound: a param ends here, so everything below is hashed.
	bound bool
}

func (n *bindNode) child(seg string) *bindNode {
	if n.children == nil {
		n.children = map[string]*bindNode{}
		n.folded = map[string]string{}
	}
	c, ok := n.children[seg]
	if !ok {
		c = &bindNode{}
		n.children[seg] = c
		n.segs = append(n.segs, seg)
		n.folded[foldKey(seg)] = seg
	}
	return c
}

// pathStep is one step of a JSON path: a key, or an index when isIndex.
// The key is held by value: a pointer to the walk's loop variable would move
// every key on a bound path to the heap.
type pathStep struct {
	key     string
	index   int
	isIndex bool
}

type bindChecker struct {
	path []pathStep
	// keys holds the keys of every small object being walked, outermost
	// first: one stack shared by all levels of the recursion, so that no
	// level's frame carries an array of its own. Deep frames made the walk
	// of a nested body (an MCP tool call's arguments) the point where a
	// gRPC worker's stack, shrunk by the GC while idle, had to be grown
	// and copied again.
	keys      []string
	offending []string
}

// bindCheckers keeps checkers with their path and key stacks between
// requests, so a check allocates nothing unless it reports.
var bindCheckers = sync.Pool{New: func() any {
	return &bindChecker{path: make([]pathStep, 0, pooledPathSteps), keys: make([]string, 0, pooledKeys)}
}}

// The stacks a pooled checker starts with. One that a large or deep body
// grew past them is left to the GC instead of pooled: every check clears
// its pooled stacks whole.
const (
	pooledPathSteps = 8
	pooledKeys      = 4 * smallObject
)

// checkBinding walks doc along the bound paths of root and reports every
// ambiguous key.
func checkBinding(doc any, root *bindNode) error {
	if root == nil || len(root.children) == 0 {
		return nil
	}
	c := bindCheckers.Get().(*bindChecker)
	c.walk(doc, root)
	offending := c.offending
	if cap(c.path) <= pooledPathSteps && cap(c.keys) <= pooledKeys {
		// Drop the document's strings before the checker waits in the pool.
		clear(c.path[:cap(c.path)])
		clear(c.keys[:cap(c.keys)])
		c.path, c.keys, c.offending = c.path[:0], c.keys[:0], nil
		bindCheckers.Put(c)
	}
	if len(offending) == 0 {
		return nil
	}
	slices.Sort(offending)
	offending = slices.Compact(offending)
	if len(offending) > maxReportedPaths {
		more := len(offending) - maxReportedPaths
		offending = append(offending[:maxReportedPaths], fmt.Sprintf("(%d more)", more))
	}
	return &AmbiguousKeyError{Paths: offending}
}

// walk checks v, reached along the bound tree at node. Inside a bound value
// (node.bound) every object is checked, since all of it is hashed.
func (c *bindChecker) walk(v any, node *bindNode) {
	switch v := v.(type) {
	case map[string]any:
		if len(v) > smallObject {
			c.walkLargeObject(v, node)
			return
		}
		// Small objects (nearly every request body): the keys are read
		// once onto the key stack, for the check and the walk. Deeper
		// levels push theirs above them; a push that reallocates leaves
		// these in the old array, which keys still reads.
		base := len(c.keys)
		for k := range v {
			c.keys = append(c.keys, k)
		}
		keys := c.keys[base:]
		c.checkKeys(keys, node)
		for _, k := range keys {
			if next := node.next(k); next != nil {
				c.walkMember(k, v[k], next)
			}
		}
		c.keys = c.keys[:base]
	case []any:
		c.walkArray(v, node)
	}
}

// walkLargeObject is walk for an object of more than smallObject keys.
func (c *bindChecker) walkLargeObject(v map[string]any, node *bindNode) {
	c.checkLargeObject(v, node)
	for k, child := range v {
		if next := node.next(k); next != nil {
			c.walkMember(k, child, next)
		}
	}
}

// walkArray is walk for an array.
func (c *bindChecker) walkArray(v []any, node *bindNode) {
	if !node.bound {
		// Only the indexed elements are on a bound path.
		for seg, next := range node.children {
			if i := arrayIndex(seg); i >= 0 && i < len(v) {
				c.push(pathStep{index: i, isIndex: true})
				c.walk(v[i], next)
				c.pop()
			}
		}
		return
	}
	for i, e := range v {
		c.push(pathStep{index: i, isIndex: true})
		c.walk(e, node.next(strconv.Itoa(i)))
		c.pop()
	}
}

// DuplicateOnBoundPath reports whether a duplicate key that ParseJSON
// refused (de) lies where the binding rule applies: the duplicated key is a
// bound segment or equal to one ignoring case, or it sits inside a bound
// value, or in an object on a bound path whose key folds onto one of its
// segments. Such a body is refused like a case twin (invalid_params and a
// security event); a duplicate elsewhere is just malformed JSON. It returns
// the key's JSON path, escaped as AmbiguousKeyError's paths are.
func (s *Selector) DuplicateOnBoundPath(de *DuplicateKeyError) (string, bool) {
	if s == nil || s.bound == nil || len(de.Path) == 0 {
		return "", false
	}
	node := s.bound
	b := []byte{'$'}
	for i, step := range de.Path {
		var seg string
		switch v := step.(type) {
		case string:
			seg = v
			b = appendPathStep(b, pathStep{key: v})
		case int:
			seg = strconv.Itoa(v)
			b = appendPathStep(b, pathStep{index: v, isIndex: true})
		default:
			return "", false
		}
		if node.bound {
			continue // everything inside a bound value is hashed
		}
		if i == len(de.Path)-1 {
			_, folds := node.folded[foldKey(seg)]
			return string(b), folds
		}
		next := node.children[seg]
		if next == nil {
			if _, folds := node.folded[foldKey(seg)]; folds {
				// A case twin of a bound segment, with a duplicate inside:
				// ambiguous already, and more so.
				return string(b), true
			}
			return "", false
		}
		node = next
	}
	return string(b), node.bound
}

// next is the node for the member seg of a value at n: its child, any
// position inside a bound value, or nil off the bound paths.
func (n *bindNode) next(seg string) *bindNode {
	if c := n.children[seg]; c != nil {
		return c
	}
	if n.bound {
		return boundLeaf
	}
	return nil
}

// walkMember walks the member k of an object, reached along the bound
// tree at next (members not on a bound path are not walked).
func (c *bindChecker) walkMember(k string, child any, next *bindNode) {
	c.push(pathStep{key: k})
	c.walk(child, next)
	c.pop()
}

// boundLeaf stands for any position inside a bound value.
var boundLeaf = &bindNode{bound: true}

func (c *bindChecker) push(s pathStep) { c.path = append(c.path, s) }
func (c *bindChecker) pop()            { c.path = c.path[:len(c.path)-1] }

// checkKeys reports the keys of a small object that a binder may confuse:
// two keys with the same fold, a key whose fold is a bound segment's but
// whose bytes are not, and a key holding U+0000 (C-string parsers cut the
// key there). Pairwise comparisons, no fold keys built; checkLargeObject
// does the same for objects of more than smallObject keys.
func (c *bindChecker) checkKeys(keys []string, node *bindNode) {
	for i, k := range keys {
		if strings.IndexByte(k, 0) >= 0 {
			c.report(k)
		}
		twin := false
		for j, other := range keys {
			if i != j && foldEqual(k, other) {
				twin = true
				break
			}
		}
		if twin {
			c.report(k)
			continue
		}
		for _, seg := range node.segs {
			if seg != k && foldEqual(seg, k) {
				c.report(k)
				break
			}
		}
	}
}

// smallObject is the size up to which checkObject compares keys pairwise.
const smallObject = 16

// checkLargeObject is checkObject for objects with many keys: grouped by
// fold key, linear in the object's size.
func (c *bindChecker) checkLargeObject(obj map[string]any, node *bindNode) {
	groups := make(map[string][]string, len(obj))
	for k := range obj {
		f := foldKey(k)
		groups[f] = append(groups[f], k)
		if strings.IndexByte(k, 0) >= 0 {
			c.report(k)
		}
	}
	for f, keys := range groups {
		if len(keys) > 1 {
			for _, k := range keys {
				c.report(k)
			}
			continue
		}
		if seg, ok := node.folded[f]; ok && seg != keys[0] {
			c.report(keys[0])
		}
	}
}

func (c *bindChecker) report(key string) {
	b := make([]byte, 0, 64)
	b = append(b, '$')
	for _, s := range c.path {
		b = appendPathStep(b, s)
	}
	b = appendPathStep(b, pathStep{key: key})
	c.offending = append(c.offending, string(b))
}

// maxReportedKeyBytes bounds how much of one key a path shows.
const maxReportedKeyBytes = 48

func appendPathStep(b []byte, s pathStep) []byte {
	if s.isIndex {
		b = append(b, '[')
		b = strconv.AppendInt(b, int64(s.index), 10)
		return append(b, ']')
	}
	k := s.key
	cut := false
	if len(k) > maxReportedKeyBytes {
		n := maxReportedKeyBytes
		for n > 0 && !utf8.RuneStart(k[n]) {
			n--
		}
		k, cut = k[:n], true
	}
	b = append(b, '[')
	b = appendASCIIJSONString(b, k)
	if cut {
		b = append(b, "..."...)
	}
	return append(b, ']')
}

// appendASCIIJSONString writes s as a JSON string in printable ASCII only:
// '"' and '\' escaped, everything below 0x20, DEL and all non-ASCII as \u
// escapes (surrogate pairs above U+FFFF). The reader sees exactly which
// bytes the key holds.
func appendASCIIJSONString(b []byte, s string) []byte {
	b = append(b, '"')
	for _, r := range s {
		switch {
		case r == '"' || r == '\\':
			b = append(b, '\\', byte(r))
		case r >= 0x20 && r < 0x7f:
			b = append(b, byte(r))
		case r > 0xFFFF:
			hi, lo := utf16.EncodeRune(r)
			b = appendU4(appendU4(b, hi), lo)
		default:
			b = appendU4(b, r)
		}
	}
	return append(b, '"')
}

func appendU4(b []byte, r rune) []byte {
	return append(b, '\\', 'u', hexDigits[r>>12&0xF], hexDigits[r>>8&0xF], hexDigits[r>>4&0xF], hexDigits[r&0xF])
}

// maxExactDoubleInteger is 2^53: every integer up to it is an IEEE double.
const maxExactDoubleInteger = "9007199254740992"

// checkBoundNumber refuses a bound number (or `type: decimal` string) that
// mainstream parsers read as different values, where idemgate's exact
// decimal would say "the same" or would name a value no parser sees:
//
//   - negative zero: -0 is 0 to idemgate, an int 0 to Python, a float -0.0
//     to Python ("-0.0") and a -0 to JavaScript and Go's float64;
//   - beyond the finite range of doubles (1E400): Infinity to Python and
//     JavaScript, an error to Go's float64, a huge exact value to decimal
//     readers; a non-zero value below it (1e-400) becomes 0 to doubles;
//   - an integer above 2^53 spelled with a fraction or exponent
//     (9007199254740993.0): an exact int to Python or Jackson when spelled
//     as an integer, a rounded double when spelled otherwise, while
//     idemgate hashes both spellings alike.
func checkBoundNumber(text string, d decimal) error {
	if d.digits == "" {
		if strings.HasPrefix(text, "-") {
			return fmt.Errorf("%w: negative zero %s (Python, JavaScript and Go read it differently; send 0)", ErrAmbiguousValue, text)
		}
		return nil
	}
	f, err := strconv.ParseFloat(text, 64)
	if err != nil {
		return fmt.Errorf("%w: %s is beyond the range of IEEE doubles (Infinity in Python and JavaScript, an error in Go)", ErrAmbiguousValue, text)
	}
	if f == 0 {
		return fmt.Errorf("%w: %s is below the range of IEEE doubles (0 to most parsers)", ErrAmbiguousValue, text)
	}
	if d.exp >= 0 && strings.ContainsAny(text, ".eE") {
		// An integer value: more than 2^53?
		n := int64(len(d.digits)) + d.exp
		if n > int64(len(maxExactDoubleInteger)) ||
			(n == int64(len(maxExactDoubleInteger)) && d.digits+strings.Repeat("0", int(d.exp)) > maxExactDoubleInteger) {
			return fmt.Errorf("%w: %s is an integer above 2^53 written with a fraction or exponent (an exact integer to some parsers, a rounded double to others); write it as a plain integer", ErrAmbiguousValue, text)
		}
	}
	return nil
}

// checkBoundString refuses a bound string holding U+0000: parsers keep it,
// but C-string consumers cut the value there and PostgreSQL text refuses
// it, so the value hashed would not be the value executed.
func checkBoundString(s string) error {
	if strings.IndexByte(s, 0) >= 0 {
		return fmt.Errorf("%w: string holds U+0000 (C-string consumers cut it there)", ErrAmbiguousValue)
	}
	return nil
}

// CheckKey applies the binding rule to one top-level member: it refuses
// (with an *AmbiguousKeyError) a doc object holding a key that equals key
// ignoring case without being byte-identical (naming it and key, if
// present), or a key holding U+0000. The server uses it for the
// fingerprint field, which it reads itself and which is not a param;
// unrelated case twins are the params' business (Select).
func CheckKey(doc Document, key string) error {
	obj, ok := doc.root.(map[string]any)
	if !ok {
		return nil
	}
	f := foldKey(key)
	var c bindChecker
	for k := range obj {
		if (k != key && foldKey(k) == f) || strings.IndexByte(k, 0) >= 0 {
			c.report(k)
		}
	}
	if len(c.offending) == 0 {
		return nil
	}
	if _, ok := obj[key]; ok {
		c.report(key)
	}
	slices.Sort(c.offending)
	if len(c.offending) > maxReportedPaths {
		more := len(c.offending) - maxReportedPaths
		c.offending = append(c.offending[:maxReportedPaths], fmt.Sprintf("(%d more)", more))
	}
	return &AmbiguousKeyError{Paths: c.offending}
}
