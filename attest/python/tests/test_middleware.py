"""The shared fixtures (attest/testdata/attestations.json, signed by idemgate's Go code) through the
WSGI middleware behind a real HTTP server, and through the ASGI middleware; log-only; JWKS refresh."""

import asyncio
import http.client
import http.server
import io
import json
import threading
import unittest
import wsgiref.simple_server

from idemgate_attest import ASGIMiddleware, Verifier, VerifyError, WSGIMiddleware

from .helpers import fixtures


def _app_wsgi(environ, start_response):
    body = environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
    if body:
        json.loads(body)  # the handler still gets the whole body
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"ok"]


class _QuietHandler(wsgiref.simple_server.WSGIRequestHandler):
    def log_message(self, *args):
        pass


def _serve_wsgi(app):
    server = wsgiref.simple_server.make_server("127.0.0.1", 0, app, handler_class=_QuietHandler)
    t = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    t.start()
    return server


def _request(port, method, path, headers, body):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request(method, path, body=body.encode("utf-8") if body else None, headers=dict(headers or {}, **{"Content-Type": "application/json"}))
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def _answer(status, payload):
    if status == 200:
        return "ok"
    return json.loads(payload)["error"]


class Fixtures(unittest.TestCase):
    def setUp(self):
        self.f = fixtures()
        self.now = lambda: self.f["now"]

    def verifier(self, case, **kw):
        return Verifier(keys=self.f["jwks"], mcp_tools=case.get("mcp_tools", ()), now=self.now, **kw)

    def test_wsgi_behind_a_real_server(self):
        self.assertTrue(self.f["cases"])
        for case in self.f["cases"]:
            with self.subTest(case["name"]):
                server = _serve_wsgi(WSGIMiddleware(_app_wsgi, self.verifier(case)))
                try:
                    status, payload = _request(server.server_port, case["method"], case["path"], case.get("headers"), case["body"])
                finally:
                    server.shutdown()
                    server.server_close()
                self.assertEqual(_answer(status, payload), case["want"], payload)

    def test_asgi(self):
        for case in self.f["cases"]:
            with self.subTest(case["name"]):
                ran = []

                async def app(scope, receive, send):
                    msg = await receive()
                    if msg["body"]:
                        json.loads(msg["body"])
                    ran.append(scope.get("idemgate.attestation"))
                    await send({"type": "http.response.start", "status": 200, "headers": []})
                    await send({"type": "http.response.body", "body": b"ok"})

                path, _, query = case["path"].partition("?")
                scope = {"type": "http", "method": case["method"], "path": path, "raw_path": path.encode(),
                         "query_string": query.encode(),
                         "headers": [(k.lower().encode(), v.encode()) for k, v in (case.get("headers") or {}).items()]}
                body = case["body"].encode("utf-8")
                parts = [body[: len(body) // 2], body[len(body) // 2:]] if body else [b""]  # two messages

                async def receive():
                    chunk = parts.pop(0)
                    return {"type": "http.request", "body": chunk, "more_body": bool(parts)}

                sent = []

                async def send(msg):
                    sent.append(msg)

                asyncio.run(ASGIMiddleware(app, self.verifier(case))(scope, receive, send))
                status = sent[0]["status"]
                self.assertEqual(_answer(status, sent[1]["body"]), case["want"])
                self.assertEqual(bool(ran), case["want"] == "ok")
                if ran and not case.get("mcp_tools"):
                    self.assertEqual(ran[0]["idk"], "00112233445566778899aabbccddeeff")

    def test_log_only_lets_through(self):
        case = next(c for c in self.f["cases"] if c["want"] == "attestation_missing" and not c.get("mcp_tools"))
        with self.assertLogs("idemgate_attest", "WARNING") as logs:
            server = _serve_wsgi(WSGIMiddleware(_app_wsgi, self.verifier(case, log_only=True)))
            try:
                status, _ = _request(server.server_port, case["method"], case["path"], case.get("headers"), case["body"])
            finally:
                server.shutdown()
                server.server_close()
        self.assertEqual(status, 200)
        self.assertIn("attestation_missing", logs.output[0])
        self.assertIn("log_only=True", logs.output[0])


class JWKSRefresh(unittest.TestCase):
    """A verifier that fetched the JWKS before a key existed accepts the first attestation it signs."""

    def test_unknown_kid_refetches(self):
        f = fixtures()
        full = f["jwks"]
        only_a1 = {"keys": [k for k in full["keys"] if k["kid"] == "a1"]}
        served = [only_a1]
        fetches = []

        class H(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                fetches.append(1)
                data = json.dumps(served[0]).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *a):
                pass

        srv = http.server.HTTPServer(("127.0.0.1", 0), H)
        threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
        clock = [f["now"]]
        try:
            v = Verifier(jwks_url="http://127.0.0.1:%d/.well-known/jwks.json" % srv.server_port, now=lambda: clock[0])
            rotated = next(c for c in f["cases"] if c["name"] == "signed by the verify-only key during a rotation")
            current = next(c for c in f["cases"] if c["name"] == "the attested confirm")

            def check(case):
                return v.check(case["method"], case["path"], {k.lower(): x for k, x in case["headers"].items()}, case["body"].encode())

            self.assertEqual(check(rotated)["idk"], "00112233445566778899aabbccddeeff")  # a1
            served[0] = full  # a2 published and active
            clock[0] += 10
            self.assertEqual(check(current)["idk"], "00112233445566778899aabbccddeeff")  # a2: refetched
            self.assertEqual(len(fetches), 2)
        finally:
            srv.shutdown()
            srv.server_close()


class JWKSStale(unittest.TestCase):
    """While the JWKS cannot be re-fetched the last set is used for max_stale past max_age, then every
    attestation is refused as attestation_keys_stale until a fetch succeeds again."""

    def test_stale_key_set_fails_closed(self):
        f = fixtures()
        down = [False]

        class H(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                if down[0]:
                    self.send_response(503)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                data = json.dumps(f["jwks"]).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *a):
                pass

        srv = http.server.HTTPServer(("127.0.0.1", 0), H)
        threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
        try:
            for max_stale, grace in ((None, 60), (20, 20), (-1, 0)):
                down[0] = False
                start = f["now"]
                clock = [start]
                kwargs = {} if max_stale is None else {"max_stale": max_stale}
                v = Verifier(jwks_url="http://127.0.0.1:%d/.well-known/jwks.json" % srv.server_port,
                             now=lambda: clock[0], max_age=300, **kwargs)
                case = next(c for c in f["cases"] if c["name"] == "the attested confirm")

                def check():
                    try:
                        v.check(case["method"], case["path"], {k.lower(): x for k, x in case["headers"].items()},
                                case["body"].encode())
                        return "ok"
                    except VerifyError as e:
                        return e.reason

                self.assertEqual(check(), "ok")
                down[0] = True
                if grace:
                    # The key set is still used: only the (fixed) attestation itself has expired.
                    clock[0] = start + 300 + grace - 1
                    self.assertEqual(check(), "attestation_expired", max_stale)
                clock[0] = start + 300 + grace + 1
                self.assertEqual(check(), "attestation_keys_stale", max_stale)
                clock[0] += 60
                self.assertEqual(check(), "attestation_keys_stale", max_stale)
                down[0] = False
                clock[0] += 10
                self.assertEqual(check(), "attestation_expired", max_stale)  # keys fresh again
        finally:
            srv.shutdown()
            srv.server_close()


if __name__ == "__main__":
    unittest.main()
