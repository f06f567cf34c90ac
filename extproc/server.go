// Package extproc is idemgate's Envoy external-processing server: for every
// HTTP request of a configured operation Envoy opens one
// envoy.service.ext_proc.v3.ExternalProcessor/Process stream, and the server
// runs the preview, confirm or status phase machine of docs/design.md §4 on
// it. Traffic for other routes passes through untouched.
//
// Per stream the server answers exactly one reply per message Envoy sends
// (or one ImmediateResponse that ends the stream), never waits for a message
// Envoy will not send, and makes every store call on a context detached from
// the stream's cancellation, bounded by store.timeout: a stream Envoy tears
// down never leaves a half-done store call behind.
package extproc

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"runtime/debug"
	"strconv"
	"sync/atomic"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/idemgate/idemgate/extproc/config"
	"github.com/idemgate/idemgate/extproc/envelope"
	"github.com/idemgate/idemgate/extproc/mcp"
	"github.com/idemgate/idemgate/extproc/requeststate"
	"github.com/idemgate/idemgate/extproc/security"
	"github.com/idemgate/idemgate/extproc/terminalcache"
	"github.com/idemgate/idemgate/state"
)

// SecurityReporter receives security events (security.Reporter implements it).
type SecurityReporter interface {
	Report(ctx context.Context, e security.Event)
}

// Options configure a Server.
type Options struct {
	Config  *config.Runtime
	Store   state.Store
	Logger  *slog.Logger
	Metrics *Metrics
	// Security receives security events; nil logs them through a reporter
	// built from Logger and Metrics.
	Security SecurityReporter
	// Now is the clock used for fingerprint expiry; nil means time.Now.
	Now func() time.Time
	// InstanceID distinguishes this process in record owners; empty means a
	// random one.
	InstanceID string
	// Tracer, when set, traces every guarded stream (tracing.go); nil
	// means no tracing at all.
	Tracer trace.Tracer
	// Approvals keeps the approvals of gated confirms (docs/design.md §10):
	// PostgreSQL's, or the memory store's. Nil (Redis alone): every
	// confirm that may need approval answers temporarily_unavailable.
	Approvals state.Approvals
	// Notifier is told of each approval created (nil: nobody is).
	Notifier ApprovalNotifier
}

// ApprovalNotifier tells people of a new approval; it must not block
// (approvalnotify.Notifier queues).
type ApprovalNotifier interface {
	Requested(a state.Approval, op *config.Operation)
}

// Server implements envoy.service.ext_proc.v3.ExternalProcessor.
type Server struct {
	extprocv3.UnimplementedExternalProcessorServer

	cfg       *config.Runtime
	store     state.Store
	approvals state.Approvals
	notifier  ApprovalNotifier
	log       *slog.Logger
	metrics   *Metrics
	security  SecurityReporter
	now       func() time.Time
	instance  string
	owners    atomic.Uint64
	abandons  *abandoner
	buffers   bufferPool
	tracer    trace.Tracer
	// mcpPreviewBlocks are the rendered preview text blocks of each MCP
	// operation.
	mcpPreviewBlocks map[*config.Operation]mcp.PreviewBlock
	// states seals the requestState of approval input requests.
	states *requeststate.Sealer
	// terminals are the terminal records this replica's confirms read
	// (limits.terminal_cache_bytes): a repeated replay needs no store call.
	terminals *terminalcache.Cache

	storeTimeout time.Duration
}

var _ extprocv3.ExternalProcessorServer = (*Server)(nil)

// NewServer checks opts and returns a Server.
func NewServer(opts Options) (*Server, error) {
	if opts.Config == nil {
		return nil, errors.New("extproc: config is required")
	}
	if opts.Store == nil {
		return nil, errors.New("extproc: store is required")
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Metrics == nil {
		return nil, errors.New("extproc: metrics are required")
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Security == nil {
		opts.Security = security.New(opts.Logger, opts.Metrics.SecurityCounters(), security.WebhookOptions{})
	}
	if opts.InstanceID == "" {
		var b [6]byte
		if _, err := rand.Read(b[:]); err != nil {
			return nil, fmt.Errorf("failed to create an instance id: %w", err)
		}
		opts.InstanceID = hex.EncodeToString(b[:])
	}
	states, err := requeststate.New(opts.Config.Keys)
	if err != nil {
		return nil, fmt.Errorf("extproc: %w", err)
	}
	return &Server{
		states:           states,
		terminals:        terminalcache.New(opts.Config.Limits.TerminalCacheBytes),
		abandons:         newAbandoner(opts.Store, opts.Config.Store.Timeout, opts.Logger, opts.Metrics),
		cfg:              opts.Config,
		store:            opts.Store,
		approvals:        opts.Approvals,
		notifier:         opts.Notifier,
		log:              opts.Logger,
		metrics:          opts.Metrics,
		security:         opts.Security,
		now:              opts.Now,
		instance:         opts.InstanceID,
		storeTimeout:     opts.Config.Store.Timeout,
		tracer:           opts.Tracer,
		mcpPreviewBlocks: mcpPreviewBlocksByOperation(opts.Config),
	}, nil
}

// newOwner returns a record owner id unique to this attempt.
func (s *Server) newOwner() string {
	return s.instance + "-" + strconv.FormatUint(s.owners.Add(1), 36)
}

// ownOwner reports whether owner is a record owner id this process made.
func (s *Server) ownOwner(owner string) bool {
	return len(owner) > len(s.instance) && owner[len(s.instance)] == '-' && owner[:len(s.instance)] == s.instance
}

// storeContext is the context of one store call: detached from the stream's
// cancellation (Envoy cancelling the stream must not cut a write in half)
// and bounded by store.timeout.
func (s *Server) storeContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), s.storeTimeout)
}

