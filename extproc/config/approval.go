package config

import (
	"encoding/base64"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"regexp"
	"strings"
	"time"

	"github.com/idemgate/idemgate/extproc/approver"
)

// ApprovalSpec is an operation's approval block as written (docs/design.md
// §10): the rules that make a confirm wait for people, who may decide, and
// how long an approval (and a gated fingerprint) lives.
type ApprovalSpec struct {
	Rules     []ApprovalRuleSpec `yaml:"rules"`
	Approvers ApproversSpec      `yaml:"approvers"`
	TTL       string             `yaml:"ttl"`
	Notify    *NotifySpec        `yaml:"notify"`
	// PublicURL is the approvers' page as people reach it
	// (https://approvals.example.com): every approval_pending answer then
	// carries approval_url, and MCP clients that show URLs get an input
	// request (docs/design.md §13).
	PublicURL string `yaml:"public_url"`
}

// NotifySpec says who is told of a new approval: a webhook whose URL and
// Standard Webhooks secret (whsec_<base64>) come from the environment.
type NotifySpec struct {
	Webhook *NotifyWebhookSpec `yaml:"webhook"`
}

// NotifyWebhookSpec names the environment variables of the webhook.
type NotifyWebhookSpec struct {
	URLEnv    string `yaml:"url_env"`
	SecretEnv string `yaml:"secret_env"`
}

// NotifySettings is the compiled notify webhook.
type NotifySettings struct {
	URL string
	// Key is the decoded secret: the HMAC-SHA256 key of the signatures.
	Key []byte
	// Source names where URL and Key came from (no material).
	Source string
}

// ApprovalRuleSpec is one rule: {param, at_least} or {daily_total: ...}.
type ApprovalRuleSpec struct {
	Param      string          `yaml:"param"`
	AtLeast    string          `yaml:"at_least"`
	DailyTotal *DailyTotalSpec `yaml:"daily_total"`
}

// DailyTotalSpec sums param per subject, UTC day and the values of Per.
type DailyTotalSpec struct {
	Param string   `yaml:"param"`
	Over  string   `yaml:"over"`
	Per   []string `yaml:"per"`
}

// ApproversSpec says how approvers are identified and how many must agree.
type ApproversSpec struct {
	JWT                   *ApproverJWTSpec `yaml:"jwt"`
	DistinctFromRequester *bool            `yaml:"distinct_from_requester"`
	Required              *int             `yaml:"required"`
	// RequesterStepUp lets the requester approve their own operation with
	// a token that is strong and fresh enough (docs/design.md §13).
	RequesterStepUp *StepUpSpec `yaml:"requester_step_up"`
}

// StepUpSpec is what makes a requester's own approval count: a token whose
// acr is listed (or whose amr holds a listed method) and whose auth_time is
// at most MaxAuthAge old.
type StepUpSpec struct {
	ACR        []string `yaml:"acr"`
	AMR        []string `yaml:"amr"`
	MaxAuthAge string   `yaml:"max_auth_age"`
}

// StepUpSettings is the compiled requester_step_up.
type StepUpSettings struct {
	ACR, AMR   []string
	MaxAuthAge time.Duration
}

// ApproverJWTSpec is how an approver's bearer token is verified.
type ApproverJWTSpec struct {
	Issuer   string `yaml:"issuer"`
	Audience string `yaml:"audience"`
	JWKSFile string `yaml:"jwks_file"`
	// JWKSURL is fetched (https, or http on a loopback host) and cached
	// for JWKSCache; exactly one of JWKSFile and JWKSURL.
	JWKSURL   string `yaml:"jwks_url"`
	JWKSCache string `yaml:"jwks_cache"`
	// Leeway bounds the clock skew allowed on exp and nbf.
	Leeway string `yaml:"leeway"`
}

