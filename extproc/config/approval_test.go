package config

import (
	"errors"
	"io/fs"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// approverJWKS is a public Ed25519 key (RFC 8037's example key).
const approverJWKS = `{"keys":[{"kty":"OKP","crv":"Ed25519","kid":"a1","x":"11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo"}]}`

func approvalOptions() Options {
	o := testOptions()
	o.ReadFile = func(name string) ([]byte, error) {
		switch name {
		case "/etc/idemgate/approvers.jwks":
			return []byte(approverJWKS), nil
		case "/etc/idemgate/secret.jwks":
			return []byte(`{"keys":[{"kty":"oct","k":"c2VjcmV0"}]}`), nil
		}
		return nil, &fs.PathError{Op: "open", Path: name, Err: fs.ErrNotExist}
	}
	return o
}

const approvalHead = `
signing: {active_key: k1, keys: {k1: {env: IDEMGATE_TEST_KEY_K1}}}
ttl: {terminal: 72h}
operations:
  - name: transfer
    scope: payments.transfer
    preview: {method: POST, path: /v1/transfers/preview}
    confirm: {method: POST, path: /v1/transfers/confirm}
    status: {method: POST, path: /v1/transfers/status}
    preview_tool: transfer_preview
    status_tool: transfer_status
    params: [{path: amount, type: decimal}, currency, payee.account_id]
`

func TestApprovalBlock(t *testing.T) {
	rt, warns, err := Parse("approval.yaml", []byte(approvalHead+`    approval:
      rules:
        - {param: amount, at_least: "1000.00"}
      approvers:
        jwt: {issuer: https://idp.example, audience: idemgate-approvals, jwks_file: /etc/idemgate/approvers.jwks}
        required: 2
      ttl: 24h
`), "", approvalOptions())
	require.NoError(t, err)
	require.Empty(t, warns)
	a := rt.Operations[0].Approval
	require.NotNil(t, a)
	require.Equal(t, 2, a.Required)
	require.True(t, a.DistinctFromRequester, "four eyes unless said otherwise")
	require.Equal(t, DefaultApproverLeeway, a.Verifier.Leeway)
	require.Len(t, a.Verifier.Keys.Keys, 1)
	require.Len(t, a.Rules, 1)
	r := a.Rules[0]
	require.Equal(t, 0, r.ParamIndex)
	for v, want := range map[string]bool{"1000": true, "1000.00": true, "\"1000.000\"": true, "999.99": false, "1000.01": true, "-5000": false, "1e9": true, "abc": true} {
		require.Equal(t, want, r.Matches(v), v)
	}

	var b strings.Builder
	require.NoError(t, rt.WriteSummary(&b, ProcessSummary{}))
	require.Contains(t, b.String(), "    approval when amount >= 1000.00; 2 approver(s), not the requester; ttl 24h0m0s; tokens iss https://idp.example aud idemgate-approvals from /etc/idemgate/approvers.jwks (leeway 1m0s)\n")

	rt, _, err = Parse("approval.yaml", []byte(approvalHead+`    approval:
      rules:
        - {daily_total: {param: amount, over: "5000.00", per: [currency]}}
      approvers: {jwt: {issuer: https://idp.example, audience: a, jwks_file: /etc/idemgate/approvers.jwks}}
`), "", approvalOptions())
	require.NoError(t, err)
	dt := rt.Operations[0].Approval.Rules[0]
	require.Equal(t, "daily total of amount per currency > 5000.00", dt.Text)
	require.Equal(t, &DailyTotalRule{Over: "5000.00", Per: []string{"currency"}}, dt.DailyTotal)
	require.False(t, dt.Matches("1000000"), "a daily_total rule is judged by the store, not at preview")
	require.True(t, rt.Operations[0].Approval.HasDailyTotal())

	// Without approval the operation is as before.
	rt, _, err = Parse("approval.yaml", []byte(approvalHead), "", approvalOptions())
	require.NoError(t, err)
	require.Nil(t, rt.Operations[0].Approval)

	// Offline: the JWKS is named, not read.
	o := approvalOptions()
	o.Offline = true
	o.ReadFile = func(string) ([]byte, error) { return nil, errors.New("must not be read") }
	_, _, err = Parse("approval.yaml", []byte(approvalHead+`    approval:
      rules: [{param: amount, at_least: "1"}]
      approvers: {jwt: {issuer: https://idp.example, audience: a, jwks_file: /nowhere.jwks}}
`), "", o)
	require.NoError(t, err)
}

func TestBadApprovalBlocks(t *testing.T) {
	cases := []struct {
		name string
		yaml string
		want []string
	}{
		{"empty", `    approval: {approvers: {jwt: {issuer: https://idp.example, audience: a, jwks_file: /etc/idemgate/approvers.jwks}}}
`, []string{
			"approval.yaml:13:16: operations[0].approval.rules: required: at least one rule (an approval block without rules gates nothing)",
		}},
		{"unknown key", `    approval:
      rules:
        - {param: amount, at_least: "1", in: eur}
      approvers: {jwt: {issuer: https://idp.example, audience: a, jwks_file: /etc/idemgate/approvers.jwks}}
`, []string{
			"approval.yaml:15:42: operations[0].approval.rules[0].in: unknown key \"in\" (known keys: at_least, daily_total, param)",
		}},
		{"bad rule values", `    approval:
      rules:
        - {param: currency, at_least: "1000"}
        - {param: memo, at_least: "1,000.00"}
        - {param: amount}
        - {daily_total: {param: amount, over: "5000.00", per: [currency]}}
        - {param: amount, at_least: "1", daily_total: {param: amount, over: "1"}}
      approvers: {jwt: {issuer: https://idp.example, audience: a, jwks_file: /etc/idemgate/approvers.jwks}}
`, []string{
			"approval.yaml:15:19: operations[0].approval.rules[0].param: currency must be bound as {path: currency, type: decimal}: at_least compares exact decimals",
			"approval.yaml:16:19: operations[0].approval.rules[1].param: memo is not in params: a rule may only read a bound param (an unbound one could change after approval)",
			"approval.yaml:16:35: operations[0].approval.rules[1].at_least: invalid decimal \"1,000.00\": digits with an optional fraction, e.g. \"1000.00\"",
			"approval.yaml:17:12: operations[0].approval.rules[2].at_least: required: the smallest amount that needs approval, e.g. \"1000.00\"",
			"approval.yaml:19:12: operations[0].approval.rules[4]: a rule is either {param, at_least} or {daily_total: {...}}, not both",
		}},
		{"bad daily_total", `    approval:
      rules:
        - {daily_total: {param: currency, over: "5,000", per: [memo, currency]}}
        - {daily_total: {per: [payee.account_id, payee.account_id]}}
      approvers: {jwt: {issuer: https://idp.example, audience: a, jwks_file: /etc/idemgate/approvers.jwks}}
`, []string{
			"approval.yaml:15:33: operations[0].approval.rules[0].daily_total.param: currency must be bound as {path: currency, type: decimal}: daily_total sums exact decimals",
			"approval.yaml:15:49: operations[0].approval.rules[0].daily_total.over: invalid decimal \"5,000\": digits with an optional fraction, e.g. \"5000.00\"",
			"approval.yaml:15:64: operations[0].approval.rules[0].daily_total.per[0]: memo is not in params: a budget may only be split by bound params",
			"approval.yaml:15:70: operations[0].approval.rules[0].daily_total.per[1]: currency is the summed param itself",
			"approval.yaml:16:26: operations[0].approval.rules[1].daily_total.param: required: the decimal param summed per day",
			"approval.yaml:16:26: operations[0].approval.rules[1].daily_total.over: required: the daily total above which approval is needed, e.g. \"5000.00\"",
			"approval.yaml:16:50: operations[0].approval.rules[1].daily_total.per[1]: payee.account_id is listed twice",
		}},
		{"approvers", `    approval:
      rules: [{param: amount, at_least: "1"}]
      approvers:
        required: 0
        jwt: {issuer: idp, leeway: 1h, jwks_file: /etc/idemgate/secret.jwks}
      ttl: 80h
`, []string{
			"approval.yaml:16:19: operations[0].approval.approvers.required: must be 1..10, got 0",
			"approval.yaml:17:23: operations[0].approval.approvers.jwt.issuer: invalid issuer \"idp\": a URL such as https://idp.example",
			"approval.yaml:17:15: operations[0].approval.approvers.jwt.audience: required: the aud an approver token must carry (one for idemgate approvals only)",
			"approval.yaml:17:36: operations[0].approval.approvers.jwt.leeway: 1h0m0s is too long (at most 5m0s): leeway extends every approver token's life",
			"approval.yaml:17:51: operations[0].approval.approvers.jwt.jwks_file: /etc/idemgate/secret.jwks: JWKS key 0 (kid \"\"): symmetric (HMAC) keys are refused: an approver token must be signed by a key idemgate cannot sign with",
			"approval.yaml:18:12: operations[0].approval.ttl: ttl.terminal (72h0m0s) must be at least approval.ttl + ttl.in_flight + 1m0s (80h3m0s): a record must outlive every gated fingerprint that can reach it",
		}},
		{"no jwt", `    approval:
      rules: [{param: amount, at_least: "1"}]
      approvers: {required: 1}
`, []string{
			"approval.yaml:15:19: operations[0].approval.approvers.jwt: required: how approvers' bearer tokens are verified ({issuer, audience, jwks_file or jwks_url})",
		}},
		{"missing jwks", `    approval:
      rules: [{param: amount, at_least: "1"}]
      approvers: {jwt: {issuer: https://idp.example, audience: a, jwks_file: /etc/idemgate/nope.jwks}}
`, []string{
			"approval.yaml:15:78: operations[0].approval.approvers.jwt.jwks_file: failed to read JWKS file /etc/idemgate/nope.jwks: file does not exist",
		}},
	}
	cases = append(cases, []struct {
		name string
		yaml string
		want []string
	}{
		{"file and url", `    approval:
      rules: [{param: amount, at_least: "1"}]
      approvers: {jwt: {issuer: https://idp.example, audience: a, jwks_file: /etc/idemgate/approvers.jwks, jwks_url: "https://idp.example/jwks"}}
`, []string{
			"approval.yaml:15:118: operations[0].approval.approvers.jwt.jwks_url: set only one of jwks_file and jwks_url",
		}},
		{"plain http", `    approval:
      rules: [{param: amount, at_least: "1"}]
      approvers: {jwt: {issuer: https://idp.example, audience: a, jwks_url: "http://idp.example/jwks", jwks_cache: 0s}}
`, []string{
			"approval.yaml:15:77: operations[0].approval.approvers.jwt.jwks_url: http://idp.example/jwks: plain http is accepted for a loopback host only; the keys that decide who approves must not travel unprotected",
			"approval.yaml:15:116: operations[0].approval.approvers.jwt.jwks_cache: must be positive, got 0s",
		}},
	}...)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, parseErrors(t, "approval.yaml", approvalHead+tc.yaml, approvalOptions()))
		})
	}
}

