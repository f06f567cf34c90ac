package envoysim

import (
	"net/http"
	"slices"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
)

// headerEntry is one entry of an Envoy header map. Keys are lower-case.
type headerEntry struct {
	key   string
	value string
}

// headerMap models Envoy's HeaderMapImpl: an ordered list of entries in
// insertion order, pseudo-headers kept in front, duplicates kept as separate
// entries (except for Envoy's inline headers, which addCopy comma-joins).
type headerMap struct {
	entries []headerEntry
	inline  map[string]bool
}

// Envoy's built-in inline headers (envoy/http/header_map.h). Headers that
// extensions register as inline at runtime (authorization, accept-encoding,
// ...) are not listed: in this harness they behave as ordinary headers.
var (
	requestInlineHeaders = setOf(
		":authority", ":method", ":path", ":protocol", ":scheme",
		"connection", "content-length", "content-type", "expect", "grpc-timeout",
		"keep-alive", "proxy-connection", "te", "transfer-encoding", "upgrade", "user-agent", "via",
		"x-client-trace-id", "x-forwarded-client-cert", "x-forwarded-for", "x-forwarded-host",
		"x-forwarded-proto", "x-request-id",
		"x-envoy-attempt-count", "x-envoy-decorator-operation", "x-envoy-downstream-service-cluster",
		"x-envoy-downstream-service-node", "x-envoy-expected-rq-timeout-ms", "x-envoy-external-address",
		"x-envoy-force-trace", "x-envoy-hedge-on-per-try-timeout", "x-envoy-internal", "x-envoy-ip-tags",
		"x-envoy-is-timeout-retry", "x-envoy-max-retries", "x-envoy-original-path", "x-envoy-original-url",
		"x-envoy-retriable-header-names", "x-envoy-retriable-status-codes", "x-envoy-retry-grpc-on",
		"x-envoy-retry-on", "x-envoy-upstream-alt-stat-name", "x-envoy-upstream-rq-per-try-timeout-ms",
		"x-envoy-upstream-rq-timeout-alt-response", "x-envoy-upstream-rq-timeout-ms",
		"x-envoy-upstream-stream-duration-ms",
	)
	responseInlineHeaders = setOf(
		":status", "connection", "content-length", "content-type", "date", "keep-alive", "location",
		"proxy-connection", "request-id", "server", "transfer-encoding", "upgrade", "via",
		"x-request-id", "x-envoy-attempt-count", "x-envoy-decorator-operation", "x-envoy-degraded",
		"x-envoy-immediate-health-check-fail", "x-envoy-overloaded", "x-envoy-ratelimited",
		"x-envoy-upstream-canary", "x-envoy-upstream-healthchecked-cluster",
		"x-envoy-upstream-service-time",
	)
)

func setOf(keys ...string) map[string]bool {
	m := make(map[string]bool, len(keys))
	for _, k := range keys {
		m[k] = true
	}
	return m
}

// hopByHop are removed by Envoy's HTTP/1 codec and connection manager; they
// never appear in a header map that ext_proc sees and are never forwarded.
var hopByHop = setOf("connection", "keep-alive", "proxy-connection", "upgrade", "te", "trailer")

func newRequestHeaderMap() *headerMap  { return &headerMap{inline: requestInlineHeaders} }
func newResponseHeaderMap() *headerMap { return &headerMap{inline: responseInlineHeaders} }

func (h *headerMap) clone() *headerMap {
	return &headerMap{entries: slices.Clone(h.entries), inline: h.inline}
}

// get returns the first value of key.
func (h *headerMap) get(key string) (string, bool) {
	for _, e := range h.entries {
		if e.key == key {
			return e.value, true
		}
	}
	return "", false
}

// values returns every value of key, in order.
func (h *headerMap) values(key string) []string {
	var vs []string
	for _, e := range h.entries {
		if e.key == key {
			vs = append(vs, e.value)
		}
	}
	return vs
}

func (h *headerMap) has(key string) bool {
	_, ok := h.get(key)
	return ok
}

// remove deletes every entry of key.
func (h *headerMap) remove(key string) {
	h.entries = slices.DeleteFunc(h.entries, func(e headerEntry) bool { return e.key == key })
}

