package mainlib

import (
	"errors"
	"fmt"
	"io"

	"github.com/idemgate/idemgate/cmd/idemgate/settings"
	"github.com/idemgate/idemgate/extproc/config"
	"github.com/idemgate/idemgate/fingerprint"
)

// checkConfig prints every problem of a config file (exit non-zero) or its
// summary. Warnings are printed either way and do not fail the check.
func checkConfig(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("check-config", stderr)
	path := fs.String("config", "", "config file to check")
	offline := fs.Bool("offline", false, "check the references to secrets (keys, DSN, Redis password) without reading them, "+
		"for a config whose secrets do not exist where it is checked (CI, a config repository)")
	if _, err := parseFlags(fs, args); err != nil {
		return err
	}
	if *path == "" {
		fmt.Fprintln(stderr, "check-config: --config is required")
		return ErrUsage
	}
	cfg, warns, err := settings.Load(*path, config.Options{Offline: *offline})
	for _, w := range warns {
		fmt.Fprintf(stderr, "warning: %s\n", w)
	}
	if err != nil {
		var p *config.Problem
		if !errors.As(err, &p) {
			return err // the file could not be read
		}
		fmt.Fprintln(stderr, err)
		return fmt.Errorf("%s: %d problem(s)", *path, countProblems(err))
	}
	if *offline {
		fmt.Fprintln(stdout, "(offline check: the secrets named below were not read)")
	}
	return cfg.WriteSummary(stdout)
}

// keygen prints a new signing key; --attestation prints an attestation
// key (the same form: base64 of 32 random bytes, an Ed25519 seed) and its
// public JWK.
func keygen(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("keygen", stderr)
	attestKid := fs.String("attestation", "", "print an attestation key with this key id (its public JWK goes to stderr)")
	if _, err := parseFlags(fs, args); err != nil {
		return err
	}
	if *attestKid != "" {
		return keygenAttestation(*attestKid, stdout, stderr)
	}
	key, err := fingerprint.GenerateKey()
	if err != nil {
		return err
	}
	_, err = fmt.Fprintln(stdout, key)
	return err
}