func TestApprovalJWKSURL(t *testing.T) {
	rt, _, err := Parse("approval.yaml", []byte(approvalHead+`    approval:
      rules: [{param: amount, at_least: "1"}]
      approvers: {jwt: {issuer: https://idp.example, audience: a, jwks_url: "https://idp.example/.well-known/jwks.json", jwks_cache: 10m}}
`), "", approvalOptions())
	require.NoError(t, err)
	v := rt.Operations[0].Approval.Verifier
	require.Nil(t, v.Keys, "fetched when the first token is verified, not at load")
	require.Equal(t, "https://idp.example/.well-known/jwks.json", v.Remote.URL)
	require.Equal(t, 10*time.Minute, v.Remote.Cache)
	require.Equal(t, "https://idp.example/.well-known/jwks.json (cached 10m0s)", rt.Operations[0].Approval.JWKSFile)
}

func TestApprovalNotify(t *testing.T) {
	o := approvalOptions()
	env := map[string]string{
		"IDEMGATE_TEST_KEY_K1": testEnv["IDEMGATE_TEST_KEY_K1"],
		"HOOK_URL":             "https://hooks.example/approvals",
		"HOOK_SECRET":          "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
		"BAD_SECRET":           "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
	}
	o.LookupEnv = func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	block := func(url, secret string) []byte {
		return []byte(approvalHead + `    approval:
      rules: [{param: amount, at_least: "1"}]
      approvers: {jwt: {issuer: https://idp.example, audience: a, jwks_file: /etc/idemgate/approvers.jwks}}
      notify: {webhook: {url_env: ` + url + `, secret_env: ` + secret + `}}
`)
	}
	rt, _, err := Parse("approval.yaml", block("HOOK_URL", "HOOK_SECRET"), "", o)
	require.NoError(t, err)
	n := rt.Operations[0].Approval.Notify
	require.Equal(t, "https://hooks.example/approvals", n.URL)
	require.Len(t, n.Key, 24)

	_, _, err = Parse("approval.yaml", block("HOOK_URL", "BAD_SECRET"), "", o)
	require.ErrorContains(t, err, "environment variable BAD_SECRET does not hold a Standard Webhooks secret")
	_, _, err = Parse("approval.yaml", block("MISSING", "HOOK_SECRET"), "", o)
	require.ErrorContains(t, err, "environment variable MISSING (the approval webhook URL) is not set")
}

