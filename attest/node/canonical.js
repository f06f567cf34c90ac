'use strict';
// idemgate's canonical parameters from a request body's bytes: an object of
// the bound params keyed by their paths as configured, keys sorted by UTF-8
// bytes, nulls and absent fields left out, numbers as exact canonical
// decimals (never through a double: JSON.parse cannot be used), strings
// byte for byte after unescaping (NFC only for a param that says
// normalize: nfc), compact JSON escaped like Go's encoding/json without HTML
// escaping; the hash is hex SHA-256. fingerprint/testdata/vectors.json is
// the reference.
const crypto = require('crypto');

class ParamError extends Error {}

// Num is a JSON number kept as the text it was written with.
class Num {
  constructor(text) { this.text = text; }
}

const MAX_DEPTH = 64;
const decoder = new TextDecoder('utf-8', { fatal: true, ignoreBOM: true });

// parseJSON reads a body strictly: UTF-8 without BOM, no duplicate keys, no
// lone surrogates, no trailing data; numbers stay Num.
function parseJSON(input) {
  let s;
  if (typeof input === 'string') {
    s = input;
  } else {
    try { s = decoder.decode(input); } catch (e) { throw new ParamError('invalid UTF-8'); }
  }
  let i = 0;
  const fail = (what) => { throw new ParamError(`not JSON: ${what} at ${i}`); };
  const ws = () => { while (i < s.length && ' \t\n\r'.includes(s[i])) i++; };
  const hex4 = () => {
    const h = s.slice(i, i + 4);
    if (!/^[0-9a-fA-F]{4}$/.test(h)) fail('bad \\u escape');
    i += 4;
    return parseInt(h, 16);
  };
  const str = () => {
    i++; // "
    let out = '';
    for (;;) {
      if (i >= s.length) fail('unterminated string');
      const c = s[i];
      const code = s.charCodeAt(i);
      if (c === '"') { i++; return out; }
      if (code < 0x20) fail('control character');
      if (c !== '\\') { out += c; i++; continue; }
      i++;
      const e = s[i++];
      const simple = { '"': '"', '\\': '\\', '/': '/', b: '\b', f: '\f', n: '\n', r: '\r', t: '\t' }[e];
      if (simple !== undefined) { out += simple; continue; }
      if (e !== 'u') fail('bad escape');
      const u = hex4();
      if (u >= 0xdc00 && u <= 0xdfff) fail('lone surrogate');
      if (u >= 0xd800 && u <= 0xdbff) {
        if (s[i] !== '\\' || s[i + 1] !== 'u') fail('lone surrogate');
        i += 2;
        const lo = hex4();
        if (lo < 0xdc00 || lo > 0xdfff) fail('lone surrogate');
        out += String.fromCharCode(u, lo);
        continue;
      }
      out += String.fromCharCode(u);
    }
  };
  const num = () => {
    const m = /^-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?/.exec(s.slice(i, i + 4096));
    if (!m) fail('bad number');
    i += m[0].length;
    return new Num(m[0]);
  };
  const value = (depth) => {
    if (depth > MAX_DEPTH) fail('too deep');
    ws();
    const c = s[i];
    if (c === '{') {
      i++;
      const obj = Object.create(null);
      ws();
      if (s[i] === '}') { i++; return obj; }
      for (;;) {
        ws();
        if (s[i] !== '"') fail('expected a key');
        const k = str();
        if (Object.prototype.hasOwnProperty.call(obj, k)) fail(`duplicate key ${JSON.stringify(k)}`);
        ws();
        if (s[i++] !== ':') fail('expected :');
        obj[k] = value(depth + 1);
        ws();
        const d = s[i++];
        if (d === '}') return obj;
        if (d !== ',') fail('expected , or }');
      }
    }
    if (c === '[') {
      i++;
      const arr = [];
      ws();
      if (s[i] === ']') { i++; return arr; }
      for (;;) {
        arr.push(value(depth + 1));
        ws();
        const d = s[i++];
        if (d === ']') return arr;
        if (d !== ',') fail('expected , or ]');
      }
    }
    if (c === '"') return str();
    for (const [word, v] of [['true', true], ['false', false], ['null', null]]) {
      if (s.startsWith(word, i)) { i += word.length; return v; }
    }
    if (c === '-' || (c >= '0' && c <= '9')) return num();
    return fail('unexpected character');
  };
  const v = value(0);
  ws();
  if (i !== s.length) fail('trailing data');
  return v;
}

const MAX_EXPONENT_DIGITS = 10;
const MAX_SCIENTIFIC_EXPONENT = 999999999;

