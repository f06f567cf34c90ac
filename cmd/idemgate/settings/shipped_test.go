package settings

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/goccy/go-yaml"
	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/extproc/config"
)

// shippedConfigs are every idemgate.yaml the repository ships (git ls-files
// '*idemgate.yaml' outside testdata); TestShippedConfigsListed keeps the
// list complete.
var shippedConfigs = []string{
	"envoy/idemgate.yaml",
	"k8s/base/idemgate.yaml",
	"k8s/envoy-gateway/idemgate.yaml",
}

// TestShippedConfigsRefuseRoutablePlaintext is the rule of docs/design.md
// §12 applied to what users copy: each shipped config passes check-config
// (offline: the pod's files are not here) as shipped, and is refused once
// grpc_listen (and approval_listen, where it is set) is a routable address
// served in plaintext without the explicit switch.
func TestShippedConfigsRefuseRoutablePlaintext(t *testing.T) {
	offline := config.Options{Offline: true}
	for _, rel := range shippedConfigs {
		t.Run(rel, func(t *testing.T) {
			data, err := os.ReadFile(filepath.Join("..", "..", "..", rel))
			require.NoError(t, err)
			_, _, err = Parse(rel, data, "", offline)
			require.NoError(t, err, "as shipped")

			var doc yaml.MapSlice
			require.NoError(t, yaml.UnmarshalWithOptions(data, &doc, yaml.UseOrderedMap()))
			_, hasApproval := lookup(doc, "approval_listen")
			for _, addr := range []string{":50051", "0.0.0.0:50051", "10.1.2.3:50051", "[::]:50051", "idemgate.payments.svc:50051"} {
				mutated := without(doc, "grpc_tls", "grpc_plaintext_remote")
				mutated = set(mutated, "grpc_listen", addr)
				_, _, err := Parse(rel, marshal(t, mutated), "", offline)
				require.Error(t, err, "grpc_listen %s", addr)
				require.Contains(t, err.Error(), "grpc_listen: \""+addr+"\" is a routable address served in plaintext")
			}
			if !hasApproval {
				return
			}
			mutated := without(doc, "approval_tls", "approval_plaintext_remote")
			mutated = set(mutated, "approval_listen", ":9091")
			_, _, err = Parse(rel, marshal(t, mutated), "", offline)
			require.Error(t, err)
			require.Contains(t, err.Error(), "approval_listen: \":9091\" is a routable address served in plaintext")
		})
	}
}

// TestShippedConfigsListed: a new shipped idemgate.yaml must join
// shippedConfigs.
func TestShippedConfigsListed(t *testing.T) {
	root := filepath.Join("..", "..", "..")
	var found []string
	require.NoError(t, filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == "testdata" || d.Name() == ".git" || (d.Name()[0] == '.' && path != root)) {
			return filepath.SkipDir
		}
		if !d.IsDir() && d.Name() == "idemgate.yaml" {
			rel, err := filepath.Rel(root, path)
			if err != nil {
				return err
			}
			found = append(found, filepath.ToSlash(rel))
		}
		return nil
	}))
	require.ElementsMatch(t, shippedConfigs, found)
}

func lookup(doc yaml.MapSlice, key string) (any, bool) {
	for _, it := range doc {
		if it.Key == key {
			return it.Value, true
		}
	}
	return nil, false
}

func without(doc yaml.MapSlice, keys ...string) yaml.MapSlice {
	out := make(yaml.MapSlice, 0, len(doc))
	for _, it := range doc {
		drop := false
		for _, k := range keys {
			drop = drop || it.Key == k
		}
		if !drop {
			out = append(out, it)
		}
	}
	return out
}

func set(doc yaml.MapSlice, key string, value any) yaml.MapSlice {
	out := append(yaml.MapSlice(nil), doc...)
	for i, it := range out {
		if it.Key == key {
			out[i].Value = value
			return out
		}
	}
	return append(out, yaml.MapItem{Key: key, Value: value})
}

func marshal(t *testing.T, doc yaml.MapSlice) []byte {
	t.Helper()
	out, err := yaml.Marshal(doc)
	require.NoError(t, err)
	return out
}
