"""Checking an attestation, and the ASGI and WSGI middleware around it."""

import base64
import binascii
import json
import logging
import re
import threading
import time
import urllib.parse
import urllib.request

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from .canonical import Number, ParamError, param_hash, parse_json

HEADER = "idempotency-attestation"
MCP_META_KEY = "io.idemgate/attestation"
ALGORITHM = "EdDSA"
TYPE = "idemgate-attestation+jwt"
ISSUER = "idemgate"
VERSION = 1
MAX_TOKEN_BYTES = 16 << 10

# The refusal names every verifier answers with (the Go and Node ones too).
MISSING = "attestation_missing"
INVALID = "attestation_invalid"
EXPIRED = "attestation_expired"
OTHER_REQUEST = "attestation_other_request"
PARAMS_DIFFER = "attestation_params_differ"
KEYS_STALE = "attestation_keys_stale"

log = logging.getLogger("idemgate_attest")

_CLAIMS = {
    "v": int, "iss": str, "idk": str, "scope": str, "ph": str, "params": list, "pv": dict, "mcp_tool": str,
    "htm": str, "htu": str, "sub": str, "own": str, "fen": int, "iat": int, "exp": int,
}
_REQUIRED = ("v", "iss", "idk", "scope", "ph", "params", "htm", "htu", "iat", "exp")


class VerifyError(Exception):
    """A refused request: reason is one of the names above, detail is for logs."""

    def __init__(self, reason, detail=""):
        super().__init__(reason + (": " + detail if detail else ""))
        self.reason = reason
        self.detail = detail


def _b64url(s):
    if not re.fullmatch(r"[A-Za-z0-9_-]*", s) or len(s) % 4 == 1:
        raise VerifyError(INVALID, "not base64url")
    return base64.urlsafe_b64decode(s + "=" * (-len(s) % 4))


def parse_jwks(data):
    """A JWKS of Ed25519 keys as {kid: Ed25519PublicKey}; any other key is an error."""
    doc = json.loads(data)
    keys = {}
    for k in doc.get("keys") or []:
        if k.get("kty") != "OKP" or k.get("crv") != "Ed25519" or k.get("alg", ALGORITHM) != ALGORITHM \
                or k.get("use", "sig") != "sig" or not k.get("kid"):
            raise ValueError("jwks: key %r is not an Ed25519 signing key" % k.get("kid"))
        x = base64.urlsafe_b64decode(k["x"] + "=" * (-len(k["x"]) % 4))
        if len(x) != 32 or k["kid"] in keys:
            raise ValueError("jwks: key %r: bad x or kid twice" % k["kid"])
        keys[k["kid"]] = Ed25519PublicKey.from_public_bytes(x)
    if not keys:
        raise ValueError("jwks: no keys")
    return keys


