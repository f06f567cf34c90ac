// Package verify checks idemgate's execution attestations in the upstream
// (docs/design.md §11). Every request idemgate lets through after ACQUIRED
// carries a compact JWS (EdDSA, Ed25519) in the Idempotency-Attestation
// header — and, for an MCP tools/call, in params._meta
// ["io.idemgate/attestation"] — that binds the idempotency key, the
// operation's scope, the canonical param hash, the method and path as
// forwarded, the subject tag, the attempt's owner/fence and a short expiry.
// A request that went around idemgate (a route that skipped the ext_proc
// filter, a spelling idemgate did not guard, a connection straight to the
// upstream's port) has none, and Middleware refuses it before the handler
// runs: the application itself, not the route table, decides.
//
// The package is meant to be dropped into an upstream: it imports only the
// standard library (a test keeps it so). The param hash is recomputed from
// the body the handler will read, with idemgate's canonical rules (the
// golden vectors in fingerprint/testdata/vectors.json run in its tests);
// which fields are bound, and how, is part of the signed claims, so the
// upstream keeps no copy of idemgate's operation list.
//
// Rollout: run with Options.LogOnly first (every refusal is logged, nothing
// refused), then turn it off.
package verify
