package envoysim

import (
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
)

type pathAction int

const (
	pathContinue pathAction = iota
	pathRedirect
	pathReject
)

// normalizePath is ConnectionManagerUtility::maybeNormalizePath: escaped
// slashes first, then RFC 3986 normalisation, then merge_slashes. It works on
// the path part; the query is kept as is.
func normalizePath(cfg HCM, full string) (string, pathAction) {
	path, query, hasQuery := strings.Cut(full, "?")
	action := pathContinue
	switch cfg.PathWithEscapedSlashesAction {
	case hcmv3.HttpConnectionManager_REJECT_REQUEST, hcmv3.HttpConnectionManager_UNESCAPE_AND_REDIRECT,
		hcmv3.HttpConnectionManager_UNESCAPE_AND_FORWARD:
		unescaped := unescapeSlashes(path)
		if unescaped != path {
			switch cfg.PathWithEscapedSlashesAction {
			case hcmv3.HttpConnectionManager_REJECT_REQUEST:
				return full, pathReject
			case hcmv3.HttpConnectionManager_UNESCAPE_AND_REDIRECT:
				action = pathRedirect
			}
			path = unescaped
		}
	}
	if cfg.NormalizePath {
		p, ok := canonicalPath(path)
		if !ok {
			return full, pathReject
		}
		path = p
	}
	if cfg.MergeSlashes {
		for strings.Contains(path, "//") {
			path = strings.ReplaceAll(path, "//", "/")
		}
	}
	if hasQuery {
		path += "?" + query
	}
	return path, action
}

func unescapeSlashes(p string) string {
	r := strings.NewReplacer("%2F", "/", "%2f", "/", "%5C", `\`, "%5c", `\`)
	return r.Replace(p)
}

// canonicalPath approximates Envoy's PathUtil::canonicalPath (Chromium's URL
// path canonicaliser): backslashes become slashes, percent-encoded
// unreserved characters are decoded, other escapes are upper-cased, and dot
// segments are removed. A path that does not start with "/" is refused.
func canonicalPath(p string) (string, bool) {
	if !strings.HasPrefix(p, "/") && !strings.HasPrefix(p, `\`) {
		return "", false
	}
	var b strings.Builder
	for i := 0; i < len(p); i++ {
		c := p[i]
		switch {
		case c == '\\':
			b.WriteByte('/')
		case c == '%' && i+2 < len(p) && isHex(p[i+1]) && isHex(p[i+2]):
			v := unhex(p[i+1])<<4 | unhex(p[i+2])
			if isUnreserved(v) {
				b.WriteByte(v)
			} else {
				b.WriteString(strings.ToUpper(p[i : i+3]))
			}
			i += 2
		default:
			b.WriteByte(c)
		}
	}
	return removeDotSegments(b.String()), true
}

func removeDotSegments(p string) string {
	segs := strings.Split(p, "/")
	out := make([]string, 0, len(segs))
	for i, s := range segs {
		switch s {
		case ".":
			if i == len(segs)-1 {
				out = append(out, "")
			}
		case "..":
			if len(out) > 1 {
				out = out[:len(out)-1]
			}
			if i == len(segs)-1 {
				out = append(out, "")
			}
		default:
			out = append(out, s)
		}
	}
	res := strings.Join(out, "/")
	if !strings.HasPrefix(res, "/") {
		res = "/" + res
	}
	return res
}

func isHex(c byte) bool {
	return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F')
}

func unhex(c byte) byte {
	switch {
	case c >= '0' && c <= '9':
		return c - '0'
	case c >= 'a' && c <= 'f':
		return c - 'a' + 10
	}
	return c - 'A' + 10
}

func isUnreserved(c byte) bool {
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
		c == '-' || c == '.' || c == '_' || c == '~'
}

// hcmChecks runs the codec and connection-manager checks that can answer
// before any filter: headers with underscores and path normalisation. It
// returns false when a local reply was sent.
func (ex *exchange) hcmChecks() bool {
	h := ex.reqHeaders
	switch ex.rt.cfg.HCM.HeadersWithUnderscoresAction {
	case corev3.HttpProtocolOptions_REJECT_REQUEST:
		for _, e := range h.entries {
			if strings.Contains(e.key, "_") {
				ex.sendLocalReply(localReply{status: 400, details: "http1.unexpected_underscore", source: "hcm"})
				return false
			}
		}
	case corev3.HttpProtocolOptions_DROP_HEADER:
		var kept []headerEntry
		for _, e := range h.entries {
			if !strings.Contains(e.key, "_") {
				kept = append(kept, e)
			}
		}
		h.entries = kept
	}
	path, _ := h.get(":path")
	newPath, action := normalizePath(ex.rt.cfg.HCM, path)
	switch {
	case action == pathReject || (action == pathRedirect && ex.isGRPC):
		ex.sendLocalReply(localReply{status: 400, details: "path_normalization_failed", source: "hcm"})
		return false
	case action == pathRedirect:
		ex.sendLocalReply(localReply{status: 307, details: "path_normalization_failed", source: "hcm",
			mutate: func(rh *headerMap) { rh.setCopy("location", newPath) }})
		return false
	}
	if newPath != path {
		h.setCopy(":path", newPath)
	}
	return true
}
