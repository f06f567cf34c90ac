// Package oracle holds an independent second implementation of the
// fingerprint format and the canonical parameter form, in Python
// (fingerprint_oracle.py, standard library only), and the tests that run it
// against fingerprint/testdata/vectors.json.
//
// The golden vectors are written by the Go implementation they check
// (`go test ./fingerprint -update`), so on their own they only prove that the
// implementation agrees with itself. The oracle was written from the contract
// alone (docs/design.md §2 and §8, the fingerprint package documentation and the
// comment at the top of vectors.json), never from the Go code: a vector it
// cannot recompute is a disagreement between the code and the written rules.
//
// The package has no Go code besides this comment; it exists so that the
// tests live next to the script and the fingerprint package stays untouched.
package oracle
