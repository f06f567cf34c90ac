package payments

import (
	"log/slog"
	"net/http"

	"github.com/idemgate/idemgate/attest/verify"
)

// Attested puts h (a Server) behind attest/verify, as an upstream of
// idemgate should be: POST /v1/transfers/confirm, and tools/call of the
// confirm tool on /mcp, run only with a valid execution attestation from
// idemgate (keys: its JWKS). Every other route is unchanged.
func Attested(h http.Handler, keys verify.KeySet, logger *slog.Logger) (http.Handler, error) {
	confirm, err := verify.New(verify.Options{Keys: keys, Logger: logger})
	if err != nil {
		return nil, err
	}
	tools, err := verify.New(verify.Options{Keys: keys, MCPTools: []string{MCPConfirmTool}, Logger: logger})
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	// No method in the patterns: every method of these paths is checked.
	mux.Handle("/v1/transfers/confirm", confirm.Middleware(h))
	mux.Handle(MCPPath, tools.Middleware(h))
	mux.Handle("/", h)
	return mux, nil
}
