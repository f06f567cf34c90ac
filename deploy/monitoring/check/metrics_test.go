package check

import (
	"flag"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/prometheus/promql/parser"
)

var update = flag.Bool("update", false, "rewrite metrics-used.txt from the rules and the dashboard")

// usedMetrics returns every metric name the rules and the dashboard read,
// recording rules' names left out (each must be defined in rules.yaml).
func usedMetrics(t *testing.T) []string {
	t.Helper()
	recorded := map[string]bool{}
	var exprs []string
	for _, g := range loadRules(t).Groups {
		for _, r := range g.Rules {
			if r.Record != "" {
				recorded[r.Record] = true
			}
			exprs = append(exprs, r.Expr)
		}
	}
	_, dash := loadDashboard(t)
	exprs = append(exprs, dash...)
	set := map[string]bool{}
	for _, e := range exprs {
		expr, err := promql.ParseExpr(e)
		if err != nil {
			t.Fatalf("%q: %v", e, err)
		}
		parser.Inspect(expr, func(n parser.Node, _ []parser.Node) error {
			vs, ok := n.(*parser.VectorSelector)
			if !ok {
				return nil
			}
			if vs.Name == "" {
				t.Errorf("%q: a selector without a metric name (%s) cannot be checked against the exports", e, vs)
				return nil
			}
			if strings.Contains(vs.Name, ":") {
				if !recorded[vs.Name] {
					t.Errorf("%q reads %s, which no recording rule in rules.yaml defines", e, vs.Name)
				}
				return nil
			}
			set[vs.Name] = true
			return nil
		})
	}
	names := make([]string, 0, len(set))
	for n := range set {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

const usedHeader = `# Every metric name deploy/monitoring's rules and dashboard read (recording
# rules left out). Written by ` + "`go test ./... -update`" + ` in deploy/monitoring/check,
# which fails while this file differs; e2e/monitoring_test.go checks each
# name is exported by a live idemgate or the pinned Envoy.
`

// TestUsedMetricsListIsCurrent: metrics-used.txt lists exactly the names
// the PromQL reads, so the live test checks what the files really use.
func TestUsedMetricsListIsCurrent(t *testing.T) {
	want := usedHeader + strings.Join(usedMetrics(t), "\n") + "\n"
	if *update {
		if err := os.WriteFile(usedFile, []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	if got := string(readFile(t, usedFile)); got != want {
		t.Errorf("metrics-used.txt is not what the rules and the dashboard read; run go test ./... -update in deploy/monitoring/check.\nwant:\n%s", want)
	}
}
