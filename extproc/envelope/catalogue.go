package envelope

// The built-in texts. They are prompts as much as messages: the reader is an
// LLM agent that decides its next step from them, so every instruction says
// plainly whether to call the same tool again and what to do instead.
var catalogues = map[string]map[Message]Text{
	"en": {
		AlreadyCompleted: {
			Meaning:     "This operation was already executed successfully by an earlier call with the same fingerprint. It was not executed again.",
			Instruction: "Do not call this tool again. Report the result below to the user as the outcome of this operation.",
		},
		AlreadyFailed: {
			Meaning:     "This operation was already attempted with the same fingerprint and the service rejected it. It was not executed again.",
			Instruction: "Do not call this tool again with this fingerprint. Report the failure below to the user. If the user wants to try again with corrected details, start over with {preview_tool}.",
		},
		InProgress: {
			Meaning:     "This operation is being processed by an earlier call with the same fingerprint; its result is not known yet.",
			Instruction: "Do not call this tool again. Wait {poll_after_seconds} seconds, then call {status_tool} with the same fingerprint to learn the result.",
		},
		NeedsReconciliation: {
			Meaning:     "An earlier attempt of this operation was interrupted, and it cannot be determined automatically whether it was executed.",
			Instruction: "Do not retry and do not start a new preview for the same operation. Tell the user that a person must verify whether it happened before anything else is done. You may call {status_tool} later to see whether it has been resolved.",
		},
		FingerprintRequired: {
			Meaning:     "This confirmation carries no fingerprint. The fingerprint is issued by {preview_tool} and is required so that the operation is executed exactly once. Nothing was executed.",
			Instruction: "Call {preview_tool} first, show the preview to the user, and then call this tool again with the fingerprint copied exactly from the preview response.",
		},
		FingerprintInvalid: {
			Meaning:     "The fingerprint is damaged, was not issued by this service, or belongs to a different operation. Nothing was executed.",
			Instruction: "Do not retry with this value. Call {preview_tool} again and use the fingerprint from its response exactly as returned, without changing any character.",
		},
		FingerprintExpired: {
			Meaning:     "The fingerprint has expired: the preview it came from is no longer valid. Nothing was executed.",
			Instruction: "Do not retry with this fingerprint. Call {preview_tool} again, show the new preview to the user, ask the user to confirm again, and then confirm with the new fingerprint.",
		},
		FingerprintSubjectMismatch: {
			Meaning:     "This fingerprint was issued to a different user than the one making this call. Nothing was executed.",
			Instruction: "Stop. Do not retry and do not try other fingerprints. Tell the user that this confirmation does not belong to them.",
		},
		ParamsChanged: {
			Meaning:     "The parameters of this confirmation differ from the ones that were previewed (see changed_fields). Nothing was executed.",
			Instruction: "Do not retry this call unchanged. If the user wants the new values, call {preview_tool} with them, show the new preview to the user and confirm with the new fingerprint; otherwise confirm again with exactly the previewed values.",
		},
		InvalidParams: {
			Meaning:     "A parameter that decides what this operation does could not be read (for example a malformed amount). Nothing was executed.",
			Instruction: "Do not retry this call unchanged. Correct the parameters and call {preview_tool} again.",
		},
		TemporarilyUnavailable: {
			Meaning:     "The idempotency service cannot record this operation right now, so it was not executed.",
			Instruction: "Nothing was executed. Wait {retry_after_seconds} seconds and then retry exactly the same call with the same fingerprint.",
		},
		RequestTooLarge: {
			Meaning:     "The request body is larger than the {max_body_bytes} bytes this service accepts. Nothing was executed.",
			Instruction: "Do not retry this call unchanged. Send a smaller request body without unnecessary fields.",
		},
		InvalidJSON: {
			Meaning:     "The request body is not valid JSON, or it is nested too deeply. Nothing was executed.",
			Instruction: "Do not retry this call unchanged. Send the request body as a single valid JSON object.",
		},
		SubjectRequired: {
			Meaning:     "The request is not associated with an authenticated user, so it cannot be bound to a fingerprint. Nothing was executed.",
			Instruction: "Do not retry. Tell the user that they must be signed in for this action, then start again with {preview_tool}.",
		},
		PathNotExact: {
			Meaning:     "This path is another spelling of a guarded operation's path (different case, a trailing slash, a suffix, encoded or extra characters). Such a call could bypass the exactly-once check, so it was refused. Nothing was executed.",
			Instruction: "Call the operation again at exactly the path and with the method given in detail, with no other changes.",
		},
		MethodNotAllowed: {
			Meaning:     "This HTTP method is not the one the guarded operation at this path accepts, so the call was refused. Nothing was executed.",
			Instruction: "Call the operation again with the method given in detail (see also the Allow header), with no other changes.",
		},
		HeaderNotAllowed: {
			Meaning:     "This call carries a header that would let the proxy send it more than once (named in detail), so it was refused. Nothing was executed.",
			Instruction: "Send the same call again without that header.",
		},
		InternalError: {
			Meaning:     "An internal error occurred in the idempotency gateway while handling this call.",
			Instruction: "Do not retry this call blindly. If it was a confirmation, call {status_tool} with the same fingerprint to learn whether the operation was executed; otherwise tell the user that the request failed.",
		},

		ApprovalPending: {
			Meaning:     "This operation needs a person's approval before it runs. The request for approval has been sent; nothing was executed yet.",
			Instruction: "Do not start a new preview and do not change the parameters. Tell the user that the operation awaits approval; when approval_url is given, show the user that link (the approval page). Wait {poll_after_seconds} seconds, then call {status_tool} with the same fingerprint; once it says approval_granted, call this tool again with the same fingerprint and parameters.",
		},
		ApprovalDenied: {
			Meaning:     "A person denied this operation. It was not executed and will not be.",
			Instruction: "Do not retry and do not start a new preview to get around the decision. Tell the user that the operation was denied.",
		},
		ApprovalExpired: {
			Meaning:     "The approval of this operation lapsed before it was executed. Nothing was executed.",
			Instruction: "Do not retry with this fingerprint. If the user still wants it, call {preview_tool} again, show the new preview to the user, and confirm with the new fingerprint; it will need approval again.",
		},
		StatusNotStarted: {
			Meaning:     "No confirmation with this fingerprint has been received; the operation has not been executed.",
			Instruction: "If the user has confirmed the preview, call the confirm tool with this fingerprint. Otherwise nothing needs to be done.",
		},
		StatusInterrupted: {
			Meaning:     "An earlier attempt was interrupted before its result was recorded. The downstream service deduplicates by idempotency key, so confirming again cannot execute the operation twice.",
			Instruction: "Call the confirm tool again with the same fingerprint to finish the operation.",
		},
		StatusInProgress: {
			Meaning:     "The operation is being processed; its result is not known yet.",
			Instruction: "Do not call the confirm tool again. Wait {poll_after_seconds} seconds and call {status_tool} again with the same fingerprint.",
		},
		StatusCompleted: {
			Meaning:     "The operation was executed successfully.",
			Instruction: "Do not call the confirm tool again. Report the result below to the user.",
		},
		StatusFailed: {
			Meaning:     "The operation was attempted and the service rejected it; it was not executed.",
			Instruction: "Do not call the confirm tool again with this fingerprint. Report the failure below to the user. To try again with corrected details, start over with {preview_tool}.",
		},
		StatusNeedsReconciliation: {
			Meaning:     "An attempt of this operation was interrupted, and it cannot be determined automatically whether it was executed.",
			Instruction: "Do not retry. Tell the user that a person must verify whether the operation happened. You may call {status_tool} again later to see whether it has been resolved.",
		},
		StatusFingerprintRequired: {
			Meaning:     "This status query carries no fingerprint.",
			Instruction: "Call {status_tool} again with the fingerprint from the preview response of the operation you want to check.",
		},
		StatusFingerprintInvalid: {
			Meaning:     "The fingerprint is damaged, was not issued by this service, or belongs to a different operation.",
			Instruction: "Call {status_tool} again with the fingerprint copied exactly from the preview response, without changing any character.",
		},
		StatusTemporarilyUnavailable: {
			Meaning:     "The status of this operation cannot be read right now.",
			Instruction: "Wait {retry_after_seconds} seconds and call {status_tool} again with the same fingerprint. Do not call the confirm tool in the meantime.",
		},
		StatusApprovalPending: {
			Meaning:     "This operation is waiting for a person to approve it; it has not been executed.",
			Instruction: "Do not call the confirm tool yet and do not start a new preview. Wait {poll_after_seconds} seconds and call {status_tool} again with the same fingerprint.",
		},
		StatusApprovalGranted: {
			Meaning:     "A person approved this operation; it has not been executed yet.",
			Instruction: "Call the confirm tool again now with the same fingerprint and exactly the same parameters. That call executes the operation.",
		},
		StatusApprovalDenied: {
			Meaning:     "A person denied this operation; it was not executed and will not be.",
			Instruction: "Do not call the confirm tool again. Tell the user that the operation was denied.",
		},
		StatusApprovalExpired: {
			Meaning:     "The approval of this operation lapsed before it was executed; it was not executed.",
			Instruction: "Do not call the confirm tool again with this fingerprint. If the user still wants it, call {preview_tool} again, show the preview to the user and confirm with the new fingerprint; it will need approval again.",
		},
	},
	"zh": {
		AlreadyCompleted: {
			Meaning:     "该操作在此前使用同一指纹的调用中已经成功执行，本次为重复调用，没有再次执行。",
			Instruction: "不要再次调用本工具。直接向用户播报下方结果，作为本次操作的结果。",
		},
		AlreadyFailed: {
			Meaning:     "该操作此前已使用同一指纹尝试过，并被服务方拒绝，本次没有再次执行。",
			Instruction: "不要再用这个指纹调用本工具。向用户播报下方的失败结果。如果用户想修正信息后重新办理，请从 {preview_tool} 重新开始。",
		},
		InProgress: {
			Meaning:     "该操作正在由此前使用同一指纹的调用处理中，结果尚未确定。",
			Instruction: "不要重新调用本工具。等待 {poll_after_seconds} 秒后，用同一个指纹调用 {status_tool} 确认结果。",
		},
		NeedsReconciliation: {
			Meaning:     "该操作此前的一次尝试被中断，系统无法自动判断它是否已经执行。",
			Instruction: "不要重试，也不要为同一笔操作重新预览。告诉用户：必须先由人工核实这笔操作是否已经发生，然后才能进行其他处理。稍后可以调用 {status_tool} 查看是否已处理完毕。",
		},
		FingerprintRequired: {
			Meaning:     "本次确认没有携带指纹。指纹由 {preview_tool} 签发，是保证操作只执行一次的必要凭据。本次没有执行任何操作。",
			Instruction: "先调用 {preview_tool}，把预览结果展示给用户，然后把预览响应中的指纹原样复制，再调用本工具。",
		},
		FingerprintInvalid: {
			Meaning:     "指纹已损坏、不是本服务签发的，或属于另一种操作。本次没有执行任何操作。",
			Instruction: "不要用这个值重试。重新调用 {preview_tool}，并原样使用其响应中的指纹，不要改动任何字符。",
		},
		FingerprintExpired: {
			Meaning:     "指纹已过期，对应的预览已经失效。本次没有执行任何操作。",
			Instruction: "不要用这个指纹重试。重新调用 {preview_tool}，把新的预览展示给用户并请用户再次确认，然后用新的指纹确认。",
		},
		FingerprintSubjectMismatch: {
			Meaning:     "这个指纹是签发给另一位用户的，与本次调用的用户不符。本次没有执行任何操作。",
			Instruction: "立即停止。不要重试，也不要尝试其他指纹。告诉用户这次确认不属于他。",
		},
		ParamsChanged: {
			Meaning:     "本次确认的参数与预览时的参数不一致（见 changed_fields）。本次没有执行任何操作。",
			Instruction: "不要原样重试。如果用户确实要使用新的参数，用新参数调用 {preview_tool}，把新的预览展示给用户，再用新的指纹确认；否则请严格使用预览时的参数重新确认。",
		},
		InvalidParams: {
			Meaning:     "决定本次操作内容的某个参数无法识别（例如金额格式错误）。本次没有执行任何操作。",
			Instruction: "不要原样重试。修正参数后重新调用 {preview_tool}。",
		},
		TemporarilyUnavailable: {
			Meaning:     "幂等服务暂时无法记录本次操作，因此没有执行。",
			Instruction: "本次没有执行任何操作。等待 {retry_after_seconds} 秒后，用同一个指纹原样重试同一个调用。",
		},
		RequestTooLarge: {
			Meaning:     "请求体超过了本服务接受的 {max_body_bytes} 字节上限。本次没有执行任何操作。",
			Instruction: "不要原样重试。去掉不必要的字段，发送更小的请求体。",
		},
		InvalidJSON: {
			Meaning:     "请求体不是合法的 JSON，或者嵌套层级过深。本次没有执行任何操作。",
			Instruction: "不要原样重试。请求体必须是一个合法的 JSON 对象。",
		},
		SubjectRequired: {
			Meaning:     "该请求没有关联到已认证的用户，因此无法与指纹绑定。本次没有执行任何操作。",
			Instruction: "不要重试。告诉用户需要先登录才能进行此操作，然后从 {preview_tool} 重新开始。",
		},
		PathNotExact: {
			Meaning:     "这个路径是受保护操作路径的另一种写法（大小写不同、末尾斜杠、后缀、编码或多余字符）。这样的调用可能绕过“只执行一次”的检查，因此被拒绝。本次没有执行任何操作。",
			Instruction: "按 detail 中给出的确切路径和方法重新调用该操作，其他内容不要改动。",
		},
		MethodNotAllowed: {
			Meaning:     "这个 HTTP 方法不是该路径上受保护操作所接受的方法，因此调用被拒绝。本次没有执行任何操作。",
			Instruction: "使用 detail 中给出的方法（另见 Allow 头）重新调用该操作，其他内容不要改动。",
		},
		HeaderNotAllowed: {
			Meaning:     "这个调用带有一个会让代理重复发送它的请求头（见 detail），因此被拒绝。本次没有执行任何操作。",
			Instruction: "去掉该请求头后重新发送同一个调用。",
		},
		InternalError: {
			Meaning:     "幂等网关在处理本次调用时发生了内部错误。",
			Instruction: "不要盲目重试。如果这是一次确认调用，用同一个指纹调用 {status_tool} 查明操作是否已经执行；否则告诉用户本次请求失败。",
		},

		ApprovalPending: {
			Meaning:     "该操作需要人工审批后才能执行，审批请求已发出，目前尚未执行。",
			Instruction: "不要重新预览，也不要修改参数。告诉用户该操作正在等待审批；如果给出了 approval_url，把该链接（审批页面）告诉用户。等待 {poll_after_seconds} 秒后，用同一个指纹调用 {status_tool}；当它返回 approval_granted 时，再用同一个指纹和参数调用本工具。",
		},
		ApprovalDenied: {
			Meaning:     "该操作已被人工拒绝，没有执行，也不会执行。",
			Instruction: "不要重试，也不要通过重新预览绕过该决定。告诉用户该操作已被拒绝。",
		},
		ApprovalExpired: {
			Meaning:     "该操作的审批在执行前已失效，没有执行任何操作。",
			Instruction: "不要再用这个指纹重试。如果用户仍要办理，请重新调用 {preview_tool}，把新的预览展示给用户并用新的指纹确认；它需要重新审批。",
		},
		StatusNotStarted: {
			Meaning:     "尚未收到使用该指纹的确认，操作没有执行。",
			Instruction: "如果用户已经确认了预览，用这个指纹调用确认工具；否则无需任何操作。",
		},
		StatusInterrupted: {
			Meaning:     "此前的一次尝试在结果记录之前被中断。下游服务按幂等键去重，再次确认不会导致重复执行。",
			Instruction: "用同一个指纹再次调用确认工具，以完成这次操作。",
		},
		StatusInProgress: {
			Meaning:     "该操作正在处理中，结果尚未确定。",
			Instruction: "不要再次调用确认工具。等待 {poll_after_seconds} 秒后，用同一个指纹再次调用 {status_tool}。",
		},
		StatusCompleted: {
			Meaning:     "该操作已经成功执行。",
			Instruction: "不要再次调用确认工具。直接向用户播报下方结果。",
		},
		StatusFailed: {
			Meaning:     "该操作已尝试执行，但被服务方拒绝，没有执行成功。",
			Instruction: "不要再用这个指纹调用确认工具。向用户播报下方的失败结果。如需修正信息后重新办理，请从 {preview_tool} 重新开始。",
		},
		StatusNeedsReconciliation: {
			Meaning:     "该操作的一次尝试被中断，系统无法自动判断它是否已经执行。",
			Instruction: "不要重试。告诉用户必须由人工核实这笔操作是否已经发生。稍后可以再次调用 {status_tool} 查看是否已处理完毕。",
		},
		StatusFingerprintRequired: {
			Meaning:     "本次状态查询没有携带指纹。",
			Instruction: "用要查询的那次操作的预览响应中的指纹，再次调用 {status_tool}。",
		},
		StatusFingerprintInvalid: {
			Meaning:     "指纹已损坏、不是本服务签发的，或属于另一种操作。",
			Instruction: "从预览响应中原样复制指纹，不要改动任何字符，再次调用 {status_tool}。",
		},
		StatusTemporarilyUnavailable: {
			Meaning:     "暂时无法读取该操作的状态。",
			Instruction: "等待 {retry_after_seconds} 秒后，用同一个指纹再次调用 {status_tool}。在此期间不要调用确认工具。",
		},
		StatusApprovalPending: {
			Meaning:     "该操作正在等待人工审批，尚未执行。",
			Instruction: "暂时不要调用确认工具，也不要重新预览。等待 {poll_after_seconds} 秒后，用同一个指纹再次调用 {status_tool}。",
		},
		StatusApprovalGranted: {
			Meaning:     "该操作已获人工批准，但尚未执行。",
			Instruction: "现在用同一个指纹和完全相同的参数再次调用确认工具，这次调用会执行该操作。",
		},
		StatusApprovalDenied: {
			Meaning:     "该操作已被人工拒绝，没有执行，也不会执行。",
			Instruction: "不要再调用确认工具。告诉用户该操作已被拒绝。",
		},
		StatusApprovalExpired: {
			Meaning:     "该操作的审批在执行前已失效，操作没有执行。",
			Instruction: "不要再用这个指纹调用确认工具。如果用户仍要办理，请重新调用 {preview_tool}，把新的预览展示给用户并用新的指纹确认；它需要重新审批。",
		},
	},
}
