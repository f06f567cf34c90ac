package mainlib

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"

	"github.com/idemgate/idemgate/attest"
	"github.com/idemgate/idemgate/cmd/idemgate/settings"
	"github.com/idemgate/idemgate/extproc/config"
)

// JWKSPath is where the admin listener publishes the attestation keys.
const JWKSPath = "/.well-known/jwks.json"

// withJWKS serves the attestation keys' JWKS at JWKSPath beside the other
// admin endpoints (404 there when attestation is off). The set holds
// public keys only; verifiers fetch it again on an unknown kid, so it may
// be cached briefly.
func withJWKS(admin http.Handler, a *config.AttestationSettings) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != JWKSPath {
			admin.ServeHTTP(w, r)
			return
		}
		if a == nil {
			http.Error(w, "attestation is off (no attestation section in the config)", http.StatusNotFound)
			return
		}
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		w.Header().Set("Content-Type", "application/jwk-set+json")
		w.Header().Set("Cache-Control", "max-age=60")
		_, _ = w.Write(a.Signer.JWKS())
	})
}

// keygenAttestation prints a new attestation key for IDEMGATE_ATTEST_KEY_*
// (stdout, the secret) and its public JWK (stderr, for a verifier that is
// given keys rather than the JWKS URL).
func keygenAttestation(kid string, stdout, stderr io.Writer) error {
	seed, err := attest.GenerateSeed()
	if err != nil {
		return err
	}
	key, err := attest.ParseSeed(seed)
	if err != nil {
		return err
	}
	jwk, err := json.Marshal(attest.PublicJWK(kid, key))
	if err != nil {
		return err
	}
	fmt.Fprintf(stderr, "public key (JWK) of attestation key %s: %s\n", kid, jwk)
	_, err = fmt.Fprintln(stdout, seed)
	return err
}

// jwks prints the JWKS of a config's attestation keys: what the admin
// listener serves, for verifiers configured with a fixed key set.
func jwks(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("jwks", stderr)
	path := fs.String("config", "", "config file whose attestation keys to print")
	if _, err := parseFlags(fs, args); err != nil {
		return err
	}
	if *path == "" {
		fmt.Fprintln(stderr, "jwks: --config is required")
		return ErrUsage
	}
	cfg, _, err := settings.Load(*path, config.Options{})
	if err != nil {
		return problemsError(*path, err)
	}
	if cfg.Runtime.Attestation == nil {
		return errors.New("jwks: the config has no attestation section")
	}
	_, err = fmt.Fprintln(stdout, string(cfg.Runtime.Attestation.Signer.JWKS()))
	return err
}
