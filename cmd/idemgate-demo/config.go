package main

import (
	"fmt"

	"github.com/goccy/go-yaml"

	"github.com/idemgate/idemgate/cmd/idemgate/settings"
	"github.com/idemgate/idemgate/envoy"
	"github.com/idemgate/idemgate/extproc/config"
	"github.com/idemgate/idemgate/fingerprint"
)

const (
	// demoKeyEnv is the variable envoy/idemgate.yaml reads the signing key
	// from; the demo generates a key when it is not set.
	demoKeyEnv = "IDEMGATE_KEY_K1"
	// demoConfigName names the derived config in problems.
	demoConfigName = "envoy/idemgate.yaml (demo: memory store, text logs)"
)

// demoConfigYAML derives the demo's idemgate config from the shipped
// envoy/idemgate.yaml: the same operations, subject, TTLs and limits, with
// the store section removed (the embedded memory store), text logs at info
// (a person reads them, and the demo reads serve's start-up line), and no
// drain wait (Envoy, the only client, is stopped first).
func demoConfigYAML() ([]byte, error) {
	var shipped yaml.MapSlice
	if err := yaml.UnmarshalWithOptions(envoy.IdemgateYAML(), &shipped, yaml.UseOrderedMap()); err != nil {
		return nil, fmt.Errorf("failed to read envoy/idemgate.yaml: %w", err)
	}
	derived := make(yaml.MapSlice, 0, len(shipped)+2)
	for _, item := range shipped {
		switch item.Key {
		case "store", "log", "drain":
			continue
		}
		derived = append(derived, item)
	}
	derived = append(derived,
		yaml.MapItem{Key: "log", Value: yaml.MapSlice{{Key: "level", Value: "info"}, {Key: "format", Value: "text"}}},
		yaml.MapItem{Key: "drain", Value: yaml.MapSlice{{Key: "period", Value: "0s"}, {Key: "timeout", Value: "5s"}}},
	)
	out, err := yaml.Marshal(derived)
	if err != nil {
		return nil, fmt.Errorf("failed to write the demo config: %w", err)
	}
	return out, nil
}

// demoConfig is the derived config, its signing key and where the key came
// from: IDEMGATE_KEY_K1 when it is set, else generated for this run. The
// demo compiles the config itself too (idemgate compiles it again): to stop
// with every problem listed before starting anything, and to sign the
// printed expired fingerprint with the key idemgate verifies with.
func demoConfig(lookupEnv func(string) (string, bool)) (data []byte, cfg *settings.Settings, warns []*config.Problem, key, keySource string, err error) {
	data, err = demoConfigYAML()
	if err != nil {
		return nil, nil, nil, "", "", err
	}
	key, set := lookupEnv(demoKeyEnv)
	keySource = "from " + demoKeyEnv
	if !set {
		if key, err = fingerprint.GenerateKey(); err != nil {
			return nil, nil, nil, "", "", err
		}
		keySource = "generated for this run (set " + demoKeyEnv + " to choose it)"
	}
	lookup := func(name string) (string, bool) {
		if name == demoKeyEnv {
			return key, true
		}
		return lookupEnv(name)
	}
	cfg, warns, err = settings.Parse(demoConfigName, data, ".", config.Options{LookupEnv: lookup})
	if err != nil {
		return nil, nil, warns, "", "", fmt.Errorf("invalid config %s:\n%w", demoConfigName, err)
	}
	return data, cfg, warns, key, keySource, nil
}
