"""An agent on the official Python SDK (PyPI `mcp` 2.x) that knows nothing of
idemgate, run once per scenario by TestMCPPythonApproval: it previews a
transfer, confirms it and confirms it again, and prints one JSON object with
what it saw. The confirm is a plain `client.call_tool`: when the server
answers `input_required`, the SDK itself runs the elicitation handler and
retries the call with the handler's answer and the server's requestState.

The handler (docs/design.md §13) does what the person at the keyboard does
with a URL-mode elicitation: it opens the page (an HTTP GET with the token
the SSO proxy would set), is told to authenticate more strongly (RFC 9470:
401 insufficient_user_authentication), authenticates again (a stepped-up
token), reads the page, approves it with the page's own form and reads the
page once more ("return to your agent"). Then it accepts, and the SDK
retries.

The scenario comes as one JSON object on stdin:
  url, agent_token          the gateway's MCP endpoint and the agent's token
  preview_tool, confirm_tool, args
  handler                   approve | decline | none (no elicitation support)
                            | tamper (drives the first round itself, then
                            retries with a changed requestState)
  weak_token, strong_token  the person's tokens (approve)
"""

import asyncio
import json
import re
import sys

import httpx2
import mcp_types
from mcp import Client
from mcp.client.streamable_http import streamable_http_client


def seen(result):
    texts = [c.text for c in result.content if getattr(c, "type", "") == "text"]
    return {"is_error": result.is_error, "structured": result.structured_content, "texts": texts, "meta": result.meta or {}}


def described(exc):
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    out = {"type": type(exc).__name__, "message": str(exc)}
    code = getattr(exc, "code", None)
    if code is None and getattr(exc, "error", None) is not None:
        code = getattr(exc.error, "code", None)
    if isinstance(code, int):
        out["code"] = code
    return out


async def person(cfg, params, log):
    """What a person does with the approval page."""
    page = []
    log["page"] = page
    async with httpx2.AsyncClient(timeout=30, follow_redirects=False) as web:
        r = await web.get(params.url, headers={"Authorization": "Bearer " + cfg["weak_token"]})
        page.append({"step": "open", "status": r.status_code, "www_authenticate": r.headers.get("www-authenticate", "")})
        strong = {"Authorization": "Bearer " + cfg["strong_token"]}
        r = await web.get(params.url, headers=strong)
        m = re.search(r'name="csrf" value="([0-9a-f]+)"', r.text)
        page.append({"step": "stepped_up", "status": r.status_code, "html": r.text})
        if m is None:
            return mcp_types.ElicitResult(action="cancel")
        r = await web.post(params.url, headers=strong, data={"csrf": m.group(1), "decision": "approve", "reason": "my own rent, confirmed with my key"})
        page.append({"step": "approve", "status": r.status_code, "location": r.headers.get("location", "")})
        r = await web.get(params.url, headers=strong)
        page.append({"step": "after", "status": r.status_code, "html": r.text})
    return mcp_types.ElicitResult(action="accept")


async def main(cfg):
    out = {"elicitations": []}

    async def handler(ctx, params):
        out["elicitations"].append({"mode": params.mode, "url": getattr(params, "url", None), "message": params.message})
        if cfg["handler"] == "decline":
            return mcp_types.ElicitResult(action="decline")
        return await person(cfg, params, out)

    callback = None if cfg["handler"] == "none" else handler
    http = httpx2.AsyncClient(headers={"Authorization": "Bearer " + cfg["agent_token"]}, timeout=60)
    async with http:
        transport = streamable_http_client(cfg["url"], http_client=http)
        async with Client(transport, mode="auto", cache=None, elicitation_callback=callback) as client:
            await client.list_tools()
            args = dict(cfg["args"])
            pv = await client.call_tool(cfg["preview_tool"], args)
            args["fingerprint"] = pv.structured_content["fingerprint"]
            out["fingerprint"] = args["fingerprint"]
            if cfg["handler"] == "tamper":
                first = await client.session.call_tool(cfg["confirm_tool"], args, allow_input_required=True)
                out["first_result_type"] = first.result_type
                state = first.request_state
                tampered = state[:-4] + ("AAAA" if not state.endswith("AAAA") else "BBBB")
                key = next(iter(first.input_requests))
                try:
                    r = await client.session.call_tool(cfg["confirm_tool"], args, input_responses={key: mcp_types.ElicitResult(action="accept")},
                                                       request_state=tampered, allow_input_required=True)
                    out["tampered"] = {"result": seen(r)} if hasattr(r, "content") else {"result_type": r.result_type}
                except Exception as exc:  # noqa: BLE001 - reported
                    out["tampered"] = {"error": described(exc)}
                print(json.dumps(out), flush=True)
                # The test approves now, then sends one line: retry with the
                # tampered state again.
                await asyncio.to_thread(sys.stdin.readline)
                try:
                    r = await client.session.call_tool(cfg["confirm_tool"], args, input_responses={key: mcp_types.ElicitResult(action="accept")},
                                                       request_state=tampered, allow_input_required=True)
                    out["tampered_after_approval"] = {"result": seen(r)} if hasattr(r, "content") else {"result_type": r.result_type}
                except Exception as exc:  # noqa: BLE001
                    out["tampered_after_approval"] = {"error": described(exc)}
                print(json.dumps(out), flush=True)
                return
            for name in ("confirm", "retry"):
                try:
                    out[name] = {"result": seen(await client.call_tool(cfg["confirm_tool"], args))}
                except Exception as exc:  # noqa: BLE001
                    out[name] = {"error": described(exc)}
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    asyncio.run(main(json.loads(sys.stdin.readline())))
