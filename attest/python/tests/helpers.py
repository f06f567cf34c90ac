import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", "..", ".."))


def load(*parts):
    with open(os.path.join(REPO, *parts), encoding="utf-8") as f:
        return json.load(f)


def vectors():
    return load("fingerprint", "testdata", "vectors.json")


def fixtures():
    return load("attest", "testdata", "attestations.json")
