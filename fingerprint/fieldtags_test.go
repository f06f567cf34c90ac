package fingerprint

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemgate/idemgate/internal/jsonx"
)

// FuzzObjectOfStrings: on any strict JSON value (what decodeClaims hands
// it, read with the payload) the byte scan answers what decoding the tags
// answers.
func FuzzObjectOfStrings(f *testing.F) {
	for _, s := range []string{`{}`, `{"amount":"a1b2","payee.account_id":"x"}`, `{"a":1}`, `{"a":"}{[,:"}`, `{"a":"\"","b":null}`, `{"a":{"b":"c"}}`, `{"a":["x"]}`, `["x"]`, `"x"`, `{ "a" : "b" , "c":"d" }`, `{"a":"\\"}`, `{"a":-1}`, `{"a":true}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		if jsonx.Check(raw) != nil {
			return
		}
		_, bad := claimFieldTags(raw, nil)
		require.Equal(t, bad == "", objectOfStrings(raw), "%q", raw)
	})
}
