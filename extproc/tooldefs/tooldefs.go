// Package tooldefs renders the tool definitions an agent developer gives a
// model for each idemgate operation: the preview, confirm and status tools,
// in the shapes of OpenAI's Chat Completions, Anthropic's Messages API and
// MCP's tools/list.
//
// The descriptions agree with what idemgate later answers because they quote
// it: the instructions for in_progress, temporarily_unavailable and the status
// tool's answers are taken from the operation's compiled envelopes (catalogue
// text, language and per-operation overrides included), and the tool names
// are the ones those envelopes carry in preview_with and poll_with.
package tooldefs

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/idemgate/idemgate/extproc/config"
	"github.com/idemgate/idemgate/extproc/envelope"
)

// Format is a provider's tool definition shape.
type Format string

// The supported formats.
const (
	OpenAI    Format = "openai"    // Chat Completions `tools`: [{"type":"function","function":{...}}]
	Anthropic Format = "anthropic" // Messages API `tools`: [{"name","description","input_schema"}]
	MCP       Format = "mcp"       // a tools/list result: {"tools":[{"name","description","inputSchema"}]}
)

// Formats lists the formats in a stable order.
func Formats() []Format { return []Format{OpenAI, Anthropic, MCP} }

// NamePattern is each format's rule for tool names: OpenAI's and Anthropic's
// documented ^[a-zA-Z0-9_-]{1,64}$, and MCP's (2025-11-25) 1 to 128 of
// A-Z a-z 0-9 _ - . (idemgate's config accepts more, ":" and "/" too, so a
// name it accepts may still not fit a provider; Render refuses it rather than
// renaming a tool the envelopes mention).
func NamePattern(f Format) *regexp.Regexp {
	if f == MCP {
		return mcpName
	}
	return functionName
}

