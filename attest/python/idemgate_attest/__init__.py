"""Verify idemgate execution attestations in a Python upstream.

idemgate adds a signed attestation (a compact JWS, EdDSA/Ed25519) to every
request it forwards after acquiring the idempotency record: header
``Idempotency-Attestation`` and, for an MCP ``tools/call``, also
``params._meta["io.idemgate/attestation"]``. It binds the idempotency key,
the operation, the canonical hash of the money-moving params, the method and
path as forwarded and a short expiry. A request that went around idemgate
has none, and the middleware refuses it (403) before the application runs.

    from idemgate_attest import Verifier, ASGIMiddleware, WSGIMiddleware

    verifier = Verifier(jwks_url="http://idemgate-admin:9090/.well-known/jwks.json")
    app = ASGIMiddleware(app, verifier)          # FastAPI, Starlette, ...
    # or: app.wsgi_app = WSGIMiddleware(app.wsgi_app, verifier)   # Flask, Django

Wrap only the confirm routes (or give ``mcp_tools`` for an MCP endpoint).
Roll out with ``log_only=True`` first. Standard library plus ``cryptography``.
"""

from .canonical import ParamError, canonical_decimal, canonical_json, canonical_params, param_hash, parse_json
from .verifier import ASGIMiddleware, VerifyError, Verifier, WSGIMiddleware

__all__ = [
    "ASGIMiddleware",
    "ParamError",
    "Verifier",
    "VerifyError",
    "WSGIMiddleware",
    "canonical_decimal",
    "canonical_json",
    "canonical_params",
    "param_hash",
    "parse_json",
]
