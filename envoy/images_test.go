package envoy

import (
	"bytes"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/envoy/envoytest"
)

// envoyImageRE matches a reference to an Envoy image of the envoyproxy
// organisation (envoyproxy/envoy, envoyproxy/envoy-distroless, ... with or
// without a registry in front) and captures its tag. No tag is a match too
// (an empty capture): `latest` is not the pin either.
var envoyImageRE = regexp.MustCompile(`envoyproxy/envoy(?:-[a-z]+)?(?::([A-Za-z0-9._-]+)|[^A-Za-z0-9._:/-]|$)`)

// envoyImageRefs returns every Envoy image reference in the text files under
// root, as "path:line" → tag. It skips what is not the repository's own
// (.git, the .envoy/ install, build output) and Go sources: images are named
// by manifests, compose files, Dockerfiles, scripts and docs; Go files only
// hold tests about them, which build the expected name from the pin.
func envoyImageRefs(t *testing.T, root string) map[string]string {
	t.Helper()
	refs := map[string]string{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if d.IsDir() {
			if rel != "." && (strings.HasPrefix(d.Name(), ".") && d.Name() != ".ci" || rel == "bin") {
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasSuffix(d.Name(), ".go") {
			return nil
		}
		info, err := d.Info()
		if err != nil || !info.Mode().IsRegular() || info.Size() > 4<<20 {
			return err
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if bytes.IndexByte(data, 0) >= 0 { // binary
			return nil
		}
		for i, line := range strings.Split(string(data), "\n") {
			for _, m := range envoyImageRE.FindAllStringSubmatch(line, -1) {
				refs[rel+":"+strconv.Itoa(i+1)] = m[1]
			}
		}
		return nil
	})
	require.NoError(t, err)
	return refs
}

// TestEveryEnvoyImageIsThePin: the images that docker-compose and k8s run
// are the release the tests validate the configs with (.envoy-version).
func TestEveryEnvoyImageIsThePin(t *testing.T) {
	pin, err := envoytest.PinnedVersion()
	require.NoError(t, err)
	root, err := envoytest.RepoRoot()
	require.NoError(t, err)
	refs := envoyImageRefs(t, root)

	var files []string
	for where, tag := range refs {
		require.Equal(t, "v"+pin, tag, "%s names an Envoy image that is not the pin (.envoy-version)", where)
		files = append(files, where[:strings.LastIndex(where, ":")])
	}
	// The check must have seen the images that run the shipped configs.
	require.Contains(t, files, "docker-compose.yaml")
	require.Contains(t, files, filepath.Join("k8s", "base", "deployment.yaml"))
}

func TestEnvoyImageScanFindsEveryForm(t *testing.T) {
	dir := t.TempDir()
	org := "envoyproxy" // split so this file is not a reference itself
	for name, text := range map[string]string{
		"a.yaml":     "image: " + org + "/envoy:v1.2.3\n",
		"b.md":       "x\n`docker run docker.io/" + org + "/envoy-distroless:v9.9.9 --help`\n",
		"c.yaml":     "image: " + org + "/envoy\n",
		"d.yaml":     "image: ghcr.io/other/envoy:v0.0.1\n",
		".git/e":     "image: " + org + "/envoy:v7.7.7\n",
		"sub/f.yaml": "image: \"" + org + "/envoy:v1.2.3\"\n",
		"g_test.go":  "want := \"" + org + "/envoy:v\" + pin\n",
	} {
		path := filepath.Join(dir, name)
		require.NoError(t, os.MkdirAll(filepath.Dir(path), 0o755))
		require.NoError(t, os.WriteFile(path, []byte(text), 0o644))
	}
	require.Equal(t, map[string]string{
		"a.yaml:1":                       "v1.2.3",
		"b.md:2":                         "v9.9.9",
		"c.yaml:1":                       "",
		filepath.Join("sub", "f.yaml:1"): "v1.2.3",
	}, envoyImageRefs(t, dir))
}
