// Package chaos is a seeded chaos run of idemgate (make chaos): real Envoys in
// front of several idemgate replicas on shared Redis (Sentinel) and
// PostgreSQL, simulated agents that retry the ways LLM agents do, faults at
// seeded moments, and an invariant checker over the recorded history.
//
// One job per file:
//
//	topology.go  the pods (Envoy + idemgate), Redis master/replica and Sentinels, PostgreSQL behind a TCP proxy
//	postgres.go  a PostgreSQL instance of the run's own, which the run may crash and restart
//	ledger.go    the upstream's execution log in front of payments, and the upstream faults
//	agents.go    the agents: preview, confirm, retry, poll, forget and come back
//	faults.go    the fault injector: three lanes of seeded faults, each logged with its window
//	history.go   what a run records (calls, faults, upstream calls, rows)
//	checker.go   the six invariants over a history
//	report.go    the run's report, the fault log, a nonce's timeline
//	run.go       one run from start to verdict
//	load.go      the load alone (topology, agents, faults) for a soak that watches the processes
//
// `make chaos SEED=n DURATION=d` runs it; `go test ./e2e/chaos/` (part of
// make test) runs 40 s with seed 15; -short skips it. checker_test.go feeds
// the checker synthetic histories that break each invariant.
package chaos
