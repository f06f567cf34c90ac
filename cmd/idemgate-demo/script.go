package main

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/idemgate/idemgate/e2e/demoauth"
	"github.com/idemgate/idemgate/extproc/config"
	"github.com/idemgate/idemgate/fingerprint"
)

const (
	// demoTokenTTL is how long the printed JWTs stay valid.
	demoTokenTTL = 8 * time.Hour
	// demoExpiredBy is how long before the demo's start the printed expired
	// fingerprint expired.
	demoExpiredBy = time.Minute

	// demoTransfer is the transfer every printed command moves: amount,
	// currency and payee.account_id are the operation's bound params; memo
	// is free text that an agent may reword between calls.
	demoTransfer = `{"amount":"250.00","currency":"EUR","payee":{"account_id":"acc_7731","name":"Carol"},"memo":"rent for May"}`

	// fingerprintSed prints the value of the first "fingerprint" member of
	// the JSON on its input (curl -i output of a preview): POSIX sed, so the
	// demo needs no jq. Base64url and "." never contain a quote.
	fingerprintSed = `sed -n 's/.*"fingerprint" *: *"\([^"]*\)".*/\1/p'`

	// demoBigTransfer is at or above demoApprovalThreshold: its confirm
	// waits for an approver other than the requester.
	demoBigTransfer = `{"amount":"1500.00","currency":"EUR","payee":{"account_id":"acc_7731","name":"Carol"},"memo":"deposit for the flat"}`

	// approvalIDSed prints the value of the first "approval_id" member, as
	// fingerprintSed does for "fingerprint".
	approvalIDSed = `sed -n 's/.*"approval_id" *: *"\([^"]*\)".*/\1/p'`
)

// scriptInfo is what the printed script names: where each part of the
// running demo is, and the config idemgate serves.
type scriptInfo struct {
	rt                      *config.Runtime
	keySource               string
	envoyVersion, envoyBin  string
	frontURL, envoyAdminURL string
	grpcAddr, idemgateAdmin string
	paymentsURL             string
	// approvalsURL is the approvers' API (approval_listen); approvers
	// signs the approvers' tokens the script prints.
	approvalsURL string
	approvers    *approverKey
}