// Defaults and bounds of the approval block.
const (
	DefaultApprovalTTL    = 24 * time.Hour
	DefaultApproverLeeway = 60 * time.Second
	MaxApproverLeeway     = 5 * time.Minute
	MaxApprovalsRequired  = 10
)

// ApprovalSettings is an operation's compiled approval block.
type ApprovalSettings struct {
	// Rules fire in order; any rule that matches requires approval.
	Rules []ApprovalRule
	// Verifier checks approvers' bearer tokens (its keys are stand-ins in
	// an offline check).
	Verifier *approver.Verifier
	// JWKSFile is where Verifier's keys were read (for the summary).
	JWKSFile string
	// DistinctFromRequester: the subject who asked may not approve (it may
	// still deny). Default true.
	DistinctFromRequester bool
	// Required is how many distinct approvers must approve (default 1).
	Required int
	// TTL is the longest life of an approval and of a fingerprint whose
	// params match an at_least rule; the webhook is retried for as long.
	TTL time.Duration
	// Notify is the webhook told of each new approval (nil: none).
	Notify *NotifySettings
	// PublicURL is the approvers' page as people reach it, without a
	// trailing slash ("" when not configured).
	PublicURL string
	// StepUp, when set, lets the requester approve with a strong, fresh
	// token (and only with one).
	StepUp *StepUpSettings
}

// ApprovalURL is where a person decides approval id ("" without
// public_url).
func (a *ApprovalSettings) ApprovalURL(id string) string {
	if a == nil || a.PublicURL == "" {
		return ""
	}
	return a.PublicURL + "/approvals/" + url.PathEscape(id)
}

// ApprovalRule is one compiled rule: AtLeast is set for {param, at_least},
// DailyTotal for {daily_total: ...}.
type ApprovalRule struct {
	// Param is the rule's param path as written in params; ParamIndex is its
	// position there (the selector's order).
	Param      string
	ParamIndex int
	AtLeast    *big.Rat
	DailyTotal *DailyTotalRule
	// Text is the rule as the approver is shown it, e.g. "amount >= 1000.00".
	Text string
}

// DailyTotalRule: approval is needed when the UTC day's sum of Param over
// the subject's executions and open approvals of the operation, per value
// of the Per params, plus this confirm, is strictly greater than Over.
type DailyTotalRule struct {
	Over string
	Per  []string
}

// Matches reports whether the bound value (the canonical text of a decimal
// param, as fingerprint binds it) fires the rule. A value that is not a
// decimal fires it: a rule that cannot be judged gates rather than lets
// through.
func (r *ApprovalRule) Matches(value string) bool {
	if r.AtLeast == nil {
		return false // a daily_total rule: the store judges it
	}
	v, ok := ParseDecimal(value)
	if !ok {
		return true
	}
	return v.Cmp(r.AtLeast) >= 0
}

var decimalPattern = regexp.MustCompile(`^-?[0-9]+(\.[0-9]+)?$`)

// ParseDecimal reads a plain decimal ("1000", "1000.00", "-0.5"; no
// exponent, no sign +) exactly.
func ParseDecimal(s string) (*big.Rat, bool) {
	s = strings.Trim(s, `"`)
	if !decimalPattern.MatchString(s) {
		return nil, false
	}
	r, ok := new(big.Rat).SetString(s)
	return r, ok
}

