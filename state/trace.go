package state

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// Span attribute keys the traced store sets. The key is the fingerprint's
// nonce (the idempotency key), never a subject or a parameter value.
const (
	AttrStoreBackend = "idemgate.store.backend"
	AttrStoreOp      = "idemgate.store.op"
	AttrStoreOutcome = "idemgate.store.outcome"
	AttrNonce        = "idemgate.nonce"
)

// Trace wraps s so that every call except Close runs in a client span
// "store.<op>" of tracer, a child of the span in the call's context (calls
// made outside a trace are not traced). Like
// Instrument it changes nothing else; serve applies it only when tracing is
// configured, so an untraced server does not pay for it.
func Trace(s Store, backend string, tracer trace.Tracer) Store {
	return &traced{s: s, backend: attribute.String(AttrStoreBackend, backend), tracer: tracer}
}

type traced struct {
	s       Store
	backend attribute.KeyValue
	tracer  trace.Tracer
}

var _ Store = (*traced)(nil)

// start begins the span of one call. A call outside any trace (readiness
// pings, the sweeper) gets the context's no-op span instead of a root span:
// periodic housekeeping would otherwise flood the collector with one-span
// traces nobody follows.
func (t *traced) start(ctx context.Context, op, key string) (context.Context, trace.Span) {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return ctx, trace.SpanFromContext(ctx)
	}
	attrs := []attribute.KeyValue{t.backend, attribute.String(AttrStoreOp, op)}
	if key != "" {
		attrs = append(attrs, attribute.String(AttrNonce, key))
	}
	return t.tracer.Start(ctx, "store."+op, trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(attrs...))
}

// end records the answer's outcome, or the error (status Error and an
// exception event), and ends span.
func end(span trace.Span, outcome Outcome, err error) {
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	} else if outcome != "" {
		span.SetAttributes(attribute.String(AttrStoreOutcome, string(outcome)))
	}
	span.End()
}

func (t *traced) Acquire(ctx context.Context, req AcquireRequest) (Answer, error) {
	ctx, span := t.start(ctx, OpAcquire, req.Key)
	a, err := t.s.Acquire(ctx, req)
	end(span, a.Outcome, err)
	return a, err
}

func (t *traced) Complete(ctx context.Context, claim Claim, c Completion) (Answer, error) {
	ctx, span := t.start(ctx, OpComplete, claim.Key)
	a, err := t.s.Complete(ctx, claim, c)
	end(span, a.Outcome, err)
	return a, err
}

func (t *traced) EndLease(ctx context.Context, claim Claim) (Answer, error) {
	ctx, span := t.start(ctx, OpEndLease, claim.Key)
	a, err := t.s.EndLease(ctx, claim)
	end(span, a.Outcome, err)
	return a, err
}

func (t *traced) AbandonUnsent(ctx context.Context, claim Claim) (Answer, error) {
	ctx, span := t.start(ctx, OpAbandonUnsent, claim.Key)
	a, err := t.s.AbandonUnsent(ctx, claim)
	end(span, a.Outcome, err)
	return a, err
}

func (t *traced) MarkUnknown(ctx context.Context, claim Claim) (Answer, error) {
	ctx, span := t.start(ctx, OpMarkUnknown, claim.Key)
	a, err := t.s.MarkUnknown(ctx, claim)
	end(span, a.Outcome, err)
	return a, err
}

func (t *traced) Takeover(ctx context.Context, req TakeoverRequest) (Answer, error) {
	ctx, span := t.start(ctx, OpTakeover, req.Key)
	a, err := t.s.Takeover(ctx, req)
	end(span, a.Outcome, err)
	return a, err
}

func (t *traced) Get(ctx context.Context, key string) (Record, bool, error) {
	ctx, span := t.start(ctx, OpGet, key)
	rec, found, err := t.s.Get(ctx, key)
	outcome := OutcomeNotFound
	if found {
		outcome = OutcomeOf(rec.State)
	}
	end(span, outcome, err)
	return rec, found, err
}

func (t *traced) Resolve(ctx context.Context, key string, c Completion) (Answer, error) {
	ctx, span := t.start(ctx, OpResolve, key)
	a, err := t.s.Resolve(ctx, key, c)
	end(span, a.Outcome, err)
	return a, err
}

func (t *traced) Sweep(ctx context.Context, limit int) (int, error) {
	ctx, span := t.start(ctx, OpSweep, "")
	n, err := t.s.Sweep(ctx, limit)
	span.SetAttributes(attribute.Int("idemgate.store.swept", n))
	end(span, "", err)
	return n, err
}

func (t *traced) Ping(ctx context.Context) error {
	ctx, span := t.start(ctx, OpPing, "")
	err := t.s.Ping(ctx)
	end(span, "", err)
	return err
}

func (t *traced) Close() error { return t.s.Close() }
