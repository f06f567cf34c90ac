'use strict';
// idemgate's golden vectors (fingerprint/testdata/vectors.json) through this package's canonical rules.
const test = require('node:test');
const assert = require('node:assert');
const { parseJSON, canonicalDecimal, canonicalJSON, canonicalParams, paramHash, ParamError } = require('../canonical');
const { vectors } = require('./helpers');

test('numbers', () => {
  const v = vectors();
  assert.ok(v.numbers.length > 0);
  for (const n of v.numbers) {
    if (n.error) assert.throws(() => canonicalDecimal(n.in), ParamError, n.in);
    else assert.strictEqual(canonicalDecimal(n.in), n.out, n.in);
  }
});

test('canonical JSON', () => {
  for (const c of vectors().canonical) assert.strictEqual(canonicalJSON(parseJSON(c.in)), c.out, c.name);
});

test('param hashes', () => {
  const tokens = vectors().tokens;
  assert.ok(tokens.length > 0);
  for (const t of tokens) {
    const doc = parseJSON(Buffer.from(t.body, 'utf8'));
    assert.strictEqual(canonicalParams(t.params, doc, t.path_vars), t.expected.canonical, t.name);
    assert.strictEqual(paramHash(t.params, doc, t.path_vars), t.expected.hash, t.name);
  }
});

test('strict JSON', () => {
  for (const bad of ['{"a":1,"a":2}', '\ufeff{}', '{} x', '{"a":"\\ud800"}', '{"a":"\\udc00"}', '{"a":01}', '{"a":NaN}', '{"a":1,}', "{'a':1}", '{"a":"\u0001"}']) {
    assert.throws(() => parseJSON(Buffer.from(bad, 'utf8')), ParamError, bad);
  }
  assert.throws(() => parseJSON(Buffer.from([0x7b, 0x22, 0x61, 0x22, 0x3a, 0x22, 0xff, 0x22, 0x7d])), ParamError, 'invalid UTF-8');
  parseJSON(Buffer.from('{"a":"\\ud83d\\ude00","b":[1.5e-3,-0,true,false,null],"c":{},"__proto__":{"x":1}}'));
});