func (c *compiler) approval(op *Operation, a *ApprovalSpec, at func(...any) []any, rt *Runtime) *ApprovalSettings {
	out := &ApprovalSettings{DistinctFromRequester: true, Required: 1}
	base := func(segs ...any) []any { return at(append([]any{"approval"}, segs...)...) }
	if len(a.Rules) == 0 {
		c.errorf(base("rules"), "required: at least one rule (an approval block without rules gates nothing)")
	}
	for j, r := range a.Rules {
		rp := func(segs ...any) []any { return base(append([]any{"rules", j}, segs...)...) }
		switch {
		case r.DailyTotal != nil && (r.Param != "" || r.AtLeast != ""):
			c.errorf(rp(), "a rule is either {param, at_least} or {daily_total: {...}}, not both")
		case r.DailyTotal != nil:
			if rule, ok := c.dailyTotal(op, r.DailyTotal, func(segs ...any) []any { return rp(append([]any{"daily_total"}, segs...)...) }); ok {
				out.Rules = append(out.Rules, rule)
			}
		case r.Param == "":
			c.errorf(rp("param"), "required: the decimal param the rule compares")
		case r.AtLeast == "":
			c.errorf(rp("at_least"), "required: the smallest amount that needs approval, e.g. \"1000.00\"")
		default:
			rule := ApprovalRule{Param: r.Param, ParamIndex: -1}
			for k, prm := range op.Params {
				if prm.Path == r.Param {
					rule.ParamIndex = k
					if !prm.Decimal {
						c.errorf(rp("param"), "%s must be bound as {path: %s, type: decimal}: at_least compares exact decimals", r.Param, r.Param)
					}
				}
			}
			if rule.ParamIndex < 0 {
				c.errorf(rp("param"), "%s is not in params: a rule may only read a bound param (an unbound one could change after approval)", r.Param)
			}
			v, ok := ParseDecimal(r.AtLeast)
			if !ok {
				c.errorf(rp("at_least"), "invalid decimal %q: digits with an optional fraction, e.g. \"1000.00\"", r.AtLeast)
			}
			rule.AtLeast = v
			rule.Text = fmt.Sprintf("%s >= %s", r.Param, r.AtLeast)
			out.Rules = append(out.Rules, rule)
		}
	}
	if a.Approvers.Required != nil {
		out.Required = *a.Approvers.Required
		if out.Required < 1 || out.Required > MaxApprovalsRequired {
			c.errorf(base("approvers", "required"), "must be 1..%d, got %d", MaxApprovalsRequired, out.Required)
		}
	}
	if a.Approvers.DistinctFromRequester != nil {
		out.DistinctFromRequester = *a.Approvers.DistinctFromRequester
	}
	out.Verifier, out.JWKSFile = c.approverJWT(a.Approvers.JWT, func(segs ...any) []any { return base(append([]any{"approvers", "jwt"}, segs...)...) })
	out.TTL = c.duration(base("ttl"), a.TTL, DurationRule{Default: DefaultApprovalTTL})
	out.StepUp = c.stepUp(a.Approvers.RequesterStepUp, func(segs ...any) []any { return base(append([]any{"approvers", "requester_step_up"}, segs...)...) })
	if out.StepUp != nil && !out.DistinctFromRequester {
		c.errorf(base("approvers", "requester_step_up"), "has no effect with distinct_from_requester: false (the requester may approve anyway); remove one of them")
	}
	out.PublicURL = c.publicURL(a.PublicURL, base("public_url"))
	if a.Notify != nil {
		out.Notify = c.notify(a.Notify, func(segs ...any) []any { return base(append([]any{"notify"}, segs...)...) })
	}
	if need := out.TTL + rt.TTL.InFlight + TTLClockMargin; rt.TTL.Terminal < need {
		c.errorf(base("ttl"), "ttl.terminal (%s) must be at least approval.ttl + ttl.in_flight + %s (%s): a record must outlive every gated fingerprint that can reach it", rt.TTL.Terminal, TTLClockMargin, need)
	}
	return out
}