// demoScript is what the demo prints: a banner and the commands, all of it
// a POSIX sh script (the banner is comments) that needs only curl.
func demoScript(st scriptInfo, now time.Time) (string, error) {
	alice, err := demoauth.Mint("alice", demoTokenTTL, now)
	if err != nil {
		return "", err
	}
	bob, err := demoauth.Mint("bob", demoTokenTTL, now)
	if err != nil {
		return "", err
	}
	// Approver tokens for the two users: bob approves alice's transfer;
	// alice's own is there to show that she cannot approve it herself.
	aliceApprover, err := st.approvers.mint("alice", demoTokenTTL, now)
	if err != nil {
		return "", err
	}
	bobApprover, err := st.approvers.mint("bob", demoTokenTTL, now)
	if err != nil {
		return "", err
	}
	// alice once more, just after a strong authentication (step-up).
	aliceSCA, err := st.approvers.mintSteppedUp("alice", demoTokenTTL, now)
	if err != nil {
		return "", err
	}
	expired, err := expiredFingerprint(st.rt, "alice", now.Add(-demoExpiredBy))
	if err != nil {
		return "", err
	}
	fpTTL := shortDuration(st.rt.TTL.Fingerprint)

	var b strings.Builder
	line := func(format string, args ...any) { fmt.Fprintf(&b, format+"\n", args...) }
	line("# idemgate demo: a real Envoy %s in front of idemgate and a demo payments API.", st.envoyVersion)
	line("#   Envoy (envoy/envoy.yaml: jwt_authn, ext_proc, router)  %s   <- send requests here (admin: %s)", st.frontURL, st.envoyAdminURL)
	line("#   idemgate serve, memory store (ext_proc gRPC)            %s (admin: http://%s/metrics)", st.grpcAddr, st.idemgateAdmin)
	line("#   demo payments API (the upstream)                        %s", st.paymentsURL)
	line("#   idemgate's approvers' API (approval_listen)             %s", st.approvalsURL)
	line("#   Envoy binary: %s", st.envoyBin)
	line("#   fingerprint signing key: %s", st.keySource)
	line("# Logs (Envoy's access log and idemgate's event=security_alert lines included) go to stderr. Ctrl-C or SIGTERM stops all three.")
	line("#")
	line("# Paste what follows into another shell: POSIX sh and curl, no jq. Run the steps in order.")
	line("")
	line("GW=%s", st.frontURL)
	line("PAY=%s", st.paymentsURL)
	line("# JWTs for the demo users alice and bob (ES256, demo-only key of e2e/demoauth), valid until %s.", now.Add(demoTokenTTL).UTC().Format(time.RFC3339))
	line("ALICE=%s", alice)
	line("BOB=%s", bob)
	line("# For step 6: a fingerprint for alice and this same transfer, signed by the demo with this run's key but expired %s before it started,", shortDuration(demoExpiredBy))
	line("# i.e. a preview older than ttl.fingerprint (%s); the demo mints it so that step 6 needs no %s wait.", fpTTL, fpTTL)
	line("EXPIRED_FP=%s", expired)
	line("APPROVALS=%s", st.approvalsURL)
	line("ADMIN=http://%s", st.idemgateAdmin)
	line("# For steps 14-22: the approvers' bearer tokens (EdDSA, a key generated for this run; issuer %s, audience %s).", demoApproverIssuer, demoApproverAudience)
	line("# In production the SSO proxy in front of approval_listen sets them; an agent's token (ALICE above) is not one.")
	line("ALICE_APPROVER=%s", aliceApprover)
	line("BOB_APPROVER=%s", bobApprover)
	line("# For step 26: alice's approver token after she authenticated strongly now (acr %s, amr [hwk], auth_time %s); the MCP transfer's requester_step_up accepts it for %s.", demoStepUpACR, now.UTC().Format(time.RFC3339), shortDuration(demoMaxAuthAge))
	line("ALICE_SCA=%s", aliceSCA)
	line("")
	line("# 1. Preview as alice: the payments API quotes; idemgate adds \"fingerprint\" and \"fingerprint_expires_at\" (now + %s) to the body and an Idempotency-Fingerprint header. Expect 200; nothing stored, nothing executed.", fpTTL)
	line(`PREVIEW=$(%s); printf '%%s\n' "$PREVIEW"`, demoCurl("preview", "$ALICE", "", "'"+demoTransfer+"'"))
	line("# Keep the fingerprint for the next steps (plain sed); expect FP= followed by the token.")
	line(`FP=$(printf '%%s\n' "$PREVIEW" | %s); echo "FP=$FP"`, fingerprintSed)
	line("")
	line("# 2. Confirm as alice with the fingerprint and the same params: idemgate acquires the fingerprint's nonce and sends it to the payments API as Idempotency-Key (3a and 8 show it). Expect 200 \"status\":\"completed\" and a transfer_id (tr_000001 on the first pass): executed once.")
	line("%s", demoCurl("confirm", "$ALICE", "", withFingerprint(demoTransfer)))
	line("")
	line("# 3a. Retry the same confirm (an agent that lost the answer): expect 200 \"status\":\"already_completed\" with the original result, Idempotent-Replayed: true and the Idempotency-Key idemgate used; the payments API is not called.")
	line("%s", demoCurl("confirm", "$ALICE", "", withFingerprint(demoTransfer)))
	line("# 3b. Retry with the free-text memo reworded (memo is not a bound param): expect the same already_completed replay, still no second execution.")
	line("%s", demoCurl("confirm", "$ALICE", "", withFingerprint(strings.Replace(demoTransfer, `"rent for May"`, `"May rent, as agreed with Carol"`, 1))))
	line("")
	line("# 4. Ask the status tool (here the fingerprint travels in the Idempotency-Fingerprint header instead of the body): expect 200 \"status\":\"completed\" with the stored result.")
	line("%s", demoCurl("status", "$ALICE", "$FP", "'{}'"))
	line("")
	line("# 5. Confirm with a drifted amount (2500.00 instead of 250.00): expect 422 \"status\":\"params_changed\", \"changed_fields\":[\"amount\"], and an event=security_alert line in the demo's log.")
	line("%s", demoCurl("confirm", "$ALICE", "", withFingerprint(strings.Replace(demoTransfer, `"250.00"`, `"2500.00"`, 1))))
	line("")
	line("# 6. Confirm with the expired fingerprint (EXPIRED_FP above): expect 410 \"status\":\"fingerprint_expired\" (preview again, ask the user again).")
	line("%s", demoCurl("confirm", "$ALICE", "", `'{"fingerprint":"'"$EXPIRED_FP"'",`+demoTransfer[1:]+`'`))
	line("")
	line("# 7. bob presents alice's fingerprint: expect 403 \"status\":\"fingerprint_subject_mismatch\" and another event=security_alert line.")
	line("%s", demoCurl("confirm", "$BOB", "", withFingerprint(demoTransfer)))
	line("")
	line("# 7b. The same confirm sent straight to the payments API ($PAY), around Envoy and idemgate, as a forgotten route or a pod-to-pod call would, with a key the caller picked: the API refuses it itself, 403 \"error\":\"attestation_missing\", because every confirm idemgate lets through carries a signed Idempotency-Attestation it checks. Nothing executes.")
	line(`curl -sS -w '\n' -H 'content-type: application/json' -H 'Idempotency-Key: picked-by-the-caller' -d '%s' "$PAY/v1/transfers/confirm"`, demoTransfer)
	line("")
	line("# 8. The payments API's counters (through the front's catch-all route, which skips idemgate): expect \"executions\":1 under the one Idempotency-Key idemgate set (each new pass from step 1 previews, and so moves, one more transfer).")
	line(`curl -sS -w '\n' "$GW/_admin/stats"`)
	line("")
	line("# The same transfer as MCP tools (Streamable HTTP on $GW/mcp, guarded by the same Envoy filter and idemgate). Any MCP client works unchanged:")
	line("# point it at $GW/mcp with the header \"Authorization: Bearer $ALICE\". Go SDK: mcp.StreamableClientTransport{Endpoint: ..., HTTPClient: a client setting the header}.")
	line("# Python SDK (mcp 2.x; its transport takes an HTTP client that carries the header). Save the lines below without their \"#   \" as agent.py and run GW=$GW ALICE=$ALICE python3 agent.py:")
	for _, l := range pythonAgent {
		line("#   %s", l)
	}
	line("MCP='-H content-type:application/json -H accept:application/json,text/event-stream -H mcp-protocol-version:2025-11-25'")
	line("# 9. tools/list: transfer_confirm has gained a required \"fingerprint\" argument (copy it from the preview), and idemgate's transfer_status tool is appended.")
	line(`%s -d '{"jsonrpc":"2.0","id":1,"method":"tools/list"}'`, mcpCurl)
	line("# 10. tools/call transfer_preview: the result's structuredContent carries \"fingerprint\" and \"fingerprint_expires_at\", and a text block tells the model to pass it on unchanged.")
	line(`MPREVIEW=$(%s -d '%s'); printf '%%s\n' "$MPREVIEW"`, mcpCurl, mcpCall(2, "transfer_preview", demoTransfer))
	line(`MFP=$(printf '%%s\n' "$MPREVIEW" | %s); echo "MFP=$MFP"`, fingerprintSed)
	line("# 11. tools/call transfer_confirm with the fingerprint: executed once (isError false, a transfer_id).")
	line(`%s -d '%s'`, mcpCurl, mcpCall(3, "transfer_confirm", `{"fingerprint":"'"$MFP"'",`+demoTransfer[1:]))
	line("# 12. The agent retries with a new JSON-RPC id (a broken stream, a re-plan): replayed, not executed — _meta \"io.idemgate/replayed\": true, id 4 as sent.")
	line(`%s -d '%s'`, mcpCurl, mcpCall(4, "transfer_confirm", `{"fingerprint":"'"$MFP"'",`+demoTransfer[1:]))
	line("# 13. The status tool, answered by idemgate itself: \"status\":\"completed\" with the stored result.")
	line(`%s -d '%s'`, mcpCurl, mcpCall(5, "transfer_status", `{"fingerprint":"'"$MFP"'"}`))
	line("")
	line("# Human approval (docs/design.md §10): in this demo a transfer of %s or more needs one approver other than the requester (approval block of the transfer operation).", demoApprovalThreshold)
	line("# 14. Preview 1500.00 as alice: expect 200 with \"approval_required\":true and a fingerprint that lives approval.ttl (%s) instead of %s, so people have time to decide.", shortDuration(demoApprovalTTL), fpTTL)
	line(`APREVIEW=$(%s); printf '%%s\n' "$APREVIEW"`, demoCurl("preview", "$ALICE", "", "'"+demoBigTransfer+"'"))
	line(`AFP=$(printf '%%s\n' "$APREVIEW" | %s); echo "AFP=$AFP"`, fingerprintSed)
	line("# 15. Confirm it as alice: expect 202 \"status\":\"approval_pending\" with an approval_id and Retry-After; nothing executed. Every retry gets the same approval_id until someone decides.")
	line(`PENDING=$(%s); printf '%%s\n' "$PENDING"`, demoCurl("confirm", "$ALICE", "", withNamedFingerprint("$AFP", demoBigTransfer)))
	line(`APPROVAL_ID=$(printf '%%s\n' "$PENDING" | %s); echo "APPROVAL_ID=$APPROVAL_ID"`, approvalIDSed)
	line("# 16. bob reads it on the approvers' API: expect 200 \"state\":\"pending\", the bound params that will run (amount, currency, payee.account_id), the requester alice and the rule that fired.")
	line("#     (People use the page $APPROVALS/approvals/$APPROVAL_ID behind their SSO proxy; it shows the same and has approve/deny buttons.)")
	line("%s", approvalCurl("$BOB_APPROVER", "", ""))
	line("# 17. alice tries to approve her own transfer: expect 403 \"error\":\"approval_forbidden\" (four eyes) and an event=security_alert reason=self_approval line in the log.")
	line("%s", approvalCurl("$ALICE_APPROVER", "approve", "I need it today"))
	line("# 18. bob approves it with a reason: expect 200 \"state\":\"approved\" and his decision listed.")
	line("%s", approvalCurl("$BOB_APPROVER", "approve", "payee verified by phone"))
	line("# 19. The status tool now says approval_granted: call the confirm again, same fingerprint and params.")
	line("%s", demoCurl("status", "$ALICE", "$AFP", "'{}'"))
	line("# 20. alice confirms again: expect 200 \"status\":\"completed\" and a transfer_id; the approval is consumed in the step that lets the transfer run. Executed once.")
	line("%s", demoCurl("confirm", "$ALICE", "", withNamedFingerprint("$AFP", demoBigTransfer)))
	line("# 21. A repeated confirm: expect 200 \"status\":\"already_completed\", Idempotent-Replayed: true; the approval is not used twice, the payments API not called.")
	line("%s", demoCurl("confirm", "$ALICE", "", withNamedFingerprint("$AFP", demoBigTransfer)))
	line("# 22. idemgate's metrics count each approval transition: requested, approved (decided on the approvers' API) and consumed, 1 each.")
	line(`curl -sS "$ADMIN/metrics" | grep '^idemgate_approval_transitions_total'`)
	line("")
	line("# Approval where the agent runs (docs/design.md §13): the MCP transfer has the same rule, and its requester may approve it herself after a strong, recent authentication (requester_step_up).")
	line("# A 2026-07-28 client that declares URL elicitation (the Python SDK with an elicitation_callback) is shown the approval page by its own client and retries by itself; curl declares none and gets the page's URL in the tool result.")
	line("# 23. MCP preview of 1500.00: \"approval_required\":true in structuredContent.")
	line(`MAPREVIEW=$(%s -d '%s'); printf '%%s\n' "$MAPREVIEW"`, mcpCurl, mcpCall(6, "transfer_preview", demoBigTransfer))
	line(`MAFP=$(printf '%%s\n' "$MAPREVIEW" | %s); echo "MAFP=$MAFP"`, fingerprintSed)
	line("# 24. MCP confirm: a tool result with isError true, \"status\":\"approval_pending\" and \"approval_url\" (open it in a browser behind your SSO proxy); nothing executed.")
	line(`MPENDING=$(%s -d '%s'); printf '%%s\n' "$MPENDING"`, mcpCurl, mcpCall(7, "transfer_confirm", `{"fingerprint":"'"$MAFP"'",`+demoBigTransfer[1:]))
	line(`APPROVAL_ID=$(printf '%%s\n' "$MPENDING" | %s); echo "APPROVAL_ID=$APPROVAL_ID"`, approvalIDSed)
	line("# 25. alice approves it with her everyday token: expect 401 and WWW-Authenticate: Bearer error=\"insufficient_user_authentication\", acr_values=\"%s\", max_age=%d (RFC 9470: her identity provider steps her up).", demoStepUpACR, int(demoMaxAuthAge.Seconds()))
	line("%s", approvalCurl("$ALICE_APPROVER", "approve", "my deposit"))
	line("# 26. alice approves with the stepped-up token: expect 200 \"state\":\"approved\", her decision recorded with acr and auth_time.")
	line("%s", approvalCurl("$ALICE_SCA", "approve", "my deposit, confirmed with my security key"))
	line("# 27. The MCP confirm again: executed once (a transfer_id), the approval consumed.")
	line(`%s -d '%s'`, mcpCurl, mcpCall(8, "transfer_confirm", `{"fingerprint":"'"$MAFP"'",`+demoBigTransfer[1:]))
	line("# 28. And again: replayed (\"already_completed\", _meta \"io.idemgate/replayed\": true), not executed.")
	line(`%s -d '%s'`, mcpCurl, mcpCall(9, "transfer_confirm", `{"fingerprint":"'"$MAFP"'",`+demoBigTransfer[1:]))
	return b.String(), nil
}

