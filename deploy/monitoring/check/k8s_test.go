package check

import (
	"bytes"
	"path/filepath"
	"reflect"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"gopkg.in/yaml.v3"
	k8syaml "sigs.k8s.io/yaml"
)

// TestPrometheusRuleEqualsTheRulesFile: the kustomize component's
// PrometheusRule carries exactly rules.yaml's groups.
func TestPrometheusRuleEqualsTheRulesFile(t *testing.T) {
	var rules, pr map[string]any
	if err := yaml.Unmarshal(readFile(t, rulesFile), &rules); err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(readFile(t, filepath.Join(componentDir, "prometheusrule.yaml")), &pr); err != nil {
		t.Fatal(err)
	}
	if pr["apiVersion"] != "monitoring.coreos.com/v1" || pr["kind"] != "PrometheusRule" {
		t.Fatalf("prometheusrule.yaml is a %v %v", pr["apiVersion"], pr["kind"])
	}
	spec, _ := pr["spec"].(map[string]any)
	if !reflect.DeepEqual(spec["groups"], rules["groups"]) {
		t.Error("k8s/components/monitoring/prometheusrule.yaml's spec.groups differ from deploy/monitoring/rules.yaml's groups: copy them over")
	}
}

// TestDashboardConfigMapCopy: the component's configMapGenerator reads a
// copy of dashboard.json (kustomize reads only below its own directory);
// the copy must be byte for byte the same.
func TestDashboardConfigMapCopy(t *testing.T) {
	if !bytes.Equal(readFile(t, dashboardFile), readFile(t, filepath.Join(componentDir, "idemgate-dashboard.json"))) {
		t.Error("k8s/components/monitoring/idemgate-dashboard.json differs from deploy/monitoring/dashboard.json: copy it over")
	}
}

// TestPrometheusRuleIsTheOperatorsType: the component's PrometheusRule
// decodes strictly into the Prometheus Operator's own type (a misspelt or
// misplaced field fails), and every alert and record it carries is the
// operator's idea of one: a name, an expression, alerts with the labels
// and annotations the runbooks rely on.
func TestPrometheusRuleIsTheOperatorsType(t *testing.T) {
	var pr monitoringv1.PrometheusRule
	if err := k8syaml.UnmarshalStrict(readFile(t, filepath.Join(componentDir, "prometheusrule.yaml")), &pr); err != nil {
		t.Fatalf("prometheusrule.yaml is not a monitoring.coreos.com/v1 PrometheusRule: %v", err)
	}
	if pr.APIVersion != monitoringv1.SchemeGroupVersion.String() || pr.Kind != monitoringv1.PrometheusRuleKind {
		t.Fatalf("prometheusrule.yaml is a %s %s", pr.APIVersion, pr.Kind)
	}
	var alerts int
	for _, g := range pr.Spec.Groups {
		for _, r := range g.Rules {
			if (r.Alert == "") == (r.Record == "") || r.Expr.String() == "" {
				t.Errorf("group %s: a rule must be an alert or a record, with an expression: %+v", g.Name, r)
			}
			if r.Alert == "" {
				continue
			}
			alerts++
			if r.Labels["severity"] == "" || r.Annotations["summary"] == "" || r.Annotations["description"] == "" || r.Annotations["runbook_url"] == "" {
				t.Errorf("alert %s lacks severity, summary, description or runbook_url", r.Alert)
			}
		}
	}
	if alerts == 0 {
		t.Fatal("the PrometheusRule carries no alert")
	}
}
