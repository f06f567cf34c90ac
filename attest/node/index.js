'use strict';
// Verify idemgate execution attestations in a Node upstream.
//
// idemgate adds a signed attestation (a compact JWS, EdDSA/Ed25519) to every
// request it forwards after acquiring the idempotency record: header
// Idempotency-Attestation and, for an MCP tools/call, also
// params._meta["io.idemgate/attestation"]. It binds the idempotency key,
// the operation, the canonical hash of the money-moving params, the method
// and path as forwarded and a short expiry. A request that went around
// idemgate has none, and the middleware refuses it (403) before the
// handler runs. No dependencies beyond node's crypto.
//
//   const { createVerifier, express, fastify } = require('idemgate-attest');
//   const v = createVerifier({ jwksUrl: 'http://idemgate-admin:9090/.well-known/jwks.json' });
//   app.post('/v1/transfers/confirm', express(v), handler);   // before (or instead of) express.json()
//   app.register(async (scope) => { await scope.register(fastify(v)); scope.post('/v1/transfers/confirm', handler); });
//
// Roll out with { logOnly: true } first.
const crypto = require('crypto');
const { ParamError, parseJSON, paramHash, isObject } = require('./canonical');

const HEADER = 'idempotency-attestation';
const MCP_META_KEY = 'io.idemgate/attestation';
const ALGORITHM = 'EdDSA';
const TYPE = 'idemgate-attestation+jwt';
const MAX_TOKEN_BYTES = 16 << 10;

// The refusal names every verifier answers with (the Go and Python ones too).
const MISSING = 'attestation_missing';
const INVALID = 'attestation_invalid';
const EXPIRED = 'attestation_expired';
const OTHER_REQUEST = 'attestation_other_request';
const PARAMS_DIFFER = 'attestation_params_differ';
const KEYS_STALE = 'attestation_keys_stale';

class VerifyError extends Error {
  constructor(reason, detail) {
    super(detail ? `${reason}: ${detail}` : reason);
    this.reason = reason;
  }
}

const CLAIMS = {
  v: 'int', iss: 'string', idk: 'string', scope: 'string', ph: 'string', params: 'array', pv: 'object', mcp_tool: 'string',
  htm: 'string', htu: 'string', sub: 'string', own: 'string', fen: 'int', iat: 'int', exp: 'int',
};
const REQUIRED = ['v', 'iss', 'idk', 'scope', 'ph', 'params', 'htm', 'htu', 'iat', 'exp'];

function b64url(s) {
  if (!/^[A-Za-z0-9_-]*$/.test(s) || s.length % 4 === 1) throw new VerifyError(INVALID, 'not base64url');
  return Buffer.from(s, 'base64url');
}

// parseJWKS reads a JWKS of Ed25519 keys into a Map kid -> KeyObject; any
// other key is an error, not skipped.
function parseJWKS(doc) {
  if (typeof doc === 'string' || Buffer.isBuffer(doc)) doc = JSON.parse(doc.toString());
  const keys = new Map();
  for (const k of (doc && doc.keys) || []) {
    if (k.kty !== 'OKP' || k.crv !== 'Ed25519' || (k.alg && k.alg !== ALGORITHM) || (k.use && k.use !== 'sig') || !k.kid || keys.has(k.kid)) {
      throw new Error(`jwks: key ${JSON.stringify(k.kid)} is not an Ed25519 signing key (or its kid repeats)`);
    }
    keys.set(k.kid, crypto.createPublicKey({ key: { kty: 'OKP', crv: 'Ed25519', x: k.x }, format: 'jwk' }));
  }
  if (keys.size === 0) throw new Error('jwks: no keys');
  return keys;
}

