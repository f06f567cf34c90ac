package fingerprint_test

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/fingerprint"
)

// testKey returns a deterministic 32-byte key whose bytes start at seed.
func testKey(seed byte) []byte {
	k := make([]byte, 32)
	for i := range k {
		k[i] = seed + byte(i)
	}
	return k
}

func TestParseKey(t *testing.T) {
	raw := make([]byte, 33) // 33 bytes: the encodings differ in padding and alphabet
	for i := range raw {
		raw[i] = byte(0xF0 + i*7) // produces '+' '/' in std, '-' '_' in URL
	}
	std := base64.StdEncoding.EncodeToString(raw)
	url := base64.URLEncoding.EncodeToString(raw)
	require.True(t, strings.ContainsAny(std, "+/"))
	require.True(t, strings.ContainsAny(url, "-_"))
	raw32 := testKey(1)
	for _, tc := range []struct {
		name string
		in   string
		want []byte
	}{
		{"standard padded", std, raw},
		{"standard raw", strings.TrimRight(std, "="), raw},
		{"url padded", url, raw},
		{"url raw", strings.TrimRight(url, "="), raw},
		{"whitespace around", "  \n" + std + "\n\t", raw},
		{"32 bytes padded", base64.StdEncoding.EncodeToString(raw32), raw32},
		{"32 bytes raw url", base64.RawURLEncoding.EncodeToString(raw32), raw32},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := fingerprint.ParseKey(tc.in)
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
		})
	}
	for _, tc := range []struct {
		name string
		in   string
	}{
		{"empty", ""},
		{"blank", " \n "},
		{"31 bytes", base64.StdEncoding.EncodeToString(make([]byte, 31))},
		{"not base64", "this is not base64 at all, it has spaces and commas!!"},
		{"mixed alphabets", strings.Replace(url, "-", "+", 1) + "_"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := fingerprint.ParseKey(tc.in)
			require.ErrorIs(t, err, fingerprint.ErrInvalidKey)
			if len(tc.in) > 8 {
				require.NotContains(t, err.Error(), strings.TrimSpace(tc.in)[:8], "error must not echo the key")
			}
		})
	}
}

func TestGenerateKey(t *testing.T) {
	a, err := fingerprint.GenerateKey()
	require.NoError(t, err)
	b, err := fingerprint.GenerateKey()
	require.NoError(t, err)
	require.NotEqual(t, a, b)
	require.Len(t, a, 44) // standard padded base64 of 32 bytes
	raw, err := base64.StdEncoding.DecodeString(a)
	require.NoError(t, err)
	require.Len(t, raw, 32)
	parsed, err := fingerprint.ParseKey(a)
	require.NoError(t, err)
	require.Equal(t, raw, parsed)
}

func TestNewKeyRing(t *testing.T) {
	r, err := fingerprint.NewKeyRing("k2", map[string][]byte{"k2": testKey(2), "k1": testKey(1), "old-2025.a_b": testKey(3)})
	require.NoError(t, err)
	require.Equal(t, "k2", r.ActiveKeyID())
	require.Equal(t, []string{"k1", "k2", "old-2025.a_b"}, r.KeyIDs())

	for _, tc := range []struct {
		name   string
		active string
		keys   map[string][]byte
		want   string
	}{
		{"active missing", "k9", map[string][]byte{"k1": testKey(1)}, `active key "k9"`},
		{"no keys", "k1", nil, `active key "k1"`},
		{"short key", "k1", map[string][]byte{"k1": make([]byte, 31)}, "31 bytes"},
		{"empty id", "", map[string][]byte{"": testKey(1)}, `key id ""`},
		{"bad id character", "k/1", map[string][]byte{"k/1": testKey(1)}, `key id "k/1"`},
		{"id too long", strings.Repeat("a", 65), map[string][]byte{strings.Repeat("a", 65): testKey(1)}, "key id"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := fingerprint.NewKeyRing(tc.active, tc.keys)
			require.ErrorIs(t, err, fingerprint.ErrInvalidKey)
			require.ErrorContains(t, err, tc.want)
		})
	}

	t.Run("64 character id is fine", func(t *testing.T) {
		id := strings.Repeat("a", 64)
		_, err := fingerprint.NewKeyRing(id, map[string][]byte{id: testKey(1)})
		require.NoError(t, err)
	})
	t.Run("key bytes are copied", func(t *testing.T) {
		key := testKey(1)
		r, err := fingerprint.NewKeyRing("k1", map[string][]byte{"k1": key})
		require.NoError(t, err)
		before, err := r.SubjectTag("k1", "alice")
		require.NoError(t, err)
		key[0] ^= 0xFF
		after, err := r.SubjectTag("k1", "alice")
		require.NoError(t, err)
		require.Equal(t, before, after)
	})
}

func TestKeyRingNeverPrintsSecrets(t *testing.T) {
	secret := bytes.Repeat([]byte{0xAB}, 32)
	r, err := fingerprint.NewKeyRing("k1", map[string][]byte{"k1": secret, "k0": testKey(7)})
	require.NoError(t, err)

	var logs bytes.Buffer
	slog.New(slog.NewJSONHandler(&logs, nil)).Info("ring", "ring", r)
	slog.New(slog.NewTextHandler(&logs, nil)).Info("ring", "ring", r)
	for _, s := range []string{
		logs.String(),
		fmt.Sprintf("%v %+v %#v %s", r, r, r, r),
		fmt.Sprintf("%v %+v", *r, *r),
	} {
		require.NotContains(t, s, "ab ab")
		require.NotContains(t, s, "171 171") // 0xAB in decimal, as %v prints bytes
		require.NotContains(t, strings.ToLower(s), "abab")
		require.NotContains(t, s, base64.StdEncoding.EncodeToString(secret)[:10])
	}
	require.Contains(t, logs.String(), `"active_key":"k1"`)
	require.Contains(t, logs.String(), "[REDACTED]")
	require.Contains(t, logs.String(), "k0")
}

func TestSubjectTag(t *testing.T) {
	r, err := fingerprint.NewKeyRing("k1", map[string][]byte{"k1": testKey(1), "k2": testKey(2)})
	require.NoError(t, err)
	alice1, err := r.SubjectTag("k1", "alice")
	require.NoError(t, err)
	require.Len(t, alice1, 22)
	require.NotContains(t, alice1, "alice")
	again, err := r.SubjectTag("k1", "alice")
	require.NoError(t, err)
	require.Equal(t, alice1, again)
	bob1, err := r.SubjectTag("k1", "bob")
	require.NoError(t, err)
	require.NotEqual(t, alice1, bob1)
	alice2, err := r.SubjectTag("k2", "alice")
	require.NoError(t, err)
	require.NotEqual(t, alice1, alice2, "tags are keyed")

	_, err = r.SubjectTag("k3", "alice")
	require.ErrorIs(t, err, fingerprint.ErrInvalidKey)
	_, err = r.SubjectTag("k1", "")
	require.Error(t, err)
}
