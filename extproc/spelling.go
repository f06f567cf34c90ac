package extproc

import (
	"strconv"
	"strings"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	"github.com/idemgate/idemgate/extproc/envelope"
	"github.com/idemgate/idemgate/extproc/route"
	"github.com/idemgate/idemgate/extproc/security"
)

// retryControlHeaders are the request headers with which a client Envoy
// counts as internal (internal_address_config) changes how often and how
// long the router tries a request. ext_proc never sees a router retry, so on
// a request that may execute they would let one checked confirm run several
// times. Envoy strips them from external clients; idemgate refuses them
// where they reach it.
var retryControlHeaders = map[string]bool{
	"x-envoy-retry-on":                         true,
	"x-envoy-retry-grpc-on":                    true,
	"x-envoy-max-retries":                      true,
	"x-envoy-retriable-status-codes":           true,
	"x-envoy-retriable-header-names":           true,
	"x-envoy-hedge-on-per-try-timeout":         true,
	"x-envoy-upstream-rq-timeout-ms":           true,
	"x-envoy-upstream-rq-per-try-timeout-ms":   true,
	"x-envoy-upstream-rq-timeout-alt-response": true,
}

// spellingRefused answers a request that names a guarded path in a way
// idemgate would not check (route.Guard): another spelling of the path
// (path_not_exact, 404) or another method (method_not_allowed, 405). Such a
// request is refused before the upstream, whatever Envoy's routes do with
// it, because a lenient upstream router may run the guarded handler for it.
// The one exception: a bodiless GET or DELETE on an MCP endpoint (the
// specification's server-to-client stream and session end) cannot carry a
// tools/call and goes on. refused is false when the request may go on.
func (ex *exchange) spellingRefused(req *extprocv3.ProcessingRequest, h *extprocv3.HttpHeaders, method, path string) (reply *extprocv3.ProcessingResponse, refused bool) {
	verdict, gp := ex.srv.cfg.Guard.Check(method, path)
	switch verdict {
	case route.Unguarded, route.Exact:
		return nil, false
	case route.WrongMethod:
		if h.GetEndOfStream() && (method == "GET" || method == "DELETE") && ex.srv.cfg.MCPEndpoints[gp.Path] != nil {
			return nil, false
		}
		allow := strings.Join(gp.Methods, ", ")
		ex.refusalEvent(req, h, security.ReasonMethodNotAllowed, method, path)
		return ex.envelope(envelope.MethodNotAllowed, 0, envelope.Extra{Detail: "use " + allow + " " + gp.Path},
			setHeader("allow", []byte(allow))), true
	}
	ex.refusalEvent(req, h, security.ReasonPathNotExact, method, path)
	return ex.envelope(envelope.PathNotExact, 0, envelope.Extra{Detail: "use " + strings.Join(gp.Methods, ", ") + " " + gp.Path}), true
}

// retryHeadersRefused refuses a request that may execute (a confirm, or
// anything on an MCP endpoint) when it carries a retryControlHeaders header.
func (ex *exchange) retryHeadersRefused(req *extprocv3.ProcessingRequest, h *extprocv3.HttpHeaders, method, path string) (*extprocv3.ProcessingResponse, bool) {
	for _, hv := range h.GetHeaders().GetHeaders() {
		if name := hv.GetKey(); retryControlHeaders[name] {
			ex.refusalEvent(req, h, security.ReasonHeaderNotAllowed, method, path)
			return ex.envelope(envelope.HeaderNotAllowed, 0, envelope.Extra{Detail: name}), true
		}
	}
	return nil, false
}

// maxEventRequest bounds the method and path a security event repeats.
const maxEventRequest = 256

// refusalEvent reports a request refused before any operation was chosen:
// no operation, nonce or fingerprint, the presenting subject's tag and what
// the client sent (quoted, so a path cannot forge log fields).
func (ex *exchange) refusalEvent(req *extprocv3.ProcessingRequest, h *extprocv3.HttpHeaders, reason, method, path string) {
	sent := method + " " + path
	if len(sent) > maxEventRequest {
		sent = sent[:maxEventRequest] + "..."
	}
	e := security.Event{Reason: reason, Request: strconv.Quote(sent), TraceID: ex.traceID}
	if subject := ex.resolveSubject(h.GetHeaders(), req.GetMetadataContext()); subject != "" {
		keys := ex.srv.cfg.Keys
		e.SubjectTag, _ = keys.SubjectTag(keys.ActiveKeyID(), subject)
	}
	ex.traceSecurity(reason)
	ex.srv.security.Report(ex.ctx, e)
}
