package config

import (
	"fmt"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/goccy/go-yaml/ast"
)

// Problem is one thing wrong (or, for a warning, dubious) in a config file,
// located by file, line, column and YAML path.
type Problem struct {
	File    string
	Line    int
	Column  int
	Path    string // e.g. operations[0].confirm.path; empty for the document
	Message string
}

// Error renders "file:line:col: path: message".
func (p *Problem) Error() string {
	var b strings.Builder
	b.WriteString(p.File)
	if p.Line > 0 {
		fmt.Fprintf(&b, ":%d:%d", p.Line, p.Column)
	}
	b.WriteString(": ")
	if p.Path != "" {
		b.WriteString(p.Path)
		b.WriteString(": ")
	}
	b.WriteString(p.Message)
	return b.String()
}

// doc is a parsed file: its name and root node, used to place problems.
type doc struct {
	file string
	root ast.Node
}

// pathString renders path segments: keys joined by dots, indexes as [i].
func pathString(path []any) string {
	var b strings.Builder
	for _, p := range path {
		switch v := p.(type) {
		case int:
			b.WriteByte('[')
			b.WriteString(strconv.Itoa(v))
			b.WriteByte(']')
		case string:
			if b.Len() > 0 {
				b.WriteByte('.')
			}
			b.WriteString(v)
		}
	}
	return b.String()
}

// entryPart says which part of a path's last entry a problem points at.
type entryPart uint8

const (
	atValue entryPart = iota // the value (the default)
	atKey                    // the key itself (an unknown or badly named key)
)

// lookup returns the node at path, or the deepest existing ancestor when
// the path does not exist (a missing required key is reported at its parent).
func (d *doc) lookup(path []any, at entryPart) ast.Node {
	node := unwrap(d.root)
	var last ast.Node = node
	for i, seg := range path {
		if node == nil {
			break
		}
		var next ast.Node
		switch s := seg.(type) {
		case string:
			for _, mv := range mappingValues(node) {
				if scalarText(mv.Key) == s {
					if at == atKey && i == len(path)-1 {
						return mv.Key
					}
					next = mv.Value
					last = mv.Key // a null value has no useful position; its key has
					break
				}
			}
		case int:
			if seq, ok := node.(*ast.SequenceNode); ok && s < len(seq.Values) {
				next = seq.Values[s]
			}
		}
		if next == nil {
			return last
		}
		next = unwrap(next)
		if _, isNull := next.(*ast.NullNode); !isNull {
			last = next
		}
		node = next
	}
	return last
}

// problemAt builds a Problem located at path (its value or its key).
func (d *doc) problemAt(path []any, at entryPart, format string, args ...any) *Problem {
	p := &Problem{File: d.file, Path: pathString(path), Message: fmt.Sprintf(format, args...)}
	if n := d.lookup(path, at); n != nil {
		// A mapping's own token is the ':' of its first entry; its first
		// key is where a reader looks.
		if values := mappingValues(n); len(values) > 0 {
			n = values[0].Key
		}
		if tk := n.GetToken(); tk != nil && tk.Position != nil {
			p.Line, p.Column = tk.Position.Line, tk.Position.Column
		}
	}
	if p.Line == 0 {
		p.Line, p.Column = 1, 1
	}
	return p
}

func (d *doc) problem(path []any, format string, args ...any) *Problem {
	return d.problemAt(path, atValue, format, args...)
}

// unwrap removes anchors and tags around a value.
func unwrap(n ast.Node) ast.Node {
	for {
		switch v := n.(type) {
		case *ast.AnchorNode:
			n = v.Value
		case *ast.TagNode:
			n = v.Value
		default:
			return n
		}
	}
}

func mappingValues(n ast.Node) []*ast.MappingValueNode {
	switch v := unwrap(n).(type) {
	case *ast.MappingNode:
		return v.Values
	case *ast.MappingValueNode:
		return []*ast.MappingValueNode{v}
	}
	return nil
}

// scalarText is the text of a scalar node ("" for null and non-scalars).
func scalarText(n ast.Node) string {
	switch v := unwrap(n).(type) {
	case *ast.StringNode:
		return v.Value
	case *ast.LiteralNode:
		if v.Value != nil {
			return v.Value.Value
		}
	case *ast.MappingKeyNode:
		return scalarText(v.Value)
	case *ast.IntegerNode, *ast.FloatNode, *ast.BoolNode, *ast.InfinityNode, *ast.NanNode:
		if tk := v.GetToken(); tk != nil {
			return tk.Value
		}
	}
	return ""
}

func isScalar(n ast.Node) bool {
	switch n.(type) {
	case *ast.StringNode, *ast.LiteralNode, *ast.IntegerNode, *ast.FloatNode,
		*ast.BoolNode, *ast.InfinityNode, *ast.NanNode:
		return true
	}
	return false
}

