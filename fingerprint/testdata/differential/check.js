#!/usr/bin/env node
// Reads bodies with JavaScript's JSON.parse and says whether the bound
// values are the previewed ones (the binding rule's differential test;
// driven by fingerprint/binding_differential_test.go). Same protocol as
// check.py.
'use strict';
const fs = require('fs');

// decimalKey writes a decimal string or a JS number as a canonical decimal
// text (no exponent, no trailing zeros), so "250.00" and 250 compare equal
// and 250.001 does not. Returns null for anything that is not a decimal.
function decimalKey(v) {
  let s;
  if (typeof v === 'number') {
    if (!Number.isFinite(v)) return null;
    s = Object.is(v, -0) ? '-0' : String(v);
  } else if (typeof v === 'string') {
    s = v;
  } else {
    return null;
  }
  const m = /^(-?)(\d+)(?:\.(\d+))?(?:[eE]([+-]?\d+))?$/.exec(s);
  if (!m) return null;
  let digits = m[2] + (m[3] || '');
  let exp = (m[4] ? parseInt(m[4], 10) : 0) - (m[3] || '').length;
  digits = digits.replace(/^0+/, '');
  if (digits === '') return (m[1] ? '-' : '') + '0';
  while (digits.endsWith('0')) { digits = digits.slice(0, -1); exp++; }
  return m[1] + digits + 'e' + exp;
}

function bound(doc) {
  if (doc === null || typeof doc !== 'object' || Array.isArray(doc)) throw new Error('not an object');
  const payee = doc.payee;
  const account = payee !== null && typeof payee === 'object' ? payee.account_id : undefined;
  return [decimalKey(doc.amount), doc.currency, account];
}

const readers = {
  // Buffer#toString: invalid UTF-8 becomes U+FFFD, a BOM stays (and fails).
  'node-json-parse': (raw) => JSON.parse(raw.toString('utf8')),
  // TextDecoder (fetch's Request#json, WHATWG): strips a BOM.
  'node-textdecoder-json-parse': (raw) => JSON.parse(new TextDecoder('utf-8').decode(raw)),
};

const cases = JSON.parse(fs.readFileSync(process.argv[2], 'utf8'));
const out = [];
for (const c of cases) {
  const raw = Buffer.from(c.body_b64, 'base64');
  const want = [decimalKey(c.amount), c.currency, c.account_id];
  for (const [name, read] of Object.entries(readers)) {
    let got;
    try {
      got = bound(read(raw));
    } catch (e) {
      out.push(JSON.stringify({ id: c.id, reader: name, verdict: 'refused', got: String(e.message).slice(0, 200) }));
      continue;
    }
    const same = got.length === want.length && got.every((g, i) => g === want[i]);
    out.push(JSON.stringify({ id: c.id, reader: name, verdict: same ? 'same' : 'differs', got: JSON.stringify(got).slice(0, 300) }));
  }
}
process.stdout.write(out.join('\n') + '\n');
