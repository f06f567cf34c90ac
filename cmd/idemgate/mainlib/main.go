// Package mainlib is the idemgate binary as an importable package, so tests
// and the end-to-end harness can run every subcommand in-process.
package mainlib

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strings"

	"github.com/idemgate/idemgate/cmd/idemgate/settings"
)

// Version is set at build time (-ldflags -X .../mainlib.Version=...).
var Version = "dev"

// ErrUsage marks a command-line mistake; the usage has been printed.
var ErrUsage = errors.New("usage error")

const usage = `idemgate — exactly-once execution for money-moving API calls made by LLM agents
(an Envoy ext_proc server).

Usage:
  idemgate serve --config FILE [--grpc-listen ADDR] [--admin-listen ADDR] [--pprof]
      Serve ext_proc (gRPC) and the admin endpoints (/metrics /healthz /readyz).
  idemgate check-config --config FILE [--offline]
      Check a config file: list every problem, or print a summary.
  idemgate keygen [--attestation KID]
      Print a new signing key (base64 of 32 random bytes) for IDEMGATE_KEY_*;
      with --attestation, an attestation key (its public JWK on stderr).
  idemgate jwks --config FILE
      Print the JWKS of the config's attestation keys (what the admin listener
      serves at /.well-known/jwks.json).
  idemgate migrate (--config FILE | --dsn DSN)
      Apply the PostgreSQL migrations.
  idemgate ops list [--state UNKNOWN|IN_FLIGHT|DONE|FAILED] [--older-than 10m] [--limit N] (--config FILE | --dsn DSN)
  idemgate ops show NONCE (--config FILE | --dsn DSN)
  idemgate ops resolve NONCE (--done|--failed) --status N --body @FILE|TEXT [--content-type TYPE] --as NAME --reason TEXT (--config FILE | --dsn DSN)
      Reconciliation (对账): find records a person must settle, read them, settle them.
  idemgate ops approvals list [--state pending|approved|denied|expired|consumed] [--limit N] (--config FILE | --dsn DSN)
  idemgate ops approvals show ID (--config FILE | --dsn DSN)
  idemgate ops approvals approve|deny ID --as NAME --reason TEXT (--config FILE | --dsn DSN)
      Approvals of gated confirms: list, read (params, rules, audit trail), decide as NAME.
  idemgate tools --config FILE --format openai|anthropic|mcp
      Print the preview, confirm and status tool definitions of every operation.
  idemgate envoy-config --config FILE [--idemgate-address HOST:PORT|unix:///PATH] [--upstream-cluster NAME]
      [--envoy-client-cert F --envoy-client-key F --idemgate-ca F --idemgate-san SAN --idemgate-sni NAME]
      Print the Envoy pieces (filters, cluster, operation routes, 413 envelope) that
      attach idemgate to an Envoy you already run, derived from the config's operations;
      with grpc_tls the cluster carries Envoy's client certificate (mutual TLS).
  idemgate version
  idemgate help

The demo (Envoy in front of idemgate and a demo payments API) is not part of this
binary: run ` + "`make demo`" + ` in the repository (cmd/idemgate-demo).
`

// Main runs one idemgate command. ctx is cancelled on SIGTERM/SIGINT; serve
// then drains. Results go to stdout, logs and problems to stderr.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return ErrUsage
	}
	cmd, rest := args[0], args[1:]
	switch cmd {
	case "serve":
		return serve(ctx, rest, stderr)
	case "check-config":
		return checkConfig(rest, stdout, stderr)
	case "keygen":
		return keygen(rest, stdout, stderr)
	case "jwks":
		return jwks(rest, stdout, stderr)
	case "migrate":
		return migrate(ctx, rest, stdout, stderr)
	case "ops":
		return ops(ctx, rest, stdout, stderr)
	case "tools":
		return tools(rest, stdout, stderr)
	case "envoy-config":
		return envoyConfig(rest, stdout, stderr)
	case "version", "--version":
		fmt.Fprintln(stdout, "idemgate", Version)
		return nil
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return nil
	default:
		fmt.Fprintf(stderr, "unknown command %q\n\n%s", cmd, usage)
		return ErrUsage
	}
}

// newFlagSet returns a flag set that reports errors instead of exiting.
func newFlagSet(name string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	return fs
}

// parseFlags parses args, allowing flags after positional arguments
// ("ops show NONCE --dsn X"), and returns the positional arguments.
func parseFlags(fs *flag.FlagSet, args []string) ([]string, error) {
	var positional []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, ErrUsage
		}
		args = fs.Args()
		if len(args) == 0 {
			return positional, nil
		}
		positional = append(positional, args[0])
		args = args[1:]
	}
}

// newLogger builds the process logger.
func newLogger(w io.Writer, s settings.LogSettings) *slog.Logger {
	opts := &slog.HandlerOptions{Level: s.Level}
	if s.Format == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// problemsError lists a config's problems one per line.
func problemsError(path string, err error) error {
	return fmt.Errorf("invalid config %s:\n%w", path, err)
}

// countProblems counts the joined problems of a config error.
func countProblems(err error) int {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return len(j.Unwrap())
	}
	return strings.Count(err.Error(), "\n") + 1
}
