package config

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"

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

// Load reads, checks and compiles the config file at path. It returns the
// runtime form and the warnings, or an error joining every *Problem found
// (and the warnings found so far). Relative key, password and DSN file paths
// are resolved against the config file's directory.
func Load(path string, opts Options) (*Runtime, []*Problem, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, fmt.Errorf("failed to read config: %w", err)
	}
	return Parse(path, data, filepath.Dir(path), opts)
}

// Parse is Load for bytes already read; name is used in problem locations.
func Parse(name string, data []byte, baseDir string, opts Options) (*Runtime, []*Problem, error) {
	opts = opts.withDefaults()
	file, err := parser.ParseBytes(data, 0)
	if err != nil {
		return nil, nil, yamlProblem(name, err)
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

	shape := &shapeCheck{d: d}
	shape.walk(d.root, reflect.TypeOf(File{}), nil)
	problems := append(extraDocs, shape.problems...)
	if shape.typeErrors > 0 || len(extraDocs) > 0 {
		return nil, nil, errors.Join(problems...)
	}

	var f File
	if d.root != nil {
		var decodeOpts []yaml.DecodeOption
		if shape.unknown == 0 {
			// The walk found no unknown key; let the decoder check again.
			decodeOpts = append(decodeOpts, yaml.DisallowUnknownField())
		}
		if err := yaml.NodeToValue(d.root, &f, decodeOpts...); err != nil {
			return nil, nil, errors.Join(append(problems, yamlProblem(name, err))...)
		}
	}
	c := &compiler{d: d, opts: opts, baseDir: baseDir, errs: problems}
	rt := c.compile(&f)
	rt.Source = name
	if len(c.errs) > 0 {
		return nil, c.warns, errors.Join(c.errs...)
	}
	return rt, c.warns, nil
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
