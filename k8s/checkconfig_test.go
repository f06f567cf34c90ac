package k8s

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"fmt"
	"io/fs"
	"math/big"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"

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
// secrets.example.yaml, with signingKey in place of every signing key and,
// when it is set, a fresh certificate in place of the example TLS Secret's
// placeholders.
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
	certPEM, keyPEM := selfSignedPEM(t)
	for _, m := range c.VolumeMounts {
		for _, v := range pod.Volumes {
			if v.Name != m.Name || v.Secret == nil {
				continue
			}
			secret := secrets[v.Secret.SecretName]
			require.NotNil(t, secret, "secrets.example.yaml shows no Secret %s, which the pod mounts", v.Secret.SecretName)
			for key, value := range secret.StringData {
				switch {
				case signingKey == "":
				case v.Secret.SecretName == "idemgate-keys":
					value = signingKey
				case secret.Type == corev1.SecretTypeTLS && key == corev1.TLSCertKey:
					value = certPEM
				case secret.Type == corev1.SecretTypeTLS && key == corev1.TLSPrivateKeyKey:
					value = keyPEM
				}
				out.files[m.MountPath+"/"+key] = []byte(value)
			}
		}
	}
	return out
}

// selfSignedPEM is a throwaway certificate and key, as kubectl create
// secret tls would store them.
func selfSignedPEM(t *testing.T) (certPEM, keyPEM string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "approvals.example"},
		DNSNames: []string{"approvals.example"}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	require.NoError(t, err)
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})),
		string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}))
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
			if dir == baseDir {
				require.NotNil(t, cfg.ApprovalTLS, "the approvers' listener is on the pod IP: TLS")
				require.False(t, cfg.ApprovalPlaintextRemote)
			}
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
