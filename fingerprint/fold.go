package fingerprint

import (
	"strings"
	"sync"
	"unicode"
	"unicode/utf8"
)

// foldKey returns a key such that foldKey(a) == foldKey(b) whenever a
// mainstream JSON binder may match a and b as the same field name ignoring
// case:
//
//   - Go's encoding/json (strings.EqualFold: Unicode simple case folding, so
//     "ſ" U+017F matches "s" and the Kelvin sign U+212A matches "k");
//   - .NET System.Text.Json with PropertyNameCaseInsensitive (ordinal
//     ignore-case: equal after simple upper-casing, so the dotless "ı"
//     U+0131 matches "i");
//   - Java's equalsIgnoreCase (equal after upper- or lower-casing each char,
//     so "İ" U+0130 matches "i"), which Jackson's case-insensitive mode uses;
//   - Go's encoding/json/v2 with MatchCaseInsensitiveNames or a `case:ignore`
//     field, which also ignores '_' and '-' ("account_id" matches "accountId").
//
// It is therefore coarser than each of them: '_' and '-' are dropped and
// every other rune is replaced by the smallest rune of the class that the
// simple fold orbit and the simple upper, lower and title mappings connect.
// Being coarser only refuses more.
// Full case mappings that change length (ß → "SS") are not covered: no
// binder above uses them to match names.
func foldKey(s string) string {
	// Fast path: ASCII needs only upper-casing ('k' and 's' have non-ASCII
	// relatives, U+212A and U+017F, but 'K' and 'S' are their classes'
	// smallest runes, so upper-casing ASCII gives the representative).
	ascii := true
	for i := 0; i < len(s); i++ {
		if s[i] >= utf8.RuneSelf {
			ascii = false
			break
		}
	}
	if ascii {
		if !strings.ContainsAny(s, "_-") {
			return strings.ToUpper(s)
		}
		b := make([]byte, 0, len(s))
		for i := 0; i < len(s); i++ {
			switch c := s[i]; {
			case c == '_' || c == '-':
			case 'a' <= c && c <= 'z':
				b = append(b, c-('a'-'A'))
			default:
				b = append(b, c)
			}
		}
		return string(b)
	}
	classes := foldClasses()
	var b strings.Builder
	b.Grow(len(s))
	for _, r := range s {
		if r == '_' || r == '-' {
			continue
		}
		if c, ok := classes[r]; ok {
			r = c
		}
		b.WriteRune(r)
	}
	return b.String()
}

var (
	foldOnce  sync.Once
	foldTable map[rune]rune
)

// foldClasses maps every rune that has case relatives to the smallest rune
// of its class (runes without relatives are absent). Built once, on first
// use: a union-find over the simple fold orbits and case mappings of all
// runes up to U+1FFFF (no cased letter lies above).
func foldClasses() map[rune]rune {
	foldOnce.Do(func() {
		parent := map[rune]rune{}
		var find func(r rune) rune
		find = func(r rune) rune {
			p, ok := parent[r]
			if !ok || p == r {
				return r
			}
			root := find(p)
			parent[r] = root
			return root
		}
		union := func(a, b rune) {
			if a == b {
				return
			}
			ra, rb := find(a), find(b)
			if ra == rb {
				return
			}
			// The smaller rune is the root, so the root is the class's minimum.
			if rb < ra {
				ra, rb = rb, ra
			}
			parent[ra] = ra
			parent[rb] = ra
		}
		for r := rune(0); r <= 0x1FFFF; r++ {
			if f := unicode.SimpleFold(r); f != r {
				union(r, f)
			}
			union(r, unicode.ToUpper(r))
			union(r, unicode.ToLower(r))
			union(r, unicode.ToTitle(r))
		}
		foldTable = make(map[rune]rune, len(parent))
		for r := range parent {
			if root := find(r); root != r {
				foldTable[r] = root
			}
		}
	})
	return foldTable
}

// foldEqual reports foldKey(a) == foldKey(b) without building either key:
// the binding check compares every pair of keys of an object on a bound
// path, on every preview and confirm.
func foldEqual(a, b string) bool {
	i, j := 0, 0
	for {
		ra, na := nextFolded(a, i)
		rb, nb := nextFolded(b, j)
		if ra != rb {
			return false
		}
		if ra < 0 {
			return true // both ended
		}
		i, j = na, nb
	}
}

// nextFolded returns the folded rune of s at or after byte i (skipping '_'
// and '-', as foldKey does) and the index after it; -1 at the end.
func nextFolded(s string, i int) (rune, int) {
	for i < len(s) {
		c := s[i]
		if c < utf8.RuneSelf {
			i++
			switch {
			case c == '_' || c == '-':
				continue
			case 'a' <= c && c <= 'z':
				return rune(c - ('a' - 'A')), i
			default:
				return rune(c), i
			}
		}
		r, n := utf8.DecodeRuneInString(s[i:])
		i += n
		if f, ok := foldClasses()[r]; ok {
			r = f
		}
		return r, i
	}
	return -1, i
}
