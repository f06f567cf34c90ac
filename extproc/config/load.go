package config

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"time"

	"github.com/goccy/go-yaml"
	"github.com/goccy/go-yaml/parser"
)

// Options say where Load finds the secrets a config refers to. Zero fields
// use the process environment and the file system.
type Options struct {
	LookupEnv func(string) (string, bool)
	ReadFile  func(string) ([]byte, error)
	// Offline checks references to secrets (signing keys, the PostgreSQL
	// DSN, the Redis password) without reading them, for checking a config
	// where its secrets do not exist (CI, a config repository). The runtime
	// it returns carries stand-ins and must not be served.
	Offline bool
}

// offlineKey is the stand-in signing key of an offline check: well-formed,
// 32 bytes, and known to everyone, so never usable.
const offlineKey = "b2ZmbGluZS1jaGVjay1zdGFuZC1pbi1rZXktbm90LXJlYWw="

func (o Options) withDefaults() Options {
	if o.LookupEnv == nil {
		o.LookupEnv = os.LookupEnv
	}
	if o.ReadFile == nil {
		o.ReadFile = os.ReadFile
	}
	return o
}

// Load reads, checks and compiles a file holding only this package's part
// of idemgate.yaml (File). It returns the runtime form and the warnings, or
// an error joining every *Problem found (and the warnings found so far).
// Relative key file paths are resolved against the config file's directory.
// The whole file, process settings included, is read by the binary's
// settings package (cmd/idemgate/settings), which uses ParseDocument.
func Load(path string, opts Options) (*Runtime, []*Problem, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, fmt.Errorf("failed to read config: %w", err)
	}
	return Parse(path, data, filepath.Dir(path), opts)
}

// Parse is Load for bytes already read; name is used in problem locations.
func Parse(name string, data []byte, baseDir string, opts Options) (*Runtime, []*Problem, error) {
	doc, err := ParseDocument(name, data, baseDir, opts)
	if err != nil {
		return nil, nil, err
	}
	rt, ch, err := doc.Compile()
	if err != nil {
		return nil, nil, err
	}
	warns, err := ch.Result()
	if err != nil {
		return nil, warns, err
	}
	return rt, warns, nil
}

// Document is one config file, parsed once, with its shape checked. The
// file has two owners: this package reads File (operations, routes,
// envelopes, keys and the settings of request handling), the binary's
// settings package reads the process settings (listeners, log, store
// backends, drain, tracing) from the same node tree. Both schemas are given
// to ParseDocument, so an unknown key or a value of the wrong kind is
// reported with its line whoever owns its section.
type Document struct {
	d        *doc
	baseDir  string
	opts     Options
	strict   bool    // one schema, no unknown key: Decode refuses unknown keys too
	problems []error // of the shape: unknown keys
}

// ParseDocument parses data (one YAML document) and checks its shape
// against File overlaid with every schema in others (pointers to structs
// whose yaml-tagged fields are more top-level keys; a key both know, such
// as store, takes the keys of both). Syntax errors, more than one document
// and values of the wrong kind are returned as an error at once; unknown
// keys are kept and reported with the compile problems (Checker.Result).
func ParseDocument(name string, data []byte, baseDir string, opts Options, others ...any) (*Document, error) {
	file, err := parser.ParseBytes(data, 0)
	if err != nil {
		return nil, yamlProblem(name, err)
	}
	d := &doc{file: name}
	var extraDocs []error
	for i, dn := range file.Docs {
		if dn == nil || dn.Body == nil {
			continue
		}
		if d.root == nil {
			d.root = dn.Body
			continue
		}
		p := &Problem{File: name, Line: 1, Column: 1, Message: fmt.Sprintf("only one YAML document is allowed, found another (document %d)", i+1)}
		if tk := dn.Body.GetToken(); tk != nil && tk.Position != nil {
			p.Line, p.Column = tk.Position.Line, tk.Position.Column
		}
		extraDocs = append(extraDocs, p)
	}

	schemas := []reflect.Type{reflect.TypeOf(File{})}
	for _, o := range others {
		schemas = append(schemas, reflect.TypeOf(o))
	}
	shape := &shapeCheck{d: d}
	shape.walk(d.root, nil, schemas...)
	problems := append(extraDocs, shape.problems...)
	if shape.typeErrors > 0 || len(extraDocs) > 0 {
		return nil, errors.Join(problems...)
	}
	doc := &Document{d: d, baseDir: baseDir, opts: opts.withDefaults(), problems: problems}
	if shape.unknown == 0 && d.root != nil {
		if len(others) == 0 {
			doc.strict = true
		} else if err := yaml.NodeToValue(d.root, reflect.New(unionOf(schemas)).Interface(), yaml.DisallowUnknownField()); err != nil {
			// The walk found no unknown key; let the decoder check again,
			// against every owner's keys at once: it also follows the
			// aliases and merge keys the walk leaves to it.
			return nil, errors.Join(append(problems, yamlProblem(name, err))...)
		}
	}
	return doc, nil
}

