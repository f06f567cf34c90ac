package mainlib

import (
	"errors"
	"fmt"
	"io"
	"net"

	"github.com/idemgate/idemgate/cmd/idemgate/settings"
	"github.com/idemgate/idemgate/envoy/pieces"
	"github.com/idemgate/idemgate/extproc/config"
)

// envoyConfig prints the Envoy pieces that attach idemgate, derived from
// the operations of a config (envoy/pieces).
func envoyConfig(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("envoy-config", stderr)
	path := fs.String("config", "", "config file whose operations to guard")
	addr := fs.String("idemgate-address", "", "host:port where Envoy reaches idemgate (default: 127.0.0.1 and the port of grpc_listen)")
	upstream := fs.String("upstream-cluster", "payments", "the Envoy cluster of the operation routes")
	if _, err := parseFlags(fs, args); err != nil {
		return err
	}
	if *path == "" {
		fmt.Fprintln(stderr, "envoy-config: --config is required")
		return ErrUsage
	}
	// Only operations, subject, limits and timeouts are read: no secret is
	// needed, so this runs where the keys and DSN do not exist.
	cfg, warns, err := settings.Load(*path, config.Options{Offline: true})
	for _, w := range warns {
		fmt.Fprintf(stderr, "warning: %s\n", w)
	}
	if err != nil {
		var p *config.Problem
		if !errors.As(err, &p) {
			return err
		}
		fmt.Fprintln(stderr, err)
		return fmt.Errorf("%s: %d problem(s)", *path, countProblems(err))
	}
	address := *addr
	if address == "" {
		_, port, err := net.SplitHostPort(cfg.GRPCListen)
		if err != nil {
			return fmt.Errorf("grpc_listen %q: %w", cfg.GRPCListen, err)
		}
		address = net.JoinHostPort("127.0.0.1", port)
	}
	out, err := pieces.Render(cfg.Runtime, pieces.Options{ConfigPath: *path, IdemgateAddress: address, UpstreamCluster: *upstream})
	if err != nil {
		return err
	}
	_, err = stdout.Write(out)
	return err
}