function toClaims(payload) {
  let c;
  try { c = parseJSON(payload); } catch (e) { throw new VerifyError(INVALID, `payload: ${e.message}`); }
  if (!isObject(c)) throw new VerifyError(INVALID, 'payload is not an object');
  for (const k of Object.keys(c)) {
    const want = CLAIMS[k];
    const v = c[k];
    if (want === undefined) throw new VerifyError(INVALID, `unknown claim ${k}`);
    if (want === 'int') {
      if (!v || typeof v.text !== 'string' || !/^-?[0-9]+$/.test(v.text)) throw new VerifyError(INVALID, `claim ${k}`);
      c[k] = Number(v.text);
    } else if (want === 'array' ? !Array.isArray(v) : want === 'object' ? !isObject(v) : typeof v !== want) {
      throw new VerifyError(INVALID, `claim ${k}`);
    }
  }
  for (const k of REQUIRED) if (!(k in c)) throw new VerifyError(INVALID, `missing claim ${k}`);
  if (c.v !== 1 || c.iss !== 'idemgate' || c.exp < c.iat) throw new VerifyError(INVALID, 'version, issuer or times');
  c.params = c.params.map((p) => ({ path: p.path, type: p.type, normalize: p.normalize }));
  return c;
}

// createVerifier: keys (a JWKS object or text) or jwksUrl (idemgate's admin
// /.well-known/jwks.json, fetched again on an unknown kid at most every
// refreshMinInterval ms and after maxAge ms, so a rotation needs no
// restart; while every re-fetch fails the last set is used for maxStale ms
// past maxAge, then every attestation is refused as attestation_keys_stale,
// so a withdrawn key cannot stay valid because the JWKS is unreachable). mcpTools makes it an MCP endpoint's verifier: only tools/call
// of those tools needs an attestation. keyHeader, when present, must equal
// the attested key. leeway (seconds) tolerates clock skew. logOnly logs
// refusals and lets requests through.
function createVerifier(opts = {}) {
  if ((opts.keys === undefined) === (opts.jwksUrl === undefined)) throw new Error('set exactly one of keys and jwksUrl');
  const o = {
    mcpTools: new Set(opts.mcpTools || []), keyHeader: (opts.keyHeader || 'idempotency-key').toLowerCase(),
    leeway: opts.leeway === undefined ? 5 : opts.leeway, maxBodyBytes: opts.maxBodyBytes || 1 << 20, logOnly: !!opts.logOnly,
    refreshMinInterval: opts.refreshMinInterval === undefined ? 5000 : opts.refreshMinInterval, maxAge: opts.maxAge || 300000,
    maxStale: opts.maxStale === undefined ? 60000 : Math.max(opts.maxStale, 0),
    now: opts.now || (() => Date.now()), logger: opts.logger || console,
  };
  let keys = opts.keys !== undefined ? parseJWKS(opts.keys) : null;
  let fetchedAt = 0;
  let triedAt = -Infinity;
  let inflight = null;

  async function key(kid) {
    if (opts.jwksUrl === undefined) return keys.get(kid);
    const now = o.now();
    const stale = keys === null || now - fetchedAt > o.maxAge;
    if ((stale || !keys.has(kid)) && now - triedAt >= o.refreshMinInterval) {
      triedAt = now;
      inflight = inflight || (async () => {
        try {
          const resp = await fetch(opts.jwksUrl, { signal: AbortSignal.timeout(5000) });
          if (!resp.ok) throw new Error(`status ${resp.status}`);
          keys = parseJWKS(await resp.text());
          fetchedAt = now;
        } catch (e) {
          o.logger.warn(`idemgate attestation: failed to fetch the JWKS from ${opts.jwksUrl}: ${e.message}`);
        } finally {
          inflight = null;
        }
      })();
    }
    if (inflight) await inflight;
    if (keys === null) return undefined;
    const age = o.now() - fetchedAt;
    if (age > o.maxAge + o.maxStale) {
      throw new VerifyError(KEYS_STALE, `the JWKS at ${opts.jwksUrl} could not be re-fetched: last fetched ${Math.round(age / 1000)}s ago (maxAge ${o.maxAge}ms + maxStale ${o.maxStale}ms)`);
    }
    return keys.get(kid);
  }

  async function claimsOf(token) {
    if (token.length > MAX_TOKEN_BYTES || token.split('.').length !== 3) throw new VerifyError(INVALID, 'not a compact JWS');
    const [h, p, s] = token.split('.');
    let header;
    try { header = JSON.parse(b64url(h).toString('utf8')); } catch (e) { throw new VerifyError(INVALID, 'header'); }
    if (!isObject(header) || Object.keys(header).sort().join() !== 'alg,kid,typ' || header.alg !== ALGORITHM || header.typ !== TYPE || typeof header.kid !== 'string') {
      throw new VerifyError(INVALID, `header ${JSON.stringify(header)}`);
    }
    const pub = await key(header.kid);
    if (!pub) throw new VerifyError(INVALID, `unknown key ${header.kid}`);
    if (!crypto.verify(null, Buffer.from(`${h}.${p}`, 'ascii'), pub, b64url(s))) throw new VerifyError(INVALID, 'signature');
    return toClaims(b64url(p));
  }

  // verify checks one request: path is the request target as received
  // (with its query), doc the parsed body (or an MCP call's arguments).
  async function verify({ method, path, token, doc, idempotencyKey = '', mcpTool = '' }) {
    if (!token) throw new VerifyError(MISSING);
    const c = await claimsOf(token);
    const now = Math.floor(o.now() / 1000);
    if (now > c.exp + o.leeway) throw new VerifyError(EXPIRED, `at ${c.exp}, now ${now}`);
    if (c.iat > now + o.leeway) throw new VerifyError(EXPIRED, 'issued in the future');
    if (c.htm !== method || c.htu !== path) throw new VerifyError(OTHER_REQUEST, `attested ${c.htm} ${c.htu}, received ${method} ${path}`);
    if ((c.mcp_tool || '') !== mcpTool) throw new VerifyError(OTHER_REQUEST, `attested tool ${c.mcp_tool || ''}, called ${mcpTool}`);
    if (idempotencyKey && idempotencyKey !== c.idk) throw new VerifyError(OTHER_REQUEST, 'idempotency key differs');
    let ph;
    try { ph = paramHash(c.params, doc, c.pv); } catch (e) { throw new VerifyError(PARAMS_DIFFER, e.message); }
    if (ph !== c.ph) throw new VerifyError(PARAMS_DIFFER);
    return c;
  }

  function guardedCall(msg) {
    if (!isObject(msg) || msg.method !== 'tools/call') return null;
    const params = isObject(msg.params) ? msg.params : {};
    if (typeof params.name !== 'string' || !o.mcpTools.has(params.name)) return null;
    const meta = isObject(params._meta) ? params._meta : {};
    const token = typeof meta[MCP_META_KEY] === 'string' ? meta[MCP_META_KEY] : '';
    return { tool: params.name, args: params.arguments === undefined ? {} : params.arguments, token };
  }

  // check verifies a whole request (headers: lower-case names; body: a
  // Buffer). Resolves to the claims, or null for an MCP message that needs
  // none; rejects with VerifyError.
  async function check({ method, path, headers, body }) {
    if (body.length > o.maxBodyBytes) throw new VerifyError(PARAMS_DIFFER, 'body too large to check');
    let token = headers[HEADER] || '';
    const idempotencyKey = headers[o.keyHeader] || '';
    if (o.mcpTools.size === 0) {
      if (!token) throw new VerifyError(MISSING);
      let doc;
      try { doc = parseJSON(body); } catch (e) { throw new VerifyError(PARAMS_DIFFER, e.message); }
      return verify({ method, path, token, doc, idempotencyKey });
    }
    if (body.toString('utf8').trim() === '') return null; // GET (the SSE stream), DELETE (session end): no call
    let msg;
    // Not strict JSON: refused, a lenient parser might still read a guarded call in it.
    try { msg = parseJSON(body); } catch (e) { throw new VerifyError(INVALID, `not JSON-RPC: ${e.message}`); }
    if (Array.isArray(msg)) {
      if (msg.some((m) => guardedCall(m))) throw new VerifyError(OTHER_REQUEST, 'a batch holds a guarded tools/call');
      return null;
    }
    const call = guardedCall(msg);
    if (!call) return null;
    if (call.token) {
      if (token && token !== call.token) throw new VerifyError(OTHER_REQUEST, 'header and params._meta attestations differ');
      token = call.token;
    }
    return verify({ method, path, token, doc: call.args, idempotencyKey, mcpTool: call.tool });
  }

  // decide: { claims } to let the request through, { error } to refuse it.
  async function decide(req) {
    try {
      return { claims: await check(req) };
    } catch (e) {
      if (!(e instanceof VerifyError)) throw e;
      o.logger.warn(`idemgate attestation refused: ${e.message} (${req.method} ${req.path}, logOnly=${o.logOnly})`);
      return o.logOnly ? { claims: null } : { error: e };
    }
  }

  return { verify, check, decide, options: o };
}

