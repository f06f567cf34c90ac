package extproc

import (
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/idemgate/idemgate/extproc/config"
	"github.com/idemgate/idemgate/extproc/envelope"
	"github.com/idemgate/idemgate/state"
)

// replay answers DONE/FAILED with the stored result: an envelope with the
// original status and body, or (replay: raw) the original status, headers
// and body byte for byte. Both carry Idempotent-Replayed and Idempotency-Key.
func (ex *exchange) replay(rec state.Record, nonce string) *extprocv3.ProcessingResponse {
	res := rec.Result
	if res == nil {
		res = &state.Result{}
	}
	msg := envelope.AlreadyCompleted
	if rec.State == state.Failed {
		msg = envelope.AlreadyFailed
	}
	marks := []*corev3.HeaderValueOption{replayedTrue, setHeader(hdrIdemKey, []byte(nonce))}
	if ex.op.Replay == config.ReplayRaw {
		headers := make([]*corev3.HeaderValueOption, 0, len(res.Headers)+len(marks))
		seen := make(map[string]bool, len(res.Headers))
		for _, h := range res.Headers {
			name := lowerASCII(h.Name)
			opt := setHeader(name, []byte(h.Value))
			if seen[name] {
				//lint:ignore SA1019 ext_proc's header mutations honour the deprecated append flag; it is what Envoy 1.40 reads there
				opt.Append = wrapperspb.Bool(true) // repeated header: add, do not overwrite
			}
			seen[name] = true
			headers = append(headers, opt)
		}
		headers = append(headers, marks...)
		spec, _ := envelope.SpecOf(msg)
		ex.decision(spec.Status)
		return immediate(res.Status, headers, res.Body, "idemgate_"+spec.Status+"_raw")
	}
	return ex.envelope(msg, res.Status, envelope.Extra{HasResult: true, ResultRef: ex.resultRef(res, nonce), Result: res.Body, ResultJSON: res.BodyJSON}, marks...)
}
func lowerASCII(s string) string {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c >= 'A' && c <= 'Z' {
			b := []byte(s)
			for j := i; j < len(b); j++ {
				if b[j] >= 'A' && b[j] <= 'Z' {
					b[j] += 'a' - 'A'
				}
			}
			return string(b)
		}
	}
	return s
}
