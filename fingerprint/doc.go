// Package fingerprint signs and verifies idemgate fingerprints and computes
// the canonical parameter hash they bind. It is pure: no I/O, no clock (the
// caller passes the time), no globals; crypto/rand is read only by NewNonce
// and GenerateKey.
//
// # The token
//
//	fingerprint = base64url(payload) "." base64url(HMAC-SHA256(key[k], base64url(payload)))
//	payload     = {"v":1,"k":"<key id>","n":"<nonce>","exp":<unix s>,"u":"<subject tag>","s":"<scope>","p":"<param hash>","f":{...}}
//
// base64url is RFC 4648 §5 without padding; a token with padding, characters
// of the standard alphabet, line breaks or non-zero trailing bits is
// malformed, so every token has exactly one spelling. The payload is compact
// JSON with its members in the order shown, strings escaped as in the
// canonical form below, and the keys of "f" in byte order. The MAC is
// computed over the base64url text of the payload, with the configured key
// itself.
//
//   - v: format version, 1.
//   - k: id of the signing key ([A-Za-z0-9._-]{1,64}). The active key signs,
//     every configured key verifies, so keys rotate without downtime.
//   - n: 128 random bits as 32 lower-case hex characters (NewNonce): the
//     idempotency key downstream.
//   - exp: expiry in unix seconds. The token is valid while now <= exp (now
//     truncated to whole seconds) and rejected from exp+1s on.
//   - u: subject tag, base64url of the first 16 bytes of
//     HMAC-SHA256(Ksubject, subject): the token carries no user identifier.
//   - s: the operation's scope string.
//   - p: lower-case hex SHA-256 of the canonical parameters.
//   - f: for every present param, its path mapped to a field tag, base64url
//     of the first 9 bytes of HMAC-SHA256(Kfield, path || 0x00 || canonical
//     value). It names the fields that drifted without carrying any value.
//
// Ksubject and Kfield are derived once per configured key with HKDF-Expand
// (RFC 5869, SHA-256, the configured key as PRK, length 32) and the labels
// "idemgate/fingerprint/v1/subject-tag" and "idemgate/fingerprint/v1/field-tag".
// The three uses of a key therefore never share a key or an input domain.
//
// Verify checks, in this order: syntax (length <= MaxTokenLength, two parts,
// strict base64url, a payload object with exactly the eight members and the
// expected types and formats), key id known, MAC (constant time), v, s, u,
// exp, p. The first failure is a *VerifyError with one of the reasons:
//
//	malformed       the token cannot be read
//	unknown_key     k names no configured key
//	bad_mac         the MAC does not match (the message says nothing more)
//	bad_version     v is not 1
//	wrong_scope     signed for another operation
//	wrong_subject   signed for another subject
//	expired         now > exp (skipped when Expect.AllowExpired)
//	params_changed  p differs (skipped when Expect.Params is nil);
//	                ChangedFields names the params whose tag or presence differs
//
// Once the MAC is verified, Verify returns the decoded Claims with any later
// error, so the caller can log the nonce and the status tool can answer.
//
// # Canonical parameters
//
// A Selector picks an operation's params: dotted body paths ("amount",
// "payee.account_id", "items.0.sku", where all-digit segments index arrays)
// and "path.<name>" (the {name} segment of the route's path template,
// always a string). Params are canonicalised into one JSON object keyed by
// the param paths exactly as written, keys sorted by bytes; absent and null
// params are left out. Values are canonicalised recursively:
//
//   - objects: keys byte for byte, sorted by bytes, null members removed;
//   - arrays: in order, nulls kept (positions matter);
//   - strings: byte for byte after JSON unescaping; NFC-normalised
//     (golang.org/x/text/unicode/norm) only for a param with NFC set
//     (`normalize: nfc`), never by default;
//   - numbers: exact canonical decimals, never via float64 (below);
//   - no whitespace. SHA-256 of these bytes, in lower-case hex, is "p".
//
// Strings (and keys) are escaped exactly as Go's encoding/json does with
// SetEscapeHTML(false): '"' and '\' with a backslash; \b \f \n \r \t in short
// form; other bytes below 0x20 as \u00xx in lower-case hex; U+2028 and U+2029
// as \u2028 and \u2029; everything else, including '<', '>', '&', DEL and all
// other non-ASCII, as raw UTF-8. Hence encoding/json, given the normalised
// tree with json.Number leaves, reproduces the canonical bytes.
//
// Numbers are read as sign, digits and exponent; leading and trailing zeros
// are stripped and -0 is 0, so 1, 1.0, 1.00, 1e0, 10e-1 and 0.1e1 are equal,
// and 12345678901234567.89 keeps every digit. The output layout is the one
// of ECMAScript Number::toString (as in RFC 8785), applied to the exact
// digits: with k significant digits and value 0.d1d2…dk × 10^n,
//
//	k <= n <= 21   integer:            100, 1000000
//	0 < n <= 21    plain decimal:      12.34, 12345678901234567.89
//	-6 < n <= 0    leading "0.":       0.1, 0.000001
//	otherwise      d[.ddd]e±x:         1e+21, 1.5e-7, 1.2345678901234567e+30
//
// A number whose exponent literal has more than 10 digits (after leading
// zeros), or whose scientific exponent is beyond ±999999999, is an error
// (ErrNumberOutOfRange) rather than a huge string.
//
// A param with Decimal set (`type: decimal`) accepts a number or a string in
// exactly the JSON number grammar ("100.00", "-5", "1e2") and hashes both like
// the number. Surrounding spaces, a leading '+', leading zeros ("007"), ".5",
// "5.", "NaN" and the like are rejected (ErrInvalidDecimal, naming the path)
// rather than guessed at; so are booleans, objects and arrays.
//
// # The binding rule
//
// Two bodies idemgate hashes alike must be the same operation to the
// upstream, whatever mainstream JSON stack it runs. So Select refuses, before
// hashing:
//
//   - ErrAmbiguousKey (an *AmbiguousKeyError naming the keys by JSON path):
//     in any object on a bound path or inside a bound value, two keys that
//     are equal ignoring case (Go's encoding/json matches struct fields by
//     Unicode simple case folding and keeps the last match; .NET's web
//     defaults and Jackson's case-insensitive mode do similar), a key equal
//     ignoring case to the bound segment without being byte-identical, or a
//     key holding U+0000. "Equal ignoring case" also ignores '_' and '-',
//     as encoding/json/v2 does under case:ignore. Duplicate keys are
//     refused by ParseJSON already.
//   - ErrAmbiguousValue: a bound number that is negative zero, beyond the
//     finite range of IEEE doubles (or non-zero and below it), or an integer
//     above 2^53 spelled with a fraction or exponent; a bound string holding
//     U+0000.
//
// # Hostile input
//
// ParseJSON keeps numbers as their literal text, refuses duplicate keys,
// invalid UTF-8 and lone surrogates, and enforces a nesting limit. Select
// enforces Limits (nesting and canonical size). Verify refuses tokens longer
// than MaxTokenLength before decoding anything. Nothing panics on any input.
package fingerprint
