package check

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/prometheus/promql/parser"
	"gopkg.in/yaml.v3"
)

// promtoolBin is the promtool pinned by this go.mod (a `tool` line), built
// once into Go's build cache; `go tool -n` prints its path, so the many
// runs of the mutation check do not each load the module graph.
var promtoolBin = sync.OnceValues(func() (string, error) {
	out, err := exec.Command("go", "tool", "-n", "promtool").Output()
	return strings.TrimSpace(string(out)), err
})

func promtool(t *testing.T, args ...string) (string, error) {
	t.Helper()
	bin, err := promtoolBin()
	if err != nil {
		t.Fatalf("go tool -n promtool: %v", err)
	}
	out, err := exec.Command(bin, args...).CombinedOutput()
	return string(out), err
}

func TestPromtoolCheckRules(t *testing.T) {
	if out, err := promtool(t, "check", "rules", rulesFile); err != nil {
		t.Fatalf("promtool check rules: %v\n%s", err, out)
	}
}

// TestPromtoolTestRules: rules_test.yaml fires and does not fire every
// alert on synthetic series.
func TestPromtoolTestRules(t *testing.T) {
	if out, err := promtool(t, "test", "rules", ruleTestsFile); err != nil {
		t.Fatalf("promtool test rules: %v\n%s", err, out)
	}
	// Every alert is tested, firing and quiet.
	var tests struct {
		Tests []struct {
			AlertRuleTest []struct {
				Alertname string           `yaml:"alertname"`
				ExpAlerts []map[string]any `yaml:"exp_alerts"`
			} `yaml:"alert_rule_test"`
		} `yaml:"tests"`
	}
	if err := yaml.Unmarshal(readFile(t, ruleTestsFile), &tests); err != nil {
		t.Fatal(err)
	}
	fires, quiet := map[string]bool{}, map[string]bool{}
	for _, tc := range tests.Tests {
		for _, a := range tc.AlertRuleTest {
			if len(a.ExpAlerts) > 0 {
				fires[a.Alertname] = true
			} else {
				quiet[a.Alertname] = true
			}
		}
	}
	for _, g := range loadRules(t).Groups {
		for _, r := range g.Rules {
			if r.Alert != "" && (!fires[r.Alert] || !quiet[r.Alert]) {
				t.Errorf("%s: rules_test.yaml must have a case where it fires (%v) and one where it does not (%v)", r.Alert, fires[r.Alert], quiet[r.Alert])
			}
		}
	}
}

// TestRemovingAConditionFailsTheRuleTests is the mutation check of the rule
// tests: for every alert whose expression ends in a comparison (`x > 0`),
// the comparison is removed (the alert then fires whenever the series
// exist) and promtool test rules must fail.
func TestRemovingAConditionFailsTheRuleTests(t *testing.T) {
	if testing.Short() {
		t.Skip("runs promtool once per alert")
	}
	src := string(readFile(t, rulesFile))
	tests := string(readFile(t, ruleTestsFile))
	for _, g := range loadRules(t).Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			expr, err := promql.ParseExpr(r.Expr)
			if err != nil {
				t.Fatal(err)
			}
			cmp, ok := expr.(*parser.BinaryExpr)
			if !ok || !cmp.Op.IsComparisonOperator() {
				t.Errorf("%s: its expression is not a comparison; the mutation check cannot remove its condition", r.Alert)
				continue
			}
			mutated := strings.Replace(src, "expr: "+r.Expr, "expr: "+cmp.LHS.String(), 1)
			if mutated == src {
				t.Errorf("%s: could not find its expression on one line of rules.yaml", r.Alert)
				continue
			}
			dir := t.TempDir()
			if err := os.WriteFile(filepath.Join(dir, "rules.yaml"), []byte(mutated), 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, "rules_test.yaml"), []byte(tests), 0o600); err != nil {
				t.Fatal(err)
			}
			out, err := promtool(t, "test", "rules", filepath.Join(dir, "rules_test.yaml"))
			if err == nil {
				t.Errorf("%s: with its condition removed (expr: %s) the rule tests still pass", r.Alert, cmp.LHS)
				continue
			}
			if !regexp.MustCompile(`(?m)^\s*name: ` + regexp.QuoteMeta(r.Alert)).MatchString(out) {
				t.Errorf("%s: with its condition removed the rule tests fail, but not its own test:\n%s", r.Alert, out)
			}
		}
	}
}

var alertName = regexp.MustCompile(`^Idemgate[A-Z][A-Za-z0-9]*$`)

// TestAlertsAreLabelledAndAnnotated: CamelCase names with one prefix, a
// severity, a summary, a description and a runbook_url into
// docs/runbooks.md whose anchor exists there.
func TestAlertsAreLabelledAndAnnotated(t *testing.T) {
	anchors := runbookAnchors(t)
	seen := map[string]bool{}
	for _, g := range loadRules(t).Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				if !strings.Contains(r.Record, ":") {
					t.Errorf("recording rule %s: name it level:metric:operation", r.Record)
				}
				continue
			}
			if !alertName.MatchString(r.Alert) {
				t.Errorf("%s: alert names are CamelCase with the Idemgate prefix", r.Alert)
			}
			if seen[r.Alert] {
				t.Errorf("%s: defined twice", r.Alert)
			}
			seen[r.Alert] = true
			switch r.Labels["severity"] {
			case "critical", "warning", "info":
			default:
				t.Errorf("%s: severity %q, want critical, warning or info", r.Alert, r.Labels["severity"])
			}
			for _, a := range []string{"summary", "description", "runbook_url"} {
				if strings.TrimSpace(r.Annotations[a]) == "" {
					t.Errorf("%s: no %s annotation", r.Alert, a)
				}
			}
			const prefix = "https://github.com/idemgate/idemgate/blob/main/docs/runbooks.md#"
			url := r.Annotations["runbook_url"]
			anchor, ok := strings.CutPrefix(url, prefix)
			if !ok {
				t.Errorf("%s: runbook_url %q is not %s<anchor>", r.Alert, url, prefix)
				continue
			}
			if !anchors[anchor] {
				t.Errorf("%s: runbook_url anchor #%s is not a heading of docs/runbooks.md", r.Alert, anchor)
			}
			if anchor != strings.ToLower(r.Alert) {
				t.Errorf("%s: runbook_url anchor #%s, want #%s (its own section)", r.Alert, anchor, strings.ToLower(r.Alert))
			}
		}
	}
	if len(seen) == 0 {
		t.Fatal("no alert in rules.yaml")
	}
}
