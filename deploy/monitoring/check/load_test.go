package check

import (
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
)

// Paths from this directory.
var (
	monitoringDir = ".."
	rulesFile     = filepath.Join(monitoringDir, "rules.yaml")
	ruleTestsFile = filepath.Join(monitoringDir, "rules_test.yaml")
	dashboardFile = filepath.Join(monitoringDir, "dashboard.json")
	usedFile      = filepath.Join(monitoringDir, "metrics-used.txt")
	repoRoot      = filepath.Join(monitoringDir, "..", "..")
	runbooksFile  = filepath.Join(repoRoot, "docs", "runbooks.md")
	componentDir  = filepath.Join(repoRoot, "k8s", "components", "monitoring")
)

var promql = parser.NewParser(parser.Options{})

// loadRules parses rules.yaml strictly (unknown fields fail) and validates
// every expression, as Prometheus does when it loads the file.
func loadRules(t *testing.T) *rulefmt.RuleGroups {
	t.Helper()
	groups, errs := rulefmt.ParseFile(rulesFile, false, model.UTF8Validation, promql, slog.New(slog.DiscardHandler))
	for _, err := range errs {
		t.Error(err)
	}
	if len(errs) > 0 {
		t.FailNow()
	}
	return groups
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