function refusalBody(e) {
  return JSON.stringify({ error: e.reason, message: 'this request did not pass idemgate: refused' }) + '\n';
}

function readBody(req, limit) {
  return new Promise((resolve, reject) => {
    const chunks = [];
    let size = 0;
    req.on('data', (c) => {
      size += c.length;
      if (size <= limit + 1) chunks.push(c);
    });
    req.on('end', () => resolve(Buffer.concat(chunks)));
    req.on('error', reject);
  });
}

// express returns (req, res, next) middleware for Express, Connect or a
// plain node:http server. Mount it before express.json(): it reads the raw
// body (or takes req.rawBody, e.g. from express.json({ verify })), then sets
// req.rawBody and req.body (JSON.parse, as express.json would) and
// req.idemgateAttestation. A body already parsed without its bytes is an
// error (500): the params cannot be recomputed.
function express(verifier) {
  return function idemgateAttestation(req, res, next) {
    (async () => {
      let body;
      if (Buffer.isBuffer(req.rawBody)) body = req.rawBody;
      else if (req._body || req.readableEnded) throw new Error('idemgate-attest: the body was parsed before the middleware: mount it before express.json(), or keep req.rawBody');
      else body = await readBody(req, verifier.options.maxBodyBytes);
      const { claims, error } = await verifier.decide({ method: req.method, path: req.originalUrl || req.url, headers: req.headers, body });
      if (error) {
        const payload = refusalBody(error);
        res.statusCode = 403;
        res.setHeader('Content-Type', 'application/json');
        res.setHeader('Content-Length', Buffer.byteLength(payload));
        res.end(payload);
        return;
      }
      req.rawBody = body;
      if (!req._body && body.length > 0) {
        try { req.body = JSON.parse(body.toString('utf8')); req._body = true; } catch (e) { /* left to the app's parser */ }
      }
      if (claims) req.idemgateAttestation = claims;
      next();
    })().catch(next);
  };
}

