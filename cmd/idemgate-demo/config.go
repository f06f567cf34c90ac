package main

import (
	"fmt"
	"sync"

	"github.com/goccy/go-yaml"

	"github.com/idemgate/idemgate/attest"
	"github.com/idemgate/idemgate/cmd/idemgate/settings"
	"github.com/idemgate/idemgate/envoy"
	"github.com/idemgate/idemgate/extproc/config"
	"github.com/idemgate/idemgate/fingerprint"
)

const (
	// demoKeyEnv is the variable envoy/idemgate.yaml reads the signing key
	// from; the demo generates a key when it is not set.
	demoKeyEnv = "IDEMGATE_KEY_K1"
	// demoAttestKeyEnv holds the demo's attestation key (DESIGN section
	// 11); generated for the run when it is not set.
	demoAttestKeyEnv = "IDEMGATE_ATTEST_KEY_A1"
	// demoConfigName names the derived config in problems.
	demoConfigName = "envoy/idemgate.yaml (demo: memory store, text logs)"
)

// demoConfigYAML derives the demo's idemgate config from the shipped
// envoy/idemgate.yaml: the same operations, subject, TTLs and limits, with
// the store section removed (the embedded memory store), text logs at info
// (a person reads them, and the demo reads serve's start-up line), no
// drain wait (Envoy, the only client, is stopped first), and, unless the
// shipped file has one, an attestation key, so that the demo's payments API
// can refuse what did not pass idemgate.
func demoConfigYAML() ([]byte, error) {
	var shipped yaml.MapSlice
	if err := yaml.UnmarshalWithOptions(envoy.IdemgateYAML(), &shipped, yaml.UseOrderedMap()); err != nil {
		return nil, fmt.Errorf("failed to read envoy/idemgate.yaml: %w", err)
	}
	derived := make(yaml.MapSlice, 0, len(shipped)+3)
	attested := false
	for _, item := range shipped {
		switch item.Key {
		case "store", "log", "drain":
			continue
		case "attestation":
			attested = true
		}
		derived = append(derived, item)
	}
	if !attested {
		derived = append(derived, yaml.MapItem{Key: "attestation", Value: yaml.MapSlice{
			{Key: "active_key", Value: "a1"},
			{Key: "keys", Value: yaml.MapSlice{{Key: "a1", Value: yaml.MapSlice{{Key: "env", Value: demoAttestKeyEnv}}}}},
		}})
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
		switch name {
		case demoKeyEnv:
			return key, true
		case demoAttestKeyEnv:
			return attestationKey(lookupEnv), true
		}
		return lookupEnv(name)
	}
	cfg, warns, err = settings.Parse(demoConfigName, data, ".", config.Options{LookupEnv: lookup})
	if err != nil {
		return nil, nil, warns, "", "", fmt.Errorf("invalid config %s:\n%w", demoConfigName, err)
	}
	return data, cfg, warns, key, keySource, nil
}

// generatedAttestationKey is this run's attestation key when
// IDEMGATE_ATTEST_KEY_A1 is not set.
var generatedAttestationKey = sync.OnceValue(func() string {
	k, err := attest.GenerateSeed()
	if err != nil {
		panic(err) // crypto/rand does not fail on Linux
	}
	return k
})

// attestationKey is the demo's attestation key: IDEMGATE_ATTEST_KEY_A1, else
// the one generated for this run (idemgate is started with it).
func attestationKey(lookupEnv func(string) (string, bool)) string {
	if k, ok := lookupEnv(demoAttestKeyEnv); ok {
		return k
	}
	return generatedAttestationKey()
}
