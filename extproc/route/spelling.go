package route

import (
	"sort"
	"strings"
)

// Loose returns the path part of :path as the most lenient of the upstream
// routers idemgate may sit in front of would read it: percent-decoded (up
// to three times, for double-encoded input), "\" as "/", ";params" removed
// from every segment, empty and "." segments dropped, ".." applied, each
// segment trimmed of spaces and cut at a NUL, the last segment cut at its
// first "." (Spring's and Rails' suffix patterns: confirm.json), and case
// folded (Unicode upper- then lower-case, so that ſ, K and ı fold like
// .NET's and Java's case-insensitive matching). Two spellings with the same
// Loose form may reach the same upstream handler; that is all Loose is for
// (Guard), never for routing.
func Loose(path string) string {
	p := StripQuery(path)
	for i := 0; i < 3 && strings.IndexByte(p, '%') >= 0; i++ {
		p = percentDecode(p)
	}
	p = strings.ReplaceAll(p, "\\", "/")
	var segs []string
	for _, s := range strings.Split(p, "/") {
		if i := strings.IndexByte(s, ';'); i >= 0 {
			s = s[:i]
		}
		if i := strings.IndexByte(s, 0); i >= 0 {
			s = s[:i]
		}
		s = strings.TrimSpace(s)
		switch s {
		case "", ".":
			continue
		case "..":
			if len(segs) > 0 {
				segs = segs[:len(segs)-1]
			}
			continue
		}
		segs = append(segs, s)
	}
	if n := len(segs); n > 0 {
		if i := strings.IndexByte(segs[n-1], '.'); i > 0 {
			segs[n-1] = segs[n-1][:i]
		}
	}
	return strings.ToLower(strings.ToUpper("/" + strings.Join(segs, "/")))
}

// percentDecode decodes every valid %XX; an invalid escape is kept as is.
func percentDecode(s string) string {
	var b strings.Builder
	b.Grow(len(s))
	for i := 0; i < len(s); i++ {
		if s[i] == '%' && i+2 < len(s) && isHex(s[i+1]) && isHex(s[i+2]) {
			b.WriteByte(unhex(s[i+1])<<4 | unhex(s[i+2]))
			i += 2
			continue
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func isHex(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'
}

func unhex(c byte) byte {
	switch {
	case c >= 'a':
		return c - 'a' + 10
	case c >= 'A':
		return c - 'A' + 10
	}
	return c - '0'
}

// Verdict is what a Guard says of a request.
type Verdict uint8

const (
	// Unguarded: no spelling of a guarded path.
	Unguarded Verdict = iota
	// Exact: a guarded path spelled exactly, with one of its methods.
	Exact
	// WrongMethod: a guarded path spelled exactly, with another method.
	WrongMethod
	// NearMiss: another spelling of a guarded path (case, a trailing "/",
	// ";x", ".json", percent-encoding, "//", dot segments, ...).
	NearMiss
)

// Guard knows every guarded path (operation routes and MCP endpoints) and
// the methods each is guarded for, and tells a request that spells one of
// them exactly from one that spells it some other way.
type Guard struct {
	entries []guardEntry
}

type guardEntry struct {
	tmpl    Template
	loose   Template // tmpl with its literals folded like Loose
	methods []string // sorted
}

// GuardedPath is one path a Guard protects and the methods it is guarded for.
type GuardedPath struct {
	Path    string
	Methods []string
}

// NewGuard compiles the guarded paths; templates must already be valid
// (ParseTemplate).
func NewGuard(paths []GuardedPath) (*Guard, error) {
	byPath := map[string]*guardEntry{}
	var order []string
	for _, gp := range paths {
		e := byPath[gp.Path]
		if e == nil {
			tmpl, err := ParseTemplate(gp.Path)
			if err != nil {
				return nil, err
			}
			e = &guardEntry{tmpl: tmpl, loose: tmpl.folded()}
			byPath[gp.Path] = e
			order = append(order, gp.Path)
		}
		e.methods = append(e.methods, gp.Methods...)
	}
	g := &Guard{}
	for _, p := range order {
		e := byPath[p]
		sort.Strings(e.methods)
		e.methods = compactStrings(e.methods)
		g.entries = append(g.entries, *e)
	}
	return g, nil
}

func compactStrings(s []string) []string {
	out := s[:0]
	for i, v := range s {
		if i == 0 || v != s[i-1] {
			out = append(out, v)
		}
	}
	return out
}

// folded is t with each literal segment folded like Loose folds a path.
func (t Template) folded() Template {
	f := Template{raw: t.raw, vars: t.vars, segments: make([]segment, len(t.segments))}
	for i, s := range t.segments {
		if s.varName == "" {
			s.literal = Loose("/" + s.literal)[1:]
		}
		f.segments[i] = s
	}
	return f
}

// Check says whether method and path (a :path, query allowed) spell a
// guarded path, and how. For WrongMethod and NearMiss it also returns the
// guarded path (as configured) and its methods, for the answer.
func (g *Guard) Check(method, path string) (Verdict, GuardedPath) {
	if g == nil {
		return Unguarded, GuardedPath{}
	}
	raw := StripQuery(path)
	plain := plainSegments(raw)
	for i := range g.entries {
		e := &g.entries[i]
		if e.tmpl.match(raw, nil) {
			if !plain {
				// A path variable holding a dot segment or an encoded "/":
				// one router reads it as this path, another cleans it away.
				return NearMiss, GuardedPath{Path: e.tmpl.raw, Methods: e.methods}
			}
			if containsString(e.methods, method) {
				return Exact, GuardedPath{Path: e.tmpl.raw, Methods: e.methods}
			}
			return WrongMethod, GuardedPath{Path: e.tmpl.raw, Methods: e.methods}
		}
	}
	loose := ""
	for i := range g.entries {
		e := &g.entries[i]
		if loose == "" {
			loose = Loose(raw)
		}
		if e.loose.match(loose, nil) {
			return NearMiss, GuardedPath{Path: e.tmpl.raw, Methods: e.methods}
		}
	}
	return Unguarded, GuardedPath{}
}

// plainSegments reports whether no segment of path reads differently to a
// router that decodes and cleans paths: none is empty, "." or ".." (also
// percent-encoded), and none holds "/", "\\" or ";" once decoded. A path
// variable may then match only a segment every upstream reads the same way.
func plainSegments(path string) bool {
	if path == "" || path[0] != '/' {
		return false
	}
	if path == "/" {
		return true
	}
	// Walked in place: this runs on every stream, and the common path
	// (no '%') allocates nothing.
	for rest := path[1:]; ; {
		seg := rest
		i := strings.IndexByte(rest, '/')
		if i >= 0 {
			seg, rest = rest[:i], rest[i+1:]
		}
		if strings.IndexByte(seg, '%') >= 0 {
			seg = percentDecode(seg)
		}
		if seg == "" || seg == "." || seg == ".." || strings.ContainsAny(seg, "/\\;\x00") {
			return false
		}
		if i < 0 {
			return true
		}
	}
}

func containsString(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}
