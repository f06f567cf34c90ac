// Package check holds the offline checks of deploy/monitoring, run by make
// test (make test-monitoring): promtool check/test rules, the dashboard
// against Grafana's schema types, every PromQL expression through
// Prometheus' parser, the runbook sections, the k8s copies and the list of
// metric names the live test (e2e/monitoring_test.go) checks are exported.
//
// A Go module of its own: Prometheus (the parser, and promtool as a `tool`
// of this go.mod, so its version is pinned here) and the Grafana foundation
// SDK bring some two hundred modules. In idemgate's go.mod they would be
// the product's dependencies in every `go mod` listing, audit and licence
// scan although nothing idemgate runs imports them.
package check