// Process runs one ext_proc stream: one HTTP request.
func (s *Server) Process(stream extprocv3.ExternalProcessor_ProcessServer) error {
	s.metrics.openStreams.Inc()
	defer s.metrics.openStreams.Dec()
	ex := &exchange{srv: s, ctx: stream.Context(), proc: passThrough}
	// Deferred first so it runs last: finish's settlement is inside the span.
	defer ex.traceEnd()
	defer ex.observeProcessing()
	// Whatever ends the stream, a record this stream acquired is settled
	// before Process returns (docs/design.md §8: within one second).
	defer ex.finish()
	defer ex.releaseBuffers()
	for {
		req, err := stream.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) || status.Code(err) == codes.Canceled || errors.Is(err, context.Canceled) {
				return nil
			}
			return err
		}
		began := time.Now()
		resp, end := ex.handleSafely(req)
		ex.busy += time.Since(began)
		if resp != nil {
			err := stream.Send(resp)
			// Send serialised the reply: its buffers are free again.
			ex.releaseBuffers()
			if err != nil {
				ex.replyFailed()
				if status.Code(err) == codes.Canceled || errors.Is(err, context.Canceled) || errors.Is(err, io.EOF) {
					return nil
				}
				return err
			}
			ex.replySent()
		}
		if end {
			// Returning nil closes the stream with OK: Envoy continues the
			// request without us (unmodified) if it still expected anything.
			return nil
		}
	}
}

// handleSafely runs one message through the phase machine, turning a panic
// into an internal_error envelope (the process never crashes on one request).
func (ex *exchange) handleSafely(req *extprocv3.ProcessingRequest) (resp *extprocv3.ProcessingResponse, end bool) {
	defer func() {
		if r := recover(); r != nil {
			ex.srv.metrics.panics.Inc()
			ex.logger().Error("recovered panic while processing a stream", "panic", fmt.Sprint(r), "stack", string(debug.Stack()))
			// The ImmediateResponse replaces whatever we were going to send:
			// a claim whose reply never went out is abandoned (the upstream
			// was never contacted); any other held claim is settled by finish.
			ex.replyFailed()
			resp, end = ex.envelope(envelope.InternalError, 0, envelope.Extra{}), true
		}
	}()
	return ex.handle(req)
}

// logEnabled reports whether the server logs at level, so that a call site
// below the configured level does not build the request-scoped logger (and
// its attributes) for nothing.
func (ex *exchange) logEnabled(level slog.Level) bool {
	return ex.srv.log.Enabled(ex.ctx, level)
}

// logger returns the request-scoped logger (built on first use).
func (ex *exchange) logger() *slog.Logger {
	if ex.log == nil {
		l := ex.srv.log
		if ex.traceID != "" {
			l = l.With("trace_id", ex.traceID)
		}
		if ex.op != nil {
			l = l.With("operation", ex.op.Name, "route", ex.kind.String())
		}
		ex.log = l
	}
	return ex.log
}

// observeProcessing records the stream's busy time, for guarded streams
// only (a passed-through stream is Envoy's business).
func (ex *exchange) observeProcessing() {
	if ex.op != nil {
		ex.srv.metrics.processing.WithLabelValues(ex.op.Name, ex.kind.String()).Observe(ex.busy.Seconds())
	}
}

func (ex *exchange) decision(outcome string) {
	name := ""
	if ex.op != nil {
		name = ex.op.Name
	}
	ex.srv.metrics.decisions.WithLabelValues(name, ex.kind.String(), outcome).Inc()
	ex.traceDecision(outcome)
}
