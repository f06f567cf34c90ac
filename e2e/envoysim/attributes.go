package envoysim

import (
	"net"
	"net/http"
	"regexp"
	"strconv"
	"strings"

	"google.golang.org/protobuf/types/known/structpb"
)

// headerIndexExpr matches request.headers['name'] / response.headers["name"].
var headerIndexExpr = regexp.MustCompile(`^(request|response)\.headers\[\s*['"]([^'"]+)['"]\s*\]$`)

// evaluateAttributes evaluates the configured attribute expressions the way
// ext_proc's ExpressionManager does for the subset modelled: bool → bool,
// integers → number, everything else → string; unknown or failing
// expressions are omitted.
func (ex *exchange) evaluateAttributes(exprs []string) *structpb.Struct {
	out := &structpb.Struct{Fields: map[string]*structpb.Value{}}
	for _, e := range exprs {
		if v, ok := ex.attribute(strings.TrimSpace(e)); ok {
			out.Fields[e] = v
		}
	}
	return out
}

func (ex *exchange) attribute(expr string) (*structpb.Value, bool) {
	req := ex.reqHeaders
	str := func(s string, ok bool) (*structpb.Value, bool) {
		if !ok {
			return nil, false
		}
		return structpb.NewStringValue(s), true
	}
	num := func(n int64) (*structpb.Value, bool) { return structpb.NewNumberValue(float64(n)), true }
	if m := headerIndexExpr.FindStringSubmatch(expr); m != nil {
		h := req
		if m[1] == "response" {
			h = ex.enc.headers
		}
		if h == nil {
			return nil, false
		}
		vs := h.values(strings.ToLower(m[2]))
		if len(vs) == 0 {
			return nil, false
		}
		return structpb.NewStringValue(strings.Join(vs, ",")), true
	}
	switch expr {
	case "request.path":
		return str(req.get(":path"))
	case "request.url_path":
		p, ok := req.get(":path")
		p, _, _ = strings.Cut(p, "?")
		return str(p, ok)
	case "request.query":
		p, _ := req.get(":path")
		_, q, _ := strings.Cut(p, "?")
		return str(q, true)
	case "request.host":
		return str(req.get(":authority"))
	case "request.scheme":
		return str(req.get(":scheme"))
	case "request.method":
		return str(req.get(":method"))
	case "request.referer":
		return str(req.get("referer"))
	case "request.useragent":
		return str(req.get("user-agent"))
	case "request.id":
		return str(req.get("x-request-id"))
	case "request.protocol":
		return str("HTTP/1.1", true)
	case "request.size":
		cl, ok := req.get("content-length")
		n, err := strconv.ParseInt(cl, 10, 64)
		if !ok || err != nil {
			return nil, false
		}
		return num(n)
	case "response.code":
		if ex.enc.headers == nil {
			return nil, false
		}
		code, err := strconv.ParseInt(headerOr(ex.enc.headers, ":status"), 10, 64)
		if err != nil {
			return nil, false
		}
		return num(code)
	case "source.address":
		return str(ex.r.RemoteAddr, ex.r.RemoteAddr != "")
	case "source.port":
		return portOf(ex.r.RemoteAddr)
	case "destination.address":
		if a, ok := ex.r.Context().Value(http.LocalAddrContextKey).(net.Addr); ok {
			return str(a.String(), true)
		}
		return nil, false
	case "destination.port":
		if a, ok := ex.r.Context().Value(http.LocalAddrContextKey).(net.Addr); ok {
			return portOf(a.String())
		}
		return nil, false
	case "connection.mtls":
		return structpb.NewBoolValue(ex.r.TLS != nil && len(ex.r.TLS.PeerCertificates) > 0), true
	case "xds.route_name":
		if ex.route == nil {
			return nil, false
		}
		return str(ex.route.route.Name, true)
	case "xds.virtual_host_name":
		if ex.route == nil {
			return nil, false
		}
		return str(ex.route.vhost.vh.Name, true)
	case "xds.cluster_name":
		if ex.route == nil {
			return nil, false
		}
		return str(ex.route.route.Cluster, true)
	}
	return nil, false
}

func portOf(addr string) (*structpb.Value, bool) {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, false
	}
	n, err := strconv.ParseInt(port, 10, 64)
	if err != nil {
		return nil, false
	}
	return structpb.NewNumberValue(float64(n)), true
}