// fastify returns a plugin: it keeps each JSON body's bytes (a content type
// parser that still gives request.body as JSON.parse does) and checks the
// attestation in a preHandler hook; claims are request.idemgateAttestation.
// Like a fastify-plugin plugin it is not encapsulated: it guards the routes
// of the scope it is registered in, so register it in a scope that holds
// the confirm routes only (or every route, with mcpTools for /mcp).
function fastify(verifier) {
  async function idemgateAttestation(instance) {
    if (instance.hasContentTypeParser('application/json')) instance.removeContentTypeParser('application/json');
    instance.addContentTypeParser('application/json', { parseAs: 'buffer' }, (req, body, done) => {
      req.rawBody = body;
      if (body.length === 0) return done(null, undefined);
      try { done(null, JSON.parse(body.toString('utf8'))); } catch (e) { e.statusCode = 400; done(e); }
    });
    instance.addHook('preHandler', async (request, reply) => {
      const raw = request.rawBody || request.raw.rawBody; // Fastify 4+ hands the parser its request, 3 the raw one
      const body = Buffer.isBuffer(raw) ? raw : Buffer.alloc(0);
      const { claims, error } = await verifier.decide({ method: request.method, path: request.raw.url, headers: request.headers, body });
      if (error) return reply.code(403).type('application/json').send(refusalBody(error));
      if (claims) request.idemgateAttestation = claims;
      return undefined;
    });
  }
  idemgateAttestation[Symbol.for('skip-override')] = true; // what fastify-plugin sets
  return idemgateAttestation;
}

module.exports = {
  createVerifier, express, fastify, parseJWKS, VerifyError,
  HEADER, MCP_META_KEY, MISSING, INVALID, EXPIRED, OTHER_REQUEST, PARAMS_DIFFER, KEYS_STALE,
  canonical: require('./canonical'),
};
