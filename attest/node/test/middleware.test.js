'use strict';
// The shared fixtures (attest/testdata/attestations.json, signed by idemgate's Go code) through the
// Express-style middleware on a real node:http server; log-only; JWKS refresh on an unknown kid.
const test = require('node:test');
const assert = require('node:assert');
const http = require('node:http');
const { createVerifier, express } = require('..');
const { fixtures, quiet } = require('./helpers');

function listen(handler) {
  return new Promise((resolve) => {
    const srv = http.createServer(handler);
    srv.listen(0, '127.0.0.1', () => resolve(srv));
  });
}

async function request(port, c) {
  const resp = await fetch(`http://127.0.0.1:${port}${c.path}`, {
    method: c.method, body: c.body === '' ? undefined : c.body, headers: Object.assign({ 'content-type': 'application/json' }, c.headers || {}),
  });
  const text = await resp.text();
  return resp.status === 200 ? 'ok' : JSON.parse(text).error;
}

// app runs the middleware, then a handler that needs the whole body.
function app(verifier, seen) {
  const mw = express(verifier);
  return (req, res) => mw(req, res, (err) => {
    if (err) { res.statusCode = 500; res.end(String(err)); return; }
    assert.ok(Buffer.isBuffer(req.rawBody) && (req.rawBody.length === 0 || req.body !== undefined));
    if (seen) seen.push(req.idemgateAttestation);
    res.end('ok');
  });
}

test('fixtures through a real server', async () => {
  const f = fixtures();
  assert.ok(f.cases.length > 0);
  for (const c of f.cases) {
    const v = createVerifier({ keys: f.jwks, mcpTools: c.mcp_tools, now: () => f.now * 1000, logger: quiet });
    const seen = [];
    const srv = await listen(app(v, seen));
    try {
      assert.strictEqual(await request(srv.address().port, c), c.want, c.name);
      if (c.want === 'ok' && !c.mcp_tools) assert.strictEqual(seen[0].idk, '00112233445566778899aabbccddeeff', c.name);
    } finally {
      srv.close();
    }
  }
});

test('log-only lets an unattested request through and logs it', async () => {
  const f = fixtures();
  const c = f.cases.find((x) => x.want === 'attestation_missing' && !x.mcp_tools);
  const logged = [];
  const v = createVerifier({ keys: f.jwks, logOnly: true, now: () => f.now * 1000, logger: { warn: (m) => logged.push(m) } });
  const srv = await listen(app(v));
  try {
    assert.strictEqual(await request(srv.address().port, c), 'ok');
  } finally {
    srv.close();
  }
  assert.match(logged[0], /attestation_missing.*logOnly=true/);
});

test('an unknown kid refetches the JWKS (key rotation without a restart)', async () => {
  const f = fixtures();
  let served = { keys: f.jwks.keys.filter((k) => k.kid === 'a1') };
  let fetches = 0;
  const jwks = await listen((req, res) => { fetches++; res.end(JSON.stringify(served)); });
  let now = f.now * 1000;
  const v = createVerifier({ jwksUrl: `http://127.0.0.1:${jwks.address().port}/.well-known/jwks.json`, now: () => now, logger: quiet });
  const lower = (h) => Object.fromEntries(Object.entries(h).map(([k, x]) => [k.toLowerCase(), x]));
  const asRequest = (c) => ({ method: c.method, path: c.path, headers: lower(c.headers), body: Buffer.from(c.body) });
  try {
    const rotated = f.cases.find((c) => c.name === 'signed by the verify-only key during a rotation');
    const current = f.cases.find((c) => c.name === 'the attested confirm');
    assert.strictEqual((await v.check(asRequest(rotated))).idk, '00112233445566778899aabbccddeeff');
    served = f.jwks;
    now += 10000;
    assert.strictEqual((await v.check(asRequest(current))).idk, '00112233445566778899aabbccddeeff');
    assert.strictEqual(fetches, 2);
  } finally {
    jwks.close();
  }
});

test('a key set that cannot be re-fetched is refused after maxAge + maxStale (attestation_keys_stale)', async () => {
  const f = fixtures();
  let down = false;
  const jwks = await listen((req, res) => {
    if (down) { res.statusCode = 503; res.end(); return; }
    res.end(JSON.stringify(f.jwks));
  });
  const lower = (h) => Object.fromEntries(Object.entries(h).map(([k, x]) => [k.toLowerCase(), x]));
  const current = f.cases.find((c) => c.name === 'the attested confirm');
  const asRequest = (c) => ({ method: c.method, path: c.path, headers: lower(c.headers), body: Buffer.from(c.body) });
  try {
    for (const [maxStale, grace] of [[undefined, 60000], [20000, 20000], [-1, 0]]) {
      down = false;
      const start = f.now * 1000;
      let now = start;
      const v = createVerifier({ jwksUrl: `http://127.0.0.1:${jwks.address().port}/.well-known/jwks.json`, now: () => now, logger: quiet, maxAge: 300000, maxStale });
      const reason = async () => {
        try { await v.check(asRequest(current)); return 'ok'; } catch (e) { return e.reason; }
      };
      assert.strictEqual(await reason(), 'ok');
      down = true;
      if (grace > 0) {
        // The key set is still used: only the (fixed) attestation itself has expired.
        now = start + 300000 + grace - 1000;
        assert.strictEqual(await reason(), 'attestation_expired', String(maxStale));
      }
      now = start + 300000 + grace + 1000;
      assert.strictEqual(await reason(), 'attestation_keys_stale', String(maxStale));
      now += 60000;
      assert.strictEqual(await reason(), 'attestation_keys_stale', String(maxStale));
      down = false;
      now += 10000;
      assert.strictEqual(await reason(), 'attestation_expired', String(maxStale)); // keys fresh again
    }
  } finally {
    jwks.close();
  }
});
