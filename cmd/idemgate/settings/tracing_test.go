package settings

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/extproc/config"
)

const tracingBase = `signing: {active_key: k1, keys: {k1: {env: K1}}}
operations:
  - name: transfer
    scope: payments.transfer
    preview: {method: POST, path: /p}
    confirm: {method: POST, path: /c}
    status: {method: POST, path: /s}
    preview_tool: p
    status_tool: s
    params: [amount]
`

func parseTracing(t *testing.T, tracing string) (*Settings, error) {
	t.Helper()
	cfg, _, err := Parse("t.yaml", []byte(tracingBase+tracing), "", config.Options{LookupEnv: func(string) (string, bool) {
		return "dGVzdC1rZXktazEtbm90LWEtc2VjcmV0LTMyYnl0ZXM=", true
	}})
	return cfg, err
}

func TestTracingOffByDefault(t *testing.T) {
	cfg, err := parseTracing(t, "")
	require.NoError(t, err)
	require.False(t, cfg.Tracing.Enabled)
	var b strings.Builder
	require.NoError(t, cfg.WriteSummary(&b))
	require.Contains(t, b.String(), "tracing:    off (no tracing.otlp)\n")
}

func TestTracingConfigured(t *testing.T) {
	cfg, err := parseTracing(t, `tracing: {otlp: {endpoint: "127.0.0.1:4317", insecure: true}, sample_ratio: 0.25, service_name: idemgate-eu}`+"\n")
	require.NoError(t, err)
	require.Equal(t, TracingSettings{Enabled: true, Endpoint: "127.0.0.1:4317", Insecure: true, Timeout: DefaultTracingTimeout, SampleRatio: 0.25, ServiceName: "idemgate-eu"}, cfg.Tracing)
	var b strings.Builder
	require.NoError(t, cfg.WriteSummary(&b))
	require.Contains(t, b.String(), "tracing:    OTLP/gRPC 127.0.0.1:4317 (plaintext, timeout 10s), sample ratio 0.25 for new traces (a sampled traceparent is always followed), service idemgate-eu\n")

	cfg, err = parseTracing(t, "tracing: {otlp: {endpoint: \"collector:4317\"}}\n")
	require.NoError(t, err)
	require.Equal(t, 1.0, cfg.Tracing.SampleRatio)
	require.Equal(t, DefaultTracingServiceName, cfg.Tracing.ServiceName)
	require.False(t, cfg.Tracing.Insecure)
}

func TestTracingConfigIsStrict(t *testing.T) {
	for _, c := range []struct{ yaml, want string }{
		{"tracing: {otlp: {endpoint: \"127.0.0.1:4317\", insecur: true}}\n",
			"t.yaml:11:46: tracing.otlp.insecur: unknown key \"insecur\""},
		{"tracing: {exporter: otlp}\n", "t.yaml:11:11: tracing.exporter: unknown key \"exporter\""},
		{"tracing: {otlp: {endpoint: \"127.0.0.1:4317\"}, sample_ratio: lots}\n", "t.yaml:11:61: tracing.sample_ratio: must be a number"},
		{"tracing: {otlp: {endpoint: \"127.0.0.1:4317\"}, sample_ratio: 1.5}\n", "tracing.sample_ratio: must be between 0 and 1, got 1.5"},
		{"tracing: {otlp: {endpoint: \"4317\"}}\n", "tracing.otlp.endpoint: must be host:port"},
		{"tracing: {otlp: {endpoint: \"127.0.0.1:4317\", timeout: soon}}\n", "tracing.otlp.timeout: invalid duration \"soon\""},
		{"tracing: {sample_ratio: 0.5}\n", "tracing: tracing.otlp.endpoint is required when tracing is configured"},
	} {
		_, err := parseTracing(t, c.yaml)
		require.Error(t, err, c.yaml)
		require.Contains(t, err.Error(), c.want, c.yaml)
	}
}
