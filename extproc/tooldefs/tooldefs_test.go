package tooldefs

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/cmd/idemgate/settings"
	"github.com/idemgate/idemgate/extproc/config"
	"github.com/idemgate/idemgate/extproc/envelope"
	"github.com/idemgate/idemgate/fingerprint"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

const shippedConfig = "../../envoy/idemgate.yaml"

func load(t *testing.T, path string) *config.Runtime {
	t.Helper()
	// A whole idemgate.yaml: the binary's settings read it, and hand the
	// ext_proc part over.
	cfg, _, err := settings.Load(path, config.Options{Offline: true})
	require.NoError(t, err)
	return cfg.Runtime
}

// parse compiles a config whose operations section is ops.
func parse(t *testing.T, head, ops string) (*config.Runtime, error) {
	t.Helper()
	src := "signing: {active_key: k1, keys: {k1: {env: K1}}}\n" + head + "\noperations:\n" + ops
	rt, _, err := config.Parse("test.yaml", []byte(src), t.TempDir(), config.Options{Offline: true})
	return rt, err
}

const transferOp = `  - name: transfer
    scope: payments.transfer
    preview: {method: POST, path: /v1/transfers/preview}
    confirm: {method: POST, path: /v1/transfers/confirm}
    status:  {method: POST, path: /v1/transfers/status}
    preview_tool: transfer_preview
    status_tool: transfer_status
    params: [{path: amount, type: decimal}, currency, payee.account_id]
`

func render(t *testing.T, rt *config.Runtime, f Format) []byte {
	t.Helper()
	defs, err := Definitions(rt)
	require.NoError(t, err)
	var buf bytes.Buffer
	require.NoError(t, Render(&buf, defs, f))
	return buf.Bytes()
}

// The shapes below are written from each provider's published reference,
// not from this package: a decoder that refuses unknown fields reads the
// output into them, and the checks that follow hold what the references
// require (names, the object-typed schema).

// jsonSchema is the subset of JSON Schema keywords the providers document for
// tool parameters; any other keyword in the output is an error.
type jsonSchema struct {
	Type                 string                 `json:"type"`
	Description          string                 `json:"description"`
	Properties           map[string]*jsonSchema `json:"properties"`
	Required             []string               `json:"required"`
	Items                *jsonSchema            `json:"items"`
	MinItems             *int                   `json:"minItems"`
	AnyOf                []*jsonSchema          `json:"anyOf"`
	Pattern              string                 `json:"pattern"`
	Enum                 []any                  `json:"enum"`
	AdditionalProperties *bool                  `json:"additionalProperties"`
}

// OpenAI Chat Completions: tools is an array of {"type": "function",
// "function": {name, description, parameters, strict}}; the name is a-z, A-Z,
// 0-9, underscores and dashes, at most 64; parameters is a JSON Schema object.
type openAITool struct {
	Type     string `json:"type"`
	Function *struct {
		Name        *string     `json:"name"`
		Description *string     `json:"description"`
		Parameters  *jsonSchema `json:"parameters"`
		Strict      *bool       `json:"strict"`
	} `json:"function"`
}

// Anthropic Messages API: tools is an array of {name, description,
// input_schema, cache_control}; name matches ^[a-zA-Z0-9_-]{1,64}$;
// input_schema is a JSON Schema with type "object".
type anthropicTool struct {
	Name         *string         `json:"name"`
	Description  *string         `json:"description"`
	InputSchema  *jsonSchema     `json:"input_schema"`
	CacheControl json.RawMessage `json:"cache_control"`
}

// MCP (2025-11-25) tools/list result: {"tools": [Tool], "nextCursor"?};
// Tool has name (required), title, description, inputSchema (required, type
// "object"), outputSchema, annotations (title and the boolean hints
// readOnlyHint, destructiveHint, idempotentHint, openWorldHint), icons and
// _meta.
type mcpResult struct {
	Tools *[]struct {
		Name         *string         `json:"name"`
		Title        string          `json:"title"`
		Description  *string         `json:"description"`
		InputSchema  *jsonSchema     `json:"inputSchema"`
		OutputSchema json.RawMessage `json:"outputSchema"`
		Annotations  *struct {
			Title           string `json:"title"`
			ReadOnlyHint    *bool  `json:"readOnlyHint"`
			DestructiveHint *bool  `json:"destructiveHint"`
			IdempotentHint  *bool  `json:"idempotentHint"`
			OpenWorldHint   *bool  `json:"openWorldHint"`
		} `json:"annotations"`
		Icons json.RawMessage `json:"icons"`
		Meta  json.RawMessage `json:"_meta"`
	} `json:"tools"`
	NextCursor *string `json:"nextCursor"`
}