func (c *compiler) approverJWT(j *ApproverJWTSpec, at func(...any) []any) (*approver.Verifier, string) {
	if j == nil {
		c.errorf(at(), "required: how approvers' bearer tokens are verified ({issuer, audience, jwks_file or jwks_url})")
		return nil, ""
	}
	v := &approver.Verifier{Issuer: j.Issuer, Audience: j.Audience}
	if j.Issuer == "" {
		c.errorf(at("issuer"), "required: the iss an approver token must carry")
	} else if u, err := url.Parse(j.Issuer); err != nil || u.Scheme == "" {
		c.errorf(at("issuer"), "invalid issuer %q: a URL such as https://idp.example", j.Issuer)
	}
	if j.Audience == "" {
		c.errorf(at("audience"), "required: the aud an approver token must carry (one for idemgate approvals only)")
	}
	v.Leeway = c.duration(at("leeway"), j.Leeway, DurationRule{Default: DefaultApproverLeeway, AllowZero: true})
	if v.Leeway > MaxApproverLeeway {
		c.errorf(at("leeway"), "%s is too long (at most %s): leeway extends every approver token's life", v.Leeway, MaxApproverLeeway)
	}
	switch {
	case j.JWKSFile != "" && j.JWKSURL != "":
		c.errorf(at("jwks_url"), "set only one of jwks_file and jwks_url")
		return v, ""
	case j.JWKSURL != "":
		return c.approverJWKSURL(v, j, at)
	case j.JWKSCache != "":
		c.errorf(at("jwks_cache"), "applies to jwks_url only")
	}
	if j.JWKSFile == "" {
		c.errorf(at("jwks_file"), "required: the JWKS file (or jwks_url) whose keys sign approver tokens")
		return v, ""
	}
	if c.opts.Offline {
		return v, j.JWKSFile + " (not read: offline check)"
	}
	data, ok := c.readFile(at(), "jwks_file", "JWKS", j.JWKSFile)
	if !ok {
		return v, j.JWKSFile
	}
	keys, err := approver.ParseJWKS(data)
	if err != nil {
		c.errorf(at("jwks_file"), "%s: %v", j.JWKSFile, err)
		return v, j.JWKSFile
	}
	v.Keys = keys
	return v, j.JWKSFile
}

// Bounds of requester_step_up.
const (
	DefaultMaxAuthAge = 5 * time.Minute
	MaxMaxAuthAge     = time.Hour
)

func (c *compiler) stepUp(s *StepUpSpec, at func(...any) []any) *StepUpSettings {
	if s == nil {
		return nil
	}
	out := &StepUpSettings{}
	if len(s.ACR) == 0 && len(s.AMR) == 0 {
		c.errorf(at(), "required: acr (the listed authentication context classes) or amr (methods), e.g. acr: [\"urn:example:psd2:sca\"]")
	}
	list := func(key string, vals []string) []string {
		seen := map[string]bool{}
		for j, v := range vals {
			switch {
			case !stepUpValue(v):
				c.errorf(at(key, j), "invalid value %q: 1-128 visible ASCII characters, no spaces, quotes or backslashes (it is sent in WWW-Authenticate)", v)
			case seen[v]:
				c.errorf(at(key, j), "%s is listed twice", v)
			}
			seen[v] = true
		}
		return append([]string(nil), vals...)
	}
	out.ACR, out.AMR = list("acr", s.ACR), list("amr", s.AMR)
	out.MaxAuthAge = c.duration(at("max_auth_age"), s.MaxAuthAge, DurationRule{Default: DefaultMaxAuthAge})
	if out.MaxAuthAge > MaxMaxAuthAge {
		c.errorf(at("max_auth_age"), "%s is too long (at most %s): step-up asks for a fresh authentication", out.MaxAuthAge, MaxMaxAuthAge)
	}
	return out
}

func stepUpValue(v string) bool {
	if v == "" || len(v) > 128 {
		return false
	}
	for i := 0; i < len(v); i++ {
		if ch := v[i]; ch <= ' ' || ch > '~' || ch == '"' || ch == '\\' {
			return false
		}
	}
	return true
}

