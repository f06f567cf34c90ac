package envelope

import (
	"github.com/idemgate/idemgate/fingerprint"
	"github.com/idemgate/idemgate/internal/jsonx"
)

// AppendString appends s as a JSON string; invalid UTF-8 becomes U+FFFD, so
// the output is valid JSON whatever bytes an upstream sent. It is the
// canonical form's writer (the project has one JSON string encoder),
// exported for the server, which builds a few small JSON fragments itself.
func AppendString(b []byte, s string) []byte { return fingerprint.AppendJSONString(b, s) }

// AppendJSONOrString appends body verbatim when it is strict JSON
// (internal/jsonx), else as a JSON string, so a replayed non-JSON result
// still yields a valid envelope, and one that some parsers would read two
// ways (a duplicate name, invalid UTF-8) is not embedded as if it were
// one value. An empty body becomes null.
func AppendJSONOrString(b, body []byte) []byte {
	if len(body) == 0 {
		return append(b, "null"...)
	}
	if jsonx.Check(body) == nil {
		return append(b, body...)
	}
	return AppendString(b, string(body))
}
