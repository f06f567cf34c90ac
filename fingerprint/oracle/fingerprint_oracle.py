#!/usr/bin/env python3
"""An independent oracle for idemgate's golden vectors (fingerprint/testdata/vectors.json).

It recomputes every vector from the written contract only -- docs/design.md §2 and §8, the
package documentation of github.com/idemgate/idemgate/fingerprint and the comment at the
top of vectors.json -- never from the Go code, so that a bug the Go implementation shares
with its own `-update` output is caught here. Python standard library only.

    python3 fingerprint_oracle.py [--strings=auto|bytes|nfc] VECTORS.json

It prints one line per mismatch, starting with "FAIL ", a closing line
"oracle: N passed, M failed", and exits 1 on any mismatch (2 on a usage error).

Where the written rules are silent, the choice made here is marked "SILENT:" below.
"""

import base64
import hashlib
import hmac
import re
import sys
import unicodedata

# --------------------------------------------------------------------------------------
# Errors. The kind strings are the ones vectors.json uses for numbers ("invalid",
# "out_of_range"); the others only ever appear in the oracle's own messages, or in a
# token vector's "error" if one is ever written.


class OracleError(Exception):
    def __init__(self, kind, detail=""):
        super().__init__(kind + (": " + detail if detail else ""))
        self.kind = kind


INVALID = "invalid"  # a number or decimal string outside the JSON number grammar
OUT_OF_RANGE = "out_of_range"

DEFAULT_MAX_DEPTH = 32  # fingerprint.DefaultMaxDepth: the body's nesting limit
DEFAULT_MAX_CANONICAL_BYTES = 64 << 10
MAX_TOKEN_LENGTH = 4096
MIN_KEY_BYTES = 32
MAX_EXPONENT_DIGITS = 10  # "more than 10 digits (after leading zeros)" is an error
MAX_SCIENTIFIC_EXPONENT = 999999999

SUBJECT_LABEL = b"idemgate/fingerprint/v1/subject-tag"
FIELD_LABEL = b"idemgate/fingerprint/v1/field-tag"


# --------------------------------------------------------------------------------------
# A strict JSON parser (RFC 8259). Python's json module is not used: it accepts NaN and
# Infinity, keeps the last of duplicate keys, turns numbers into floats and lets lone
# surrogates through, each of which would change what is hashed. This one works on bytes,
# keeps every number as its literal text, and refuses duplicate keys, invalid UTF-8, lone
# surrogates, a byte-order mark, trailing data and nesting deeper than the limit.


class Number:
    """A JSON number, kept as the exact text it was written with."""

    __slots__ = ("text",)

    def __init__(self, text):
        self.text = text

    def __repr__(self):
        return "Number(%r)" % self.text


