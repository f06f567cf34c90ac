package envelope

import "strings"

// MCPText holds the texts idemgate writes into MCP traffic besides the
// envelopes (docs/design.md §9). Like the envelopes they are prompts: the
// model reads tool descriptions and tool results and must be able to follow
// them without knowing idemgate exists.
type MCPText struct {
	// FingerprintArgument describes the argument added to the confirm
	// tool's inputSchema.
	FingerprintArgument string
	// PreviewBlock is the text block appended to a successful preview
	// result (many clients give the model only content, not
	// structuredContent).
	PreviewBlock string
	// StatusTool describes the status tool idemgate adds to tools/list.
	StatusTool string
	// StatusFingerprintArgument describes the status tool's argument.
	StatusFingerprintArgument string
}

var mcpCatalogues = map[string]MCPText{
	"en": {
		FingerprintArgument:       "Required. The fingerprint returned by {preview_tool} for exactly these parameters. Copy it unchanged, character for character, from the {preview_tool} result; never invent, shorten or edit it. If you have none, or it has expired, call {preview_tool} first and show the preview to the user. Calling this tool again with the same fingerprint never executes the operation twice.",
		PreviewBlock:              "Fingerprint for this preview: {fingerprint}\nIt expires at {expires_at}. After the user confirms, call {confirm_tool} with the same parameters and with {field} set to exactly this value, unchanged. Do not call {confirm_tool} without it.",
		StatusTool:                "Report whether the operation confirmed with a fingerprint was executed: not_started, in_progress, completed (with its result), failed (with the reason), needs_reconciliation, or for an operation that needs a person's approval approval_pending (wait and ask again), approval_granted (call {confirm_tool} again now with the same fingerprint and parameters), approval_denied or approval_expired. It never executes anything. Use it instead of calling {confirm_tool} again whenever you are unsure whether a confirmation went through.",
		StatusFingerprintArgument: "The fingerprint exactly as it was passed to {confirm_tool}.",
	},
	"zh": {
		FingerprintArgument:       "必填。{preview_tool} 针对这组参数返回的指纹。从 {preview_tool} 的结果中原样逐字复制，绝不能编造、截短或修改。如果没有指纹或指纹已过期，请先调用 {preview_tool} 并把预览展示给用户。用同一个指纹再次调用本工具绝不会重复执行。",
		PreviewBlock:              "本次预览的指纹：{fingerprint}\n有效期至 {expires_at}。用户确认后，用相同的参数调用 {confirm_tool}，并把 {field} 设为这个值，原样不改。没有它不要调用 {confirm_tool}。",
		StatusTool:                "查询用指纹确认的操作是否已执行：not_started、in_progress、completed（附结果）、failed（附原因）、needs_reconciliation，对需要人工审批的操作还有 approval_pending（稍后再查）、approval_granted（现在用同一个指纹和参数再次调用 {confirm_tool}）、approval_denied 或 approval_expired。它不会执行任何操作。只要不确定某次确认是否成功，就用它查询，而不要再次调用 {confirm_tool}。",
		StatusFingerprintArgument: "与传给 {confirm_tool} 的完全相同的指纹。",
	},
}

// MCPTool names the tools an MCP operation's texts mention.
type MCPTool struct {
	PreviewTool string
	ConfirmTool string
	StatusTool  string
	// Field is the fingerprint argument's name.
	Field string
}

// MCPTexts returns the MCP texts of language (English when unknown) with
// the tool names filled in. {fingerprint} and {expires_at} in PreviewBlock
// are left for the preview (mcp.PreviewBlock fills them).
func MCPTexts(language string, t MCPTool) MCPText {
	cat, ok := mcpCatalogues[language]
	if !ok {
		cat = mcpCatalogues["en"]
	}
	r := strings.NewReplacer("{preview_tool}", t.PreviewTool, "{confirm_tool}", t.ConfirmTool, "{status_tool}", t.StatusTool, "{field}", t.Field)
	return MCPText{
		FingerprintArgument:       r.Replace(cat.FingerprintArgument),
		PreviewBlock:              r.Replace(cat.PreviewBlock),
		StatusTool:                r.Replace(cat.StatusTool),
		StatusFingerprintArgument: r.Replace(cat.StatusFingerprintArgument),
	}
}
