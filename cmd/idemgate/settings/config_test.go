package settings

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/extproc/config"

	"github.com/idemgate/idemgate/extproc/envelope"
)

// testEnv is the environment the testdata files refer to. The keys are test
// values, not secrets.
var testEnv = map[string]string{
	"IDEMGATE_TEST_KEY_K1":         "dGVzdC1rZXktazEtbm90LWEtc2VjcmV0LTMyYnl0ZXM=",
	"IDEMGATE_TEST_KEY_SHORT":      "c2hvcnQ=",
	"IDEMGATE_TEST_REDIS_PASSWORD": "redis-secret-password",
	"IDEMGATE_TEST_PG_DSN":         "postgres://idem:pg-secret-password@127.0.0.1:5432/idemgate?sslmode=disable",
	"IDEMGATE_TEST_EMPTY":          "",
}

func testOptions() config.Options {
	return config.Options{LookupEnv: func(k string) (string, bool) {
		v, ok := testEnv[k]
		return v, ok
	}}
}

func TestLoadGood(t *testing.T) {
	cfg, warns, err := Load("testdata/good.yaml", testOptions())
	require.NoError(t, err)
	require.Empty(t, warns)
	require.Equal(t, ":50051", cfg.GRPCListen)
	require.Equal(t, &ListenerTLS{
		CertFile: filepath.Join("testdata", "tls", "server.pem"), KeyFile: filepath.Join("testdata", "tls", "server-key.pem"),
		ClientCAFile: filepath.Join("testdata", "tls", "ca.pem"),
		ClientSANs:   []string{"spiffe://cluster.local/ns/payments/sa/envoy", "envoy.payments.svc"},
	}, cfg.GRPCTLS)
	require.Equal(t, &ListenerTLS{CertFile: filepath.Join("testdata", "tls", "server.pem"), KeyFile: filepath.Join("testdata", "tls", "server-key.pem")}, cfg.ApprovalTLS)
	require.False(t, cfg.GRPCPlaintextRemote)
	require.Equal(t, "json", cfg.Log.Format)
	require.Equal(t, "k1", cfg.Runtime.Keys.ActiveKeyID())
	require.Equal(t, []string{"k0", "k1"}, cfg.Runtime.Keys.KeyIDs())
	require.Equal(t, "x-idemgate-subject", cfg.Runtime.Subject.Header)
	require.Equal(t, "tiered", cfg.Store.Backend())
	require.Equal(t, "redis-secret-password", cfg.Store.Redis.Password.Reveal())
	require.Equal(t, "env IDEMGATE_TEST_PG_DSN", cfg.Store.Postgres.DSNSource)
	require.Equal(t, 2*time.Minute, cfg.Runtime.TTL.InFlight)
	require.Equal(t, "zh", cfg.Runtime.Language)
	require.Len(t, cfg.Runtime.Operations, 2)

	tr := cfg.Runtime.Operations[0]
	require.Equal(t, "idempotency-key", tr.DownstreamHeader)
	require.True(t, tr.HonoursKeys())
	require.Equal(t, []string{"transfer_id"}, tr.ResultRef)
	require.Equal(t, "fingerprint_expires_at", tr.ExpiresAtField)
	require.True(t, tr.Params[0].Decimal)
	require.NotNil(t, tr.Selector)
	body := map[string]any{}
	require.NoError(t, json.Unmarshal(tr.Envelopes.Render(envelope.InProgress, "t", 0, envelope.Extra{}).Body, &body))
	require.Equal(t, "等 2 秒后调用 transfer_status", body["instruction"])

	payout := cfg.Runtime.Operations[1]
	require.False(t, payout.HonoursKeys())
	require.Equal(t, config.ReplayRaw, payout.Replay)

	target, vars, ok := cfg.Runtime.Routes.Match("POST", "/v1/accounts/acc-7/payouts/confirm?x=1")
	require.True(t, ok)
	require.Same(t, payout, target.Op)
	require.Equal(t, config.KindConfirm, target.Kind)
	require.Equal(t, map[string]string{"account": "acc-7"}, vars)
	target, _, ok = cfg.Runtime.Routes.Match("POST", "/v1/transfers/status")
	require.True(t, ok)
	require.Equal(t, config.KindStatus, target.Kind)
}

func TestSecretsAreNeverPrinted(t *testing.T) {
	cfg, _, err := Load("testdata/good.yaml", testOptions())
	require.NoError(t, err)
	var buf bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&buf, nil))
	logger.Info("config", "store", cfg.Store, "redis", cfg.Store.Redis, "pg", cfg.Store.Postgres, "keys", cfg.Runtime.Keys)
	logger.Info("direct", "password", cfg.Store.Redis.Password, "dsn", cfg.Store.Postgres.DSN)
	jsonBytes, err := json.Marshal(cfg.Store)
	require.NoError(t, err)
	var summary bytes.Buffer
	require.NoError(t, cfg.WriteSummary(&summary))
	for _, out := range []string{buf.String(), string(jsonBytes), fmt.Sprintf("%v %+v %#v", cfg.Store.Redis, cfg.Store.Postgres, cfg.Store.Redis.Password), summary.String()} {
		require.NotContains(t, out, "redis-secret-password")
		require.NotContains(t, out, "pg-secret-password")
		require.NotContains(t, out, testEnv["IDEMGATE_TEST_KEY_K1"])
	}
	require.Contains(t, buf.String(), "[REDACTED]")
}

