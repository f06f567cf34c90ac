package settings

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/extproc/config"
)

// TestBadConfigs loads one file per kind of mistake and asserts the exact
// messages, positions included. Every file must appear here, so a new bad
// file without an expectation fails the test.
func TestBadConfigs(t *testing.T) {
	cases := []struct {
		file string
		want []string
	}{
		{file: "active_key_missing.yaml", want: []string{
			"active_key_missing.yaml:2:15: signing.active_key: names key \"k9\", which is not under signing.keys",
		}},
		{file: "bad_duration.yaml", want: []string{
			"bad_duration.yaml:5:18: ttl.in_flight: invalid duration \"2 minutes\": use a Go duration such as 250ms, 15m or 72h",
		}},
		{file: "bad_approval_listen.yaml", want: []string{
			"bad_approval_listen.yaml:5:18: approval_listen: must differ from grpc_listen (127.0.0.1:50051) and admin_listen (:9090)",
		}},
		{file: "approval_tls_key_mismatch.yaml", want: []string{
			"approval_tls_key_mismatch.yaml:6:56: approval_tls.key_file: ../tls/server.pem and ../tls/other-key.pem are not a certificate and its key: tls: private key does not match public key",
		}},
		{file: "grpc_tls_files.yaml", want: []string{
			"grpc_tls_files.yaml:7:14: grpc_tls.cert_file: failed to read server certificate file ../tls/missing.pem: no such file or directory",
			"grpc_tls_files.yaml:9:19: grpc_tls.client_ca_file: ../tls/server-key.pem holds no PEM certificate",
			"grpc_tls_files.yaml:10:17: grpc_tls.client_sans[0]: invalid URI SAN \"spiffe://\": a URI such as spiffe://cluster.local/ns/NS/sa/SA",
			"grpc_tls_files.yaml:10:30: grpc_tls.client_sans[1]: invalid SAN \"envoy payments\": a URI such as spiffe://cluster.local/ns/NS/sa/SA or a DNS name",
		}},
		{file: "grpc_tls_incomplete.yaml", want: []string{
			"grpc_tls_incomplete.yaml:6:12: grpc_tls.client_ca_file: required: the CA certificates that sign Envoy's client certificate",
			"grpc_tls_incomplete.yaml:6:12: grpc_tls.client_sans: required: the URI (SPIFFE ID) or DNS SANs of the client certificates allowed to connect",
		}},
		{file: "listen_plaintext_remote.yaml", want: []string{
			"listen_plaintext_remote.yaml:5:14: grpc_listen: \":50051\" is a routable address served in plaintext: anyone who reaches it could drive idemgate (mint fingerprints for any subject, obtain attestations). Use a loopback address (127.0.0.1:port), a unix socket (unix:///run/idemgate/extproc.sock), or set grpc_tls; grpc_plaintext_remote: true is the explicit way around (serve then warns at every start)",
			"listen_plaintext_remote.yaml:6:18: approval_listen: \"0.0.0.0:9091\" is a routable address served in plaintext: approvers' bearer tokens and decisions would cross the network unencrypted. Use a loopback address (127.0.0.1:port), a unix socket (unix:///run/idemgate/approvals.sock), or set approval_tls; approval_plaintext_remote: true is the explicit way around (serve then warns at every start)",
		}},
		{file: "tls_and_switch.yaml", want: []string{
			"tls_and_switch.yaml:7:28: approval_plaintext_remote: set approval_tls or approval_plaintext_remote: true, not both",
		}},
		{file: "unix_relative.yaml", want: []string{
			"unix_relative.yaml:5:14: grpc_listen: invalid unix socket address \"unix://run/idemgate/extproc.sock\": use unix:// and an absolute, clean path, e.g. unix:///run/idemgate/extproc.sock",
			"unix_relative.yaml:6:18: approval_listen: invalid unix socket address \"unix:///run/idemgate/../approvals.sock\": use unix:// and an absolute, clean path, e.g. unix:///run/idemgate/approvals.sock",
		}},
		{file: "bad_listen.yaml", want: []string{
			"bad_listen.yaml:5:14: grpc_listen: invalid listen address \"50051\": use host:port, :port or unix:///absolute/path",
		}},
		{file: "bad_log.yaml", want: []string{
			"bad_log.yaml:5:14: log.level: unknown level \"verbose\" (known: debug, info, warn, error)",
			"bad_log.yaml:5:31: log.format: unknown format \"xml\" (known: text, json)",
		}},
		{file: "bad_messages.yaml", want: []string{
			"bad_messages.yaml:17:26: operations[0].messages.already_completed: set meaning, instruction or both",
			"bad_messages.yaml:15:7: operations[0].messages.in_progres: unknown message \"in_progres\" (known: already_completed, already_failed, approval_denied, approval_expired, approval_pending, fingerprint_expired, fingerprint_invalid, fingerprint_required, fingerprint_subject_mismatch, header_not_allowed, in_progress, internal_error, invalid_json, invalid_params, method_not_allowed, needs_reconciliation, params_changed, path_not_exact, request_too_large, status.approval_denied, status.approval_expired, status.approval_granted, status.approval_pending, status.completed, status.failed, status.fingerprint_invalid, status.fingerprint_required, status.in_progress, status.interrupted, status.needs_reconciliation, status.not_started, status.temporarily_unavailable, subject_required, temporarily_unavailable)",
			"bad_messages.yaml:16:34: operations[0].messages.in_progress.instruction: unknown placeholder {status} (known: {preview_tool} {status_tool} {poll_after_seconds} {retry_after_seconds} {max_body_bytes})",
		}},
		{file: "bad_params.yaml", want: []string{
			"bad_params.yaml:14:30: operations[0].params[0].type: unknown type \"money\" (known: decimal)",
			"bad_params.yaml:16:9: operations[0].params[2]: fingerprint.n is inside fingerprint_field \"fingerprint\", which carries the fingerprint itself",
			"bad_params.yaml:14:7: operations[0].params: invalid param \"payee..account\": empty path segment",
			"bad_params.yaml:14:7: operations[0].params: invalid param \"currency\": listed twice",
		}},
		{file: "bad_normalize.yaml", want: []string{
			"bad_normalize.yaml:14:45: operations[0].params[0].normalize: unknown normalization \"nfkc\" (known: nfc; omit it to compare strings byte for byte)",
		}},
		{file: "bad_path_template.yaml", want: []string{
			"bad_path_template.yaml:8:35: operations[0].preview.path: invalid path template \"/v1/transfers/{id\": segment \"{id\": a variable must be a whole segment {name}",
			"bad_path_template.yaml:9:23: operations[0].confirm.method: invalid HTTP method \"GET POST\"",
			"bad_path_template.yaml:9:41: operations[0].confirm.path: invalid path template \"v1/transfers/confirm\": must start with /",
			"bad_path_template.yaml:10:34: operations[0].status.path: invalid path template \"/v1/transfers/status?x=1\": must not contain a query string or fragment",
		}},
		{file: "bad_replay.yaml", want: []string{
			"bad_replay.yaml:15:36: operations[0].downstream_idempotency_header: invalid header name \"Idempotency Key\" (an empty string means the downstream ignores idempotency keys)",
			"bad_replay.yaml:14:13: operations[0].replay: unknown replay mode \"verbatim\" (known: envelope, raw)",
		}},
		{file: "bad_webhook.yaml", want: []string{
			"bad_webhook.yaml:6:18: security.webhook.url: invalid URL \"ftp://alerts\": use http:// or https:// with a host",
			"bad_webhook.yaml:6:46: security.webhook.queue_size: must be positive",
		}},
		{file: "duplicate_key.yaml", want: []string{
			"duplicate_key.yaml:7:3: mapping key \"terminal\" already defined at [6:3]",
		}},
		{file: "duplicate_operation.yaml", want: []string{
			"duplicate_operation.yaml:14:11: operations[1].name: duplicate operation name \"transfer\" (first used by operations[0])",
			"duplicate_operation.yaml:15:12: operations[1].scope: duplicate scope \"payments.transfer\" (first used by operations[0]): a fingerprint of one operation would confirm the other",
		}},
		{file: "duplicate_route.yaml", want: []string{
			"duplicate_route.yaml:17:35: operations[1].confirm.path: route POST /v1/transfers/confirm matches the same requests as operations[0].confirm",
		}},
		{file: "duplicate_scope.yaml", want: []string{
			"duplicate_scope.yaml:15:12: operations[1].scope: duplicate scope \"payments.transfer\" (first used by operations[0]): a fingerprint of one operation would confirm the other",
		}},
		{file: "empty.yaml", want: []string{
			"empty.yaml:1:1: signing: required: the keys that sign fingerprints (generate one with `idemgate keygen`)",
			"empty.yaml:1:1: operations: required: at least one operation",
		}},
		{file: "fingerprint_ttl_zero.yaml", want: []string{
			"fingerprint_ttl_zero.yaml:5:20: ttl.fingerprint: must be positive, got 0s",
		}},
		{file: "key_bad_id.yaml", want: []string{
			"key_bad_id.yaml:5:5: signing.keys.key one: key id \"key one\" must be 1-64 characters of A-Z a-z 0-9 . _ -",
		}},
		{file: "key_both_sources.yaml", want: []string{
			"key_both_sources.yaml:4:10: signing.keys.k1: set only one of env and file",
		}},
		{file: "key_env_empty.yaml", want: []string{
			"key_env_empty.yaml:4:15: signing.keys.k1.env: environment variable IDEMGATE_TEST_EMPTY (the signing key) is empty",
		}},
		{file: "key_env_unset.yaml", want: []string{
			"key_env_unset.yaml:4:15: signing.keys.k1.env: environment variable IDEMGATE_TEST_KEY_UNSET (the signing key) is not set",
		}},
		{file: "key_file_missing.yaml", want: []string{
			"key_file_missing.yaml:4:16: signing.keys.k1.file: failed to read signing key file keys/does-not-exist: no such file or directory",
		}},
		{file: "key_short.yaml", want: []string{
			"key_short.yaml:4:10: signing.keys.k1: key from env IDEMGATE_TEST_KEY_SHORT: invalid key: 5 bytes, need at least 32 (generate one with `idemgate keygen`)",
		}},
		{file: "literal_password.yaml", want: []string{
			"literal_password.yaml:8:5: store.redis.password: unknown key \"password\" (known keys: addrs, db, key_prefix, master_name, mode, password_env, password_file, timeout, tls, username)",
		}},
		{file: "many_problems.yaml", want: []string{
			"many_problems.yaml:1:1: grpc_listn: unknown key \"grpc_listn\" (known keys: admin_listen, approval_listen, approval_plaintext_remote, approval_tls, attestation, drain, grpc_listen, grpc_plaintext_remote, grpc_tls, limits, log, messages, operations, security, signing, store, subject, tracing, ttl)",
			"many_problems.yaml:17:5: operations[0].retires: unknown key \"retires\" (known keys: approval, confirm, downstream_idempotency_header, fingerprint_field, mcp, messages, name, outcomes, params, poll_after, preview, preview_tool, replay, result_ref, scope, status, status_tool, upstream_retries, upstream_timeout)",
			"many_problems.yaml:6:18: ttl.in_flight: invalid duration \"2 minutes\": use a Go duration such as 250ms, 15m or 72h",
			"many_problems.yaml:7:22: messages.language: unknown language \"fr\" (known: en, zh)",
		}},
		{file: "max_body_zero.yaml", want: []string{
			"max_body_zero.yaml:5:26: limits.max_body_bytes: must be positive",
			"max_body_zero.yaml:5:45: limits.max_json_depth: must be between 1 and 1000",
			"max_body_zero.yaml:5:73: limits.terminal_cache_bytes: must not be negative (0 keeps no terminal records in memory)",
		}},
		{file: "missing_operation_fields.yaml", want: []string{
			"missing_operation_fields.yaml:6:5: operations[0].name: required",
			"missing_operation_fields.yaml:6:5: operations[0].scope: required: the string that binds a fingerprint to this operation",
			"missing_operation_fields.yaml:6:5: operations[0].confirm: required: {method: POST, path: /...}",
			"missing_operation_fields.yaml:7:14: operations[0].status.path: required",
			"missing_operation_fields.yaml:6:5: operations[0].preview_tool: required: the tool name the agent calls to preview (used in instructions)",
			"missing_operation_fields.yaml:6:5: operations[0].status_tool: required: the tool name the agent polls for the result (used in instructions)",
			"missing_operation_fields.yaml:6:5: operations[0].params: required: the fields that change money or have irreversible effect (an unbound fingerprint could confirm any amount)",
		}},
		{file: "missing_operations.yaml", want: []string{
			"missing_operations.yaml:1:1: operations: required: at least one operation",
		}},
		{file: "missing_signing.yaml", want: []string{
			"missing_signing.yaml:1:1: signing: required: the keys that sign fingerprints (generate one with `idemgate keygen`)",
		}},
		{file: "path_param_not_in_template.yaml", want: []string{
			"path_param_not_in_template.yaml:13:14: operations[0].params[0]: path.account needs a {account} segment in the confirm path /v1/payouts/confirm",
		}},
		{file: "postgres_dsn_both.yaml", want: []string{
			"postgres_dsn_both.yaml:7:5: store.postgres: set exactly one of dsn, dsn_env and dsn_file",
		}},
		{file: "postgres_pooler.yaml", want: []string{
			"postgres_pooler.yaml:8:13: store.postgres.pooler: unknown pooler mode \"statement\" (known: none, session, transaction; statement pooling breaks transactions and is not supported)",
		}},
		{file: "postgres_dsn_invalid.yaml", want: []string{
			"postgres_dsn_invalid.yaml:6:14: store.postgres: invalid PostgreSQL DSN (from inline; not shown because it may hold a password)",
		}},
		{file: "redis_mode.yaml", want: []string{
			"redis_mode.yaml:7:13: store.redis.addrs[0]: invalid address \"127.0.0.1\": use host:port",
			"redis_mode.yaml:8:11: store.redis.mode: unknown mode \"sentinal\" (known: single, cluster, sentinel)",
		}},
		{file: "redis_tls.yaml", want: []string{
			"redis_tls.yaml:8:59: store.redis.tls.insecure_skip_verify: unknown key \"insecure_skip_verify\" (known keys: ca_file, cert_file, key_file, server_name)",
			"redis_tls.yaml:8:11: store.redis.tls: set both cert_file and key_file (a client certificate) or neither",
			"redis_tls.yaml:8:20: store.redis.tls.ca_file: failed to read Redis CA file missing-ca.pem: no such file or directory",
		}},
		{file: "redis_sentinel_no_master.yaml", want: []string{
			"redis_sentinel_no_master.yaml:6:11: store.redis.master_name: required when mode is sentinel",
		}},
		{file: "subject_both.yaml", want: []string{
			"subject_both.yaml:6:3: subject: set only one of header and metadata",
		}},
		{file: "subject_metadata_incomplete.yaml", want: []string{
			"subject_metadata_incomplete.yaml:6:14: subject.metadata.path: required (e.g. jwt_payload.sub)",
		}},
		{file: "syntax.yaml", want: []string{
			"syntax.yaml:7:12: sequence end token ']' not found",
		}},
		{file: "ttl_terminal_short.yaml", want: []string{
			"ttl_terminal_short.yaml:5:35: ttl.terminal: 10m0s must be at least ttl.fingerprint + ttl.in_flight + 1m0s (32m0s): a record must outlive every fingerprint that can reach it, or a late confirm would execute again",
		}},
		{file: "ttl_terminal_margin.yaml", want: []string{
			"ttl_terminal_margin.yaml:5:50: ttl.terminal: 17m30s must be at least ttl.fingerprint + ttl.in_flight + 1m0s (18m0s): a record must outlive every fingerprint that can reach it, or a late confirm would execute again",
		}},
		{file: "ttl_replay_cache_long.yaml", want: []string{
			"ttl_replay_cache_long.yaml:5:68: ttl.replay_cache: 2h0m0s must not be longer than ttl.terminal (1h0m0s): Redis never needs a record PostgreSQL no longer keeps",
		}},
		{file: "unknown_key.yaml", want: []string{
			"unknown_key.yaml:1:1: grpc_listn: unknown key \"grpc_listn\" (known keys: admin_listen, approval_listen, approval_plaintext_remote, approval_tls, attestation, drain, grpc_listen, grpc_plaintext_remote, grpc_tls, limits, log, messages, operations, security, signing, store, subject, tracing, ttl)",
		}},
		{file: "unknown_key_nested.yaml", want: []string{
			"unknown_key_nested.yaml:14:5: operations[0].retires: unknown key \"retires\" (known keys: approval, confirm, downstream_idempotency_header, fingerprint_field, mcp, messages, name, outcomes, params, poll_after, preview, preview_tool, replay, result_ref, scope, status, status_tool, upstream_retries, upstream_timeout)",
		}},
		{file: "unknown_language.yaml", want: []string{
			"unknown_language.yaml:5:22: messages.language: unknown language \"fr\" (known: en, zh)",
		}},
		{file: "wrong_kind.yaml", want: []string{
			"wrong_kind.yaml:5:26: limits.max_body_bytes: must be an integer",
			"wrong_kind.yaml:6:13: operations: must be a list",
		}},
	}
	files, err := filepath.Glob("testdata/bad/*.yaml")
	require.NoError(t, err)
	require.Len(t, files, len(cases), "every file in testdata/bad needs a case")
	for _, tc := range cases {
		t.Run(tc.file, func(t *testing.T) {
			cfg, _, err := Load(filepath.Join("testdata", "bad", tc.file), testOptions())
			require.Nil(t, cfg)
			require.Error(t, err)
			got := strings.Split(strings.ReplaceAll(err.Error(), "testdata/bad/", ""), "\n")
			require.Equal(t, tc.want, got)
			for _, e := range unjoin(err) {
				var p *config.Problem
				require.ErrorAs(t, e, &p)
				require.Positive(t, p.Line)
			}
		})
	}
}

