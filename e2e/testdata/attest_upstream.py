"""A payments-like upstream in Python for e2e/attestation_test.go: a lenient WSGI app (any
method, case, trailing slash reach the confirm handler) behind idemgate_attest's
WSGIMiddleware with the JWKS in a file. Prints "listening PORT" once serving.

    python3 attest_upstream.py JWKS_FILE
"""

import json
import sys
import threading
import wsgiref.simple_server

from idemgate_attest import Verifier, WSGIMiddleware

lock = threading.Lock()
executions = []


def confirm(environ, start_response):
    body = environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
    claims = environ.get("idemgate.attestation")
    with lock:
        executions.append(claims["idk"] if claims else None)
        n = len(executions)
    out = json.dumps({"transfer_id": "tr_py_%d" % n, "status": "completed", "amount": json.loads(body).get("amount")}).encode()
    start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(out)))])
    return [out]


def app(verifier):
    guarded = WSGIMiddleware(confirm, verifier)

    def route(environ, start_response):
        path = environ.get("PATH_INFO", "").lower().rstrip("/")
        if path.endswith("/v1/transfers/confirm"):
            return guarded(environ, start_response)
        if path == "/v1/transfers/preview":
            environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
            out = b'{"status":"quoted","fee":"0.50"}'
        elif path == "/_stats":
            with lock:
                out = json.dumps({"executions": len(executions), "keys": executions}).encode()
        else:
            start_response("404 Not Found", [("Content-Type", "text/plain")])
            return [b"not found"]
        start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(out)))])
        return [out]

    return route


class Quiet(wsgiref.simple_server.WSGIRequestHandler):
    def log_message(self, *args):
        pass


def main():
    with open(sys.argv[1], encoding="utf-8") as f:
        verifier = Verifier(keys=f.read())
    server = wsgiref.simple_server.make_server("127.0.0.1", 0, app(verifier), handler_class=Quiet)
    print("listening %d" % server.server_port, flush=True)
    server.serve_forever(poll_interval=0.05)


if __name__ == "__main__":
    main()
