package extproc

import (
	"strconv"

	"github.com/idemgate/idemgate/fingerprint"
	"github.com/idemgate/idemgate/state"
)

// resultRef is the reference a replay or status answer names the result by:
// the one recorded with it at completion, else (a result settled by a
// person, or recorded before refs were) read from the stored body now.
func (ex *exchange) resultRef(res *state.Result, nonce string) string {
	if len(ex.op.ResultRef) == 0 {
		return nonce
	}
	if res.Ref != "" {
		return res.Ref
	}
	return ex.readResultRef(res.Body, nonce)
}

// recordedRef is the Ref stored with a result at completion: the body is
// parsed once here rather than on every replay. Empty when the operation
// names no result_ref (the nonce needs no recording).
func (ex *exchange) recordedRef(body []byte, nonce string) string {
	if len(ex.op.ResultRef) == 0 {
		return ""
	}
	return ex.readResultRef(body, nonce)
}

// readResultRef reads the configured result_ref path from body; the nonce
// when it is not found.
func (ex *exchange) readResultRef(body []byte, nonce string) string {
	if len(body) == 0 {
		return nonce
	}
	doc, err := fingerprint.ParseJSON(body, ex.srv.cfg.Limits.MaxJSONDepth)
	if err != nil {
		return nonce
	}
	v := doc.Value()
	for _, seg := range ex.op.ResultRef {
		switch node := v.(type) {
		case map[string]any:
			v = node[seg]
		case []any:
			i, err := strconv.Atoi(seg)
			if err != nil || i < 0 || i >= len(node) {
				return nonce
			}
			v = node[i]
		default:
			return nonce
		}
	}
	switch s := v.(type) {
	case string:
		if s != "" {
			return s
		}
	case interface{ String() string }: // json.Number
		return s.String()
	case bool:
		return strconv.FormatBool(s)
	}
	return nonce
}
