package config

import (
	"github.com/idemgate/idemgate/extproc/route"
)

// GuardedPaths lists every path idemgate guards, in configuration order:
// each operation's preview, confirm and status routes and each MCP endpoint,
// with the methods they are guarded for. Any other spelling of these paths,
// and any other method on them, is refused (extproc) and sent to idemgate by
// the Envoy pieces (envoyconfig).
func (rt *Runtime) GuardedPaths() []route.GuardedPath {
	var out []route.GuardedPath
	seen := map[string]bool{}
	for _, op := range rt.Operations {
		for _, r := range []Route{op.Preview, op.Confirm, op.Status} {
			if r.Method == "" {
				continue
			}
			out = append(out, route.GuardedPath{Path: r.Template.String(), Methods: []string{r.Method}})
		}
		if op.MCP != nil && op.MCP.Endpoint != "" && !seen[op.MCP.Endpoint] {
			seen[op.MCP.Endpoint] = true
			out = append(out, route.GuardedPath{Path: op.MCP.Endpoint, Methods: []string{"POST"}})
		}
	}
	return out
}

// guard compiles GuardedPaths. A path that is not a valid template was
// reported where it was configured and is left out here.
func (c *compiler) guard(rt *Runtime) *route.Guard {
	var valid []route.GuardedPath
	for _, gp := range rt.GuardedPaths() {
		if _, err := route.ParseTemplate(gp.Path); err == nil {
			valid = append(valid, gp)
		}
	}
	g, err := route.NewGuard(valid)
	if err != nil {
		c.errorf(p("operations"), "%v", err)
	}
	return g
}
