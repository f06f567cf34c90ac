'use strict';
// Runs the shared fixtures (attest/testdata/attestations.json) through the
// middleware mounted in real Express and real Fastify apps (installed by
// the Go test TestNodeVerifierInExpressAndFastify, found through
// NODE_PATH; the package itself has no dependencies). Prints one line per
// mismatch and exits 1 on any.
const path = require('path');
const expressLib = require('express');
const Fastify = require('fastify');
const { createVerifier, express, fastify } = require('..');

const f = require(path.join(__dirname, '..', '..', 'testdata', 'attestations.json'));
const quiet = { warn() {} };

async function request(base, c) {
  const resp = await fetch(base + c.path, {
    method: c.method, body: c.body === '' ? undefined : c.body,
    headers: Object.assign({ 'content-type': 'application/json' }, c.headers || {}),
  });
  const text = await resp.text();
  if (resp.status === 200) return text === 'ok' ? 'ok' : `200 ${text}`;
  try { return JSON.parse(text).error || `${resp.status} ${text}`; } catch (e) { return `${resp.status} ${text}`; }
}

const apps = {
  async express(v) {
    const app = expressLib();
    app.use(express(v));
    app.use(expressLib.json()); // after the verifier: it sees the body already read and leaves it
    app.use((req, res) => {
      if (req.rawBody.length > 0 && req.body === undefined) { res.status(500).send('no body'); return; }
      res.send('ok');
    });
    const srv = await new Promise((resolve) => { const s = app.listen(0, '127.0.0.1', () => resolve(s)); });
    return { base: `http://127.0.0.1:${srv.address().port}`, close: () => srv.close() };
  },
  async fastify(v) {
    const app = Fastify();
    await app.register(fastify(v));
    app.all('*', async (request) => {
      if (request.rawBody && request.rawBody.length > 0 && request.body === undefined) throw new Error('no body');
      return 'ok';
    });
    await app.listen({ port: 0, host: '127.0.0.1' });
    return { base: `http://127.0.0.1:${app.server.address().port}`, close: () => app.close() };
  },
};

(async () => {
  let failed = 0;
  let ran = 0;
  for (const [name, start] of Object.entries(apps)) {
    for (const c of f.cases) {
      const v = createVerifier({ keys: f.jwks, mcpTools: c.mcp_tools, now: () => f.now * 1000, logger: quiet });
      const app = await start(v);
      try {
        const got = await request(app.base, c);
        ran++;
        if (got !== c.want) { failed++; console.log(`FAIL ${name}: ${c.name}: got ${got}, want ${c.want}`); }
      } finally {
        await app.close();
      }
    }
  }
  console.log(`frameworks: ${ran} ran, ${failed} failed`);
  process.exit(failed === 0 && ran > 0 ? 0 : 1);
})().catch((e) => { console.error(e); process.exit(1); });
