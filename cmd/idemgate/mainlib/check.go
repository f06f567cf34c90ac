package mainlib

import (
	"errors"
	"fmt"
	"io"

	"github.com/idemgate/idemgate/extproc/config"
	"github.com/idemgate/idemgate/fingerprint"
)

// checkConfig prints every problem of a config file (exit non-zero) or its
// summary. Warnings are printed either way and do not fail the check.
func checkConfig(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("check-config", stderr)
	path := fs.String("config", "", "config file to check")
	if _, err := parseFlags(fs, args); err != nil {
		return err
	}
	if *path == "" {
		fmt.Fprintln(stderr, "check-config: --config is required")
		return ErrUsage
	}
	rt, warns, err := config.Load(*path, config.Options{})
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
	return rt.WriteSummary(stdout)
}

// keygen prints a new signing key.
func keygen(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("keygen", stderr)
	if _, err := parseFlags(fs, args); err != nil {
		return err
	}
	key, err := fingerprint.GenerateKey()
	if err != nil {
		return err
	}
	_, err = fmt.Fprintln(stdout, key)
	return err
}
