package envelope

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

var testOp = Operation{PreviewTool: "transfer_preview", StatusTool: "transfer_status", PollAfter: 2 * time.Second, MaxBodyBytes: 1024}

func TestCataloguesAreComplete(t *testing.T) {
	for _, lang := range Languages() {
		for _, m := range Messages() {
			text, ok := catalogues[lang][m]
			require.Truef(t, ok, "%s: %s missing", lang, m)
			require.NotEmptyf(t, text.Meaning, "%s: %s meaning", lang, m)
			require.NotEmptyf(t, text.Instruction, "%s: %s instruction", lang, m)
			require.NoError(t, CheckPlaceholders(text.Meaning))
			require.NoError(t, CheckPlaceholders(text.Instruction))
		}
		require.Len(t, catalogues[lang], len(specs), lang)
	}
	require.Equal(t, []string{"en", "zh"}, Languages())
}

func decode(t *testing.T, b []byte) map[string]any {
	t.Helper()
	var m map[string]any
	require.NoError(t, json.Unmarshal(b, &m), string(b))
	return m
}

func TestRenderEveryMessage(t *testing.T) {
	for _, lang := range Languages() {
		set, err := Compile(lang, nil, testOp)
		require.NoError(t, err)
		for _, m := range Messages() {
			r := set.Render(m, "trace-1", 201, Extra{})
			body := decode(t, r.Body)
			spec := specs[m]
			require.Equal(t, spec.Status, body["status"], m)
			require.Equal(t, spec.Retryable, body["retryable"], m)
			require.Equal(t, "trace-1", body["trace_id"], m)
			require.NotContains(t, body["meaning"], "{", m)
			require.NotContains(t, body["instruction"], "{", m)
			if spec.HTTPStatus == 0 {
				require.Equal(t, 201, r.HTTPStatus)
			} else {
				require.Equal(t, spec.HTTPStatus, r.HTTPStatus)
			}
		}
	}
}

func TestRenderTableOfDesignSection5(t *testing.T) {
	set, err := Compile("en", nil, testOp)
	require.NoError(t, err)
	for _, tc := range []struct {
		msg        Message
		http       int
		retryable  bool
		retryAfter int64
		extra      Extra
		want       map[string]any
	}{
		{msg: AlreadyCompleted, http: 201, extra: Extra{HasResult: true, ResultRef: "tr_1", Result: []byte(`{"id":"tr_1"}`)},
			want: map[string]any{"result_ref": "tr_1", "result": map[string]any{"id": "tr_1"}}},
		{msg: AlreadyFailed, http: 201, extra: Extra{HasResult: true, ResultRef: "n", Result: []byte("not json")},
			want: map[string]any{"result_ref": "n", "result": "not json"}},
		{msg: InProgress, http: 409, retryAfter: 2, want: map[string]any{"poll_with": "transfer_status", "poll_after_ms": 2000.0}},
		{msg: NeedsReconciliation, http: 409, want: map[string]any{"poll_with": "transfer_status"}},
		{msg: FingerprintRequired, http: 400, want: map[string]any{"preview_with": "transfer_preview"}},
		{msg: FingerprintInvalid, http: 400, want: map[string]any{"preview_with": "transfer_preview"}},
		{msg: FingerprintExpired, http: 410, want: map[string]any{"preview_with": "transfer_preview"}},
		{msg: FingerprintSubjectMismatch, http: 403, want: map[string]any{}},
		{msg: ParamsChanged, http: 422, extra: Extra{ChangedFields: []string{"amount", "payee.account_id"}},
			want: map[string]any{"preview_with": "transfer_preview", "changed_fields": []any{"amount", "payee.account_id"}}},
		{msg: TemporarilyUnavailable, http: 503, retryable: true, retryAfter: 1, want: map[string]any{"retry_after_ms": 1000.0}},
		{msg: RequestTooLarge, http: 413, want: map[string]any{}},
		{msg: InvalidJSON, http: 400, want: map[string]any{}},
		{msg: PathNotExact, http: 404, extra: Extra{Detail: "use POST /v1/transfers/confirm"}, want: map[string]any{"detail": "use POST /v1/transfers/confirm"}},
		{msg: MethodNotAllowed, http: 405, extra: Extra{Detail: "use POST /v1/transfers/confirm"}, want: map[string]any{"detail": "use POST /v1/transfers/confirm"}},
		{msg: HeaderNotAllowed, http: 400, extra: Extra{Detail: "x-envoy-retry-on"}, want: map[string]any{"detail": "x-envoy-retry-on"}},
	} {
		t.Run(string(tc.msg), func(t *testing.T) {
			r := set.Render(tc.msg, "t", 201, tc.extra)
			require.Equal(t, tc.http, r.HTTPStatus)
			require.Equal(t, tc.retryAfter, r.RetryAfterSeconds)
			body := decode(t, r.Body)
			require.Equal(t, tc.retryable, body["retryable"])
			for k, v := range tc.want {
				require.Equal(t, v, body[k], k)
			}
			// No field beyond the base five and the expected extras.
			require.Len(t, body, 5+len(tc.want), string(r.Body))
		})
	}
}

