package redis

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestDecodeReply(t *testing.T) {
	good := func(extra ...any) []any {
		base := []any{"DONE", "1700000000000000",
			"state", "DONE", "param_hash", "p", "scope", "s", "subject_tag", "u", "owner", "o", "fence", "2",
			"lease_until_us", "1700000000000000", "created_at_us", "1699999999000000",
			"updated_at_us", "1700000000000000", "expires_at_us", "1700003600000000"}
		return append(base, extra...)
	}
	r, err := decodeReply(good("result_status", "200", "result_headers", `[{"name":"a","value":"b"}]`, "result_body", "x\x00y"))
	require.NoError(t, err)
	require.True(t, r.found)
	require.Equal(t, int64(2), r.record.Fence)
	require.True(t, r.record.LeaseExpired, "lease_until equal to now counts as expired")
	require.Equal(t, []byte("x\x00y"), r.record.Result.Body)

	r, err = decodeReply([]any{"NOT_FOUND", "1"})
	require.NoError(t, err)
	require.False(t, r.found)

	for _, tc := range []struct {
		name string
		v    any
	}{
		{"not an array", "OK"},
		{"nil", nil},
		{"too short", []any{"OK"}},
		{"odd length", []any{"OK", "1", "state"}},
		{"outcome not a string", []any{int64(1), "1"}},
		{"clock not a string", []any{"OK", int64(1)}},
		{"clock not a number", []any{"OK", "soon"}},
		{"field not a string", []any{"OK", "1", int64(3), "x"}},
		{"missing fields", []any{"OK", "1", "state", "DONE"}},
		{"bad state", good("state", "WEIRD")},
		{"bad fence", good("fence", "two")},
		{"bad time", good("created_at_us", "yesterday")},
		{"bad status", good("result_status", "ok", "result_headers", "[]", "result_body", "")},
		{"bad headers", good("result_status", "200", "result_headers", "{", "result_body", "")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := decodeReply(tc.v)
			require.ErrorIs(t, err, errBadReply)
		})
	}
}

func TestAnswerRejectsOutcomeNotAllowedForTheCall(t *testing.T) {
	_, err := answer(reply{outcome: "ACQUIRED"}, "OK", "NOT_OWNER")
	require.ErrorIs(t, err, errBadReply)
}
