package envelope

import (
	"encoding/json"

	"github.com/idemgate/idemgate/fingerprint"
)

// AppendString appends s as a JSON string; invalid UTF-8 becomes U+FFFD, so
// the output is valid JSON whatever bytes an upstream sent. It is the
// canonical form's writer (the project has one JSON string encoder),
// exported for the server, which builds a few small JSON fragments itself.
func AppendString(b []byte, s string) []byte { return fingerprint.AppendJSONString(b, s) }

// AppendJSONOrString appends body verbatim when it is valid JSON, else as a
// JSON string, so a replayed non-JSON result still yields a valid envelope.
// An empty body becomes null.
func AppendJSONOrString(b, body []byte) []byte {
	if len(body) == 0 {
		return append(b, "null"...)
	}
	if json.Valid(body) {
		return append(b, body...)
	}
	return AppendString(b, string(body))
}
