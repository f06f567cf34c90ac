package extproc

import (
	"errors"
	"mime"
	"strings"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	"github.com/idemgate/idemgate/extproc/envelope"
	"github.com/idemgate/idemgate/extproc/security"
	"github.com/idemgate/idemgate/fingerprint"
)

// The binding rule (docs/design.md §2) at the server: a body whose bound
// fields the upstream could read otherwise than idemgate is refused before
// the upstream, at preview, confirm and status, and the attempt is a
// security event. Nothing is acquired, so the exact body still confirms.

const (
	hdrContentEncoding = "content-encoding"
)

// invalidParams answers params that cannot be bound: invalid_params with the
// error as detail (paths in it are escaped to printable ASCII by the
// fingerprint package, and the envelope escapes the whole string). An
// ambiguous key or value is also reported as a security event. claims are
// the verified fingerprint's, when there is one.
func (ex *exchange) invalidParams(err error, claims fingerprint.Claims) *extprocv3.ProcessingResponse {
	var ae *fingerprint.AmbiguousKeyError
	switch {
	case errors.As(err, &ae):
		ex.report(security.Event{Reason: security.ReasonAmbiguousKey, Keys: ae.Paths}, claims)
	case errors.Is(err, fingerprint.ErrAmbiguousValue):
		ex.report(security.Event{Reason: security.ReasonAmbiguousValue}, claims)
	}
	return ex.envelope(envelope.InvalidParams, 0, envelope.Extra{Detail: err.Error()})
}

// bodyEncodingRefused checks what the request headers say about a body
// idemgate is about to read: a Content-Encoding other than identity means
// the bytes are not the JSON the upstream will decode, and a Content-Type
// that is not JSON means the upstream may parse the same bytes as a form
// (a JSON string can hold "&amount=9999&"). Both are refused as
// invalid_json. A missing Content-Type is accepted: no mainstream framework
// picks a non-JSON parser for it.
func (ex *exchange) bodyEncodingRefused() string {
	if enc := strings.TrimSpace(ex.contentEncoding); enc != "" && !strings.EqualFold(enc, "identity") {
		return "Content-Encoding " + quoteHeader(enc) + ": send the body uncompressed, as JSON"
	}
	ct := strings.TrimSpace(ex.contentType)
	if ct == "" || strings.EqualFold(ct, "application/json") {
		// The usual spelling, decided without parsing it (the parser
		// allocates a map per call).
		return ""
	}
	mt, params, err := mime.ParseMediaType(ct)
	if err != nil || !(mt == "application/json" || (strings.HasPrefix(mt, "application/") && strings.HasSuffix(mt, "+json"))) {
		return "Content-Type " + quoteHeader(ct) + " is not JSON: send Content-Type: application/json"
	}
	if cs, ok := params["charset"]; ok && !strings.EqualFold(cs, "utf-8") {
		return "Content-Type charset " + quoteHeader(cs) + ": send UTF-8"
	}
	return ""
}

// quoteHeader shows a header value in a detail: printable ASCII, quoted,
// at most 64 bytes.
func quoteHeader(v string) string {
	if len(v) > 64 {
		v = v[:64]
	}
	return string(appendQuotedASCII(nil, v))
}

func appendQuotedASCII(b []byte, s string) []byte {
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < 0x20 || c >= 0x7f || c == '"' || c == '\\' {
			c = '?'
		}
		b = append(b, c)
	}
	return append(b, '"')
}
