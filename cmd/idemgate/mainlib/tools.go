package mainlib

import (
	"errors"
	"fmt"
	"io"

	"github.com/idemgate/idemgate/cmd/idemgate/settings"
	"github.com/idemgate/idemgate/extproc/config"
	"github.com/idemgate/idemgate/extproc/tooldefs"
)

// tools prints the preview, confirm and status tool definitions of every
// operation in a config, in one provider's format.
func tools(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("tools", stderr)
	path := fs.String("config", "", "config file whose operations to describe")
	format := fs.String("format", "", "openai, anthropic or mcp")
	if _, err := parseFlags(fs, args); err != nil {
		return err
	}
	if *path == "" || *format == "" {
		fmt.Fprintln(stderr, "tools: --config and --format (openai|anthropic|mcp) are required")
		return ErrUsage
	}
	cfg, err := loadOffline(*path, stderr)
	if err != nil {
		return err
	}
	defs, err := tooldefs.Definitions(cfg.Runtime)
	if err != nil {
		return err
	}
	return tooldefs.Render(stdout, defs, tooldefs.Format(*format))
}

// loadOffline loads a config for a command that describes its operations
// and needs no secret (tools, envoy-config): offline, so it runs where the
// keys and DSN do not exist (a laptop, CI). The runtime is only read, never
// served. Warnings and problems go to stderr.
func loadOffline(path string, stderr io.Writer) (*settings.Settings, error) {
	cfg, warns, err := settings.Load(path, config.Options{Offline: true})
	for _, w := range warns {
		fmt.Fprintf(stderr, "warning: %s\n", w)
	}
	if err != nil {
		var p *config.Problem
		if !errors.As(err, &p) {
			return nil, err
		}
		fmt.Fprintln(stderr, err)
		return nil, fmt.Errorf("%s: %d problem(s)", path, countProblems(err))
	}
	return cfg, nil
}