// insert appends an entry; pseudo-headers go after the last pseudo-header.
func (h *headerMap) insert(key, value string) {
	if strings.HasPrefix(key, ":") {
		i := 0
		for i < len(h.entries) && strings.HasPrefix(h.entries[i].key, ":") {
			i++
		}
		h.entries = slices.Insert(h.entries, i, headerEntry{key, value})
		return
	}
	h.entries = append(h.entries, headerEntry{key, value})
}

// setCopy is Envoy's setCopy with http_set_copy_replace_all_headers (the
// default): every existing entry goes, one new entry is added.
func (h *headerMap) setCopy(key, value string) {
	h.remove(key)
	h.insert(key, value)
}

// addCopy is Envoy's addCopy: inline headers that already exist get the value
// comma-joined onto the first entry; other headers get another entry.
func (h *headerMap) addCopy(key, value string) {
	if h.inline[key] {
		for i := range h.entries {
			if h.entries[i].key == key {
				if h.entries[i].value == "" {
					h.entries[i].value = value
				} else {
					h.entries[i].value += "," + value
				}
				return
			}
		}
	}
	h.insert(key, value)
}

// byteSize is Envoy's HeaderMap::byteSize: keys plus values.
func (h *headerMap) byteSize() int {
	n := 0
	for _, e := range h.entries {
		n += len(e.key) + len(e.value)
	}
	return n
}

// toProto encodes the map as ext_proc sends it: one HeaderValue per entry, in
// order, with raw_value only, filtered by the forward rules.
func (h *headerMap) toProto(allowed func(string) bool) *corev3.HeaderMap {
	out := &corev3.HeaderMap{}
	for _, e := range h.entries {
		if allowed != nil && !allowed(e.key) {
			continue
		}
		out.Headers = append(out.Headers, &corev3.HeaderValue{Key: e.key, RawValue: []byte(e.value)})
	}
	return out
}

// toHTTP copies the regular headers (no pseudo-headers, no hop-by-hop) into an
// http.Header, keeping duplicate entries.
func (h *headerMap) toHTTP(dst http.Header) {
	for _, e := range h.entries {
		if strings.HasPrefix(e.key, ":") || hopByHop[e.key] || e.key == "transfer-encoding" || e.key == "host" {
			continue
		}
		dst[http.CanonicalHeaderKey(e.key)] = append(dst[http.CanonicalHeaderKey(e.key)], e.value)
	}
}

// appendHTTP appends the entries of an http.Header, lower-casing keys. The Go
// HTTP stack does not keep the wire order of distinct names, so names are
// sorted; the values of one name keep their order.
func (h *headerMap) appendHTTP(src http.Header) {
	keys := make([]string, 0, len(src))
	for k := range src {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b string) int { return strings.Compare(strings.ToLower(a), strings.ToLower(b)) })
	for _, k := range keys {
		lk := strings.ToLower(k)
		if hopByHop[lk] || lk == "host" {
			continue
		}
		for _, v := range src[k] {
			// The HTTP/1 codec adds through addViaMove, which comma-joins
			// repeated inline headers exactly like addCopy.
			h.addCopy(lk, v)
		}
	}
}

// headerNameIsValid follows Envoy's HeaderUtility::headerNameIsValid:
// pseudo-header names must be lower-case tokens, other names are HTTP/1
// tokens (upper case allowed; it is lower-cased afterwards).
func headerNameIsValid(key string) bool {
	if key == "" {
		return false
	}
	pseudo := key[0] == ':'
	if pseudo {
		key = key[1:]
		if key == "" {
			return false
		}
	}
	for i := 0; i < len(key); i++ {
		c := key[i]
		if pseudo && c >= 'A' && c <= 'Z' {
			return false
		}
		if !isTokenChar(c) {
			return false
		}
	}
	return true
}

func isTokenChar(c byte) bool {
	switch {
	case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		return true
	}
	return strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}

// headerValueIsValid rejects NUL, CR, LF and the other control characters
// nghttp2 refuses; HTAB and obs-text are allowed.
func headerValueIsValid(v string) bool {
	for i := 0; i < len(v); i++ {
		c := v[i]
		if (c < 0x20 && c != '\t') || c == 0x7f {
			return false
		}
	}
	return true
}

// authorityIsValid approximates Envoy's HeaderUtility::authorityIsValid.
func authorityIsValid(v string) bool {
	if v == "" {
		return false
	}
	for i := 0; i < len(v); i++ {
		c := v[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case strings.IndexByte("-._~!$&'()*+,;=:@[]%", c) >= 0:
		default:
			return false
		}
	}
	return true
}
