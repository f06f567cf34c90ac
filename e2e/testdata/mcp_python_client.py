"""An MCP agent on the official Python SDK (PyPI `mcp`) that knows nothing of
idemgate: it lists the tools, previews a transfer, confirms it with the
fingerprint it was shown, retries the confirm (a new request, a new JSON-RPC
id), confirms a drifted amount and asks the status tool. It prints one JSON
object describing what it saw; TestMCPPythonSDK asserts on it.

usage: python mcp_python_client.py URL BEARER_TOKEN MODE   (MODE: auto | legacy)
"""

import asyncio
import json
import sys

import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client


def seen(result):
    texts = [c.text for c in result.content if getattr(c, "type", "") == "text"]
    return {
        "is_error": result.is_error,
        "structured": result.structured_content,
        "texts": texts,
        "meta": result.meta or {},
    }


async def main(url, token, mode):
    http = httpx2.AsyncClient(headers={"Authorization": "Bearer " + token}, timeout=60)
    out = {}
    async with http:
        transport = streamable_http_client(url, http_client=http)
        # cache=None: every call reaches the server (no tools/list cache).
        async with Client(transport, mode=mode, cache=None) as client:
            tools = await client.list_tools()
            out["tools"] = {t.name: t.input_schema for t in tools.tools}
            args = {"amount": "42.00", "currency": "EUR", "payee": {"account_id": "acct_py"}, "memo": "books"}
            preview = await client.call_tool("transfer_preview", args)
            out["preview"] = seen(preview)
            args["fingerprint"] = preview.structured_content["fingerprint"]
            out["confirm"] = seen(await client.call_tool("transfer_confirm", args))
            args["memo"] = "books, again"
            out["retry"] = seen(await client.call_tool("transfer_confirm", args))
            drifted = dict(args, amount="4200.00")
            out["drift"] = seen(await client.call_tool("transfer_confirm", drifted))
            out["status"] = seen(await client.call_tool("transfer_status", {"fingerprint": args["fingerprint"]}))
    print(json.dumps(out))


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))
