package check

import (
	"bytes"
	"path/filepath"
	"reflect"
	"testing"

	"gopkg.in/yaml.v3"
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