var (
	functionName = regexp.MustCompile(`^[a-zA-Z0-9_-]{1,64}$`)
	mcpName      = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,128}$`)
	// decimalPattern is the JSON number grammar fingerprint.CanonicalDecimal
	// accepts in a `type: decimal` string.
	decimalPattern = `^-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?$`
)

// Schema is the subset of JSON Schema the definitions use. Properties is a
// map, so encoding/json writes it with sorted keys: the output is stable.
type Schema struct {
	Type        string             `json:"type,omitempty"`
	Description string             `json:"description,omitempty"`
	Properties  map[string]*Schema `json:"properties,omitempty"`
	Required    []string           `json:"required,omitempty"`
	Items       *Schema            `json:"items,omitempty"`
	MinItems    int                `json:"minItems,omitempty"`
	AnyOf       []*Schema          `json:"anyOf,omitempty"`
	Pattern     string             `json:"pattern,omitempty"`
}

// Kind says which of an operation's routes a tool calls.
type Kind = config.Kind

// Tool is one provider-neutral tool definition.
type Tool struct {
	Operation   string
	Kind        Kind
	Name        string
	Description string
	InputSchema *Schema
}

// ConfirmTool is the name given to an operation's confirm tool. The config
// names only the preview and status tools (the ones the envelopes mention;
// confirm answers say "this tool"), so the confirm tool is named after the
// preview tool: "transfer_preview" gives "transfer_confirm"; a preview tool
// whose name does not end in "preview" gives "<operation>_confirm".
func ConfirmTool(op *config.Operation) string {
	if stem, ok := strings.CutSuffix(op.PreviewTool, "preview"); ok && stem != "" {
		return stem + "confirm"
	}
	return op.Name + "_confirm"
}

// Definitions returns the preview, confirm and status tools of every HTTP
// operation of rt, in config order, with descriptions in rt.Language.
func Definitions(rt *config.Runtime) ([]Tool, error) {
	t, ok := catalogues[rt.Language]
	if !ok {
		return nil, fmt.Errorf("no tool texts for language %q", rt.Language)
	}
	var out []Tool
	var errs []error
	for _, op := range rt.Operations {
		if op.MCP != nil {
			// An MCP operation's tools are the MCP server's own; idemgate
			// adds the fingerprint argument and the status tool to its
			// tools/list answer (docs/design.md §9).
			continue
		}
		tools, err := operationTools(op, t)
		if err != nil {
			errs = append(errs, fmt.Errorf("operation %s: %w", op.Name, err))
			continue
		}
		out = append(out, tools...)
	}
	return out, errors.Join(errs...)
}

func operationTools(op *config.Operation, t texts) ([]Tool, error) {
	if op.Envelopes == nil {
		return nil, errors.New("envelopes not compiled")
	}
	var paramNames []string
	for _, p := range op.Params {
		paramNames = append(paramNames, "`"+p.Path+"`")
	}
	statusMsgs := []envelope.Message{envelope.StatusNotStarted, envelope.StatusInProgress, envelope.StatusCompleted,
		envelope.StatusFailed, envelope.StatusNeedsReconciliation}
	confirmWhenMsgs := []envelope.Message{envelope.InProgress, envelope.TemporarilyUnavailable}
	statusWhenMsgs := []envelope.Message{envelope.StatusInProgress, envelope.StatusNeedsReconciliation}
	if op.Approval != nil {
		// docs/design.md §10: the model must know that approval_pending
		// means wait and poll, not preview again.
		statusMsgs = append(statusMsgs, envelope.StatusApprovalPending, envelope.StatusApprovalGranted,
			envelope.StatusApprovalDenied, envelope.StatusApprovalExpired)
		confirmWhenMsgs = append(confirmWhenMsgs, envelope.ApprovalPending)
		statusWhenMsgs = append(statusWhenMsgs, envelope.StatusApprovalGranted)
	}
	var statuses []string
	for _, m := range statusMsgs {
		s, _ := envelope.SpecOf(m)
		statuses = append(statuses, "`"+s.Status+"`")
	}
	expand := strings.NewReplacer(
		"{operation}", op.Name,
		"{preview_tool}", op.PreviewTool,
		"{confirm_tool}", ConfirmTool(op),
		"{status_tool}", op.StatusTool,
		"{fingerprint_field}", op.FingerprintField,
		"{params}", strings.Join(paramNames, t.ListSeparator),
		"{statuses}", strings.Join(statuses, t.ListSeparator),
	).Replace

	quote := func(ms ...envelope.Message) (string, error) {
		var parts []string
		for _, m := range ms {
			status, instruction, err := envelopeInstruction(op.Envelopes, m)
			if err != nil {
				return "", err
			}
			parts = append(parts, strings.NewReplacer("{status}", status, "{instruction}", instruction).Replace(t.When))
		}
		return strings.Join(parts, t.SentenceSeparator), nil
	}
	confirmWhen, err := quote(confirmWhenMsgs...)
	if err != nil {
		return nil, err
	}
	statusWhen, err := quote(statusWhenMsgs...)
	if err != nil {
		return nil, err
	}

	preview, err := paramsSchema(op, t, expand(t.ParamPreview), expand)
	if err != nil {
		return nil, err
	}
	confirm, err := paramsSchema(op, t, expand(t.ParamConfirm), expand)
	if err != nil {
		return nil, err
	}
	fingerprint := &Schema{Type: "string", Description: expand(t.Fingerprint)}
	confirm.Properties[op.FingerprintField] = fingerprint
	confirm.Required = append(confirm.Required, op.FingerprintField)
	status := &Schema{
		Type:       "object",
		Properties: map[string]*Schema{op.FingerprintField: fingerprint},
		Required:   []string{op.FingerprintField},
	}
	return []Tool{
		{Operation: op.Name, Kind: config.KindPreview, Name: op.PreviewTool, Description: expand(t.Preview), InputSchema: preview},
		{Operation: op.Name, Kind: config.KindConfirm, Name: ConfirmTool(op), Description: expand(t.Confirm) + t.SentenceSeparator + confirmWhen, InputSchema: confirm},
		{Operation: op.Name, Kind: config.KindStatus, Name: op.StatusTool, Description: expand(t.Status) + t.SentenceSeparator + statusWhen, InputSchema: status},
	}, nil
}

// envelopeInstruction returns the status and instruction of message m as the
// agent will read them: rendered by the operation's own envelopes, so the
// configured language and overrides apply.
func envelopeInstruction(set *envelope.Set, m envelope.Message) (string, string, error) {
	r := set.Render(m, "", 0, envelope.Extra{})
	var body struct {
		Status      string `json:"status"`
		Instruction string `json:"instruction"`
	}
	if err := json.Unmarshal(r.Body, &body); err != nil {
		return "", "", fmt.Errorf("envelope %s: %w", m, err)
	}
	return body.Status, body.Instruction, nil
}

// paramsSchema builds the input schema of the bound params: a dotted path
// becomes nested objects, an all-digit segment an array index, and
// "path.<name>" a string property <name> of its own. Every bound param is
// required: a money parameter left out of the preview would be bound as
// absent and refused on a confirm that carries it.
func paramsSchema(op *config.Operation, t texts, describe string, expand func(string) string) (*Schema, error) {
	root := &Schema{Type: "object", Properties: map[string]*Schema{}}
	var errs []error
	var pathVars []string
	for _, p := range op.Params {
		if name, ok := strings.CutPrefix(p.Path, "path."); ok {
			pathVars = append(pathVars, name)
			continue
		}
		leaf := &Schema{Description: describe}
		if p.Decimal {
			leaf.Description += t.SentenceSeparator + t.Decimal
			leaf.AnyOf = []*Schema{{Type: "string", Pattern: decimalPattern}, {Type: "number"}}
		}
		if err := insert(root, strings.Split(p.Path, "."), leaf); err != nil {
			errs = append(errs, fmt.Errorf("param %s: %w", p.Path, err))
		}
	}
	for _, name := range pathVars {
		if _, taken := root.Properties[name]; taken {
			errs = append(errs, fmt.Errorf("param path.%s: the body has a top-level field %q too; a tool has one argument per name", name, name))
			continue
		}
		d := strings.NewReplacer("{name}", name, "{path}", op.Preview.Template.String()).Replace(expand(t.PathParam))
		root.Properties[name] = &Schema{Type: "string", Description: d}
		root.Required = append(root.Required, name)
	}
	if _, taken := root.Properties[op.FingerprintField]; taken {
		errs = append(errs, fmt.Errorf("a param is named like fingerprint_field %q", op.FingerprintField))
	}
	return root, errors.Join(errs...)
}

// insert places leaf at the path segs below node, creating the objects and
// arrays on the way.
func insert(node *Schema, segs []string, leaf *Schema) error {
	seg := segs[0]
	var slot **Schema
	if isIndex(seg) {
		if node.Type != "array" {
			return fmt.Errorf("segment %s indexes something that is not an array", seg)
		}
		i, err := strconv.Atoi(seg)
		if err != nil {
			return fmt.Errorf("segment %s: %w", seg, err)
		}
		node.MinItems = max(node.MinItems, i+1)
		slot = &node.Items
	} else {
		if node.Type != "object" {
			return fmt.Errorf("segment %s names a field of something that is not an object", seg)
		}
		child := node.Properties[seg]
		slot = &child
		defer func() {
			node.Properties[seg] = *slot
			if !slices.Contains(node.Required, seg) {
				node.Required = append(node.Required, seg)
			}
		}()
	}
	if len(segs) == 1 {
		// Array elements share one items schema, so items.0.sku and
		// items.1.sku land on the same leaf: fine when they describe it alike.
		if *slot != nil && !sameSchema(*slot, leaf) {
			return errors.New("another param already describes this value or one inside it")
		}
		*slot = leaf
		return nil
	}
	want := "object"
	if isIndex(segs[1]) {
		want = "array"
	}
	switch {
	case *slot == nil && want == "object":
		*slot = &Schema{Type: "object", Properties: map[string]*Schema{}}
	case *slot == nil:
		*slot = &Schema{Type: "array"}
	case (*slot).Type != want:
		return fmt.Errorf("segment %s is used as an object and as an array, or as a value and a container", seg)
	}
	return insert(*slot, segs[1:], leaf)
}

func sameSchema(a, b *Schema) bool {
	x, errA := json.Marshal(a)
	y, errB := json.Marshal(b)
	return errA == nil && errB == nil && bytes.Equal(x, y)
}

// mcpAnnotations are MCP's tool hints. They state what idemgate guarantees:
// preview and status change nothing, and a confirm repeated with the same
// arguments (the same fingerprint) has no further effect. destructiveHint is
// left to its default (true): a confirm moves money and cannot be undone.
type mcpAnnotations struct {
	ReadOnlyHint   *bool `json:"readOnlyHint,omitempty"`
	IdempotentHint *bool `json:"idempotentHint,omitempty"`
}

func annotationsFor(k Kind) *mcpAnnotations {
	yes := true
	switch k {
	case config.KindConfirm:
		return &mcpAnnotations{IdempotentHint: &yes}
	case config.KindStatus:
		return &mcpAnnotations{ReadOnlyHint: &yes, IdempotentHint: &yes}
	}
	return &mcpAnnotations{ReadOnlyHint: &yes}
}

func isIndex(seg string) bool {
	return seg != "" && strings.Trim(seg, "0123456789") == ""
}

// Render writes tools in format f as indented JSON. Every name must fit the
// format's NamePattern and be unique.
func Render(w io.Writer, tools []Tool, f Format) error {
	if !slices.Contains(Formats(), f) {
		return fmt.Errorf("unknown format %q (known: openai, anthropic, mcp)", f)
	}
	var errs []error
	seen := map[string]string{}
	for _, t := range tools {
		if !NamePattern(f).MatchString(t.Name) {
			errs = append(errs, fmt.Errorf("operation %s: %s tool name %q does not match %s's rule %s", t.Operation, t.Kind, t.Name, f, NamePattern(f)))
		}
		if prev, dup := seen[t.Name]; dup {
			errs = append(errs, fmt.Errorf("tool name %q is used twice (%s and operation %s %s)", t.Name, prev, t.Operation, t.Kind))
		}
		seen[t.Name] = "operation " + t.Operation + " " + t.Kind.String()
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	var doc any
	switch f {
	case OpenAI:
		type function struct {
			Name        string  `json:"name"`
			Description string  `json:"description"`
			Parameters  *Schema `json:"parameters"`
		}
		type tool struct {
			Type     string   `json:"type"`
			Function function `json:"function"`
		}
		out := []tool{}
		for _, t := range tools {
			out = append(out, tool{Type: "function", Function: function{t.Name, t.Description, t.InputSchema}})
		}
		doc = out
	case Anthropic:
		type tool struct {
			Name        string  `json:"name"`
			Description string  `json:"description"`
			InputSchema *Schema `json:"input_schema"`
		}
		out := []tool{}
		for _, t := range tools {
			out = append(out, tool{t.Name, t.Description, t.InputSchema})
		}
		doc = out
	case MCP:
		type tool struct {
			Name        string          `json:"name"`
			Description string          `json:"description"`
			InputSchema *Schema         `json:"inputSchema"`
			Annotations *mcpAnnotations `json:"annotations,omitempty"`
		}
		out := []tool{}
		for _, t := range tools {
			out = append(out, tool{t.Name, t.Description, t.InputSchema, annotationsFor(t.Kind)})
		}
		doc = struct {
			Tools []tool `json:"tools"`
		}{out}
	}
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false) // descriptions are read by people and models, not embedded in HTML
	enc.SetIndent("", "  ")
	return enc.Encode(doc)
}
