package mainlib

import (
	"fmt"
	"io"
	"net"

	"github.com/idemgate/idemgate/envoy/pieces"
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
	cfg, err := loadOffline(*path, stderr)
	if err != nil {
		return err
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