func TestWarnings(t *testing.T) {
	cfg, warns, err := Load("testdata/warn/in_flight_short.yaml", testOptions())
	require.NoError(t, err)
	require.NotNil(t, cfg)
	var got []string
	for _, w := range warns {
		got = append(got, w.Error())
	}
	require.Equal(t, []string{
		"testdata/warn/in_flight_short.yaml:6:12: store.timeout: 800ms is long: Envoy's message_timeout (1s in the shipped config) must cover up to two store calls per confirm",
		"testdata/warn/in_flight_short.yaml:7:11: store.redis: Redis without PostgreSQL: Redis is not a system of record; a failover or flush can forget completed operations and let them execute again",
		"testdata/warn/in_flight_short.yaml:18:23: operations[0].upstream_timeout: ttl.in_flight (30s) should exceed upstream_timeout × (1 + upstream_retries) = 30s: a confirm still running when its lease ends can be taken over or marked unknown while the upstream is working on it",
	}, got)
}

// normalize: nfc is opt-in per param, and check-config says when it is safe.
func TestNormalizeNFC(t *testing.T) {
	cfg, warns, err := Load("testdata/warn/normalize_nfc.yaml", testOptions())
	require.NoError(t, err)
	var got []string
	for _, w := range warns {
		got = append(got, w.Error())
	}
	require.Equal(t, []string{
		`testdata/warn/normalize_nfc.yaml:15:39: operations[0].params[1].normalize: nfc makes byte-different spellings of payee.name (NFD "cafe\u0301" and NFC "caf\u00e9") confirm as one value: safe only if the upstream itself NFC-normalises payee.name before using it; otherwise remove normalize and let strings compare byte for byte`,
	}, got)
	params := cfg.Runtime.Operations[0].Params
	require.False(t, params[0].NFC)
	require.True(t, params[1].NFC)
	require.False(t, params[2].NFC, "byte for byte by default")
	var b strings.Builder
	require.NoError(t, cfg.WriteSummary(&b))
	require.Contains(t, b.String(), "params   amount (decimal), payee.name (nfc: safe only if the upstream NFC-normalises it), payee.account_id;")
}