_WS = b" \t\n\r"
_NUMBER_RE = re.compile(rb"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
_SHORT_ESCAPES = {
    ord('"'): '"', ord("\\"): "\\", ord("/"): "/", ord("b"): "\b",
    ord("f"): "\f", ord("n"): "\n", ord("r"): "\r", ord("t"): "\t",
}
_HEX = frozenset(b"0123456789abcdefABCDEF")


class _Parser:
    def __init__(self, data, max_depth):
        self.data = data
        self.pos = 0
        self.max_depth = max_depth

    def fail(self, what):
        raise OracleError("invalid_json", "%s at byte %d" % (what, self.pos))

    def skip_ws(self):
        d, p = self.data, self.pos
        while p < len(d) and d[p] in _WS:
            p += 1
        self.pos = p

    def value(self, depth):
        self.skip_ws()
        d, p = self.data, self.pos
        if p >= len(d):
            self.fail("unexpected end")
        c = d[p]
        if c == ord("{"):
            return self.obj(depth + 1)
        if c == ord("["):
            return self.arr(depth + 1)
        if c == ord('"'):
            return self.string()
        for lit, val in ((b"true", True), (b"false", False), (b"null", None)):
            if d.startswith(lit, p):
                self.pos = p + len(lit)
                return val
        m = _NUMBER_RE.match(d, p)
        if m and m.end() > p:
            self.pos = m.end()
            return Number(m.group().decode("ascii"))
        self.fail("unexpected byte %r" % chr(c))

    def check_depth(self, depth):
        if depth > self.max_depth:
            raise OracleError("too_deep", "nesting deeper than %d" % self.max_depth)

    def obj(self, depth):
        self.check_depth(depth)
        self.pos += 1
        out = {}
        self.skip_ws()
        if self.data[self.pos:self.pos + 1] == b"}":
            self.pos += 1
            return out
        while True:
            self.skip_ws()
            if self.data[self.pos:self.pos + 1] != b'"':
                self.fail("expected a key")
            key = self.string()
            if key in out:
                # Compared after unescaping: "a" and "\u0061" are the same key.
                raise OracleError("duplicate_key", repr(key))
            self.skip_ws()
            if self.data[self.pos:self.pos + 1] != b":":
                self.fail("expected ':'")
            self.pos += 1
            out[key] = self.value(depth)
            self.skip_ws()
            c = self.data[self.pos:self.pos + 1]
            self.pos += 1
            if c == b"}":
                return out
            if c != b",":
                self.fail("expected ',' or '}'")

    def arr(self, depth):
        self.check_depth(depth)
        self.pos += 1
        out = []
        self.skip_ws()
        if self.data[self.pos:self.pos + 1] == b"]":
            self.pos += 1
            return out
        while True:
            out.append(self.value(depth))
            self.skip_ws()
            c = self.data[self.pos:self.pos + 1]
            self.pos += 1
            if c == b"]":
                return out
            if c != b",":
                self.fail("expected ',' or ']'")

    def hex4(self):
        h = self.data[self.pos:self.pos + 4]
        if len(h) != 4 or any(b not in _HEX for b in h):
            self.fail("bad \\u escape")
        self.pos += 4
        return int(h, 16)

    def string(self):
        d = self.data
        self.pos += 1  # the opening quote
        parts = []
        raw_start = self.pos
        while True:
            if self.pos >= len(d):
                self.fail("unterminated string")
            c = d[self.pos]
            if c == ord('"') or c == ord("\\"):
                parts.append(self.utf8(d[raw_start:self.pos]))
                self.pos += 1
                if c == ord('"'):
                    return "".join(parts)
                e = d[self.pos:self.pos + 1]
                self.pos += 1
                if not e:
                    self.fail("unterminated escape")
                if e[0] in _SHORT_ESCAPES:
                    parts.append(_SHORT_ESCAPES[e[0]])
                elif e == b"u":
                    u = self.hex4()
                    if 0xDC00 <= u <= 0xDFFF:
                        self.fail("lone low surrogate")
                    if 0xD800 <= u <= 0xDBFF:
                        if d[self.pos:self.pos + 2] != b"\\u":
                            self.fail("lone high surrogate")
                        self.pos += 2
                        lo = self.hex4()
                        if not 0xDC00 <= lo <= 0xDFFF:
                            self.fail("lone high surrogate")
                        u = 0x10000 + ((u - 0xD800) << 10) + (lo - 0xDC00)
                    parts.append(chr(u))
                else:
                    self.fail("bad escape")
                raw_start = self.pos
            elif c < 0x20:
                self.fail("control character in string")
            else:
                self.pos += 1

    def utf8(self, b):
        try:
            # Python's strict decoder refuses overlong forms, encoded surrogates and
            # anything above U+10FFFF, as RFC 3629 requires.
            return b.decode("utf-8")
        except UnicodeDecodeError:
            self.fail("invalid UTF-8")


def parse_json(data, max_depth=DEFAULT_MAX_DEPTH):
    if isinstance(data, str):
        data = data.encode("utf-8")
    p = _Parser(data, max_depth)
    v = p.value(0)
    p.skip_ws()
    if p.pos != len(data):
        p.fail("trailing data")
    return v


# --------------------------------------------------------------------------------------
# Canonical decimals: sign, digits and exponent; leading and trailing zeros stripped,
# -0 is 0; the layout of ECMAScript Number::toString applied to the exact digits.

_DECIMAL_RE = re.compile(r"(-?)(0|[1-9][0-9]*)(?:\.([0-9]+))?(?:[eE]([+-]?)([0-9]+))?")


def canonical_decimal(text):
    # fullmatch with explicit [0-9]: Python's \d would also match non-ASCII digits.
    m = _DECIMAL_RE.fullmatch(text)
    if not m:
        raise OracleError(INVALID, repr(text))
    neg, ipart, fpart, esign, edigits = m.groups()
    fpart = fpart or ""
    exp = 0
    if edigits is not None:
        if len(edigits.lstrip("0")) > MAX_EXPONENT_DIGITS:
            raise OracleError(OUT_OF_RANGE, "exponent literal of %s" % text)
        exp = int(edigits) * (-1 if esign == "-" else 1)
    digits = (ipart + fpart).lstrip("0")
    if not digits:
        return "0"
    # value = digits × 10^scale
    scale = exp - len(fpart)
    stripped = digits.rstrip("0")
    scale += len(digits) - len(stripped)
    digits = stripped
    k = len(digits)
    n = k + scale  # value = 0.d1…dk × 10^n
    if abs(n - 1) > MAX_SCIENTIFIC_EXPONENT:
        raise OracleError(OUT_OF_RANGE, "scientific exponent of %s" % text)
    if k <= n <= 21:
        out = digits + "0" * (n - k)
    elif 0 < n <= 21:
        out = digits[:n] + "." + digits[n:]
    elif -6 < n <= 0:
        out = "0." + "0" * (-n) + digits
    else:
        e = n - 1
        mant = digits if k == 1 else digits[0] + "." + digits[1:]
        out = mant + "e" + ("+" if e >= 0 else "-") + str(abs(e))
    return "-" + out if neg else out


# --------------------------------------------------------------------------------------
# Canonical JSON.


def escape_string(s):
    """Go encoding/json escaping with SetEscapeHTML(false), as the package doc spells it."""
    out = ['"']
    for ch in s:
        o = ord(ch)
        if ch == '"':
            out.append('\\"')
        elif ch == "\\":
            out.append("\\\\")
        elif ch == "\b":
            out.append("\\b")
        elif ch == "\f":
            out.append("\\f")
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\r":
            out.append("\\r")
        elif ch == "\t":
            out.append("\\t")
        elif o < 0x20:
            out.append("\\u%04x" % o)
        elif o == 0x2028 or o == 0x2029:
            out.append("\\u%04x" % o)
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def _utf8_key(s):
    return s.encode("utf-8")


def canonicalize(v, nfc, nfc_keys=None):
    """Canonical JSON text of a parsed value. nfc: NFC-normalise strings first;
    nfc_keys (default: nfc) also keys, as the pre-`normalize` rule of the package doc
    did. A param's `normalize: nfc` normalises its strings, not keys (the vectors'
    comment); otherwise strings are kept byte for byte after unescaping (docs/design.md §2)."""
    if nfc_keys is None:
        nfc_keys = nfc
    if v is None:
        return "null"
    if v is True:
        return "true"
    if v is False:
        return "false"
    if isinstance(v, Number):
        return canonical_decimal(v.text)
    if isinstance(v, str):
        return escape_string(unicodedata.normalize("NFC", v) if nfc else v)
    if isinstance(v, list):
        return "[" + ",".join(canonicalize(x, nfc, nfc_keys) for x in v) + "]"
    if isinstance(v, dict):
        members = {}
        for key, val in v.items():
            k = unicodedata.normalize("NFC", key) if nfc_keys else key
            # SILENT: whether a null member takes part in the "two keys equal after NFC"
            # check; here it does (the rule names keys, not non-null members).
            if k in members:
                raise OracleError("duplicate_key_after_nfc", repr(k))
            members[k] = val
        items = sorted(((k, x) for k, x in members.items() if x is not None),
                       key=lambda kv: _utf8_key(kv[0]))
        return "{" + ",".join(escape_string(k) + ":" + canonicalize(x, nfc, nfc_keys) for k, x in items) + "}"
    raise OracleError("unsupported", type(v).__name__)


# --------------------------------------------------------------------------------------
# Selecting the params (docs/design.md §2, package doc "Canonical parameters").


def simple_fold(s):
    """An approximation of Unicode simple case folding with the standard library, which
    has no CaseFolding table: a character's full folding when that is one character,
    else its lower case when that is one character, else itself. This gives simple
    folding for every character whose C/S mapping is its full folding, including
    Cherokee, final sigma and the Kelvin sign; characters with only multi-character
    (F) folds are left alone, as simple folding does."""
    out = []
    for ch in s:
        f = ch.casefold()
        if len(f) != 1:
            f = ch.lower()
            if len(f) != 1:
                f = ch
        out.append(f)
    return "".join(out)


def _check_fold_collisions(obj, where):
    seen = {}
    for key in obj:
        f = simple_fold(key)
        if f in seen and seen[f] != key:
            raise OracleError("ambiguous_key", "%s: %r and %r" % (where, seen[f], key))
        seen.setdefault(f, key)


def _check_value_keys(v, where):
    # SILENT: docs/design.md §2 refuses keys "in any object on a bound path" equal under simple
    # case folding "to a bound segment or to each other". Read here as: in each object
    # the path walks through, a key folding to the segment looked up; inside the bound
    # value, any two keys of one object folding to each other.
    if isinstance(v, dict):
        _check_fold_collisions(v, where)
        for x in v.values():
            _check_value_keys(x, where)
    elif isinstance(v, list):
        for x in v:
            _check_value_keys(x, where)


_ABSENT = object()


def lookup(doc, path, path_vars):
    if path.startswith("path."):
        # Always the path variable, never a body member called "path".
        return path_vars.get(path[len("path."):], _ABSENT)
    cur = doc
    for seg in path.split("."):
        if isinstance(cur, dict):
            fseg = simple_fold(seg)
            for key in cur:
                if key != seg and simple_fold(key) == fseg:
                    raise OracleError("ambiguous_key", "%s: %r and %r" % (path, key, seg))
            if seg not in cur:
                return _ABSENT
            cur = cur[seg]
        elif isinstance(cur, list) and re.fullmatch(r"[0-9]+", seg):
            # SILENT: an all-digit segment on an object is looked up as a key (above);
            # an index with leading zeros ("items.01") is read as its number.
            i = int(seg)
            if i >= len(cur):
                return _ABSENT
            cur = cur[i]
        else:
            return _ABSENT
    return cur


def select(params, doc, path_vars, legacy_nfc):
    """Returns (canonical object text, [(path, field canonical text)] in configured order)."""
    fields = []
    for p in params:
        path = p["path"]
        v = lookup(doc, path, path_vars)
        if v is _ABSENT or v is None:
            continue
        if p.get("type") == "decimal":
            if isinstance(v, Number):
                text = v.text
            elif isinstance(v, str):
                text = v
            else:
                raise OracleError("invalid_decimal", "%s is %s" % (path, type(v).__name__))
            try:
                canon = canonical_decimal(text)
            except OracleError as e:
                raise OracleError("invalid_decimal" if e.kind == INVALID else e.kind, path)
        else:
            _check_value_keys(v, path)
            # `normalize: nfc` says "its strings": keys inside the value stay byte for
            # byte (the vectors' comment says so); legacy vectors normalised both.
            nfc = legacy_nfc or p.get("normalize") == "nfc"
            canon = canonicalize(v, nfc, legacy_nfc)
        fields.append((path, canon))
    ordered = sorted(fields, key=lambda f: _utf8_key(f[0]))
    text = "{" + ",".join(escape_string(path) + ":" + c for path, c in ordered) + "}"
    if len(text.encode("utf-8")) > DEFAULT_MAX_CANONICAL_BYTES:
        raise OracleError("too_large", "%d bytes" % len(text.encode("utf-8")))
    return text, fields


# --------------------------------------------------------------------------------------
# Keys, tags and tokens (docs/design.md §2 and §8, package doc "The token").


def parse_key(encoded):
    s = encoded.strip()
    # Standard or URL alphabet, padded or not (docs/design.md §8).
    s = s.rstrip("=").replace("-", "+").replace("_", "/")
    if not re.fullmatch(r"[A-Za-z0-9+/]*", s) or len(s) % 4 == 1:
        raise OracleError("invalid_key", "not base64")
    key = base64.b64decode(s + "=" * (-len(s) % 4), validate=True)
    if len(key) < MIN_KEY_BYTES:
        raise OracleError("invalid_key", "%d bytes" % len(key))
    return key


def hkdf_expand(prk, info, length=32):
    """RFC 5869 HKDF-Expand with SHA-256."""
    out, t, i = b"", b"", 1
    while len(out) < length:
        t = hmac.new(prk, t + info + bytes([i]), hashlib.sha256).digest()
        out += t
        i += 1
    return out[:length]


def b64url(b):
    return base64.urlsafe_b64encode(b).rstrip(b"=").decode("ascii")


def b64url_strict_decode(s):
    """RFC 4648 §5 without padding, one spelling only: no padding, no standard alphabet,
    no line breaks, and the unused trailing bits must be zero."""
    if not re.fullmatch(r"[A-Za-z0-9_-]*", s) or len(s) % 4 == 1:
        return None
    b = base64.urlsafe_b64decode(s + "=" * (-len(s) % 4))
    if b64url(b) != s:  # non-zero trailing bits re-encode differently
        return None
    return b


def subject_tag(key, subject):
    ks = hkdf_expand(key, SUBJECT_LABEL)
    return b64url(hmac.new(ks, subject.encode("utf-8"), hashlib.sha256).digest()[:16])


def field_tag(key, path, canon):
    kf = hkdf_expand(key, FIELD_LABEL)
    msg = path.encode("utf-8") + b"\x00" + canon.encode("utf-8")
    return b64url(hmac.new(kf, msg, hashlib.sha256).digest()[:9])


def payload_text(key_id, nonce, exp, utag, scope, phash, ftags):
    f = ",".join(escape_string(p) + ":" + escape_string(t)
                 for p, t in sorted(ftags.items(), key=lambda kv: _utf8_key(kv[0])))
    return ('{"v":1,"k":' + escape_string(key_id) + ',"n":' + escape_string(nonce)
            + ',"exp":' + str(exp) + ',"u":' + escape_string(utag)
            + ',"s":' + escape_string(scope) + ',"p":' + escape_string(phash)
            + ',"f":{' + f + "}}")


def sign(key_id, key, payload):
    body = b64url(payload.encode("utf-8"))
    mac = hmac.new(key, body.encode("ascii"), hashlib.sha256).digest()
    return body + "." + b64url(mac)


_KEY_ID_RE = re.compile(r"[A-Za-z0-9._-]{1,64}")
_MEMBERS = ("v", "k", "n", "exp", "u", "s", "p", "f")


def _is_int(v):
    return isinstance(v, Number) and re.fullmatch(r"-?(0|[1-9][0-9]*)", v.text)


def verify(token, keys, subject, scope, phash, now):
    """The reason Verify must give (None when valid), in the documented order:
    syntax, key id, MAC, v, s, u, exp, p."""
    if len(token) > MAX_TOKEN_LENGTH:
        return "malformed"
    parts = token.split(".")
    if len(parts) != 2:
        return "malformed"
    raw, mac = b64url_strict_decode(parts[0]), b64url_strict_decode(parts[1])
    if raw is None or mac is None:
        return "malformed"
    try:
        c = parse_json(raw)
    except OracleError:
        return "malformed"
    if not isinstance(c, dict) or set(c) != set(_MEMBERS):
        return "malformed"
    f = c["f"]
    if not (_is_int(c["v"]) and _is_int(c["exp"])
            and isinstance(c["k"], str) and _KEY_ID_RE.fullmatch(c["k"])
            and isinstance(c["n"], str) and re.fullmatch(r"[0-9a-f]{32}", c["n"])
            and isinstance(c["u"], str) and isinstance(c["s"], str)
            and isinstance(c["p"], str) and re.fullmatch(r"[0-9a-f]{64}", c["p"])
            and isinstance(f, dict) and all(isinstance(x, str) for x in f.values())):
        return "malformed"
    key = keys.get(c["k"])
    if key is None:
        return "unknown_key"
    want = hmac.new(key, parts[0].encode("ascii"), hashlib.sha256).digest()
    if not hmac.compare_digest(want, mac):
        return "bad_mac"
    if int(c["v"].text) != 1:
        return "bad_version"
    if c["s"] != scope:
        return "wrong_scope"
    if c["u"] != subject_tag(key, subject):
        return "wrong_subject"
    if int(now) > int(c["exp"].text):  # now truncated to whole seconds
        return "expired"
    if c["p"] != phash:
        return "params_changed"
    return None


# --------------------------------------------------------------------------------------
# Checking the vectors.


class Report:
    def __init__(self):
        self.passed = 0
        self.failed = 0

    def check(self, where, what, want, got):
        if want == got:
            self.passed += 1
        else:
            self.fail(where, "%s: vector %s, oracle %s" % (what, _show(want), _show(got)))

    def fail(self, where, msg):
        self.failed += 1
        print("FAIL %s: %s" % (where, msg))


def _ascii(c):
    o = ord(c)
    if o < 0x80:
        return c
    return "\\u%04x" % o if o < 0x10000 else "\\U%08x" % o


def _show(v):
    if isinstance(v, Number):
        return v.text
    if isinstance(v, str):
        # Non-ASCII shown as escapes in messages only: "e\u0301" and "\u00e9" look alike
        # on a terminal, and that is exactly the difference a mismatch may be about.
        return "".join(_ascii(c) for c in escape_string(v))
    if isinstance(v, dict):
        return "{" + ", ".join("%s: %s" % (escape_string(k), _show(x)) for k, x in v.items()) + "}"
    return repr(v)


def _known(rep, where, obj, allowed):
    # A member the oracle does not know may carry a rule it does not apply: say so
    # rather than pass silently.
    ok = True
    for m in obj:
        if m not in allowed:
            rep.fail(where, "unknown member %s: the oracle does not know its rule" % escape_string(m))
            ok = False
    return ok


_NOTE = ("name", "comment")


def check_numbers(rep, entries):
    for i, e in enumerate(entries):
        where = "numbers[%d] in=%s" % (i, escape_string(e.get("in", "")))
        if not _known(rep, where, e, ("in", "out", "error") + _NOTE):
            continue
        try:
            got = ("out", canonical_decimal(e["in"]))
        except OracleError as err:
            got = ("error", err.kind)
        want = ("error", e["error"]) if "error" in e else ("out", e.get("out"))
        if want == got:
            rep.passed += 1
        else:
            rep.fail(where, "vector %s %s, oracle %s %s" % (want[0], _show(want[1]), got[0], _show(got[1])))


def _nfc_flag(rep, where, obj):
    n = obj.get("normalize")
    if n not in (None, "nfc"):
        rep.fail(where, "normalize %s: the oracle knows only \"nfc\"" % _show(n))
    return n == "nfc"


def check_canonical(rep, entries, legacy_nfc):
    for i, e in enumerate(entries):
        where = "canonical[%d] %s" % (i, escape_string(e.get("name", "")))
        if not _known(rep, where, e, ("in", "out", "error", "normalize") + _NOTE):
            continue
        nfc = legacy_nfc or _nfc_flag(rep, where, e)
        try:
            # A whole JSON value, not a request body: the hard nesting cap, not the
            # default body limit (SILENT: the vectors never come near either).
            got = ("out", canonicalize(parse_json(e["in"], 1000), nfc))
        except OracleError as err:
            got = ("error", err.kind)
        want = ("error", e["error"]) if "error" in e else ("out", e.get("out"))
        if want == got:
            rep.passed += 1
        else:
            rep.fail(where, "vector %s %s, oracle %s %s" % (want[0], _show(want[1]), got[0], _show(got[1])))


_TOKEN_MEMBERS = ("keys", "active_key", "nonce", "now", "exp", "subject", "scope", "params",
                  "body", "path_vars", "expected") + _NOTE
_PARAM_MEMBERS = ("path", "type", "normalize")
_EXPECTED_MEMBERS = ("subject_key_hex", "field_key_hex", "canonical", "hash", "subject_tag",
                     "field_tags", "payload", "token", "error")


def check_token(rep, i, t, legacy_nfc):
    where = "tokens[%d] %s" % (i, escape_string(t.get("name", "")))
    exp_ = t.get("expected", {})
    ok = _known(rep, where, t, _TOKEN_MEMBERS) and _known(rep, where + " expected", exp_, _EXPECTED_MEMBERS)
    for p in t["params"]:
        ok = _known(rep, where + " param " + escape_string(p.get("path", "")), p, _PARAM_MEMBERS) and ok
        if p.get("type") not in (None, "decimal"):
            rep.fail(where, "param type %s: the oracle knows only \"decimal\"" % _show(p.get("type")))
            ok = False
        if p.get("normalize") not in (None, "nfc"):
            _nfc_flag(rep, where, p)
            ok = False
    if not ok:
        return
    keys = {kid: parse_key(k) for kid, k in t["keys"].items()}
    kid = t["active_key"]
    key = keys[kid]
    now, exp = int(t["now"].text), int(t["exp"].text)
    try:
        doc = parse_json(t["body"]) if t.get("body", "") != "" else None
        canon, fields = select(t["params"], doc, t.get("path_vars", {}), legacy_nfc)
    except OracleError as err:
        rep.check(where, "error", exp_.get("error"), err.kind)
        return
    if "error" in exp_:
        rep.fail(where, "error: vector %s, oracle none (canonical %s)" % (_show(exp_["error"]), _show(canon)))
        return

    rep.check(where, "subject_key_hex", exp_.get("subject_key_hex"), hkdf_expand(key, SUBJECT_LABEL).hex())
    rep.check(where, "field_key_hex", exp_.get("field_key_hex"), hkdf_expand(key, FIELD_LABEL).hex())
    rep.check(where, "canonical", exp_.get("canonical"), canon)
    phash = hashlib.sha256(canon.encode("utf-8")).hexdigest()
    rep.check(where, "hash", exp_.get("hash"), phash)
    utag = subject_tag(key, t["subject"])
    rep.check(where, "subject_tag", exp_.get("subject_tag"), utag)
    ftags = {path: field_tag(key, path, c) for path, c in fields}
    rep.check(where, "field_tags", exp_.get("field_tags"), ftags)
    payload = payload_text(kid, t["nonce"], exp, utag, t["scope"], phash, ftags)
    rep.check(where, "payload", exp_.get("payload"), payload)
    token = sign(kid, key, payload)
    rep.check(where, "token", exp_.get("token"), token)
    # "Each token verifies at now and at exp, and is expired at exp+1." Checked on the
    # oracle's own token, which is the vector's whenever the line above passed, so a
    # wrong expected token is reported once rather than once per instant.
    for label, at, want in (("verify at now", now, None), ("verify at exp", exp, None),
                            ("verify at exp+1", exp + 1, "expired")):
        got = verify(token, keys, t["subject"], t["scope"], phash, at)
        rep.check(where, label, want or "valid", got or "valid")


def main(argv):
    mode = "auto"
    args = []
    for a in argv[1:]:
        if a.startswith("--strings="):
            mode = a.split("=", 1)[1]
        else:
            args.append(a)
    if len(args) != 1 or mode not in ("auto", "bytes", "nfc"):
        print("usage: fingerprint_oracle.py [--strings=auto|bytes|nfc] VECTORS.json", file=sys.stderr)
        return 2
    with open(args[0], "rb") as fh:
        vectors = parse_json(fh.read(), 1000)

    rep = Report()
    _known(rep, "vectors", vectors, ("comment", "numbers", "canonical", "tokens"))
    if mode == "auto":
        # docs/design.md §2: strings are compared byte for byte unless a param declares
        # `normalize: nfc`. Vectors written before that rule carry no "normalize" member
        # anywhere and follow the package doc of the time (every string and key NFC).
        flagged = any("normalize" in e for e in vectors.get("canonical", [])) or any(
            "normalize" in p for t in vectors.get("tokens", []) for p in t.get("params", []))
        mode = "bytes" if flagged else "nfc"
    legacy_nfc = mode == "nfc"
    if legacy_nfc:
        print("note: strings and keys NFC-normalised everywhere (no \"normalize\" member in the "
              "vectors: the rule before per-param normalize)")
    else:
        print("note: strings byte for byte unless marked normalize: nfc (docs/design.md §2)")

    check_numbers(rep, vectors.get("numbers", []))
    check_canonical(rep, vectors.get("canonical", []), legacy_nfc)
    for i, t in enumerate(vectors.get("tokens", [])):
        try:
            check_token(rep, i, t, legacy_nfc)
        except (OracleError, KeyError, TypeError, ValueError) as err:
            rep.fail("tokens[%d]" % i, "cannot check: %s" % err)
    print("oracle: %d passed, %d failed" % (rep.passed, rep.failed))
    return 1 if rep.failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
