package requeststate_test

import (
	"bytes"
	"encoding/base64"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/extproc/requeststate"
	"github.com/idemgate/idemgate/fingerprint"
)

func ring(t *testing.T, active string, ids ...string) *fingerprint.KeyRing {
	t.Helper()
	keys := map[string][]byte{}
	for i, id := range ids {
		keys[id] = bytes.Repeat([]byte{byte(i + 1)}, 32)
	}
	r, err := fingerprint.NewKeyRing(active, keys)
	require.NoError(t, err)
	return r
}

func sealer(t *testing.T, active string, ids ...string) *requeststate.Sealer {
	t.Helper()
	s, err := requeststate.New(ring(t, active, ids...))
	require.NoError(t, err)
	return s
}

var now = time.Unix(1_800_000_000, 0)

func TestSealOpenRoundTrip(t *testing.T) {
	s := sealer(t, "k1", "k1")
	st := requeststate.State{Nonce: "n0nce", ApprovalID: "apr_1", SubjectTag: "tag-1", Expires: now.Add(time.Hour)}
	wire, err := s.Seal(st)
	require.NoError(t, err)
	got, err := s.Open(wire, now)
	require.NoError(t, err)
	require.Equal(t, st.Nonce, got.Nonce)
	require.Equal(t, st.ApprovalID, got.ApprovalID)
	require.Equal(t, st.SubjectTag, got.SubjectTag)
	require.True(t, st.Expires.Equal(got.Expires))

	// A ring rotated to k2 that still holds k1 opens it; one without k1
	// does not.
	rotated := sealer(t, "k2", "k1", "k2")
	_, err = rotated.Open(wire, now)
	require.NoError(t, err)
	_, err = sealer(t, "k2", "k2").Open(wire, now)
	require.ErrorIs(t, err, requeststate.ErrInvalid)
}

// TestOpenRefuses: every change to a sealed state, an expired one and
// foreign text are refused.
func TestOpenRefuses(t *testing.T) {
	s := sealer(t, "k1", "k1")
	wire, err := s.Seal(requeststate.State{Nonce: "n0nce", ApprovalID: "apr_1", SubjectTag: "tag-1", Expires: now.Add(time.Minute)})
	require.NoError(t, err)
	parts := strings.Split(wire, ".")
	forged := base64.RawURLEncoding.EncodeToString([]byte("other\napr_1\ntag-1\n1900000000"))
	cases := map[string]string{
		"empty":            "",
		"foreign":          "eyJzdGF0ZSI6MX0",
		"payload replaced": parts[0] + "." + parts[1] + "." + forged + "." + parts[3],
		"mac cut":          wire[:len(wire)-2],
		"mac flipped":      wire[:len(wire)-1] + flip(wire[len(wire)-1]),
		"unknown kid":      parts[0] + ".k9." + parts[2] + "." + parts[3],
		"extra part":       wire + ".x",
		"too long":         wire + strings.Repeat("A", requeststate.MaxLen),
	}
	for name, w := range cases {
		_, err := s.Open(w, now)
		require.ErrorIs(t, err, requeststate.ErrInvalid, name)
	}
	_, err = s.Open(wire, now.Add(time.Minute))
	require.ErrorIs(t, err, requeststate.ErrInvalid, "expired")
	// Another deployment's key (same kid, other secret) does not verify.
	other, err := requeststate.New(ring(t, "k1", "x", "k1"))
	require.NoError(t, err)
	_, err = other.Open(wire, now)
	require.ErrorIs(t, err, requeststate.ErrInvalid)
}

func TestSealRefusesFieldsWithSeparators(t *testing.T) {
	s := sealer(t, "k1", "k1")
	_, err := s.Seal(requeststate.State{Nonce: "a\nb", ApprovalID: "apr_1", SubjectTag: "t", Expires: now})
	require.ErrorIs(t, err, requeststate.ErrInvalid)
	_, err = s.Seal(requeststate.State{Nonce: "n", ApprovalID: "", SubjectTag: "t", Expires: now})
	require.ErrorIs(t, err, requeststate.ErrInvalid)
}

func flip(c byte) string {
	if c == 'A' {
		return "B"
	}
	return "A"
}
