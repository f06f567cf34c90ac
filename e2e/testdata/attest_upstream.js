'use strict';
// A payments-like upstream in Node for e2e/attestation_test.go: a lenient
// node:http app (any method, case, trailing slash reach the confirm
// handler) with idemgate-attest's Express-style middleware, the JWKS read
// from a file. Prints "listening PORT" once serving.
//
//   node attest_upstream.js JWKS_FILE
const fs = require('fs');
const http = require('http');
const path = require('path');
const { createVerifier, express } = require(path.join(__dirname, '..', '..', 'attest', 'node'));

const verifier = createVerifier({ keys: fs.readFileSync(process.argv[2], 'utf8'), logger: { warn() {} } });
const guard = express(verifier);
const executions = [];

function send(res, status, obj) {
  const out = JSON.stringify(obj);
  res.writeHead(status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(out) });
  res.end(out);
}

const server = http.createServer((req, res) => {
  const p = req.url.split('?')[0].toLowerCase().replace(/\/$/, '');
  if (p.endsWith('/v1/transfers/confirm')) {
    guard(req, res, (err) => {
      if (err) return send(res, 500, { error: String(err) });
      executions.push(req.idemgateAttestation ? req.idemgateAttestation.idk : null);
      return send(res, 200, { transfer_id: `tr_js_${executions.length}`, status: 'completed', amount: req.body.amount });
    });
    return;
  }
  if (p === '/v1/transfers/preview') {
    req.resume();
    req.on('end', () => send(res, 200, { status: 'quoted', fee: '0.50' }));
    return;
  }
  if (p === '/_stats') return send(res, 200, { executions: executions.length, keys: executions });
  return send(res, 404, { error: 'not found' });
});
server.listen(0, '127.0.0.1', () => console.log(`listening ${server.address().port}`));