// shortDuration prints 15m rather than 15m0s.
func shortDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// pythonAgent is the smallest agent on the official Python SDK (mcp 2.x)
// that lists the tools through the front; TestDemoPythonHint runs it.
// Passing elicitation_callback= to Client makes it declare URL elicitation
// (docs/mcp.md).
var pythonAgent = []string{
	"import asyncio, os, httpx2",
	"from mcp import Client",
	"from mcp.client.streamable_http import streamable_http_client",
	"async def main():",
	`    async with httpx2.AsyncClient(headers={"Authorization": "Bearer " + os.environ["ALICE"]}) as http:`,
	`        async with Client(streamable_http_client(os.environ["GW"] + "/mcp", http_client=http)) as client:`,
	"            print([t.name for t in (await client.list_tools()).tools])",
	"asyncio.run(main())",
}

// mcpCurl is one POST of a JSON-RPC message to the front's MCP endpoint.
const mcpCurl = `curl -sS -w '\n' $MCP -H "Authorization: Bearer $ALICE" "$GW/mcp"`

// mcpCall is a tools/call request for sh's single quotes; arguments may
// close and reopen the quotes to expand a variable.
func mcpCall(id int, tool, arguments string) string {
	return fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":%q,"arguments":%s}}`, id, tool, arguments)
}

