package config

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

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

func testOptions() Options {
	return Options{LookupEnv: func(k string) (string, bool) {
		v, ok := testEnv[k]
		return v, ok
	}}
}

func TestLoadGood(t *testing.T) {
	rt, warns, err := Load("testdata/good.yaml", testOptions())
	require.NoError(t, err)
	require.Empty(t, warns)
	require.Equal(t, ":50051", rt.GRPCListen)
	require.Equal(t, "json", rt.Log.Format)
	require.Equal(t, "k1", rt.Keys.ActiveKeyID())
	require.Equal(t, []string{"k0", "k1"}, rt.Keys.KeyIDs())
	require.Equal(t, "x-idemgate-subject", rt.Subject.Header)
	require.Equal(t, "tiered", rt.Store.Backend())
	require.Equal(t, "redis-secret-password", rt.Store.Redis.Password.Reveal())
	require.Equal(t, "env IDEMGATE_TEST_PG_DSN", rt.Store.Postgres.DSNSource)
	require.Equal(t, 2*time.Minute, rt.TTL.InFlight)
	require.Equal(t, "zh", rt.Language)
	require.Len(t, rt.Operations, 2)

	tr := rt.Operations[0]
	require.Equal(t, "idempotency-key", tr.DownstreamHeader)
	require.True(t, tr.HonoursKeys())
	require.Equal(t, []string{"transfer_id"}, tr.ResultRef)
	require.Equal(t, "fingerprint_expires_at", tr.ExpiresAtField)
	require.True(t, tr.Params[0].Decimal)
	require.NotNil(t, tr.Selector)
	body := map[string]any{}
	require.NoError(t, json.Unmarshal(tr.Envelopes.Render(envelope.InProgress, "t", 0, envelope.Extra{}).Body, &body))
	require.Equal(t, "等 2 秒后调用 transfer_status", body["instruction"])

	payout := rt.Operations[1]
	require.False(t, payout.HonoursKeys())
	require.Equal(t, ReplayRaw, payout.Replay)

	target, vars, ok := rt.Routes.Match("POST", "/v1/accounts/acc-7/payouts/confirm?x=1")
	require.True(t, ok)
	require.Same(t, payout, target.Op)
	require.Equal(t, KindConfirm, target.Kind)
	require.Equal(t, map[string]string{"account": "acc-7"}, vars)
	target, _, ok = rt.Routes.Match("POST", "/v1/transfers/status")
	require.True(t, ok)
	require.Equal(t, KindStatus, target.Kind)
}

func TestSecretsAreNeverPrinted(t *testing.T) {
	rt, _, err := Load("testdata/good.yaml", testOptions())
	require.NoError(t, err)
	var buf bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&buf, nil))
	logger.Info("config", "store", rt.Store, "redis", rt.Store.Redis, "pg", rt.Store.Postgres, "keys", rt.Keys)
	logger.Info("direct", "password", rt.Store.Redis.Password, "dsn", rt.Store.Postgres.DSN)
	jsonBytes, err := json.Marshal(rt.Store)
	require.NoError(t, err)
	var summary bytes.Buffer
	require.NoError(t, rt.WriteSummary(&summary))
	for _, out := range []string{buf.String(), string(jsonBytes), fmt.Sprintf("%v %+v %#v", rt.Store.Redis, rt.Store.Postgres, rt.Store.Redis.Password), summary.String()} {
		require.NotContains(t, out, "redis-secret-password")
		require.NotContains(t, out, "pg-secret-password")
		require.NotContains(t, out, testEnv["IDEMGATE_TEST_KEY_K1"])
	}
	require.Contains(t, buf.String(), "[REDACTED]")
}

func TestSummary(t *testing.T) {
	rt, _, err := Load("testdata/good.yaml", testOptions())
	require.NoError(t, err)
	var b bytes.Buffer
	require.NoError(t, rt.WriteSummary(&b))
	t.Log("\n" + b.String())
	require.Contains(t, b.String(), "keys:       k0 (file keys/k0), k1 (env IDEMGATE_TEST_KEY_K1) active\n")
	require.Contains(t, b.String(), "    confirm  POST /v1/transfers/confirm  sends idempotency-key, replay envelope\n")
	require.Contains(t, b.String(), "    confirm  POST /v1/accounts/{account}/payouts/confirm  downstream ignores keys, replay raw\n")
}

func TestOfflineChecksReferencesWithoutReadingSecrets(t *testing.T) {
	nothing := Options{
		LookupEnv: func(string) (string, bool) { return "", false },
		ReadFile:  func(name string) ([]byte, error) { return nil, fmt.Errorf("read %s: no such file", name) },
	}
	_, _, err := Load("testdata/good.yaml", nothing)
	require.ErrorContains(t, err, "environment variable IDEMGATE_TEST_KEY_K1 (the signing key) is not set")

	offline := nothing
	offline.Offline = true
	rt, warns, err := Load("testdata/good.yaml", offline)
	require.NoError(t, err)
	require.Empty(t, warns)
	require.Equal(t, "env IDEMGATE_TEST_PG_DSN (not read: offline check)", rt.Store.Postgres.DSNSource)
	require.Equal(t, "file keys/k0 (not read: offline check)", rt.KeySources["k0"])

	// A malformed reference is still an error offline.
	_, _, err = Parse("both.yaml", []byte("signing: {active_key: k1, keys: {k1: {env: A, file: b}}}\n"+
		"operations: []\n"), "", offline)
	require.ErrorContains(t, err, "set only one of env and file")
}