// unionOf is a struct type with the yaml keys of every schema in ts (a key
// several know takes the union of their struct types), for a strict decode
// of a file with several owners.
func unionOf(ts []reflect.Type) reflect.Type {
	if len(ts) == 1 {
		return ts[0]
	}
	var (
		fields []reflect.StructField
		types  [][]reflect.Type
		index  = map[string]int{}
	)
	for _, t := range ts {
		for i := 0; i < t.NumField(); i++ {
			f := t.Field(i)
			key, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
			if key == "" || key == "-" {
				continue
			}
			if j, ok := index[key]; ok {
				types[j] = append(types[j], f.Type)
				continue
			}
			index[key] = len(fields)
			fields = append(fields, reflect.StructField{Name: fmt.Sprintf("F%d", len(fields)), Type: f.Type, Tag: reflect.StructTag(`yaml:"` + key + `"`)})
			types = append(types, []reflect.Type{f.Type})
		}
	}
	for j := range fields {
		if len(types[j]) == 1 {
			continue
		}
		pointer := false
		var elems []reflect.Type
		for _, t := range types[j] {
			if t.Kind() == reflect.Pointer {
				pointer, t = true, t.Elem()
			}
			if t.Kind() == reflect.Struct {
				elems = append(elems, t)
			}
		}
		if len(elems) != len(types[j]) {
			continue // not all structs: the first owner's type decides
		}
		fields[j].Type = unionOf(elems)
		if pointer {
			fields[j].Type = reflect.PointerTo(fields[j].Type)
		}
	}
	return reflect.StructOf(fields)
}

// Decode fills v, a pointer to one of the schemas given to ParseDocument,
// from the file. An error joins the shape's problems and the decoder's.
func (doc *Document) Decode(v any) error {
	if doc.d.root == nil {
		return nil
	}
	var decodeOpts []yaml.DecodeOption
	if doc.strict {
		// The walk found no unknown key; let the decoder check again.
		decodeOpts = append(decodeOpts, yaml.DisallowUnknownField())
	}
	if err := yaml.NodeToValue(doc.d.root, v, decodeOpts...); err != nil {
		return errors.Join(append(doc.problems, yamlProblem(doc.d.file, err))...)
	}
	return nil
}

// Compile decodes and compiles this package's part of the file. Its
// problems are collected in the returned Checker, which the owner of the
// rest of the file goes on using for its part before asking for the Result.
func (doc *Document) Compile() (*Runtime, *Checker, error) {
	var f File
	if err := doc.Decode(&f); err != nil {
		return nil, nil, err
	}
	c := &compiler{d: doc.d, opts: doc.opts, baseDir: doc.baseDir}
	rt := c.compile(&f)
	rt.Source = doc.d.file
	return rt, &Checker{c: c, shape: doc.problems}, nil
}

// yamlProblem turns a go-yaml error into a located Problem.
func yamlProblem(name string, err error) *Problem {
	p := &Problem{File: name, Line: 1, Column: 1, Message: err.Error()}
	var ye yaml.Error
	if errors.As(err, &ye) {
		p.Message = ye.GetMessage()
		if tk := ye.GetToken(); tk != nil && tk.Position != nil {
			p.Line, p.Column = tk.Position.Line, tk.Position.Column
		}
	}
	return p
}

// Checker collects the problems of one Document and lends its helpers (the
// same messages, locations and secret handling) to the owner of the file's
// other part.
type Checker struct {
	c     *compiler
	shape []error
}

// Errorf reports a problem at path (YAML keys and list indexes).
func (ch *Checker) Errorf(path []any, format string, args ...any) { ch.c.errorf(path, format, args...) }

// Warnf reports a warning at path.
func (ch *Checker) Warnf(path []any, format string, args ...any) { ch.c.warnf(path, format, args...) }

// Duration parses the Go duration s found at path; see DurationRule.
func (ch *Checker) Duration(path []any, s string, r DurationRule) time.Duration {
	return ch.c.duration(path, s, r)
}

// Secret reads the secret ref names; see SecretRef. It never puts the
// value in a message.
func (ch *Checker) Secret(path []any, ref SecretRef) (value, source string, ok bool) {
	return ch.c.secret(path, ref)
}

// ReadFile reads a file the config names at path.key (relative names
// resolve against the config file's directory); what names it in messages.
func (ch *Checker) ReadFile(path []any, key, what, file string) ([]byte, bool) {
	return ch.c.readFile(path, key, what, file)
}

// Offline reports whether secrets and files are only named, not read
// (Options.Offline).
func (ch *Checker) Offline() bool { return ch.c.opts.Offline }

// Result returns the warnings and an error joining every problem: those of
// the shape (unknown keys) first, then those of compiling. With sections
// (top-level keys in the order of the file's reference), the compile
// problems and the warnings are listed section by section in that order,
// each section's in the order they were found, so that a file owned by two
// packages reads as one; keys not named keep their place after the named.
func (ch *Checker) Result(sections ...string) ([]*Problem, error) {
	errs := append([]error(nil), ch.c.errs...)
	warns := append([]*Problem(nil), ch.c.warns...)
	if len(sections) > 0 {
		rank := func(path string) int {
			top, _, _ := strings.Cut(path, ".")
			top, _, _ = strings.Cut(top, "[")
			for i, s := range sections {
				if s == top {
					return i
				}
			}
			return len(sections)
		}
		sort.SliceStable(errs, func(i, j int) bool {
			return rank(problemPath(errs[i])) < rank(problemPath(errs[j]))
		})
		sort.SliceStable(warns, func(i, j int) bool { return rank(warns[i].Path) < rank(warns[j].Path) })
	}
	all := append(append([]error(nil), ch.shape...), errs...)
	if len(all) > 0 {
		return warns, errors.Join(all...)
	}
	return warns, nil
}

func problemPath(err error) string {
	var p *Problem
	if errors.As(err, &p) {
		return p.Path
	}
	return ""
}
