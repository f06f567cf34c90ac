"""An MCP agent on the official Python SDK (PyPI `mcp`) that knows nothing of
idemgate, driven line by line: TestMCPPythonSDK walks it through a preview,
confirm, retry, drift and status; the tests of mcp_python_seed_test.go inject
faults between its calls.

It reads one JSON command a line on stdin and answers each with one JSON line
on stdout carrying the command's id; commands run concurrently, so answers
may come in any order.

  {"id":1,"op":"connect","session":"a"}          open a session: answers the tools it
                                                 listed, {"tools":{name: input schema}}
                                                 (optional "mode": auto | legacy)
  {"id":2,"op":"call","session":"a","tool":T,"args":{...}}
  {"id":3,"op":"parallel","session":"a","n":100,"tool":T,"args":{...}}
  {"id":4,"op":"close","session":"a"}

A call answers {"id":..,"result":SEEN} with what the SDK gave back, or
{"id":..,"error":{"type":..,"message":..,"code":..}} with what it raised
(a dead gateway, a cut stream, a session the transport tore down); parallel
answers {"id":..,"results":[...]} with one of those per call. The script only
ends at the end of stdin.

usage: python mcp_python_agent.py URL BEARER_TOKEN MODE   (MODE: auto | legacy)
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


def described(exc):
    """The innermost exceptions of exc (the SDK's transport raises groups)."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    out = {"type": type(exc).__name__, "message": str(exc)}
    if isinstance(exc, BaseExceptionGroup):
        out["message"] = "; ".join(f"{type(e).__name__}: {e}" for e in exc.exceptions)
    code = getattr(exc, "code", None)
    if isinstance(code, int):
        out["code"] = code
    return out


class Session:
    """One SDK client, entered and left in its own task (anyio's scopes must
    be), so that a transport failure ends this session, not the script."""

    def __init__(self, url, token, mode):
        self.url, self.token, self.mode = url, token, mode
        self.client = None
        self.tools = {}
        self.error = None
        self.ready = asyncio.Event()
        self.dead = asyncio.Event()
        self.stop = asyncio.Event()
        self.task = asyncio.create_task(self.run())

    async def run(self):
        try:
            http = httpx2.AsyncClient(headers={"Authorization": "Bearer " + self.token}, timeout=60)
            async with http:
                transport = streamable_http_client(self.url, http_client=http)
                # cache=None: every call reaches the server.
                async with Client(transport, mode=self.mode, cache=None) as client:
                    listed = await client.list_tools()
                    self.tools = {t.name: t.input_schema for t in listed.tools}
                    self.client = client
                    self.ready.set()
                    await self.stop.wait()
        except BaseException as exc:  # noqa: BLE001 - reported, not raised
            self.error = described(exc)
        finally:
            self.client = None
            if self.error is None:
                self.error = {"type": "SessionClosed", "message": "the session is closed"}
            self.dead.set()
            self.ready.set()

    async def call(self, tool, args):
        await self.ready.wait()
        if self.client is None:
            return {"error": self.error or {"type": "NotConnected", "message": "no session"}}
        call = asyncio.ensure_future(self.client.call_tool(tool, args))
        died = asyncio.ensure_future(self.dead.wait())
        await asyncio.wait({call, died}, return_when=asyncio.FIRST_COMPLETED)
        died.cancel()
        if not call.done():
            call.cancel()
            return {"error": self.error}
        try:
            return {"result": seen(call.result())}
        except BaseException as exc:  # noqa: BLE001
            return {"error": described(exc)}


async def handle(cmd, sessions, url, token, mode):
    op, name = cmd.get("op"), cmd.get("session", "main")
    if op == "connect":
        s = Session(url, token, cmd.get("mode", mode))
        sessions[name] = s
        await s.ready.wait()
        return {"error": s.error} if s.client is None else {"connected": name, "tools": s.tools}
    s = sessions.get(name)
    if s is None:
        return {"error": {"type": "NoSession", "message": f"no session {name!r}"}}
    if op == "call":
        return await s.call(cmd["tool"], cmd.get("args"))
    if op == "parallel":
        results = await asyncio.gather(*(s.call(cmd["tool"], cmd.get("args")) for _ in range(cmd["n"])))
        return {"results": list(results)}
    if op == "close":
        s.stop.set()
        await s.dead.wait()
        return {"closed": name}
    return {"error": {"type": "BadCommand", "message": f"unknown op {op!r}"}}


def answer(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


async def main(url, token, mode):
    sessions = {}
    running = set()

    async def run(cmd):
        try:
            out = await handle(cmd, sessions, url, token, mode)
        except BaseException as exc:  # noqa: BLE001
            out = {"error": described(exc)}
        answer(dict(out, id=cmd.get("id")))

    while True:
        line = await asyncio.to_thread(sys.stdin.readline)
        if not line:
            break
        if not line.strip():
            continue
        task = asyncio.create_task(run(json.loads(line)))
        running.add(task)
        task.add_done_callback(running.discard)
    if running:
        await asyncio.wait(running)
    for s in sessions.values():
        s.stop.set()
    await asyncio.gather(*(s.task for s in sessions.values()), return_exceptions=True)


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))
