package k8s

import (
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"io/fs"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/cmd/idemgate/settings"
	"github.com/idemgate/idemgate/extproc/config"
)

// podFiles is what the idemgate container sees: its environment (resolved
// from the example Secrets) and the files of its Secret volumes.
type podFiles struct {
	env   map[string]string
	files map[string][]byte
}

func (p podFiles) options() config.Options {
	return config.Options{
		LookupEnv: func(name string) (string, bool) { v, ok := p.env[name]; return v, ok },
		ReadFile: func(path string) ([]byte, error) {
			if b, ok := p.files[path]; ok {
				return b, nil
			}
			return nil, fmt.Errorf("open %s: %w", path, fs.ErrNotExist)
		},
	}
}

// idemgatePod resolves the idemgate container's env and Secret files from
// secrets.example.yaml, with signingKey in place of every signing key.
func idemgatePod(t *testing.T, objs []object, signingKey string) podFiles {
	t.Helper()
	pod := &deployment(t, objs).Spec.Template.Spec
	c := container(t, pod, "idemgate")
	secrets := exampleSecrets(t)
	out := podFiles{env: map[string]string{}, files: map[string][]byte{}}
	for _, e := range c.Env {
		if ref := e.ValueFrom.SecretKeyRef; ref != nil {
			out.env[e.Name] = secrets[ref.Name].StringData[ref.Key]
		} else {
			out.env[e.Name] = e.Value
		}
	}
	for _, m := range c.VolumeMounts {
		for _, v := range pod.Volumes {
			if v.Name != m.Name || v.Secret == nil {
				continue
			}
			for key, value := range secrets[v.Secret.SecretName].StringData {
				if signingKey != "" && v.Secret.SecretName == "idemgate-keys" {
					value = signingKey
				}
				out.files[m.MountPath+"/"+key] = []byte(value)
			}
		}
	}
	return out
}

// TestMountedConfigIsAcceptedByTheLoader runs idemgate's config loader (what
// `idemgate check-config` and `serve` run) on the config each kustomization
// mounts, with the files and variables the pod provides.
func TestMountedConfigIsAcceptedByTheLoader(t *testing.T) {
	key := make([]byte, 32)
	_, err := rand.Read(key)
	require.NoError(t, err)
	for _, dir := range []string{baseDir, istioDir} {
		t.Run(dir, func(t *testing.T) {
			objs := render(t, dir)
			raw, loose := idemgateConfig(t, objs)
			pod := idemgatePod(t, objs, base64.StdEncoding.EncodeToString(key))
			cfg, warnings, err := settings.Parse(dir+"/idemgate.yaml", raw, "/etc/idemgate/config", pod.options())
			require.NoError(t, err)
			rt := cfg.Runtime
			require.Empty(t, warnings)
			require.Equal(t, loose.GRPCListen, cfg.GRPCListen)
			require.Equal(t, loose.AdminListen, cfg.AdminListen)
			require.Equal(t, time.Duration(loose.Store.Timeout), rt.Store.Timeout)
			require.Equal(t, time.Duration(loose.Drain.Period), cfg.Drain.Period)
			require.Equal(t, time.Duration(loose.Drain.Timeout), cfg.Drain.Timeout)
			require.Equal(t, loose.Subject.Header, rt.Subject.Header)
			require.Equal(t, "tiered", cfg.Store.Backend())
			require.Equal(t, pod.env["IDEMGATE_REDIS_PASSWORD"], cfg.Store.Redis.Password.Reveal())
			require.Equal(t, "env IDEMGATE_POSTGRES_DSN", cfg.Store.Postgres.DSNSource)
		})
	}
}

// TestExampleKeyIsRefused: applying secrets.example.yaml unchanged must not
// give a running idemgate a publicly known signing key.
func TestExampleKeyIsRefused(t *testing.T) {
	objs := render(t, baseDir)
	raw, _ := idemgateConfig(t, objs)
	pod := idemgatePod(t, objs, "")
	_, _, err := settings.Parse("base/idemgate.yaml", raw, "/etc/idemgate/config", pod.options())
	require.Error(t, err)
	t.Log(err)
	require.Contains(t, err.Error(), "signing")
}
