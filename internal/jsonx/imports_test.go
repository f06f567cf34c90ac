package jsonx_test

import (
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// encodingJSONAllowed lists the product files (tests are free) that may
// import encoding/json, each for a struct encoded or decoded off the
// request path or behind a cache. JSON a request carries is read with this
// package alone: its strictness is the binding rule's, and a second reader
// on the request path is how two readings of one body start. A new import
// fails TestEncodingJSONStaysOffTheRequestPath until it is listed here with
// its reason.
var encodingJSONAllowed = map[string]string{
	"internal/jsonx/tree.go":               "the Number type only, so a tree equals encoding/json's UseNumber tree; nothing is decoded with it",
	"attest/attest.go":                     "the JWS header and the key set, encoded once at start (the claims are written with this package)",
	"attest/verify/claims.go":              "a downstream's verifier decoding an attestation",
	"attest/verify/jws.go":                 "a downstream's verifier decoding a key set and JWS header",
	"extproc/approvalapi/api.go":           "the approvers' API on approval_listen, not the gateway's request path",
	"extproc/approvalnotify/notify.go":     "the approval webhook, sent in the background",
	"extproc/approver/jwt.go":              "approvers' JWTs and key sets on approval_listen",
	"extproc/security/security.go":         "security events encoded for the log",
	"extproc/tooldefs/tooldefs.go":         "tool definitions rendered for operators and tests",
	"state/internal/codec/headers.go":      "stored response headers, decoded once per distinct set (codec.Cache)",
	"state/postgres/approval.go":           "an approval's rule list in its row",
	"cmd/idemgate/mainlib/attest.go":       "command line",
	"cmd/idemgate/mainlib/opsapprovals.go": "command line",
	"cmd/idemgate/mainlib/serve.go":        "configuration at start",
	"cmd/idemgate/settings/settings.go":    "configuration at start",
}

// encodingJSONAllowedTrees are directories of tools and test
// infrastructure, never in the gateway.
var encodingJSONAllowedTrees = []string{"cmd/idemgate-demo/", "e2e/", "envoy/"}

func TestEncodingJSONStaysOffTheRequestPath(t *testing.T) {
	root, err := filepath.Abs("../..")
	require.NoError(t, err)
	var found []string
	fset := token.NewFileSet()
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); path != root && (strings.HasPrefix(name, ".") || name == "testdata" || name == "node_modules") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		for _, imp := range f.Imports {
			if p, _ := strconv.Unquote(imp.Path.Value); p == "encoding/json" {
				rel, _ := filepath.Rel(root, path)
				found = append(found, filepath.ToSlash(rel))
			}
		}
		return nil
	})
	require.NoError(t, err)
	require.Contains(t, found, "internal/jsonx/tree.go", "the walk must see the repository")
	for _, f := range found {
		if _, ok := encodingJSONAllowed[f]; ok {
			continue
		}
		if slices.ContainsFunc(encodingJSONAllowedTrees, func(dir string) bool { return strings.HasPrefix(f, dir) }) {
			continue
		}
		t.Errorf("%s imports encoding/json: read request JSON with internal/jsonx, or list the file in encodingJSONAllowed with the reason it is off the request path", f)
	}
	for f := range encodingJSONAllowed {
		require.Contains(t, found, f, "%s no longer imports encoding/json: drop it from the list", f)
	}
}
