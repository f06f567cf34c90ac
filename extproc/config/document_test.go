package config

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// process stands for the binary's settings: another owner's top-level keys,
// one of them (store) shared with this package.
type process struct {
	Listen string       `yaml:"grpc_listen"`
	Store  processStore `yaml:"store"`
}

type processStore struct {
	Redis *struct {
		Addrs []string `yaml:"addrs"`
	} `yaml:"redis"`
}

const documentOps = `signing: {active_key: k1, keys: {k1: {env: IDEMGATE_TEST_KEY_K1}}}
operations:
  - {name: t, scope: s, preview: {method: POST, path: /p}, confirm: {method: POST, path: /c}, status: {method: POST, path: /s}, preview_tool: a, status_tool: b, params: [x]}
`

func TestDocumentOverlaysTheOtherOwnersKeys(t *testing.T) {
	src := "grpc_listen: \":1\"\nstore: {timeout: 1s, redis: {addrs: [\"r:6379\"]}}\n" + documentOps
	doc, err := ParseDocument("f.yaml", []byte(src), "", testOptions(), process{})
	require.NoError(t, err)
	rt, ch, err := doc.Compile()
	require.NoError(t, err)
	var proc process
	require.NoError(t, doc.Decode(&proc))
	_, err = ch.Result()
	require.NoError(t, err)
	require.Equal(t, ":1", proc.Listen)
	require.Equal(t, []string{"r:6379"}, proc.Store.Redis.Addrs)
	require.Equal(t, "1s", rt.Store.Timeout.String())

	// Alone, this package knows only its own keys.
	_, _, err = Parse("f.yaml", []byte(src), "", testOptions())
	require.ErrorContains(t, err, `f.yaml:1:1: grpc_listen: unknown key "grpc_listen" (known keys: attestation, limits, messages, operations, security, signing, store, subject, ttl)`)
	require.ErrorContains(t, err, `store.redis: unknown key "redis" (known keys: timeout)`)
}

func TestDocumentReportsUnknownKeysOfBothOwners(t *testing.T) {
	src := "grpc_listn: \":1\"\nstore: {timeot: 1s, redis: {adrs: []}}\n" + documentOps
	doc, err := ParseDocument("f.yaml", []byte(src), "", testOptions(), process{})
	require.NoError(t, err)
	_, ch, err := doc.Compile()
	require.NoError(t, err)
	_, err = ch.Result()
	require.Error(t, err)
	got := strings.Split(err.Error(), "\n")
	require.Equal(t, []string{
		`f.yaml:1:1: grpc_listn: unknown key "grpc_listn" (known keys: attestation, grpc_listen, limits, messages, operations, security, signing, store, subject, ttl)`,
		`f.yaml:2:9: store.timeot: unknown key "timeot" (known keys: redis, timeout)`,
		`f.yaml:2:29: store.redis.adrs: unknown key "adrs" (known keys: addrs)`,
	}, got)
}

func TestResultListsProblemsSectionBySection(t *testing.T) {
	doc, err := ParseDocument("f.yaml", []byte("ttl: {in_flight: x}\n"+documentOps), "", testOptions(), process{})
	require.NoError(t, err)
	_, ch, err := doc.Compile()
	require.NoError(t, err)
	ch.Errorf(p("grpc_listen"), "first in the file's order")
	_, err = ch.Result("grpc_listen", "ttl")
	require.Error(t, err)
	require.Equal(t, []string{
		"f.yaml:1:1: grpc_listen: first in the file's order",
		`f.yaml:1:18: ttl.in_flight: invalid duration "x": use a Go duration such as 250ms, 15m or 72h`,
	}, strings.Split(err.Error(), "\n"))
}

// The shape walk leaves aliases and merge keys to the decoder, which then
// checks the keys of every owner at once.
func TestDocumentRefusesUnknownKeysBehindAliases(t *testing.T) {
	for name, src := range map[string]string{
		"alias":     "ttl: &t {fingerprint: 15m}\nstore: *t\n",
		"merge key": "ttl: &t {fingerprint: 15m}\nstore: {<<: *t, timeout: 1s}\n",
	} {
		t.Run(name, func(t *testing.T) {
			_, err := ParseDocument("f.yaml", []byte(src+documentOps), "", testOptions(), process{})
			require.ErrorContains(t, err, `unknown field "fingerprint"`)
			_, _, err = Parse("f.yaml", []byte(src+documentOps), "", testOptions())
			require.ErrorContains(t, err, `unknown field "fingerprint"`)
		})
	}
	// Known keys behind an alias are fine.
	doc, err := ParseDocument("f.yaml", []byte("grpc_listen: &l \":1\"\nstore: {redis: {addrs: [*l]}}\n"+documentOps), "", testOptions(), process{})
	require.NoError(t, err)
	var proc process
	require.NoError(t, doc.Decode(&proc))
	require.Equal(t, []string{":1"}, proc.Store.Redis.Addrs)
}