func TestOverridesAndPlaceholders(t *testing.T) {
	set, err := Compile("zh", map[Message]Text{
		InProgress: {Instruction: "wait {poll_after_seconds}s then call {status_tool}"},
	}, testOp)
	require.NoError(t, err)
	body := decode(t, set.Render(InProgress, "", 0, Extra{}).Body)
	require.Equal(t, "wait 2s then call transfer_status", body["instruction"])
	require.Equal(t, catalogues["zh"][InProgress].Meaning, body["meaning"], "empty override field keeps the catalogue text")

	_, err = Compile("fr", nil, testOp)
	require.EqualError(t, err, `unknown language "fr" (known: en, zh)`)
	_, err = Compile("en", map[Message]Text{"nope": {Meaning: "x"}}, testOp)
	require.EqualError(t, err, `unknown message "nope"`)
	require.EqualError(t, CheckPlaceholders("call {tool}"), "unknown placeholder {tool} (known: {preview_tool} {status_tool} {poll_after_seconds} {retry_after_seconds} {max_body_bytes})")
}

func TestAppendStringEscapes(t *testing.T) {
	for _, s := range []string{"plain", `q"b\s`, "ctl\x00\x1f\n\t\r", "bad\xffutf8", "line\u2028sep", "中文"} {
		b := AppendString(nil, s)
		var got string
		require.NoError(t, json.Unmarshal(b, &got), string(b))
		require.Equal(t, strings.ToValidUTF8(s, "\ufffd"), got)
	}
}

func TestResultEmbedding(t *testing.T) {
	require.Equal(t, `null`, string(AppendJSONOrString(nil, nil)))
	require.Equal(t, ` {"a":1} `, string(AppendJSONOrString(nil, []byte(` {"a":1} `))))
	require.Equal(t, `"{oops"`, string(AppendJSONOrString(nil, []byte(`{oops`))))
	// Stricter than encoding/json's Valid: a result some parsers read two
	// ways is embedded as text, and invalid UTF-8 never reaches the
	// envelope raw.
	require.Equal(t, `"{\"a\":1,\"a\":2}"`, string(AppendJSONOrString(nil, []byte(`{"a":1,"a":2}`))))
	require.Equal(t, `"\"\ufffd\""`, string(AppendJSONOrString(nil, []byte("\"\xff\""))))
}

// A result already known to be strict JSON (the terminal cache checks it
// once) is embedded as it is, without a second parse; nothing else changes.
func TestResultKnownToBeJSON(t *testing.T) {
	set, err := Compile("en", nil, testOp)
	require.NoError(t, err)
	render := func(x Extra) map[string]any {
		var got map[string]any
		require.NoError(t, json.Unmarshal(set.Render(AlreadyCompleted, "t", 201, x).Body, &got))
		return got
	}
	body := []byte(`{"id":"tr_1"}`)
	known := render(Extra{HasResult: true, ResultRef: "tr_1", Result: body, ResultJSON: true})
	require.Equal(t, render(Extra{HasResult: true, ResultRef: "tr_1", Result: body}), known)
	require.Equal(t, map[string]any{"id": "tr_1"}, known["result"])
	require.Nil(t, render(Extra{HasResult: true, ResultRef: "n", ResultJSON: true})["result"], "an empty result is null, flag or not")
}

func TestTextIsWhatTheEnvelopeCarries(t *testing.T) {
	set, err := Compile("en", nil, testOp)
	require.NoError(t, err)
	for _, m := range Messages() {
		var body struct{ Meaning, Instruction string }
		require.NoError(t, json.Unmarshal(set.Render(m, "t", 200, Extra{}).Body, &body))
		require.Equal(t, Text{Meaning: body.Meaning, Instruction: body.Instruction}, set.Text(m), m)
	}
}

func BenchmarkRender(b *testing.B) {
	set, err := Compile("en", nil, testOp)
	require.NoError(b, err)
	b.ReportAllocs()
	for b.Loop() {
		_ = set.Render(InProgress, "5f0c2b8e-1d1e-4c63-9d0e-5b0a4f3f4a1c", 0, Extra{})
	}
}