func TestSummary(t *testing.T) {
	cfg, _, err := Load("testdata/good.yaml", testOptions())
	require.NoError(t, err)
	var b bytes.Buffer
	require.NoError(t, cfg.WriteSummary(&b))
	t.Log("\n" + b.String())
	require.Contains(t, b.String(), "keys:       k0 (file keys/k0), k1 (env IDEMGATE_TEST_KEY_K1) active\n")
	require.Contains(t, b.String(), "    confirm  POST /v1/transfers/confirm  sends idempotency-key, replay envelope\n")
	require.Contains(t, b.String(), "    confirm  POST /v1/accounts/{account}/payouts/confirm  downstream ignores keys, replay raw\n")
}

func TestOfflineChecksReferencesWithoutReadingSecrets(t *testing.T) {
	nothing := config.Options{
		LookupEnv: func(string) (string, bool) { return "", false },
		ReadFile:  func(name string) ([]byte, error) { return nil, fmt.Errorf("read %s: no such file", name) },
	}
	_, _, err := Load("testdata/good.yaml", nothing)
	require.ErrorContains(t, err, "environment variable IDEMGATE_TEST_KEY_K1 (the signing key) is not set")

	offline := nothing
	offline.Offline = true
	cfg, warns, err := Load("testdata/good.yaml", offline)
	require.NoError(t, err)
	require.Empty(t, warns)
	require.Equal(t, "env IDEMGATE_TEST_PG_DSN (not read: offline check)", cfg.Store.Postgres.DSNSource)
	require.Equal(t, "file keys/k0 (not read: offline check)", cfg.Runtime.KeySources["k0"])

	// A malformed reference is still an error offline.
	_, _, err = Parse("both.yaml", []byte("signing: {active_key: k1, keys: {k1: {env: A, file: b}}}\n"+
		"operations: []\n"), "", offline)
	require.ErrorContains(t, err, "set only one of env and file")
}
func TestConfiguredOutcomes(t *testing.T) {
	cfg, warns, err := Load("testdata/good.yaml", testOptions())
	require.NoError(t, err)
	require.Empty(t, warns)
	o := cfg.Runtime.Operations[0].Outcomes
	require.Equal(t, config.OutcomeFailed, o.Classify(409), "exact code overrides the default")
	require.Equal(t, config.OutcomeAmbiguous, o.Classify(202), "a 2xx may be ambiguous (accepted, not yet executed)")
	require.Equal(t, config.OutcomeDone, o.Classify(201))
	require.Equal(t, config.OutcomeAmbiguous, o.Classify(429), "untouched codes keep their default")
	require.Equal(t, []string{"202 ambiguous", "409 failed", "5xx ambiguous"}, o.Overrides())
	var sum strings.Builder
	require.NoError(t, cfg.WriteSummary(&sum))
	require.Contains(t, sum.String(), "outcomes 202 ambiguous, 409 failed, 5xx ambiguous")

	// The second operation configures none: the defaults.
	require.Equal(t, config.OutcomeAmbiguous, cfg.Runtime.Operations[1].Outcomes.Classify(409))
}

func TestOutcomesAreValidated(t *testing.T) {
	good, err := os.ReadFile("testdata/good.yaml")
	require.NoError(t, err)
	for bad, want := range map[string]string{
		`{503: done}`:        `operations[0].outcomes.503: only a 2xx may be done`,
		`{"4xx": done}`:      `operations[0].outcomes.4xx: only a 2xx may be done`,
		`{201: failed}`:      `operations[0].outcomes.201: a 2xx may not be failed`,
		`{409: maybe}`:       `operations[0].outcomes.409: unknown outcome "maybe" (known: done, failed, ambiguous)`,
		`{"1xx": failed}`:    `operations[0].outcomes.1xx: "1xx" is neither an HTTP status (200-599) nor a range like 4xx (2xx-5xx)`,
		`{"40x": failed}`:    `operations[0].outcomes.40x: "40x" is neither an HTTP status`,
		`{4090: failed}`:     `operations[0].outcomes.4090: "4090" is neither an HTTP status`,
		`{"+09": ambiguous}`: `"+09" is neither an HTTP status`,
	} {
		t.Run(bad, func(t *testing.T) {
			cfg := strings.Replace(string(good), `outcomes: {409: failed, "5xx": ambiguous, 202: ambiguous}`, "outcomes: "+bad, 1)
			require.NotEqual(t, string(good), cfg)
			dir := t.TempDir()
			require.NoError(t, os.CopyFS(filepath.Join(dir, "keys"), os.DirFS("testdata/keys")))
			path := filepath.Join(dir, "idemgate.yaml")
			require.NoError(t, os.WriteFile(path, []byte(cfg), 0o600))
			_, _, err := Load(path, testOptions())
			require.Error(t, err)
			require.Contains(t, err.Error(), want)
			require.Regexp(t, `idemgate.yaml:\d+:\d+: `, err.Error(), "the problem names its line")
		})
	}
}
