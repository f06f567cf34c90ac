// The classic dashboard schema (dashboard, not dashboardv2): it is the JSON
// Grafana's file provisioning and its dashboard sidecar load in every
// version; the SDK marks it deprecated in favour of the v2 schema of
// Grafana 12's new dashboard API.
//lint:file-ignore SA1019 the classic schema is the one provisioning loads

package check

import (
	"encoding/json"
	"errors"
	"fmt"
	"testing"

	"github.com/grafana/grafana-foundation-sdk/go/cog"
	"github.com/grafana/grafana-foundation-sdk/go/cog/plugins"
	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
	"github.com/grafana/grafana-foundation-sdk/go/prometheus"
)

// failed reports whether err is an error: the SDK's Dashboard decoder
// returns its list of field errors as an error even when it is empty.
func failed(err error) bool {
	var errs cog.BuildErrors
	if errors.As(err, &errs) {
		return len(errs) > 0
	}
	return err != nil
}

// loadDashboard decodes dashboard.json strictly into the Grafana schema
// types (an unknown or mistyped field, a missing required one fails) and
// returns every PromQL expression of its panels. Panels and their queries
// are decoded one by one: the SDK's PanelOrRowPanel and the panel's
// targets drop a value whose decoder returned its empty error list (see
// failed), so the dashboard's own Panels would stay empty.
func loadDashboard(t *testing.T) (dashboard.Dashboard, []string) {
	t.Helper()
	plugins.RegisterDefaultPlugins()
	raw := readFile(t, dashboardFile)
	var d dashboard.Dashboard
	if err := d.UnmarshalJSONStrict(raw); failed(err) {
		t.Fatalf("dashboard.json does not match Grafana's dashboard schema: %v", err)
	}
	var doc struct {
		Panels []json.RawMessage `json:"panels"`
	}
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	var exprs []string
	for i, rp := range doc.Panels {
		var p dashboard.Panel
		if err := p.UnmarshalJSONStrict(rp); failed(err) {
			t.Fatalf("dashboard.json panels[%d] does not match Grafana's panel schema: %v", i, err)
		}
		var rawTargets struct {
			Targets []json.RawMessage `json:"targets"`
		}
		if err := json.Unmarshal(rp, &rawTargets); err != nil {
			t.Fatal(err)
		}
		title := fmt.Sprintf("panels[%d]", i)
		if p.Title != nil {
			title = *p.Title
		}
		if len(rawTargets.Targets) == 0 {
			t.Errorf("panel %q has no query", title)
		}
		// Each query against Prometheus' query schema (the panel's decoder
		// drops them for the same empty error list).
		for j, rt := range rawTargets.Targets {
			var q prometheus.Dataquery
			if err := q.UnmarshalJSONStrict(rt); failed(err) {
				t.Errorf("panel %q targets[%d] does not match the Prometheus query schema: %v", title, j, err)
				continue
			}
			if q.Datasource == nil || q.Datasource.Type == nil || *q.Datasource.Type != "prometheus" {
				t.Errorf("panel %q targets[%d]: datasource type must be prometheus", title, j)
			}
			if q.Expr == "" {
				t.Errorf("panel %q targets[%d]: an empty expression", title, j)
			}
			exprs = append(exprs, q.Expr)
		}
	}
	return d, exprs
}

// TestDashboardMatchesGrafanaSchema: dashboard.json decodes strictly and
// every expression parses with Prometheus' PromQL parser.
func TestDashboardMatchesGrafanaSchema(t *testing.T) {
	d, exprs := loadDashboard(t)
	if d.Uid == nil || *d.Uid != "idemgate-overview" {
		t.Errorf("uid %v: the ConfigMap and links name the dashboard idemgate-overview", d.Uid)
	}
	if len(exprs) < 10 {
		t.Fatalf("only %d expressions: the dashboard lost its panels", len(exprs))
	}
	for _, e := range exprs {
		if _, err := promql.ParseExpr(e); err != nil {
			t.Errorf("%q: %v", e, err)
		}
	}
}