// fieldsByTag caches, per struct type, yaml key → field type.
var fieldsByTag sync.Map // reflect.Type → map[string]reflect.Type

func structFields(t reflect.Type) map[string]reflect.Type {
	if m, ok := fieldsByTag.Load(t); ok {
		return m.(map[string]reflect.Type)
	}
	m := map[string]reflect.Type{}
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if name == "" || name == "-" {
			continue
		}
		m[name] = f.Type
	}
	fieldsByTag.Store(t, m)
	return m
}

// overlaidFields is the yaml key → field types of several schemas of one
// mapping: a key is known when any of them knows it, and its value is
// checked against every schema that knows it.
func overlaidFields(ts []reflect.Type) map[string][]reflect.Type {
	m := map[string][]reflect.Type{}
	for _, t := range ts {
		if t.Kind() != reflect.Struct {
			continue
		}
		for k, ft := range structFields(t) {
			m[k] = append(m[k], ft)
		}
	}
	return m
}

func knownKeys(fields map[string][]reflect.Type) string {
	var keys []string
	for k := range fields {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return strings.Join(keys, ", ")
}

var paramType = reflect.TypeOf(Param{})

// shapeCheck walks the document against the schema types and reports every
// unknown key and every value of the wrong kind. Several schemas may describe
// one mapping (the top level, and store, are shared by this package and the
// binary's settings): they are overlaid. The YAML decoder stops at
// the first problem; this walk is what lets check-config list all of them.
// typeErrors counts the wrong-kind problems (after which decoding is not
// attempted, since the decoder would only repeat the first one).
type shapeCheck struct {
	d          *doc
	problems   []error
	unknown    int
	typeErrors int
}

func (c *shapeCheck) walk(node ast.Node, path []any, schemas ...reflect.Type) {
	node = unwrap(node)
	if node == nil || len(schemas) == 0 {
		return
	}
	switch node.(type) {
	case *ast.NullNode, *ast.AliasNode:
		return // absent, or a reference the decoder resolves
	}
	ts := make([]reflect.Type, len(schemas))
	for i, t := range schemas {
		for t.Kind() == reflect.Pointer {
			t = t.Elem()
		}
		ts[i] = t
	}
	t := ts[0]
	if t == paramType {
		if isScalar(node) {
			return
		}
		if mappingValues(node) == nil {
			c.wrongKind(path, "must be a param path or a mapping {path, type}")
			return
		}
		c.walk(node, path, reflect.TypeOf(paramMapping{}))
		return
	}
	switch t.Kind() {
	case reflect.Struct:
		values := mappingValues(node)
		if values == nil {
			if m, ok := node.(*ast.MappingNode); !ok || len(m.Values) != 0 {
				c.wrongKind(path, "must be a mapping")
			}
			return
		}
		fields := overlaidFields(ts)
		for _, mv := range values {
			if _, merge := mv.Key.(*ast.MergeKeyNode); merge {
				continue
			}
			key := scalarText(mv.Key)
			ft, ok := fields[key]
			if !ok {
				c.unknown++
				c.problems = append(c.problems, c.d.problemAt(append(clonePath(path), key), atKey,
					"unknown key %q (known keys: %s)", key, knownKeys(fields)))
				continue
			}
			c.walk(mv.Value, append(clonePath(path), key), ft...)
		}
	case reflect.Map:
		values := mappingValues(node)
		if values == nil {
			if m, ok := node.(*ast.MappingNode); !ok || len(m.Values) != 0 {
				c.wrongKind(path, "must be a mapping")
			}
			return
		}
		for _, mv := range values {
			c.walk(mv.Value, append(clonePath(path), scalarText(mv.Key)), t.Elem())
		}
	case reflect.Slice:
		seq, ok := node.(*ast.SequenceNode)
		if !ok {
			c.wrongKind(path, "must be a list")
			return
		}
		for i, v := range seq.Values {
			c.walk(v, append(clonePath(path), i), t.Elem())
		}
	case reflect.String:
		if !isScalar(node) {
			c.wrongKind(path, "must be a string")
		}
	case reflect.Int, reflect.Int64:
		if _, ok := node.(*ast.IntegerNode); !ok {
			c.wrongKind(path, "must be an integer")
		}
	case reflect.Bool:
		if _, ok := node.(*ast.BoolNode); !ok {
			c.wrongKind(path, "must be true or false")
		}
	case reflect.Float64:
		switch node.(type) {
		case *ast.IntegerNode, *ast.FloatNode:
		default:
			c.wrongKind(path, "must be a number")
		}
	}
}

func (c *shapeCheck) wrongKind(path []any, msg string) {
	c.typeErrors++
	c.problems = append(c.problems, c.d.problem(path, "%s", msg))
}

func clonePath(p []any) []any {
	return append(make([]any, 0, len(p)+1), p...)
}
