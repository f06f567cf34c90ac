// Package envoy ships the Envoy configuration that puts idemgate in front of
// an API: envoy.yaml (a complete static bootstrap for the demo, docker-compose,
// local runs and e2e), idemgate.yaml (the idemgate config that goes with it) and
// ext_proc-filter.yaml (the filter, cluster and per-route switch to paste into
// an existing Envoy). The files are embedded so that e2e and the demo use the
// exact bytes the tests of this package validate.
package envoy

import (
	"bytes"
	_ "embed"
)

var (
	//go:embed envoy.yaml
	bootstrapYAML []byte
	//go:embed idemgate.yaml
	idemgateYAML []byte
	//go:embed ext_proc-filter.yaml
	filterSnippetYAML []byte
)

// BootstrapYAML returns a copy of envoy.yaml.
func BootstrapYAML() []byte { return bytes.Clone(bootstrapYAML) }

// IdemgateYAML returns a copy of idemgate.yaml, the config envoy.yaml expects.
func IdemgateYAML() []byte { return bytes.Clone(idemgateYAML) }

// FilterSnippetYAML returns a copy of ext_proc-filter.yaml.
func FilterSnippetYAML() []byte { return bytes.Clone(filterSnippetYAML) }
