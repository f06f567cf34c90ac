#!/usr/bin/env python3
"""Reads bodies with Python's json and says whether the bound values are the
previewed ones (the binding rule's differential test; driven by
fingerprint/binding_differential_test.go).

Input (argv[1]): a JSON array of cases {id, body_b64, amount, currency,
account_id}. Output: one JSON object per case and reader on stdout:
{id, reader, verdict: same|differs|refused, got}.
"""
import base64
import decimal
import json
import sys


def amount_of(v):
    """The amount as an upstream reads it: a Decimal, or None."""
    if isinstance(v, bool) or v is None:
        return None
    if isinstance(v, (int, decimal.Decimal)):
        return decimal.Decimal(v)
    if isinstance(v, float):
        # What a float-reading upstream does with it: str() and Decimal.
        return decimal.Decimal(str(v))
    if isinstance(v, str):
        try:
            return decimal.Decimal(v)
        except decimal.InvalidOperation:
            return None
    return None


def bound(doc):
    if not isinstance(doc, dict):
        raise ValueError("not an object")
    payee = doc.get("payee")
    account = payee.get("account_id") if isinstance(payee, dict) else None
    return amount_of(doc.get("amount")), doc.get("currency"), account


READERS = {
    # json.loads on the raw bytes, as Flask's get_json and most frameworks do.
    "python-json": lambda raw: json.loads(raw),
    # Money APIs often ask for exact decimals.
    "python-json-decimal": lambda raw: json.loads(raw, parse_float=decimal.Decimal),
}


def main():
    with open(sys.argv[1], "rb") as f:
        cases = json.load(f)
    for c in cases:
        raw = base64.b64decode(c["body_b64"])
        want = (decimal.Decimal(c["amount"]), c["currency"], c["account_id"])
        for name, read in READERS.items():
            try:
                got = bound(read(raw))
            except (ValueError, RecursionError, UnicodeDecodeError) as e:
                print(json.dumps({"id": c["id"], "reader": name, "verdict": "refused", "got": str(e)[:200]}))
                continue
            verdict = "same" if got == want else "differs"
            print(json.dumps({"id": c["id"], "reader": name, "verdict": verdict, "got": repr(got)[:300]}))


if __name__ == "__main__":
    main()