var (
	providerFunctionName = regexp.MustCompile(`^[a-zA-Z0-9_-]{1,64}$`)
	providerMCPName      = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,128}$`)
)

// defined is one tool read back from a provider's shape.
type defined struct {
	name, description string
	schema            *jsonSchema
}

func decodeStrict(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if dec.More() {
		return errors.New("more than one JSON document")
	}
	return nil
}

// readBack decodes output of format f against its provider's shape and
// returns the tools it defines.
func readBack(t *testing.T, f Format, data []byte) []defined {
	t.Helper()
	out, err := readShape(f, data)
	require.NoError(t, err)
	return out
}

func readShape(f Format, data []byte) ([]defined, error) {
	var out []defined
	var errs []error
	need := func(ok bool, what string) {
		if !ok {
			errs = append(errs, errors.New(what))
		}
	}
	switch f {
	case OpenAI:
		var tools []openAITool
		if err := decodeStrict(data, &tools); err != nil {
			return nil, err
		}
		for _, tl := range tools {
			need(tl.Type == "function", `type must be "function"`)
			if tl.Function == nil || tl.Function.Name == nil || tl.Function.Description == nil || tl.Function.Parameters == nil {
				errs = append(errs, errors.New("function needs name, description and parameters"))
				continue
			}
			need(providerFunctionName.MatchString(*tl.Function.Name), "name "+*tl.Function.Name+" breaks the name rule")
			out = append(out, defined{*tl.Function.Name, *tl.Function.Description, tl.Function.Parameters})
		}
	case Anthropic:
		var tools []anthropicTool
		if err := decodeStrict(data, &tools); err != nil {
			return nil, err
		}
		for _, tl := range tools {
			if tl.Name == nil || tl.InputSchema == nil || tl.Description == nil {
				errs = append(errs, errors.New("a tool needs name, description and input_schema"))
				continue
			}
			need(providerFunctionName.MatchString(*tl.Name), "name "+*tl.Name+" breaks the name rule")
			out = append(out, defined{*tl.Name, *tl.Description, tl.InputSchema})
		}
	case MCP:
		var res mcpResult
		if err := decodeStrict(data, &res); err != nil {
			return nil, err
		}
		if res.Tools == nil {
			return nil, errors.New("a tools/list result needs tools")
		}
		for _, tl := range *res.Tools {
			if tl.Name == nil || tl.InputSchema == nil || tl.Description == nil {
				errs = append(errs, errors.New("a tool needs name, description and inputSchema"))
				continue
			}
			need(providerMCPName.MatchString(*tl.Name), "name "+*tl.Name+" breaks the name rule")
			out = append(out, defined{*tl.Name, *tl.Description, tl.InputSchema})
		}
	default:
		return nil, fmt.Errorf("unknown format %s", f)
	}
	for _, d := range out {
		need(d.schema.Type == "object", d.name+": the input schema of a tool is an object")
		need(d.description != "", d.name+": empty description")
		errs = append(errs, checkSchema(d.name, d.schema)...)
	}
	return out, errors.Join(errs...)
}

// checkSchema holds a schema to JSON Schema's own rules: known types,
// required names existing properties, patterns that compile.
func checkSchema(at string, s *jsonSchema) []error {
	var errs []error
	if s.Type != "" && !slices.Contains([]string{"object", "array", "string", "number", "integer", "boolean", "null"}, s.Type) {
		errs = append(errs, fmt.Errorf("%s: unknown type %q", at, s.Type))
	}
	for _, r := range s.Required {
		if _, ok := s.Properties[r]; !ok {
			errs = append(errs, fmt.Errorf("%s: required %s is no property", at, r))
		}
	}
	if s.Type == "array" && s.Items == nil {
		errs = append(errs, fmt.Errorf("%s: array without items", at))
	}
	if s.Pattern != "" {
		if _, err := regexp.Compile(s.Pattern); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", at, err))
		}
	}
	for name, p := range s.Properties {
		errs = append(errs, checkSchema(at+"."+name, p)...)
	}
	if s.Items != nil {
		errs = append(errs, checkSchema(at+"[]", s.Items)...)
	}
	for i, a := range s.AnyOf {
		errs = append(errs, checkSchema(fmt.Sprintf("%s.anyOf[%d]", at, i), a)...)
	}
	return errs
}

// TestShapeChecksCanFail: the provider shape checks refuse the other
// providers' shapes and broken definitions.
func TestShapeChecksCanFail(t *testing.T) {
	rt := load(t, shippedConfig)
	out := map[Format][]byte{}
	for _, f := range Formats() {
		out[f] = render(t, rt, f)
	}
	for _, read := range Formats() {
		for _, wrote := range Formats() {
			if read == wrote {
				continue
			}
			_, err := readShape(read, out[wrote])
			require.Error(t, err, "%s output read as %s", wrote, read)
		}
	}
	for _, tt := range []struct {
		f        Format
		from, to string
	}{
		{Anthropic, `"name": "transfer_status"`, `"name": "transfer:status"`},
		{OpenAI, `"type": "function"`, `"type": "tool"`},
		{MCP, `"inputSchema": {
        "type": "object"`, `"inputSchema": {
        "type": "string"`},
		{MCP, `"required": [
          "fingerprint"
        ]`, `"required": [
          "token"
        ]`},
		{Anthropic, `"type": "string"`, `"type": "text"`},
	} {
		bad := strings.Replace(string(out[tt.f]), tt.from, tt.to, 1)
		require.NotEqual(t, string(out[tt.f]), bad, "%s: %s not found", tt.f, tt.from)
		_, err := readShape(tt.f, []byte(bad))
		require.Error(t, err, "%s with %s", tt.f, tt.to)
		t.Log(err)
	}
}

func TestShippedConfigGolden(t *testing.T) {
	rt := load(t, shippedConfig)
	for _, f := range Formats() {
		t.Run(string(f), func(t *testing.T) {
			got := render(t, rt, f)
			golden := filepath.Join("testdata", "envoy-idemgate."+string(f)+".json")
			if *update {
				require.NoError(t, os.WriteFile(golden, got, 0o644))
			}
			want, err := os.ReadFile(golden)
			require.NoError(t, err, "run go test ./extproc/tooldefs/ -update to write it")
			require.Equal(t, string(want), string(got))
			tools := readBack(t, f, got)
			var names []string
			for _, d := range tools {
				names = append(names, d.name)
			}
			require.Equal(t, []string{"transfer_preview", "transfer_confirm", "transfer_status"}, names)
			if f == MCP {
				var res mcpResult
				require.NoError(t, decodeStrict(got, &res))
				hints := func(i int) (ro, idem bool) {
					a := (*res.Tools)[i].Annotations
					require.NotNil(t, a)
					return a.ReadOnlyHint != nil && *a.ReadOnlyHint, a.IdempotentHint != nil && *a.IdempotentHint
				}
				ro, _ := hints(0)
				require.True(t, ro, "preview changes nothing")
				ro, idem := hints(1)
				require.False(t, ro, "confirm executes")
				require.True(t, idem, "a repeated confirm has no further effect")
				require.Nil(t, (*res.Tools)[1].Annotations.DestructiveHint, "left to its default: a payment cannot be undone")
				ro, idem = hints(2)
				require.True(t, ro && idem)
			}
		})
	}
}

// envelopeTools returns every tool name the operation's envelopes hand the
// agent (preview_with, poll_with) across all messages, and the texts they
// carry.
func envelopeTools(t *testing.T, op *config.Operation) (names []string, texts []string) {
	t.Helper()
	for _, m := range envelope.Messages() {
		r := op.Envelopes.Render(m, "trace", 200, envelope.Extra{})
		var body struct {
			Meaning     string `json:"meaning"`
			Instruction string `json:"instruction"`
			PreviewWith string `json:"preview_with"`
			PollWith    string `json:"poll_with"`
		}
		require.NoError(t, json.Unmarshal(r.Body, &body))
		for _, n := range []string{body.PreviewWith, body.PollWith} {
			if n != "" && !slices.Contains(names, n) {
				names = append(names, n)
			}
		}
		texts = append(texts, body.Meaning, body.Instruction)
	}
	return names, texts
}

// TestEveryToolTheEnvelopesMentionIsDefined: an agent told "poll
// transfer_status" or "call transfer_preview" must have that tool, in every
// format, and a tool name in an envelope's text is one of them.
func TestEveryToolTheEnvelopesMentionIsDefined(t *testing.T) {
	rt, err := parse(t, "", transferOp+`  - name: refund
    scope: payments.refund
    preview: {method: POST, path: /v1/refunds/preview}
    confirm: {method: POST, path: /v1/refunds/confirm}
    status:  {method: POST, path: /v1/refunds/status}
    preview_tool: quote_refund
    status_tool: refund_state
    params: [amount]
`)
	require.NoError(t, err)
	for _, f := range Formats() {
		t.Run(string(f), func(t *testing.T) {
			var defs []string
			for _, d := range readBack(t, f, render(t, rt, f)) {
				defs = append(defs, d.name)
			}
			require.Len(t, defs, 6)
			for _, op := range rt.Operations {
				names, texts := envelopeTools(t, op)
				require.ElementsMatch(t, []string{op.PreviewTool, op.StatusTool}, names, "the envelopes name both tools")
				for _, n := range names {
					require.Contains(t, defs, n, "operation %s: envelopes mention %s", op.Name, n)
				}
				for _, other := range rt.Operations {
					if other == op {
						continue
					}
					for _, text := range texts {
						require.NotContains(t, text, other.PreviewTool, "operation %s names another operation's tool", op.Name)
						require.NotContains(t, text, other.StatusTool, "operation %s names another operation's tool", op.Name)
					}
				}
			}
			require.Contains(t, defs, "refund_confirm", "a preview tool not named *preview gives <operation>_confirm")
		})
	}
}

// TestDescriptionsQuoteTheEnvelopes: the confirm and status descriptions
// carry the instructions the agent will read, in the configured language and
// with the configured overrides.
func TestDescriptionsQuoteTheEnvelopes(t *testing.T) {
	for _, tt := range []struct {
		name, head string
		override   string
		want       []string
	}{
		{"en", "messages: {language: en}", "", []string{"Step 2 of 2", "Wait 2 seconds, then call transfer_status"}},
		{"zh", "messages: {language: zh}", "", []string{"第 2 步", "用同一个指纹调用 transfer_status"}},
		{"override", "", "    messages: {in_progress: {instruction: \"Stop and poll transfer_status in {poll_after_seconds} s.\"}}\n",
			[]string{"Stop and poll transfer_status in 2 s."}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			rt, err := parse(t, tt.head, transferOp+tt.override)
			require.NoError(t, err)
			op := rt.Operations[0]
			defs, err := Definitions(rt)
			require.NoError(t, err)
			require.Len(t, defs, 3)
			byKind := map[config.Kind]Tool{}
			for _, d := range defs {
				byKind[d.Kind] = d
			}
			confirm, status := byKind[config.KindConfirm].Description, byKind[config.KindStatus].Description
			for _, w := range tt.want {
				require.Contains(t, confirm, w)
			}
			for _, q := range []struct {
				m    envelope.Message
				into string
			}{
				{envelope.InProgress, confirm},
				{envelope.TemporarilyUnavailable, confirm},
				{envelope.StatusInProgress, status},
				{envelope.StatusNeedsReconciliation, status},
			} {
				_, instruction, err := envelopeInstruction(op.Envelopes, q.m)
				require.NoError(t, err)
				require.NotEmpty(t, instruction)
				require.Contains(t, q.into, instruction, "%s is quoted as the agent reads it", q.m)
			}
			if tt.name == "zh" {
				for _, d := range defs {
					require.Regexp(t, `\p{Han}`, d.Description, d.Name)
					require.NotContains(t, d.Description, "Step ", d.Name)
					require.NotContains(t, d.Description, "。 ", "%s: Chinese sentences are not joined with spaces", d.Name)
				}
			}
			require.Contains(t, byKind[config.KindConfirm].InputSchema.Properties, op.FingerprintField)
			require.Contains(t, byKind[config.KindConfirm].InputSchema.Required, op.FingerprintField)
			require.NotEmpty(t, byKind[config.KindConfirm].InputSchema.Properties[op.FingerprintField].Description)
		})
	}
}

// TestInputSchemaFromParams: dotted paths nest, digit segments index arrays,
// path.<name> is its own string property, decimals take a string or a number,
// and the confirm schema adds the fingerprint under fingerprint_field.
func TestInputSchemaFromParams(t *testing.T) {
	rt, err := parse(t, "", `  - name: pay
    scope: accounts.pay
    preview: {method: POST, path: "/v1/accounts/{account}/pay/preview"}
    confirm: {method: POST, path: "/v1/accounts/{account}/pay/confirm"}
    status:  {method: POST, path: /v1/pay/status}
    preview_tool: pay_preview
    status_tool: pay_status
    fingerprint_field: token
    params: [path.account, {path: total.value, type: decimal}, total.currency, items.0.sku, items.1.sku, items.0.qty]
`)
	require.NoError(t, err)
	defs, err := Definitions(rt)
	require.NoError(t, err)
	var buf bytes.Buffer
	require.NoError(t, Render(&buf, defs, Anthropic))
	tools := readBack(t, Anthropic, buf.Bytes())
	require.Len(t, tools, 3)
	for _, d := range tools[:2] {
		s := d.schema
		require.ElementsMatch(t, []string{"total", "items", "account"}, slices.DeleteFunc(slices.Clone(s.Required), func(r string) bool { return r == "token" }))
		require.Equal(t, "string", s.Properties["account"].Type)
		require.Contains(t, s.Properties["account"].Description, "{account}")
		total := s.Properties["total"]
		require.Equal(t, "object", total.Type)
		require.ElementsMatch(t, []string{"value", "currency"}, total.Required)
		require.Len(t, total.Properties["value"].AnyOf, 2)
		items := s.Properties["items"]
		require.Equal(t, "array", items.Type)
		require.NotNil(t, items.MinItems)
		require.Equal(t, 2, *items.MinItems)
		require.Equal(t, "object", items.Items.Type)
		require.ElementsMatch(t, []string{"sku", "qty"}, items.Items.Required)
	}
	require.NotContains(t, tools[0].schema.Properties, "token", "preview takes no fingerprint")
	require.Contains(t, tools[1].schema.Required, "token")
	require.Equal(t, []string{"token"}, tools[2].schema.Required)
	require.Len(t, tools[2].schema.Properties, 1)
	require.Contains(t, tools[1].description, "`token`")
}

// TestDecimalPatternIsTheCanonicalGrammar: a string the schema's pattern
// admits is exactly a string a `type: decimal` param accepts.
func TestDecimalPatternIsTheCanonicalGrammar(t *testing.T) {
	re := regexp.MustCompile(decimalPattern)
	for _, s := range []string{"0", "1", "100.00", "-3.5", "1e3", "1E-7", "12345678901234567.89", "0.0",
		"", "+1", ".5", "5.", "01", "1e", "1.2.3", "0x10", "NaN", "Infinity", " 1", "1 ", "--1", "1e+", "-"} {
		_, err := fingerprint.CanonicalDecimal(s)
		require.Equal(t, err == nil, re.MatchString(s), "%q", s)
	}
}

// TestSchemaConflictsAreErrors: params that cannot be one JSON document (a
// value and a field inside it, an object and an array, a path segment and a
// body field of the same name) are refused.
func TestSchemaConflictsAreErrors(t *testing.T) {
	for _, params := range []string{
		"[payee, payee.account_id]",
		"[items.0, items.x]",
		"[items.0.sku, {path: items.1.sku, type: decimal}]",
		"[path.amount, amount]",
	} {
		t.Run(params, func(t *testing.T) {
			op := strings.Replace(transferOp, "[{path: amount, type: decimal}, currency, payee.account_id]", params, 1)
			op = strings.ReplaceAll(op, "path: /v1/transfers/preview", `path: "/v1/{amount}/preview"`)
			op = strings.ReplaceAll(op, "path: /v1/transfers/confirm", `path: "/v1/{amount}/confirm"`)
			rt, err := parse(t, "", op)
			require.NoError(t, err, "the config accepts it; the tool schema cannot")
			_, err = Definitions(rt)
			require.Error(t, err)
			t.Log(err)
		})
	}
}

// TestNamesOutsideAProviderRuleAreRefused: the config admits names a
// provider does not (":" "/" ".", over 64 characters); Render refuses them
// instead of renaming a tool the envelopes mention.
func TestNamesOutsideAProviderRuleAreRefused(t *testing.T) {
	long := strings.Repeat("a", 70) + "_preview"
	for _, tt := range []struct {
		preview string
		ok      map[Format]bool
	}{
		{"transfer_preview", map[Format]bool{OpenAI: true, Anthropic: true, MCP: true}},
		{"payments.transfer_preview", map[Format]bool{MCP: true}},
		{long, map[Format]bool{MCP: true}},
		{"payments:transfer_preview", map[Format]bool{}},
		{"payments/transfer_preview", map[Format]bool{}},
	} {
		rt, err := parse(t, "", strings.Replace(transferOp, "preview_tool: transfer_preview", "preview_tool: "+tt.preview, 1))
		require.NoError(t, err, tt.preview)
		defs, err := Definitions(rt)
		require.NoError(t, err)
		for _, f := range Formats() {
			var buf bytes.Buffer
			err := Render(&buf, defs, f)
			if tt.ok[f] {
				require.NoError(t, err, "%s in %s", tt.preview, f)
				readBack(t, f, buf.Bytes())
			} else {
				require.Error(t, err, "%s in %s", tt.preview, f)
				require.Contains(t, err.Error(), tt.preview)
				require.Zero(t, buf.Len(), "nothing is printed when a name is refused")
			}
		}
	}
	t.Run("a name used twice", func(t *testing.T) {
		rt, err := parse(t, "", transferOp+strings.NewReplacer("name: transfer", "name: refund", "payments.transfer", "payments.refund",
			"/v1/transfers/", "/v1/refunds/").Replace(transferOp))
		require.NoError(t, err)
		defs, err := Definitions(rt)
		require.NoError(t, err)
		err = Render(&bytes.Buffer{}, defs, MCP)
		require.ErrorContains(t, err, "used twice")
	})
	require.Error(t, Render(&bytes.Buffer{}, nil, Format("gemini")))
}

// TestApprovalIsExplainedToTheModel (docs/design.md §10): for an operation
// with approval, the confirm tool quotes approval_pending's instruction
// (wait, poll the status tool, do not preview again) and the status tool
// lists the approval states and quotes approval_granted's.
func TestApprovalIsExplainedToTheModel(t *testing.T) {
	gated := transferOp + `    approval:
      rules: [{param: amount, at_least: "1000"}]
      approvers: {jwt: {issuer: https://idp.example, audience: a, jwks_file: approvers.jwks}}
`
	rt, err := parse(t, "", gated)
	require.NoError(t, err)
	op := rt.Operations[0]
	defs, err := Definitions(rt)
	require.NoError(t, err)
	byKind := map[config.Kind]Tool{}
	for _, d := range defs {
		byKind[d.Kind] = d
	}
	_, pending, err := envelopeInstruction(op.Envelopes, envelope.ApprovalPending)
	require.NoError(t, err)
	require.Contains(t, pending, "Do not start a new preview")
	require.Contains(t, byKind[config.KindConfirm].Description, pending)
	_, granted, err := envelopeInstruction(op.Envelopes, envelope.StatusApprovalGranted)
	require.NoError(t, err)
	require.Contains(t, byKind[config.KindStatus].Description, granted)
	require.Contains(t, byKind[config.KindStatus].Description, "`approval_pending`")

	plain, err := parse(t, "", transferOp)
	require.NoError(t, err)
	defs, err = Definitions(plain)
	require.NoError(t, err)
	for _, d := range defs {
		require.NotContains(t, d.Description, "approval", "operations without approval say nothing of it")
	}
}