class Verifier:
    """Checks attestations. Give keys (a JWKS document: dict, str or bytes) or
    jwks_url (idemgate's admin /.well-known/jwks.json, fetched again on an
    unknown kid at most every refresh_min_interval seconds and after max_age,
    so a key rotation needs no restart; while every re-fetch fails the last set
    is used for max_stale seconds past max_age, then every attestation is
    refused as attestation_keys_stale, so a withdrawn key cannot stay valid
    because the JWKS is unreachable). mcp_tools makes it an MCP endpoint's
    verifier: only tools/call of those tools needs an attestation. key_header,
    when the request has it, must equal the attested key. leeway (seconds)
    tolerates clock skew. log_only logs refusals and lets requests through."""

    def __init__(self, keys=None, jwks_url=None, mcp_tools=(), key_header="idempotency-key", leeway=5,
                 max_body_bytes=1 << 20, log_only=False, refresh_min_interval=5, max_age=300, max_stale=60,
                 now=time.time):
        if (keys is None) == (jwks_url is None):
            raise ValueError("set exactly one of keys and jwks_url")
        if isinstance(keys, dict) and "keys" in keys:
            keys = json.dumps(keys)
        self._keys = parse_jwks(keys) if keys is not None else None
        self._url = jwks_url
        self.mcp_tools = frozenset(mcp_tools)
        self.key_header = key_header.lower()
        self.leeway = leeway
        self.max_body_bytes = max_body_bytes
        self.log_only = log_only
        self._min_interval = refresh_min_interval
        self._max_age = max_age
        self._max_stale = max(max_stale, 0)
        self._now = now
        self._lock = threading.Lock()
        self._fetched_at = 0.0
        self._tried_at = float("-inf")

    def _key(self, kid):
        if self._url is None:
            return self._keys.get(kid)
        with self._lock:
            now = self._now()
            stale = self._keys is None or now - self._fetched_at > self._max_age
            if (stale or kid not in self._keys) and now - self._tried_at >= self._min_interval:
                self._tried_at = now
                try:
                    with urllib.request.urlopen(self._url, timeout=5) as resp:
                        self._keys, self._fetched_at = parse_jwks(resp.read(1 << 20)), now
                except Exception as e:  # keep the old set; a withdrawn key ages out below
                    log.warning("idemgate attestation: failed to fetch the JWKS from %s: %s", self._url, e)
            if self._keys is None:
                return None
            age = now - self._fetched_at
            if age > self._max_age + self._max_stale:
                raise VerifyError(KEYS_STALE, "the JWKS at %s could not be re-fetched: last fetched %ds ago "
                                  "(max_age %ss + max_stale %ss)" % (self._url, age, self._max_age, self._max_stale))
            return self._keys.get(kid)

    def _claims(self, token):
        if len(token) > MAX_TOKEN_BYTES or token.count(".") != 2:
            raise VerifyError(INVALID, "not a compact JWS")
        h, p, s = token.split(".")
        try:
            header = json.loads(_b64url(h))
        except (ValueError, binascii.Error) as e:
            raise VerifyError(INVALID, "header: %s" % e) from e
        if not isinstance(header, dict) or set(header) != {"alg", "typ", "kid"} or header["alg"] != ALGORITHM \
                or header["typ"] != TYPE or not isinstance(header["kid"], str):
            raise VerifyError(INVALID, "header %r" % header)
        key = self._key(header["kid"])
        if key is None:
            raise VerifyError(INVALID, "unknown key %r" % header["kid"])
        try:
            key.verify(_b64url(s), (h + "." + p).encode("ascii"))
        except (InvalidSignature, binascii.Error) as e:
            raise VerifyError(INVALID, "signature") from e
        try:
            claims = parse_json(_b64url(p))
        except ParamError as e:
            raise VerifyError(INVALID, "payload: %s" % e) from e
        if not isinstance(claims, dict) or not set(claims) <= set(_CLAIMS) or any(k not in claims for k in _REQUIRED):
            raise VerifyError(INVALID, "claims %r" % sorted(claims))
        for k, v in list(claims.items()):
            if _CLAIMS[k] is int:
                if not isinstance(v, str) or not re.fullmatch(r"-?[0-9]+", v):
                    raise VerifyError(INVALID, "claim %s" % k)
                claims[k] = int(v)
            elif isinstance(v, Number) or not isinstance(v, _CLAIMS[k]):
                raise VerifyError(INVALID, "claim %s" % k)
        if claims["v"] != VERSION or claims["iss"] != ISSUER or claims["exp"] < claims["iat"]:
            raise VerifyError(INVALID, "version, issuer or times")
        return claims

    def verify(self, method, path, token, doc, idempotency_key="", mcp_tool=""):
        """Check one request (path: the request target as received, with its
        query; doc: the parsed body, or an MCP call's arguments) and return
        the claims, or raise VerifyError."""
        if not token:
            raise VerifyError(MISSING)
        c = self._claims(token)
        now = int(self._now())
        if now > c["exp"] + self.leeway:
            raise VerifyError(EXPIRED, "at %d, now %d" % (c["exp"], now))
        if c["iat"] > now + self.leeway:
            raise VerifyError(EXPIRED, "issued in the future")
        if c["htm"] != method or c["htu"] != path:
            raise VerifyError(OTHER_REQUEST, "attested %s %s, received %s %s" % (c["htm"], c["htu"], method, path))
        if c.get("mcp_tool", "") != mcp_tool:
            raise VerifyError(OTHER_REQUEST, "attested tool %r, called %r" % (c.get("mcp_tool", ""), mcp_tool))
        if idempotency_key and idempotency_key != c["idk"]:
            raise VerifyError(OTHER_REQUEST, "idempotency key differs")
        try:
            ph = param_hash(c["params"], doc, c.get("pv"))
        except (ParamError, KeyError, TypeError, AttributeError) as e:
            raise VerifyError(PARAMS_DIFFER, str(e)) from e
        if ph != c["ph"]:
            raise VerifyError(PARAMS_DIFFER)
        return c

    def check(self, method, path, headers, body):
        """Check a whole request: headers is a {lower-case name: value} dict,
        body its bytes. Returns the claims, or None for an MCP message that
        needs none; raises VerifyError."""
        if len(body) > self.max_body_bytes:
            raise VerifyError(PARAMS_DIFFER, "body too large to check")
        token = headers.get(HEADER, "")
        key = headers.get(self.key_header, "")
        if not self.mcp_tools:
            if not token:
                raise VerifyError(MISSING)
            try:
                doc = parse_json(body)
            except ParamError as e:
                raise VerifyError(PARAMS_DIFFER, str(e)) from e
            return self.verify(method, path, token, doc, key)
        if not body.strip():
            return None  # GET (the SSE stream), DELETE (session end): no call
        try:
            msg = parse_json(body)
        except ParamError as e:  # a lenient parser might still read a guarded call in it
            raise VerifyError(INVALID, "not JSON-RPC: %s" % e) from e
        if isinstance(msg, list):
            if any(self._call(m) for m in msg):
                raise VerifyError(OTHER_REQUEST, "a batch holds a guarded tools/call")
            return None
        call = self._call(msg)
        if call is None:
            return None
        tool, args, meta_token = call
        if meta_token:
            if token and token != meta_token:
                raise VerifyError(OTHER_REQUEST, "header and params._meta attestations differ")
            token = meta_token
        return self.verify(method, path, token, args, key, tool)

    def _call(self, msg):
        if not isinstance(msg, dict) or msg.get("method") != "tools/call":
            return None
        params = msg.get("params")
        params = params if isinstance(params, dict) else {}
        tool = params.get("name")
        if not isinstance(tool, str) or tool not in self.mcp_tools:
            return None
        args = params.get("arguments")
        meta = params.get("_meta")
        token = meta.get(MCP_META_KEY, "") if isinstance(meta, dict) else ""
        return tool, ({} if args is None else args), token if isinstance(token, str) else ""

    def _decide(self, method, path, headers, body):
        """(claims, None) to let the request through, (None, VerifyError) to refuse it."""
        try:
            return self.check(method, path, headers, body), None
        except VerifyError as e:
            log.warning("idemgate attestation refused: %s (%s %s, log_only=%s)", e, method, path, self.log_only)
            return None, (None if self.log_only else e)