// TestApprovalStepUpAndPublicURL (docs/design.md §13): requester_step_up
// and public_url compile, and bad values are refused with their lines.
func TestApprovalStepUpAndPublicURL(t *testing.T) {
	rt, _, err := Parse("approval.yaml", []byte(approvalHead+`    approval:
      rules: [{param: amount, at_least: "1000.00"}]
      public_url: https://approvals.example.com/
      approvers:
        jwt: {issuer: https://idp.example, audience: a, jwks_file: /etc/idemgate/approvers.jwks}
        requester_step_up: {acr: ["urn:example:sca"], amr: [hwk]}
`), "", approvalOptions())
	require.NoError(t, err)
	a := rt.Operations[0].Approval
	require.Equal(t, "https://approvals.example.com", a.PublicURL)
	require.Equal(t, "https://approvals.example.com/approvals/apr_1", a.ApprovalURL("apr_1"))
	require.Equal(t, &StepUpSettings{ACR: []string{"urn:example:sca"}, AMR: []string{"hwk"}, MaxAuthAge: DefaultMaxAuthAge}, a.StepUp)
	var b strings.Builder
	require.NoError(t, rt.WriteSummary(&b, ProcessSummary{}))
	require.Contains(t, b.String(), "not the requester unless stepped up (acr urn:example:sca, amr hwk, auth within 5m0s)")
	require.Contains(t, b.String(), "; page https://approvals.example.com\n")

	for _, tc := range []struct {
		name, yaml string
		want       []string
	}{
		{"step-up values", `    approval:
      rules: [{param: amount, at_least: "1"}]
      approvers:
        jwt: {issuer: https://idp.example, audience: a, jwks_file: /etc/idemgate/approvers.jwks}
        requester_step_up: {acr: ["a b", x, x], amr: ['q"'], max_auth_age: 2h}
`, []string{
			"approval.yaml:17:35: operations[0].approval.approvers.requester_step_up.acr[0]: invalid value \"a b\": 1-128 visible ASCII characters, no spaces, quotes or backslashes (it is sent in WWW-Authenticate)",
			"approval.yaml:17:45: operations[0].approval.approvers.requester_step_up.acr[2]: x is listed twice",
			"approval.yaml:17:55: operations[0].approval.approvers.requester_step_up.amr[0]: invalid value \"q\\\"\": 1-128 visible ASCII characters, no spaces, quotes or backslashes (it is sent in WWW-Authenticate)",
			"approval.yaml:17:76: operations[0].approval.approvers.requester_step_up.max_auth_age: 2h0m0s is too long (at most 1h0m0s): step-up asks for a fresh authentication",
		}},
		{"step-up empty, four eyes off, bad url", `    approval:
      rules: [{param: amount, at_least: "1"}]
      public_url: http://approvals.example.com/x?y=1
      approvers:
        jwt: {issuer: https://idp.example, audience: a, jwks_file: /etc/idemgate/approvers.jwks}
        distinct_from_requester: false
        requester_step_up: {}
`, []string{
			"approval.yaml:19:28: operations[0].approval.approvers.requester_step_up: required: acr (the listed authentication context classes) or amr (methods), e.g. acr: [\"urn:example:psd2:sca\"]",
			"approval.yaml:19:28: operations[0].approval.approvers.requester_step_up: has no effect with distinct_from_requester: false (the requester may approve anyway); remove one of them",
			"approval.yaml:15:19: operations[0].approval.public_url: http://approvals.example.com/x?y=1: no query or fragment (approval URLs are <public_url>/approvals/<id>)",
		}},
		{"plain http url", `    approval:
      rules: [{param: amount, at_least: "1"}]
      public_url: http://approvals.example.com
      approvers: {jwt: {issuer: https://idp.example, audience: a, jwks_file: /etc/idemgate/approvers.jwks}}
`, []string{
			"approval.yaml:15:19: operations[0].approval.public_url: http://approvals.example.com: plain http is accepted for a loopback host only; people authenticate on this page",
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, parseErrors(t, "approval.yaml", approvalHead+tc.yaml, approvalOptions()))
		})
	}
}

// parseErrors parses yaml, which must fail, and returns each of its
// problems as written.
func parseErrors(t *testing.T, name, yaml string, opts Options) []string {
	t.Helper()
	_, _, err := Parse(name, []byte(yaml), "", opts)
	require.Error(t, err)
	var got []string
	for _, e := range unjoin(err) {
		got = append(got, e.Error())
	}
	return got
}
