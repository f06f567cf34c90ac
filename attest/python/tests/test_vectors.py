"""idemgate's golden vectors (fingerprint/testdata/vectors.json) through this package's canonical rules."""

import unittest

from idemgate_attest import ParamError, canonical_decimal, canonical_json, canonical_params, param_hash, parse_json

from .helpers import vectors


class GoldenVectors(unittest.TestCase):
    def test_numbers(self):
        entries = vectors()["numbers"]
        self.assertTrue(entries)
        for n in entries:
            with self.subTest(n=n["in"]):
                if "error" in n:
                    with self.assertRaises(ParamError):
                        canonical_decimal(n["in"])
                else:
                    self.assertEqual(canonical_decimal(n["in"]), n["out"])

    def test_canonical(self):
        for c in vectors()["canonical"]:
            with self.subTest(c["name"]):
                self.assertEqual(canonical_json(parse_json(c["in"])), c["out"])

    def test_param_hashes(self):
        tokens = vectors()["tokens"]
        self.assertTrue(tokens)
        for t in tokens:
            with self.subTest(t["name"]):
                doc = parse_json(t["body"].encode("utf-8"))
                self.assertEqual(canonical_params(t["params"], doc, t.get("path_vars")), t["expected"]["canonical"])
                self.assertEqual(param_hash(t["params"], doc, t.get("path_vars")), t["expected"]["hash"])

    def test_strict_json(self):
        for bad in [b'{"a":1,"a":2}', b"\xef\xbb\xbf{}", b"{} x", b'{"a":"\\ud800"}', b'{"a":"\xff"}', b'{"a":01}',
                    b'{"a":NaN}', b'{"a":1,}', b"{'a':1}", b'{"a":"\x01"}']:
            with self.subTest(bad=bad):
                with self.assertRaises(ParamError):
                    parse_json(bad)
        parse_json(b'{"a":"\\ud83d\\ude00","b":[1.5e-3,-0,true,false,null],"c":{}}')


if __name__ == "__main__":
    unittest.main()