// publicURL checks approval.public_url: https (or http on a loopback host)
// with a host, no query or fragment; the trailing slash is dropped.
func (c *compiler) publicURL(s string, at []any) string {
	if s == "" {
		return ""
	}
	u, err := url.Parse(s)
	switch {
	case err != nil || u.Host == "" || (u.Scheme != "https" && u.Scheme != "http") || u.User != nil:
		c.errorf(at, "invalid URL %q: the approvers' page as people reach it, e.g. https://approvals.example.com", s)
		return ""
	case u.RawQuery != "" || u.Fragment != "" || strings.HasSuffix(s, "?") || strings.HasSuffix(s, "#"):
		c.errorf(at, "%s: no query or fragment (approval URLs are <public_url>/approvals/<id>)", s)
		return ""
	case u.Scheme == "http" && !loopbackHost(u.Hostname()):
		c.errorf(at, "%s: plain http is accepted for a loopback host only; people authenticate on this page", s)
		return ""
	}
	return strings.TrimRight(s, "/")
}

// notifyStandIn is the secret of an offline check: well-formed, public,
// never a real key.
const notifyStandIn = "whsec_b2ZmbGluZS1jaGVjay1zdGFuZC1pbi1zZWNyZXQ="

func (c *compiler) notify(n *NotifySpec, at func(...any) []any) *NotifySettings {
	if n.Webhook == nil {
		c.errorf(at(), "required: webhook {url_env, secret_env}")
		return nil
	}
	w := n.Webhook
	urlText, _, okURL := c.secret(at("webhook"), SecretRef{What: "approval webhook URL", EnvKey: "url_env", Env: w.URLEnv, FileKey: "url_file", StandIn: "https://offline.invalid/approvals"})
	secret, _, okSecret := c.secret(at("webhook"), SecretRef{What: "approval webhook secret", EnvKey: "secret_env", Env: w.SecretEnv, FileKey: "secret_file", StandIn: notifyStandIn})
	if !okURL || !okSecret {
		return nil
	}
	out := &NotifySettings{Source: "env " + w.URLEnv + ", secret env " + w.SecretEnv}
	u, err := url.Parse(urlText)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		c.errorf(at("webhook", "url_env"), "environment variable %s does not hold a URL (http:// or https:// with a host)", w.URLEnv)
		return nil
	}
	out.URL = urlText
	key, ok := DecodeWebhookSecret(secret)
	if !ok {
		c.errorf(at("webhook", "secret_env"), "environment variable %s does not hold a Standard Webhooks secret: whsec_ and the base64 of 24 to 64 random bytes", w.SecretEnv)
		return nil
	}
	out.Key = key
	return out
}

// DecodeWebhookSecret reads a Standard Webhooks secret, whsec_<base64>.
func DecodeWebhookSecret(s string) ([]byte, bool) {
	b64, ok := strings.CutPrefix(strings.TrimSpace(s), "whsec_")
	if !ok {
		return nil, false
	}
	key, err := base64.StdEncoding.DecodeString(b64)
	if err != nil || len(key) < 24 || len(key) > 64 {
		return nil, false
	}
	return key, true
}

