package tooldefs

// The texts a tool definition adds around the envelopes' own instructions.
// They say what each tool is for and how the three fit together; what to do
// after a particular answer is quoted from the operation's compiled envelopes
// (see describe in tooldefs.go), so a description can never contradict the
// answer the agent later reads. Placeholders are replaced per operation:
// {operation} {preview_tool} {confirm_tool} {status_tool} {fingerprint_field}
// {params} {statuses} {name} {path}.
type texts struct {
	Preview string
	Confirm string
	Status  string
	// When introduces a quoted envelope instruction: "When the answer is
	// <status>: <instruction>".
	When string
	// Fingerprint describes the fingerprint argument of confirm and status.
	Fingerprint string
	// ParamPreview and ParamConfirm describe a bound param in each tool.
	ParamPreview string
	ParamConfirm string
	// Decimal is appended to the description of a `type: decimal` param.
	Decimal string
	// PathParam describes a path.<name> param.
	PathParam string
	// ListSeparator joins the names in {params} and {statuses}.
	ListSeparator string
	// SentenceSeparator joins sentences: a space in English, nothing in
	// Chinese, whose full stop needs none.
	SentenceSeparator string
}

var catalogues = map[string]texts{
	"en": {
		Preview: "Step 1 of 2 of the operation {operation}: previews it without executing anything. " +
			"The response carries `{fingerprint_field}`, a token bound to the calling user and to the values of {params}, " +
			"valid until `{fingerprint_field}_expires_at`. Show the preview to the user. Only after the user agrees, " +
			"call {confirm_tool} with that `{fingerprint_field}` copied exactly and with exactly the previewed values. " +
			"If the user wants different values, call this tool again with them.",
		Confirm: "Step 2 of 2 of the operation {operation}: executes it exactly once, as previewed by {preview_tool}. " +
			"Pass `{fingerprint_field}` from the preview response and exactly the previewed values of {params}. " +
			"Calling this tool again with the same `{fingerprint_field}` never executes the operation twice: " +
			"the answer reports the outcome of the first call. An answer written by the idempotency service carries " +
			"`status`, `meaning`, `instruction` and `retryable`; follow its `instruction`.",
		Status: "Reports what happened to a confirmation of the operation {operation}, identified by the " +
			"`{fingerprint_field}` from {preview_tool}: `status` is one of {statuses}, with the result once it is known. " +
			"It never executes anything. Call it when an answer of {confirm_tool} names it in `poll_with`.",
		When:              "When the answer is `{status}`: {instruction}",
		Fingerprint:       "The `{fingerprint_field}` value from the {preview_tool} response, copied exactly, without changing any character.",
		ParamPreview:      "Bound to the fingerprint this preview returns: confirm with exactly this value.",
		ParamConfirm:      "Must equal the value previewed with {preview_tool}; a different value is refused and nothing is executed.",
		Decimal:           "A decimal amount: a JSON number or a string such as \"100.00\".",
		PathParam:         "The {{name}} segment of the path {path}. Bound to the fingerprint like the other parameters.",
		ListSeparator:     ", ",
		SentenceSeparator: " ",
	},
	"zh": {
		Preview: "操作 {operation} 的第 1 步（共 2 步）：只预览，不执行任何操作。" +
			"响应中带有 `{fingerprint_field}`，它与当前用户以及 {params} 的取值绑定，有效期至 `{fingerprint_field}_expires_at`。" +
			"把预览结果展示给用户。只有在用户同意之后，才用原样复制的 `{fingerprint_field}` 和预览时完全相同的参数调用 {confirm_tool}。" +
			"如果用户想改用其他参数，请用新参数再次调用本工具。",
		Confirm: "操作 {operation} 的第 2 步（共 2 步）：按 {preview_tool} 的预览执行，且只执行一次。" +
			"请传入预览响应中的 `{fingerprint_field}`，以及与预览时完全相同的 {params}。" +
			"用同一个 `{fingerprint_field}` 再次调用本工具绝不会重复执行：应答会报告第一次调用的结果。" +
			"幂等服务给出的应答带有 `status`、`meaning`、`instruction` 和 `retryable`，请按其中的 `instruction` 行事。",
		Status: "查询操作 {operation} 的一次确认结果，以 {preview_tool} 返回的 `{fingerprint_field}` 标识：" +
			"`status` 为 {statuses} 之一，结果确定后附带结果。本工具从不执行任何操作。" +
			"当 {confirm_tool} 的应答在 `poll_with` 中指明本工具时调用它。",
		When:              "应答为 `{status}` 时：{instruction}",
		Fingerprint:       "{preview_tool} 响应中的 `{fingerprint_field}`，原样复制，不要改动任何字符。",
		ParamPreview:      "与本次预览返回的指纹绑定：确认时必须使用完全相同的值。",
		ParamConfirm:      "必须与 {preview_tool} 预览时的值完全相同；不同的值会被拒绝，且不会执行任何操作。",
		Decimal:           "十进制金额：JSON 数字，或 \"100.00\" 这样的字符串。",
		PathParam:         "路径 {path} 中的 {{name}} 段。与其他参数一样绑定到指纹。",
		ListSeparator:     "、",
		SentenceSeparator: "",
	},
}
