"""idemgate's canonical parameters, from a request body's bytes.

An object of the bound params keyed by their paths as configured, keys
sorted by UTF-8 bytes, nulls and absent fields left out, numbers as exact
canonical decimals (never through float), strings byte for byte after JSON
unescaping (NFC only for a param that says ``normalize: nfc``), written as
compact JSON escaped like Go's encoding/json without HTML escaping; the hash
is hex SHA-256. fingerprint/testdata/vectors.json is the reference.
"""

import hashlib
import json
import re
import unicodedata


class ParamError(ValueError):
    """The body is not one idemgate could have forwarded, or a param cannot be read."""


class Number(str):
    """A JSON number kept as the text it was written with."""


_MAX_EXPONENT_DIGITS = 10
_MAX_SCIENTIFIC_EXPONENT = 999999999
_DECIMAL = re.compile(r"(-?)(0|[1-9][0-9]*)(?:\.([0-9]+))?(?:[eE]([+-]?)([0-9]+))?")


def _no_duplicates(pairs):
    out = {}
    for key, value in pairs:
        if key in out:
            raise ParamError("duplicate key %r" % key)
        out[key] = value
    return out


def _no_constant(name):
    raise ParamError("%s is not JSON" % name)


def _check_strings(v):
    # json.loads keeps a lone surrogate escape (\ud800) as a code point;
    # idemgate refuses such bodies, so must we.
    if isinstance(v, str):
        if any("\ud800" <= ch <= "\udfff" for ch in v):
            raise ParamError("lone surrogate")
    elif isinstance(v, list):
        for x in v:
            _check_strings(x)
    elif isinstance(v, dict):
        for k, x in v.items():
            _check_strings(k)
            _check_strings(x)


def parse_json(data):
    """Parse a body strictly: UTF-8 without BOM, no duplicate keys, no NaN,
    no lone surrogates, no trailing data; numbers stay Number (their text)."""
    if isinstance(data, (bytes, bytearray)):
        try:
            text = bytes(data).decode("utf-8")
        except UnicodeDecodeError as e:
            raise ParamError("invalid UTF-8") from e
    else:
        text = data
    if text.startswith("\ufeff"):
        raise ParamError("byte-order mark")
    try:
        v = json.loads(text, object_pairs_hook=_no_duplicates, parse_int=Number, parse_float=Number,
                       parse_constant=_no_constant)
    except ParamError:
        raise
    except (ValueError, RecursionError) as e:
        raise ParamError("not JSON: %s" % e) from e
    _check_strings(v)
    return v


def canonical_decimal(text):
    """The canonical text of a JSON number (or a decimal string): no leading
    or trailing zeros, -0 is 0, ECMAScript Number::toString's layout applied
    to the exact digits."""
    m = _DECIMAL.fullmatch(text)
    if not m:
        raise ParamError("not a decimal: %r" % text)
    neg, ipart, fpart, esign, edigits = m.groups()
    fpart = fpart or ""
    exp = 0
    if edigits is not None:
        if len(edigits.lstrip("0")) > _MAX_EXPONENT_DIGITS:
            raise ParamError("decimal out of range")
        exp = int(edigits) * (-1 if esign == "-" else 1)
    digits = (ipart + fpart).lstrip("0")
    if not digits:
        return "0"
    scale = exp - len(fpart)
    stripped = digits.rstrip("0")
    scale += len(digits) - len(stripped)
    digits = stripped
    k = len(digits)
    n = k + scale  # value = 0.d1...dk x 10^n
    if abs(n - 1) > _MAX_SCIENTIFIC_EXPONENT:
        raise ParamError("decimal out of range")
    if k <= n <= 21:
        out = digits + "0" * (n - k)
    elif 0 < n <= 21:
        out = digits[:n] + "." + digits[n:]
    elif -6 < n <= 0:
        out = "0." + "0" * (-n) + digits
    else:
        mant = digits if k == 1 else digits[0] + "." + digits[1:]
        e = n - 1
        out = mant + "e" + ("+" if e >= 0 else "-") + str(abs(e))
    return "-" + out if neg else out


_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t",
            "\u2028": "\\u2028", "\u2029": "\\u2029"}


def _string(s):
    out = ['"']
    for ch in s:
        esc = _ESCAPES.get(ch)
        if esc is not None:
            out.append(esc)
        elif ch < " ":
            out.append("\\u%04x" % ord(ch))
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def _utf8(s):
    return s.encode("utf-8")


def canonical_json(v, nfc=False):
    """Canonical JSON text of a parsed value; nfc normalises strings (not keys)."""
    if v is None:
        return "null"
    if v is True:
        return "true"
    if v is False:
        return "false"
    if isinstance(v, Number):
        return canonical_decimal(str(v))
    if isinstance(v, str):
        return _string(unicodedata.normalize("NFC", v) if nfc else v)
    if isinstance(v, list):
        return "[" + ",".join(canonical_json(x, nfc) for x in v) + "]"
    if isinstance(v, dict):
        keys = sorted((k for k, x in v.items() if x is not None), key=_utf8)
        return "{" + ",".join(_string(k) + ":" + canonical_json(v[k], nfc) for k in keys) + "}"
    raise ParamError("unsupported value %r" % type(v).__name__)


_ABSENT = object()


def _lookup(doc, path, path_vars):
    if path.startswith("path."):
        return (path_vars or {}).get(path[len("path."):], _ABSENT)
    cur = doc
    for seg in path.split("."):
        if isinstance(cur, dict):
            if seg not in cur:
                return _ABSENT
            cur = cur[seg]
        elif isinstance(cur, list) and re.fullmatch(r"[0-9]+", seg):
            i = int(seg)
            if i >= len(cur):
                return _ABSENT
            cur = cur[i]
        else:
            return _ABSENT
    return cur


def canonical_params(params, doc, path_vars=None):
    """The canonical params text: params are [{"path", "type"?, "normalize"?}]."""
    fields = []
    for p in params:
        path = p["path"]
        v = _lookup(doc, path, path_vars)
        if v is _ABSENT or v is None:
            continue
        typ, norm = p.get("type", ""), p.get("normalize", "")
        if typ == "decimal":
            if not isinstance(v, str):  # Number is a str too
                raise ParamError("param %s: not a decimal" % path)
            canon = canonical_decimal(str(v))
        elif typ == "":
            if norm not in ("", "nfc"):
                raise ParamError("param %s: unknown normalize %r" % (path, norm))
            canon = canonical_json(v, norm == "nfc")
        else:
            raise ParamError("param %s: unknown type %r" % (path, typ))
        fields.append((path, canon))
    fields.sort(key=lambda f: _utf8(f[0]))
    return "{" + ",".join(_string(path) + ":" + c for path, c in fields) + "}"


def param_hash(params, doc, path_vars=None):
    """Hex SHA-256 of canonical_params."""
    return hashlib.sha256(canonical_params(params, doc, path_vars).encode("utf-8")).hexdigest()