// dailyTotal compiles a daily_total rule.
func (c *compiler) dailyTotal(op *Operation, d *DailyTotalSpec, at func(...any) []any) (ApprovalRule, bool) {
	rule := ApprovalRule{Param: d.Param, ParamIndex: -1, DailyTotal: &DailyTotalRule{Over: d.Over}}
	ok := true
	bound := func(path string) (int, bool) {
		for k, prm := range op.Params {
			if prm.Path == path {
				return k, prm.Decimal
			}
		}
		return -1, false
	}
	if d.Param == "" {
		c.errorf(at("param"), "required: the decimal param summed per day")
		ok = false
	} else if k, decimal := bound(d.Param); k < 0 {
		c.errorf(at("param"), "%s is not in params: a rule may only read a bound param (an unbound one could change after approval)", d.Param)
		ok = false
	} else if !decimal {
		c.errorf(at("param"), "%s must be bound as {path: %s, type: decimal}: daily_total sums exact decimals", d.Param, d.Param)
		ok = false
	} else {
		rule.ParamIndex = k
	}
	if d.Over == "" {
		c.errorf(at("over"), "required: the daily total above which approval is needed, e.g. \"5000.00\"")
		ok = false
	} else if _, valid := ParseDecimal(d.Over); !valid {
		c.errorf(at("over"), "invalid decimal %q: digits with an optional fraction, e.g. \"5000.00\"", d.Over)
		ok = false
	}
	seen := map[string]bool{}
	for j, per := range d.Per {
		switch k, _ := bound(per); {
		case seen[per]:
			c.errorf(at("per", j), "%s is listed twice", per)
			ok = false
		case k < 0:
			c.errorf(at("per", j), "%s is not in params: a budget may only be split by bound params", per)
			ok = false
		case per == d.Param:
			c.errorf(at("per", j), "%s is the summed param itself", per)
			ok = false
		}
		seen[per] = true
		rule.DailyTotal.Per = append(rule.DailyTotal.Per, per)
	}
	rule.Text = "daily total of " + d.Param
	if len(d.Per) > 0 {
		rule.Text += " per " + strings.Join(d.Per, ", ")
	}
	rule.Text += " > " + d.Over
	return rule, ok
}

// HasDailyTotal reports whether some rule is a daily_total.
func (a *ApprovalSettings) HasDailyTotal() bool {
	for _, r := range a.Rules {
		if r.DailyTotal != nil {
			return true
		}
	}
	return false
}

// approverJWKSURL checks jwks_url; the keys are fetched when the first
// token is verified (an IdP that is down must not stop serve), then cached.
func (c *compiler) approverJWKSURL(v *approver.Verifier, j *ApproverJWTSpec, at func(...any) []any) (*approver.Verifier, string) {
	u, err := url.Parse(j.JWKSURL)
	switch {
	case err != nil || u.Host == "" || (u.Scheme != "https" && u.Scheme != "http"):
		c.errorf(at("jwks_url"), "invalid URL %q: use https:// with a host", j.JWKSURL)
	case u.Scheme == "http" && !loopbackHost(u.Hostname()):
		c.errorf(at("jwks_url"), "%s: plain http is accepted for a loopback host only; the keys that decide who approves must not travel unprotected", j.JWKSURL)
	}
	cache := c.duration(at("jwks_cache"), j.JWKSCache, DurationRule{Default: approver.DefaultJWKSCache})
	v.Remote = &approver.RemoteJWKS{URL: j.JWKSURL, Cache: cache}
	return v, j.JWKSURL + " (cached " + cache.String() + ")"
}

func loopbackHost(h string) bool {
	if h == "localhost" {
		return true
	}
	ip := net.ParseIP(h)
	return ip != nil && ip.IsLoopback()
}

func (a *ApprovalSettings) summary() string {
	var rules []string
	for _, r := range a.Rules {
		rules = append(rules, r.Text)
	}
	four := "the requester may approve"
	if a.DistinctFromRequester {
		four = "not the requester"
	}
	notify := ""
	if a.Notify != nil {
		notify = "; notify webhook (" + a.Notify.Source + ")"
	}
	if a.StepUp != nil && a.DistinctFromRequester {
		four += fmt.Sprintf(" unless stepped up (acr %s, amr %s, auth within %s)", strings.Join(a.StepUp.ACR, " "), strings.Join(a.StepUp.AMR, " "), a.StepUp.MaxAuthAge)
	}
	if a.PublicURL != "" {
		notify += "; page " + a.PublicURL
	}
	return fmt.Sprintf("when %s; %d approver(s), %s; ttl %s; tokens iss %s aud %s from %s (leeway %s)%s",
		strings.Join(rules, " or "), a.Required, four, a.TTL, a.Verifier.Issuer, a.Verifier.Audience, a.JWKSFile, a.Verifier.Leeway, notify)
}