// canonicalDecimal writes a JSON number text (or a decimal string) in
// canonical form: ECMAScript Number::toString's layout of the exact digits.
function canonicalDecimal(text) {
  const m = /^(-?)(0|[1-9][0-9]*)(?:\.([0-9]+))?(?:[eE]([+-]?)([0-9]+))?$/.exec(text);
  if (!m) throw new ParamError(`not a decimal: ${JSON.stringify(text)}`);
  const [, neg, ipart, fpart = '', esign, edigits] = m;
  let exp = 0;
  if (edigits !== undefined) {
    if (edigits.replace(/^0+/, '').length > MAX_EXPONENT_DIGITS) throw new ParamError('decimal out of range');
    exp = Number(edigits) * (esign === '-' ? -1 : 1);
  }
  let digits = (ipart + fpart).replace(/^0+/, '');
  if (digits === '') return '0';
  let scale = exp - fpart.length;
  const stripped = digits.replace(/0+$/, '');
  scale += digits.length - stripped.length;
  digits = stripped;
  const k = digits.length;
  const n = k + scale;
  if (Math.abs(n - 1) > MAX_SCIENTIFIC_EXPONENT) throw new ParamError('decimal out of range');
  let out;
  if (k <= n && n <= 21) out = digits + '0'.repeat(n - k);
  else if (n > 0 && n <= 21) out = digits.slice(0, n) + '.' + digits.slice(n);
  else if (n > -6 && n <= 0) out = '0.' + '0'.repeat(-n) + digits;
  else {
    const e = n - 1;
    out = (k === 1 ? digits : digits[0] + '.' + digits.slice(1)) + 'e' + (e >= 0 ? '+' : '-') + Math.abs(e);
  }
  return neg ? '-' + out : out;
}

const ESCAPES = { '"': '\\"', '\\': '\\\\', '\b': '\\b', '\f': '\\f', '\n': '\\n', '\r': '\\r', '\t': '\\t', '\u2028': '\\u2028', '\u2029': '\\u2029' };

function quote(str) {
  let out = '"';
  for (const ch of str) {
    const esc = ESCAPES[ch];
    if (esc !== undefined) out += esc;
    else if (ch < ' ') out += '\\u' + ch.charCodeAt(0).toString(16).padStart(4, '0');
    else out += ch;
  }
  return out + '"';
}

const byUTF8 = (a, b) => Buffer.compare(Buffer.from(a, 'utf8'), Buffer.from(b, 'utf8'));

function isObject(v) { return v !== null && typeof v === 'object' && !Array.isArray(v) && !(v instanceof Num); }

// canonicalJSON writes a parsed value's canonical JSON; nfc normalises
// strings (not keys).
function canonicalJSON(v, nfc) {
  if (v === null) return 'null';
  if (v === true) return 'true';
  if (v === false) return 'false';
  if (v instanceof Num) return canonicalDecimal(v.text);
  if (typeof v === 'string') return quote(nfc ? v.normalize('NFC') : v);
  if (Array.isArray(v)) return '[' + v.map((x) => canonicalJSON(x, nfc)).join(',') + ']';
  if (isObject(v)) {
    const keys = Object.keys(v).filter((k) => v[k] !== null).sort(byUTF8);
    return '{' + keys.map((k) => quote(k) + ':' + canonicalJSON(v[k], nfc)).join(',') + '}';
  }
  throw new ParamError(`unsupported value ${typeof v}`);
}

const ABSENT = Symbol('absent');

function lookup(doc, path, pathVars) {
  if (path.startsWith('path.')) {
    const name = path.slice(5);
    return pathVars && Object.prototype.hasOwnProperty.call(pathVars, name) ? pathVars[name] : ABSENT;
  }
  let cur = doc;
  for (const seg of path.split('.')) {
    if (isObject(cur)) {
      if (!Object.prototype.hasOwnProperty.call(cur, seg)) return ABSENT;
      cur = cur[seg];
    } else if (Array.isArray(cur) && /^[0-9]+$/.test(seg)) {
      const i = Number(seg);
      if (i >= cur.length) return ABSENT;
      cur = cur[i];
    } else {
      return ABSENT;
    }
  }
  return cur;
}

// canonicalParams: params are [{path, type?, normalize?}].
function canonicalParams(params, doc, pathVars) {
  const fields = [];
  for (const p of params) {
    const v = lookup(doc, p.path, pathVars);
    if (v === ABSENT || v === null) continue;
    const type = p.type || '';
    const norm = p.normalize || '';
    let canon;
    if (type === 'decimal') {
      if (v instanceof Num) canon = canonicalDecimal(v.text);
      else if (typeof v === 'string') canon = canonicalDecimal(v);
      else throw new ParamError(`param ${p.path}: not a decimal`);
    } else if (type === '') {
      if (norm !== '' && norm !== 'nfc') throw new ParamError(`param ${p.path}: unknown normalize ${norm}`);
      canon = canonicalJSON(v, norm === 'nfc');
    } else {
      throw new ParamError(`param ${p.path}: unknown type ${type}`);
    }
    fields.push([p.path, canon]);
  }
  fields.sort((a, b) => byUTF8(a[0], b[0]));
  return '{' + fields.map(([path, c]) => quote(path) + ':' + c).join(',') + '}';
}

function paramHash(params, doc, pathVars) {
  return crypto.createHash('sha256').update(canonicalParams(params, doc, pathVars), 'utf8').digest('hex');
}

module.exports = { ParamError, Num, parseJSON, canonicalDecimal, canonicalJSON, canonicalParams, paramHash, isObject };