def _refusal(e):
    body = json.dumps({"error": e.reason, "message": "this request did not pass idemgate: refused"}).encode() + b"\n"
    return body, [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]


class ASGIMiddleware:
    """Refuses (403) HTTP requests without a valid attestation; the claims go
    to scope["idemgate.attestation"]. The body is read once and replayed."""

    def __init__(self, app, verifier):
        self.app = app
        self.verifier = verifier

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        chunks, size, more = [], 0, True
        while more and size <= self.verifier.max_body_bytes:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                return
            chunk = msg.get("body", b"")
            size += len(chunk)
            chunks.append(chunk)
            more = msg.get("more_body", False)
        body = b"".join(chunks)  # over max_body_bytes: refused below, never handed on half-read
        raw = scope.get("raw_path") or urllib.parse.quote(scope["path"]).encode()
        path = raw.decode("latin-1") + ("?" + scope["query_string"].decode("latin-1") if scope.get("query_string") else "")
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        claims, err = self.verifier._decide(scope["method"], path, headers, body)
        if err is not None:
            payload, hdrs = _refusal(err)
            await send({"type": "http.response.start", "status": 403, "headers": hdrs})
            await send({"type": "http.response.body", "body": payload})
            return
        if claims is not None:
            scope = dict(scope, **{"idemgate.attestation": claims})
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": more}
            return await receive()

        await self.app(scope, replay, send)


class WSGIMiddleware:
    """Refuses (403) requests without a valid attestation; the claims go to
    environ["idemgate.attestation"]. The path compared is RAW_URI or
    REQUEST_URI when the server sets one (gunicorn, uWSGI), else
    SCRIPT_NAME + PATH_INFO re-quoted and QUERY_STRING."""

    def __init__(self, app, verifier):
        self.app = app
        self.verifier = verifier

    def __call__(self, environ, start_response):
        import io

        try:
            length = int(environ.get("CONTENT_LENGTH") or 0)
        except ValueError:
            length = 0
        body = environ["wsgi.input"].read(min(length, self.verifier.max_body_bytes + 1)) if length > 0 else b""
        if length > self.verifier.max_body_bytes:
            body = b"\0" * length  # refused as too large; never handed on half-read
        path = environ.get("RAW_URI") or environ.get("REQUEST_URI")
        if not path:
            path = urllib.parse.quote((environ.get("SCRIPT_NAME", "") + environ.get("PATH_INFO", "")).encode("latin-1"))
            if environ.get("QUERY_STRING"):
                path += "?" + environ["QUERY_STRING"]
        headers = {k[5:].replace("_", "-").lower(): v for k, v in environ.items() if k.startswith("HTTP_")}
        claims, err = self.verifier._decide(environ["REQUEST_METHOD"], path, headers, body)
        if err is not None:
            payload, hdrs = _refusal(err)
            start_response("403 Forbidden", [(k.decode(), v.decode()) for k, v in hdrs])
            return [payload]
        environ["wsgi.input"] = io.BytesIO(body)
        environ["CONTENT_LENGTH"] = str(len(body))
        if claims is not None:
            environ["idemgate.attestation"] = claims
        return self.app(environ, start_response)
