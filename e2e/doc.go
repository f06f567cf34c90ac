// Package e2e holds idemgate's end-to-end tests: the list of section 十 of
// the seed note (../shared/seed, "怎么测"), plus the failures DESIGN.md
// promises to survive, each run against a complete deployment of its own.
//
// Every test starts one stack (package e2e/internal/stack):
//
//	agent (JWT per user) ─▶ front ─▶ ext_proc ─▶ idemgate (child process, built from cmd/idemgate)
//	                          │                     ├─▶ redis-server (test-owned: flushed, killed, restarted)
//	                          ▼                     └─▶ PostgreSQL (fresh database; optionally behind a TCP proxy the test cuts)
//	                      payments (demo upstream, in-process, behind a recorder of every confirm it receives)
//
// The front runs the shipped envoy/envoy.yaml and idemgate a config derived
// from the shipped envoy/idemgate.yaml: same operations and params, stores
// pointed at the test's Redis and database, loopback ports, and the test's
// TTLs. Each test asserts on three things: the business executions the
// upstream counted, the idempotency_record rows in PostgreSQL, and what the
// agent received (status, retryable, an instruction, trace_id equal to the
// request's x-request-id).
//
// # Running
//
//	make test                                                 # everything, services started if missing
//	IDEMGATE_REQUIRE_SERVICES=1 go test -race -count=1 ./e2e/ # this package only
//	go test -race -count=1 -run TestCrash -v ./e2e/           # one test, with its log lines
//
// Needs redis-server on PATH and PostgreSQL on 127.0.0.1:5432 (user
// postgres, trust; IDEMGATE_TEST_PG names another server). Without
// IDEMGATE_REQUIRE_SERVICES a missing service skips the tests; with it (as
// make test and CI set it) they fail. -short skips the package. TestMain
// builds cmd/idemgate once per run, with -race when the tests run with
// -race, so the race detector watches the server too (a reported race fails
// the test); IDEMGATE_BIN=/path/to/idemgate uses a binary instead. Logs of
// idemgate and of the front are printed only for a failed test. The whole
// package takes about a minute on two cores with -race, plus the build.
//
// The suite is not behind a build tag (house style rule 40 has
// //go:build e2e): issue 5 asks for it to run under make test, which is
// go test ./... without tags. It skips under -short instead.
//
// Deadlines are widened for shared two-core machines (see the constants in
// package stack): store.timeout 2s, store.redis.timeout 500ms and ext_proc's
// message_timeout 8s instead of 250ms, 50ms and 1s, keeping the shipped
// ratio. With the shipped values, 120 simultaneous confirms under -race
// queue for PostgreSQL connections past 250 ms and get the (correct, but
// off-topic) temporarily_unavailable. Everything else is as shipped, unless
// a test says otherwise (ttl.fingerprint 3s, ttl.in_flight 2s or 6s, the
// confirm route's timeout 1s).
//
// # Real-Envoy mode
//
// With ENVOY_BIN=/path/to/envoy (v1.36 or newer, the version the harness
// follows) every stack runs `$ENVOY_BIN -c <edited envoy.yaml> --base-id <unique>`
// instead of the harness: the same bootstrap bytes, edited on the decoded
// v3 Bootstrap (listener and admin on random loopback ports, clusters
// idemgate and payments pointed at the test's processes, the test's route
// and message timeouts), so a tweak means the same to both fronts. The stack
// waits for the admin /ready and the listener. Without ENVOY_BIN,
// TestRealEnvoy skips with one line saying real-Envoy mode is off; with it,
// TestRealEnvoy checks `envoy --version` and runs a preview, a confirm and a
// replay, and every other test runs through Envoy unchanged.
//
// trace_id is checked against the x-request-id the front gave the request:
// the harness reports it with every local reply (Hooks.OnLocalReply); a real
// Envoy's is read from its stdout access log (the shipped
// envoy.access_loggers.stdout, default format, where "%REQ(X-REQUEST-ID)%"
// follows "%REQ(USER-AGENT)%"; each agent request carries a unique
// User-Agent). No Envoy binary can be installed where this suite was written,
// so real-Envoy mode has been checked only as far as its parts have unit
// tests in package stack.
//
// # The tests
//
//	seed 十 / DESIGN                     test
//	并发压测 concurrency                  TestConcurrentIdenticalConfirmsExecuteOnce
//	崩溃注入 kill -9 after execution      TestCrashBetweenExecutionAndRecord (honours keys / ignores keys)
//	缓存清空 FLUSHALL                     TestReplayAfterRedisFlushall
//	参数篡改 tampered amount              TestTamperedParamsAreRefusedAndReported
//	越权重放 another user's fingerprint   TestAnotherUsersFingerprintIsRefused
//	TTL 边界 exp−1s / exp+1s              TestFingerprintExpiryBoundary
//	late retry after expiry (seed 四/六)   TestLateRetryAfterExpiryReplaysTheResult (known bug, skipped)
//	乱序 late completion, NOT_OWNER       TestStaleOwnersLateAnswerDoesNotOverwrite
//	Redis killed during load             TestRedisKilledDuringLoad
//	PostgreSQL unreachable               TestPostgresUnreachable
//	upstream timeout (local 504)         TestUpstreamTimeout
//	preview through the stack            TestPreviewThroughTheFullStack
//	status tool                          TestStatusToolNotStartedThenCompleted
//	which front ran                      TestRealEnvoy
//
// # What the harness stands in for
//
// In harness mode these results hold for Envoy only as far as envoysim
// models Envoy; each is an item of the "Harness must" checklist
// (../shared/reference/envoy-ext-proc-behaviour.md section 13) with its own
// test in e2e/envoysim. Running the suite with ENVOY_BIN checks them against
// Envoy itself.
//
//   - Every envelope is an ImmediateResponse turned into a local reply that
//     skips the response phase, with content-type application/json and the
//     x-request-id Envoy generated (all tests).
//   - BUFFERED request and response bodies with header SEND, and the
//     content-length rule for a replaced response body
//     (TestPreviewThroughTheFullStack).
//   - header_mutation removing x-idemgate-subject before jwt_authn sets it
//     from the verified sub (claim_to_headers), and jwt_authn's own 401
//     (TestAnotherUsersFingerprintIsRefused).
//   - A broken ext_proc stream (idemgate killed while the upstream works)
//     answered with status_on_error 500 under failure_mode_allow: false,
//     and the gRPC connection re-established to the restarted server
//     (TestCrashBetweenExecutionAndRecord).
//   - The router's route timeout answered 504 locally, the stream then
//     closed without a response phase (TestUpstreamTimeout).
//   - The request-headers/body mutation (Idempotency-Key) kept on the
//     upstream request (every test that checks the key payments saw).
//   - Concurrent streams on one pooled HTTP/2 connection to idemgate
//     (TestConcurrentIdenticalConfirmsExecuteOnce, TestRedisKilledDuringLoad).
package e2e
