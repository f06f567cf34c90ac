package stack

import "fmt"

// applyIdemgateConfig sets a test's extra top-level sections of
// idemgate.yaml (Options.IdemgateConfig, for example tracing) over the
// rendered document. A section the stack itself sets is refused: a test
// overriding the listeners or the store would run a different deployment
// without saying so.
func applyIdemgateConfig(doc map[string]any, extra map[string]any) error {
	for k, v := range extra {
		switch k {
		case "grpc_listen", "admin_listen", "store", "signing", "operations":
			return fmt.Errorf("Options.IdemgateConfig may not replace %q: the stack sets it", k)
		}
		doc[k] = v
	}
	return nil
}
