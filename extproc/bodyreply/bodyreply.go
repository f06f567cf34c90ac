// Package bodyreply builds idemgate's reply to a response body that sets up
// to two headers and may replace the body: the reply of a signed preview,
// and of the load benchmark's floor that sends the same answer.
package bodyreply

import (
	"strconv"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
)

// Reply holds every part of the message in one value, so the whole reply is
// one allocation: a signed preview answers every request with one, which as
// separate messages (reply, oneof, body response, common response, header
// and body mutations, header options and values, the content-length digits)
// would be a dozen small objects.
type Reply struct {
	resp   extprocv3.ProcessingResponse
	oneof  extprocv3.ProcessingResponse_ResponseBody
	body   extprocv3.BodyResponse
	common extprocv3.CommonResponse
	mut    extprocv3.HeaderMutation
	bm     extprocv3.BodyMutation
	bmBody extprocv3.BodyMutation_Body
	opts   [2]corev3.HeaderValueOption
	vals   [2]corev3.HeaderValue
	set    [2]*corev3.HeaderValueOption
	n      int
	digits [20]byte
}

// SetHeader adds a header that overwrites name with value (raw_value, no
// append_action: Envoy's default for a set header). At most two.
func (r *Reply) SetHeader(name string, value []byte) {
	r.vals[r.n] = corev3.HeaderValue{Key: name, RawValue: value}
	r.opts[r.n].Header = &r.vals[r.n]
	r.set[r.n] = &r.opts[r.n]
	r.n++
}

// SetContentLength sets content-length to n (Envoy compares it with a
// replaced body).
func (r *Reply) SetContentLength(n int) {
	r.SetHeader("content-length", strconv.AppendInt(r.digits[:0], int64(n), 10))
}

// Reset forgets the headers set, so the value can build another reply once
// the previous one was sent.
func (r *Reply) Reset() { r.n = 0 }

// Message returns the reply: CONTINUE with the headers set and, with
// replace, body as the new body.
func (r *Reply) Message(body []byte, replace bool) *extprocv3.ProcessingResponse {
	r.mut.SetHeaders = r.set[:r.n]
	r.common.Status = extprocv3.CommonResponse_CONTINUE
	r.common.HeaderMutation = &r.mut
	r.common.BodyMutation = nil
	if replace {
		r.bmBody.Body = body
		r.bm.Mutation = &r.bmBody
		r.common.BodyMutation = &r.bm
	}
	r.body.Response = &r.common
	r.oneof.ResponseBody = &r.body
	r.resp.Response = &r.oneof
	return &r.resp
}