func TestDefaults(t *testing.T) {
	src := `signing:
  active_key: k1
  keys: {k1: {env: IDEMGATE_TEST_KEY_K1}}
operations:
  - name: transfer
    scope: payments.transfer
    preview: {method: post, path: /p}
    confirm: {method: POST, path: /c}
    status: {method: POST, path: /s}
    preview_tool: tp
    status_tool: ts
    params: [amount]
`
	cfg, warns, err := Parse("inline.yaml", []byte(src), "", testOptions())
	require.NoError(t, err)
	require.Empty(t, warns)
	require.Equal(t, DefaultGRPCListen, cfg.GRPCListen)
	require.Equal(t, DefaultAdminListen, cfg.AdminListen)
	require.Equal(t, "text", cfg.Log.Format)
	require.Equal(t, config.DefaultSubjectHeader, cfg.Runtime.Subject.Header)
	require.Equal(t, "memory", cfg.Store.Backend())
	require.Equal(t, config.DefaultStoreTimeout, cfg.Store.Timeout)
	require.Equal(t, config.TTLSettings{Fingerprint: config.DefaultFingerprintTTL, InFlight: config.DefaultInFlightTTL, Terminal: config.DefaultTerminalTTL, ReplayCache: config.DefaultReplayCache(config.DefaultFingerprintTTL, config.DefaultTerminalTTL)}, cfg.Runtime.TTL)
	require.Equal(t, config.LimitSettings{MaxBodyBytes: config.DefaultMaxBodyBytes, MaxJSONDepth: config.DefaultMaxJSONDepth, TerminalCacheBytes: config.DefaultTerminalCacheBytes}, cfg.Runtime.Limits)
	require.Equal(t, "en", cfg.Runtime.Language)
	require.Equal(t, config.WebhookSettings{Timeout: config.DefaultWebhookTimeout, QueueSize: config.DefaultWebhookQueue}, cfg.Runtime.Webhook)
	require.Equal(t, DrainSettings{Period: DefaultDrainPeriod, Timeout: DefaultDrainTimeout}, cfg.Drain)
	op := cfg.Runtime.Operations[0]
	require.Equal(t, "POST", op.Preview.Method)
	require.Equal(t, "fingerprint", op.FingerprintField)
	require.Equal(t, "idempotency-key", op.DownstreamHeader)
	require.Equal(t, config.ReplayEnvelope, op.Replay)
	require.Equal(t, config.DefaultPollAfter, op.PollAfter)
	require.Nil(t, op.ResultRef)
	require.NotNil(t, cfg.Runtime.Envelopes)
}

func TestMetadataSubject(t *testing.T) {
	src := `signing: {active_key: k1, keys: {k1: {env: IDEMGATE_TEST_KEY_K1}}}
subject:
  metadata: {namespace: envoy.filters.http.jwt_authn, path: jwt_payload.sub}
operations:
  - {name: t, scope: s, preview: {method: POST, path: /p}, confirm: {method: POST, path: /c}, status: {method: POST, path: /s}, preview_tool: a, status_tool: b, params: [x]}
`
	cfg, _, err := Parse("inline.yaml", []byte(src), "", testOptions())
	require.NoError(t, err)
	require.Equal(t, config.SubjectSource{MetadataNamespace: "envoy.filters.http.jwt_authn", MetadataPath: []string{"jwt_payload", "sub"}}, cfg.Runtime.Subject)
}

func TestLoadMissingFile(t *testing.T) {
	_, _, err := Load(filepath.Join(t.TempDir(), "nope.yaml"), config.Options{})
	require.ErrorIs(t, err, os.ErrNotExist)
}

// unjoin splits an errors.Join into its parts.
func unjoin(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	return []error{err}
}
