// Package soak runs the chaos harness's load (e2e/chaos) for a long time at
// a steady rate with periodic faults and watches whether anything idemgate
// holds grows: its resident memory, goroutines and open file descriptors,
// its PostgreSQL connections and Redis's memory (make soak).
//
// One job per file:
//
//	series.go   a sampled series and the growth check with its bounds
//	sampler.go  reads each series from /proc, /metrics, pg_stat_activity and INFO memory
//	pause.go    the soak's own faults beside chaos's: SIGSTOP/SIGCONT of a replica, the Redis master restarted in place
//	svg.go      one plain SVG line plot per series (no plotting library, no network)
//	report.go   the markdown report
//
// soak_test.go (build tag soak) is the run itself; make test runs the unit
// tests of the growth check, the SVG writer and the report.
package soak
