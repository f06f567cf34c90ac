package extproc

import (
	"context"
	"errors"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemgate/idemgate/fingerprint"
	"github.com/idemgate/idemgate/state"
)

// Span names and attribute keys. Attributes name the operation, its scope,
// the nonce and what was decided; never the subject or a parameter value
// (the fingerprint binds them, a trace backend must not collect them).
const (
	spanVerify   = "idemgate.verify"
	spanAcquire  = "idemgate.acquire"
	spanUpstream = "idemgate.upstream"
	spanComplete = "idemgate.complete"
	spanSettle   = "idemgate.settle"

	attrOperation    = "idemgate.operation"
	attrScope        = "idemgate.scope"
	attrRoute        = "idemgate.route"
	attrDecision     = "idemgate.decision"
	attrOutcomeClass = "idemgate.outcome_class"
	attrVerify       = "idemgate.verify.reason"
	attrAction       = "idemgate.settle.action"
	attrHTTPStatus   = "http.response.status_code"
)

// TracerName is the instrumentation scope of idemgate's spans.
const TracerName = "github.com/idemgate/idemgate/extproc"

// traceContext is the W3C trace-context propagator: a guarded stream's span
// continues the trace of the traceparent (and tracestate) header the
// request reached Envoy with.
var traceContext = propagation.TraceContext{}

// streamTrace is the tracing state of one stream. Every span is nil when the
// server has no tracer, and every hook below then returns at its first
// line: an untraced server pays a nil check per hook, no allocation.
type streamTrace struct {
	span     trace.Span // the stream's span
	upstream trace.Span // open from letting the request through to the response headers
	// root is the stream context carrying span; ex.ctx is set to a child
	// span's context while one is open, so store spans nest under it.
	root context.Context
}

// headerCarrier reads an ext_proc header map for the propagator.
type headerCarrier struct{ hm *corev3.HeaderMap }

func (c headerCarrier) Get(key string) string {
	v, _ := headerValue(c.hm, key)
	return v
}
func (headerCarrier) Set(string, string) {} // extraction only
func (c headerCarrier) Keys() []string {
	keys := make([]string, 0, len(c.hm.GetHeaders()))
	for _, h := range c.hm.GetHeaders() {
		keys = append(keys, h.GetKey())
	}
	return keys
}

// traceStart opens the stream's span once the request matched a guarded
// route (pass-through traffic is never traced), as a child of the
// request's traceparent when it has one.
func (ex *exchange) traceStart(hm *corev3.HeaderMap) {
	tracer := ex.srv.tracer
	if tracer == nil {
		return
	}
	ctx := traceContext.Extract(ex.ctx, headerCarrier{hm})
	ctx, span := tracer.Start(ctx, "idemgate."+ex.kind.String(),
		trace.WithSpanKind(trace.SpanKindServer),
		trace.WithAttributes(
			attribute.String(attrOperation, ex.op.Name),
			attribute.String(attrScope, ex.op.Scope),
			attribute.String(attrRoute, ex.kind.String()),
		))
	ex.ctx, ex.tr.span, ex.tr.root = ctx, span, ctx
}

// traceEnd ends the stream's span (after finish settled any claim, so the
// settlement's spans are inside it).
func (ex *exchange) traceEnd() {
	if ex.tr.span == nil {
		return
	}
	if ex.tr.upstream != nil {
		// No response phase came: Envoy ended the stream (upstream timeout,
		// reset, client gone).
		ex.tr.upstream.SetStatus(codes.Error, "the stream ended before the upstream response headers")
		ex.tr.upstream.End()
		ex.tr.upstream = nil
	}
	ex.tr.span.End()
}

// traceChild opens a child span of the stream's span and makes it the
// context of the store calls that follow, until traceChildEnd.
func (ex *exchange) traceChild(name string) trace.Span {
	if ex.tr.span == nil {
		return nil
	}
	ctx, span := ex.srv.tracer.Start(ex.tr.root, name)
	ex.ctx = ctx
	return span
}

// traceChildEnd ends a span from traceChild, recording err when there is one.
func (ex *exchange) traceChildEnd(span trace.Span, err error) {
	if span == nil {
		return
	}
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
	ex.ctx = ex.tr.root
}

// traceVerified records a verify span's result: the nonce once the MAC
// verified (on the stream span too), and why a fingerprint was refused.
// Refusals that are security events are errors (traceSecurity); an expired
// fingerprint is not.
func (ex *exchange) traceVerified(span trace.Span, claims fingerprint.Claims, err error) {
	if span == nil {
		return
	}
	if claims.Nonce != "" {
		nonce := attribute.String(state.AttrNonce, claims.Nonce)
		span.SetAttributes(nonce)
		ex.tr.span.SetAttributes(nonce)
	}
	if reason, ok := fingerprint.ReasonOf(err); ok {
		span.SetAttributes(attribute.String(attrVerify, string(reason)))
	}
	ex.traceChildEnd(span, nil)
}

// traceDecision records the stream's decision: "acquired", or the status of
// the answer idemgate gave itself (already_completed, params_changed, …).
func (ex *exchange) traceDecision(decision string) {
	if ex.tr.span == nil {
		return
	}
	ex.tr.span.SetAttributes(attribute.String(attrDecision, decision))
}

// traceSecurity marks the stream's span as an error for a security event
// (its reason, never the values involved).
func (ex *exchange) traceSecurity(reason string) {
	if ex.tr.span == nil {
		return
	}
	err := errors.New("security_alert: " + reason)
	ex.tr.span.RecordError(err)
	ex.tr.span.SetStatus(codes.Error, err.Error())
}

// traceStoreFailed marks the stream's span as an error for a failed store
// call answered temporarily_unavailable (the store span has the details).
func (ex *exchange) traceStoreFailed(op string, err error) {
	if ex.tr.span == nil {
		return
	}
	ex.tr.span.RecordError(err, trace.WithAttributes(attribute.String(state.AttrStoreOp, op)))
	ex.tr.span.SetStatus(codes.Error, "store "+op+" failed")
}

// traceUpstreamStart opens the upstream wait span when the reply letting the
// request through has gone out.
func (ex *exchange) traceUpstreamStart() {
	if ex.tr.span == nil {
		return
	}
	_, ex.tr.upstream = ex.srv.tracer.Start(ex.tr.root, spanUpstream, trace.WithSpanKind(trace.SpanKindInternal))
}

// traceUpstreamAnswered ends the upstream wait span at the response headers
// and records the outcome class on the stream.
func (ex *exchange) traceUpstreamAnswered() {
	if ex.tr.span == nil {
		return
	}
	class := attribute.String(attrOutcomeClass, ex.respClass.String())
	if ex.tr.upstream != nil {
		ex.tr.upstream.SetAttributes(attribute.Int(attrHTTPStatus, ex.respStatus), class)
		ex.tr.upstream.End()
		ex.tr.upstream = nil
	}
	ex.tr.span.SetAttributes(class)
}

// traceSettled ends the span of settling an ambiguous or abandoned claim.
func (ex *exchange) traceSettled(span trace.Span, action string, err error) {
	if span == nil {
		return
	}
	span.SetAttributes(attribute.String(attrAction, action))
	ex.traceChildEnd(span, err)
}

// traceApproval adds an approval transition (requested, consumed) to the
// stream's span as the event approval.<transition>.
func (ex *exchange) traceApproval(transition, approvalID string) {
	if ex.tr.span == nil {
		return
	}
	ex.tr.span.AddEvent("approval."+transition, trace.WithAttributes(attribute.String("idemgate.approval_id", approvalID)))
}
