// Package docs holds the tests that keep the reference pages honest.
package docs

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// testName is a test named in a table of security.md: `TestX` or
// `TestX/sub_test_name` (go test -run's spelling of a subtest).
var testName = regexp.MustCompile("`(Test[A-Za-z0-9_]+)(/[^`]+)?`")

// subtestName is the name a t.Run call gives, as a string literal.
var subtestName = regexp.MustCompile(`t\.Run\("((?:[^"\\]|\\.)*)"`)

// TestSecurityMitigationsNameRealTests checks that every test the threat
// model names exists: a mitigation whose test was renamed or deleted must
// not keep claiming it. A subtest is looked for among the t.Run names of
// its parent's file, spelled as go test spells them (spaces as
// underscores).
func TestSecurityMitigationsNameRealTests(t *testing.T) {
	page, err := os.ReadFile("security.md")
	if err != nil {
		t.Fatal(err)
	}
	sources := testSources(t)
	named := testName.FindAllStringSubmatch(string(page), -1)
	if len(named) < 20 {
		t.Fatalf("security.md names %d tests; the tables were not read", len(named))
	}
	for _, m := range named {
		test, sub := m[1], strings.TrimPrefix(m[2], "/")
		file, ok := definingFile(sources, test)
		if !ok {
			t.Errorf("security.md names %s, which no _test.go file defines", test)
			continue
		}
		if sub == "" {
			continue
		}
		if !hasSubtest(sources[file], sub) {
			t.Errorf("security.md names %s/%s, but %s has no such t.Run", test, sub, file)
		}
	}
}

// testSources reads every _test.go file of the repository (and the judges'
// module under k8s/mesh), keyed by path.
func testSources(t *testing.T) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir("..", func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && strings.HasPrefix(d.Name(), ".") && path != ".." {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		out[path] = string(b)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// hasSubtest reports whether src has a t.Run whose name go test spells sub.
func hasSubtest(src, sub string) bool {
	for _, m := range subtestName.FindAllStringSubmatch(src, -1) {
		if strings.ReplaceAll(m[1], " ", "_") == sub {
			return true
		}
	}
	return false
}

// definingFile returns the file that declares func name(.
func definingFile(sources map[string]string, name string) (string, bool) {
	decl := regexp.MustCompile(`(?m)^func ` + regexp.QuoteMeta(name) + `\(`)
	for path, src := range sources {
		if decl.MatchString(src) {
			return path, true
		}
	}
	return "", false
}
