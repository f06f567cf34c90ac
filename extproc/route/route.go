// Package route matches an HTTP method and path against the configured route
// templates ("/v1/accounts/{account}/transfers/confirm"). Templates are
// compiled once; matching a request allocates only the map of path variables,
// and only for templates that have variables.
package route

import (
	"errors"
	"fmt"
	"sort"
	"strings"
)

// Template is a compiled path template.
type Template struct {
	raw      string
	segments []segment
	vars     int
}

type segment struct {
	literal string
	varName string // non-empty for a {name} segment
}

// String returns the template as written.
func (t Template) String() string { return t.raw }

// Vars returns the names of the template's {name} segments in order.
func (t Template) Vars() []string {
	var out []string
	for _, s := range t.segments {
		if s.varName != "" {
			out = append(out, s.varName)
		}
	}
	return out
}

// HasVar reports whether the template has a {name} segment.
func (t Template) HasVar(name string) bool {
	for _, s := range t.segments {
		if s.varName == name {
			return true
		}
	}
	return false
}

// ParseTemplate compiles a path template: an absolute path whose segments are
// literals or {name} (name: a letter or underscore followed by letters,
// digits or underscores). Query strings, empty segments and a segment mixing
// literal text with a variable are refused.
func ParseTemplate(path string) (Template, error) {
	if path == "" {
		return Template{}, errors.New("empty path")
	}
	if path[0] != '/' {
		return Template{}, errors.New("must start with /")
	}
	if strings.ContainsAny(path, "?#") {
		return Template{}, errors.New("must not contain a query string or fragment")
	}
	t := Template{raw: path}
	if path == "/" {
		return t, nil
	}
	seen := map[string]bool{}
	for _, part := range strings.Split(path[1:], "/") {
		if part == "" {
			return Template{}, errors.New("must not contain empty segments (// or a trailing /)")
		}
		if !strings.ContainsAny(part, "{}") {
			t.segments = append(t.segments, segment{literal: part})
			continue
		}
		if len(part) < 3 || part[0] != '{' || part[len(part)-1] != '}' {
			return Template{}, fmt.Errorf("segment %q: a variable must be a whole segment {name}", part)
		}
		name := part[1 : len(part)-1]
		if !validVarName(name) {
			return Template{}, fmt.Errorf("segment %q: variable names are a letter or _ followed by letters, digits or _", part)
		}
		if seen[name] {
			return Template{}, fmt.Errorf("variable {%s} appears twice", name)
		}
		seen[name] = true
		t.segments = append(t.segments, segment{varName: name})
		t.vars++
	}
	return t, nil
}

func validVarName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '_', c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z':
		case c >= '0' && c <= '9' && i > 0:
		default:
			return false
		}
	}
	return true
}

// Shape is the template with variable names erased: two templates with the
// same shape match exactly the same paths.
func (t Template) Shape() string {
	var b strings.Builder
	for _, s := range t.segments {
		b.WriteByte('/')
		if s.varName != "" {
			b.WriteString("{}")
		} else {
			b.WriteString(s.literal)
		}
	}
	return b.String()
}

// match reports whether path (without query) matches, filling vars.
func (t *Template) match(path string, vars map[string]string) bool {
	if len(path) == 0 || path[0] != '/' {
		return false
	}
	rest := path[1:]
	if len(t.segments) == 0 {
		return rest == ""
	}
	for i, s := range t.segments {
		var part string
		if j := strings.IndexByte(rest, '/'); j >= 0 {
			if i == len(t.segments)-1 {
				return false
			}
			part, rest = rest[:j], rest[j+1:]
		} else {
			if i != len(t.segments)-1 {
				return false
			}
			part, rest = rest, ""
		}
		if s.varName == "" {
			if part != s.literal {
				return false
			}
			continue
		}
		if part == "" {
			return false
		}
		if vars != nil {
			vars[s.varName] = part
		}
	}
	return true
}

// Entry is one route of a table.
type Entry[T any] struct {
	Method string
	Path   string
	Value  T
}

type compiled[T any] struct {
	tmpl  Template
	value T
}

// Table maps (method, path) to a value.
type Table[T any] struct {
	exact     map[string]map[string]T // method → path, templates without variables
	templated map[string][]compiled[T]
}

// NewTable compiles entries. Templates that match exactly the same paths
// under the same method are an error; otherwise a path matched by several
// templates goes to the most specific one (a literal segment beats a variable,
// decided left to right).
func NewTable[T any](entries []Entry[T]) (*Table[T], error) {
	t := &Table[T]{exact: map[string]map[string]T{}, templated: map[string][]compiled[T]{}}
	seen := map[string]string{}
	var errs []error
	for _, e := range entries {
		tmpl, err := ParseTemplate(e.Path)
		if err != nil {
			errs = append(errs, fmt.Errorf("route %s %s: %w", e.Method, e.Path, err))
			continue
		}
		key := e.Method + " " + tmpl.Shape()
		if prev, ok := seen[key]; ok {
			errs = append(errs, fmt.Errorf("route %s %s: matches the same requests as %s %s", e.Method, e.Path, e.Method, prev))
			continue
		}
		seen[key] = e.Path
		if tmpl.vars == 0 {
			if t.exact[e.Method] == nil {
				t.exact[e.Method] = map[string]T{}
			}
			t.exact[e.Method][e.Path] = e.Value
			continue
		}
		t.templated[e.Method] = append(t.templated[e.Method], compiled[T]{tmpl: tmpl, value: e.Value})
	}
	for _, list := range t.templated {
		sort.SliceStable(list, func(i, j int) bool { return moreSpecific(list[i].tmpl, list[j].tmpl) })
	}
	return t, errors.Join(errs...)
}

func moreSpecific(a, b Template) bool {
	for i := 0; i < len(a.segments) && i < len(b.segments); i++ {
		al, bl := a.segments[i].varName == "", b.segments[i].varName == ""
		if al != bl {
			return al
		}
	}
	return len(a.segments) > len(b.segments)
}

// StripQuery returns the path part of an HTTP :path (before '?' or '#').
func StripQuery(path string) string {
	if i := strings.IndexAny(path, "?#"); i >= 0 {
		return path[:i]
	}
	return path
}

// Match finds the route for method and path (a :path; the query string is
// ignored). vars is nil when the matched template has no variables.
func (t *Table[T]) Match(method, path string) (value T, vars map[string]string, ok bool) {
	path = StripQuery(path)
	if v, ok := t.exact[method][path]; ok {
		return v, nil, true
	}
	list := t.templated[method]
	for i := range list {
		c := &list[i]
		if !c.tmpl.match(path, nil) {
			continue
		}
		vars = make(map[string]string, c.tmpl.vars)
		c.tmpl.match(path, vars)
		return c.value, vars, true
	}
	var zero T
	return zero, nil, false
}