// demoCurl is one POST to an operation route of the front.
func demoCurl(route, token, headerFingerprint, body string) string {
	c := `curl -sS -i -w '\n' "$GW/v1/transfers/` + route + `" -H "Authorization: Bearer ` + token + `"`
	if headerFingerprint != "" {
		c += ` -H "Idempotency-Fingerprint: ` + headerFingerprint + `"`
	}
	return c + ` -H 'Content-Type: application/json' -d ` + body
}

// withFingerprint quotes a transfer for sh with "fingerprint":"$FP" first.
func withFingerprint(transfer string) string {
	return withNamedFingerprint("$FP", transfer)
}

// withNamedFingerprint is withFingerprint with the variable v ("$AFP").
func withNamedFingerprint(v, transfer string) string {
	return `'{"fingerprint":"'"` + v + `"'",` + transfer[1:] + `'`
}

// approvalCurl is one call of the approvers' API on $APPROVAL_ID as the
// holder of token: a read without action, else a decision with reason.
func approvalCurl(token, action, reason string) string {
	c := `curl -sS -i -w '\n' -H "Authorization: Bearer ` + token + `"`
	if action == "" {
		return c + ` "$APPROVALS/v1/approvals/$APPROVAL_ID"`
	}
	return c + ` -H 'Content-Type: application/json' -d '{"reason":"` + reason + `"}' "$APPROVALS/v1/approvals/$APPROVAL_ID/` + action + `"`
}

// expiredFingerprint signs demoTransfer for subject with the demo's key and
// an expiry in the past, as a preview would have signed it back then.
func expiredFingerprint(rt *config.Runtime, subject string, exp time.Time) (string, error) {
	target, _, ok := rt.Routes.Match(http.MethodPost, "/v1/transfers/preview")
	if !ok {
		return "", errors.New("envoy/idemgate.yaml has no operation previewed at POST /v1/transfers/preview")
	}
	op := target.Op
	doc, err := fingerprint.ParseJSON([]byte(demoTransfer), rt.Limits.MaxJSONDepth)
	if err != nil {
		return "", fmt.Errorf("failed to parse the demo transfer: %w", err)
	}
	params, err := op.Selector.Select(doc, nil)
	if err != nil {
		return "", fmt.Errorf("failed to select the demo transfer's params: %w", err)
	}
	nonce, err := fingerprint.NewNonce()
	if err != nil {
		return "", err
	}
	token, _, err := rt.Keys.Sign(fingerprint.SignRequest{Subject: subject, Scope: op.Scope, Params: params, Nonce: nonce, Expiry: exp})
	if err != nil {
		return "", fmt.Errorf("failed to sign the expired fingerprint: %w", err)
	}
	return token, nil
}
