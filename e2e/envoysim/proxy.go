package envoysim

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// Proxy is the Envoy stand-in: an http.Handler that runs the configured
// filter chain for every request.
type Proxy struct {
	rt     *runtime
	logger *slog.Logger
	hooks  Hooks
	now    func() time.Time

	grpcConns  map[string]*grpc.ClientConn
	transports map[string]*http.Transport

	stats counters

	mu        sync.Mutex
	server    *http.Server
	listener  net.Listener
	serveErr  chan error
	closeOnce sync.Once
	closeErr  error
}

var _ http.Handler = (*Proxy)(nil)

// Hooks are optional callbacks tests use to observe the proxy. They run on
// the request's goroutine and must not block.
type Hooks struct {
	// OnRequestDone receives one access-log record per downstream request.
	OnRequestDone func(AccessLog)
	// OnLocalReply is called for every local reply Envoy would generate
	// (jwt_authn refusals, ext_proc errors and immediate responses, router
	// 503/504/404, 413/500 buffer overflows).
	OnLocalReply func(LocalReply)
	// OnUpstreamRequest is called for every upstream attempt, retries
	// included, with the headers as sent.
	OnUpstreamRequest func(UpstreamRequest)
}

// AccessLog is what an Envoy access log would say about a request.
type AccessLog struct {
	RequestID           string
	Method              string
	Path                string
	ResponseCode        int
	ResponseCodeDetails string
	ExtProcStreamOpened bool
	UpstreamAttempts    int
	DownstreamReset     bool
	Duration            time.Duration
}

// LocalReply describes a reply Envoy generated itself.
type LocalReply struct {
	RequestID string
	Status    int
	Body      string
	// Details is %RESPONSE_CODE_DETAILS%.
	Details string
	// Source names the generator: hcm, jwt_authn, ext_proc or router.
	Source string
}

// UpstreamRequest is one attempt to the upstream cluster.
type UpstreamRequest struct {
	RequestID string
	Attempt   int
	Cluster   string
	Method    string
	Path      string
	Authority string
	Header    http.Header
}

// Stats are the proxy's counters, named after Envoy's stats where one exists.
type Stats struct {
	Requests                int64
	StreamsOpened           int64 // ext_proc streams_started
	StreamsClosed           int64 // ext_proc streams_closed (closed by the proxy)
	StreamsFailed           int64 // ext_proc streams_failed (non-OK status)
	MessagesSent            int64 // ext_proc stream_msgs_sent
	MessagesReceived        int64 // ext_proc stream_msgs_received
	SpuriousMessages        int64 // ext_proc spurious_msgs_received
	MessageTimeouts         int64 // ext_proc message_timeouts
	FailureModeAllowed      int64 // ext_proc failure_mode_allowed
	RejectedHeaderMutations int64 // ext_proc rejected_header_mutations
	LocalReplies            int64
	JWTDenied               int64 // jwt_authn denied
	UpstreamRequests        int64 // upstream_rq_total (attempts)
	UpstreamRetries         int64 // upstream_rq_retry
	DownstreamResets        int64
}

type counters struct {
	requests, streamsOpened, streamsClosed, streamsFailed, messagesSent, messagesReceived,
	spuriousMessages, messageTimeouts, failureModeAllowed, rejectedHeaderMutations,
	localReplies, jwtDenied, upstreamRequests, upstreamRetries, downstreamResets atomic.Int64
}

// Option configures New.
type Option func(*Proxy)

// WithLogger sets the logger (default: discard).
func WithLogger(l *slog.Logger) Option { return func(p *Proxy) { p.logger = l } }

// WithHooks installs observation hooks.
func WithHooks(h Hooks) Option { return func(p *Proxy) { p.hooks = h } }

// WithClock replaces the clock jwt_authn checks exp/nbf against.
func WithClock(now func() time.Time) Option { return func(p *Proxy) { p.now = now } }

// New validates cfg and returns a Proxy. It refuses configurations that use
// anything the harness does not model.
func New(cfg Config, opts ...Option) (*Proxy, error) {
	rt, err := compile(cfg)
	if err != nil {
		return nil, err
	}
	p := &Proxy{
		rt:         rt,
		logger:     slog.New(slog.DiscardHandler),
		now:        time.Now,
		grpcConns:  map[string]*grpc.ClientConn{},
		transports: map[string]*http.Transport{},
	}
	for _, o := range opts {
		o(p)
	}
	for name, cl := range cfg.Clusters {
		if cl.HTTP2 {
			// One pooled HTTP/2 connection per gRPC cluster; streams are
			// multiplexed on it and never reused.
			conn, err := grpc.NewClient("passthrough:///"+cl.Address,
				grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				p.closeConns()
				return nil, fmt.Errorf("failed to create the gRPC client for cluster %q: %w", name, err)
			}
			p.grpcConns[name] = conn
			continue
		}
		timeout := cl.ConnectTimeout
		if timeout == 0 {
			timeout = 5 * time.Second
		}
		p.transports[name] = &http.Transport{
			DialContext:         (&net.Dialer{Timeout: timeout}).DialContext,
			DisableCompression:  true,
			MaxIdleConnsPerHost: 256,
			IdleConnTimeout:     time.Minute,
		}
	}
	return p, nil
}

func (p *Proxy) grpcConn(cluster string) *grpc.ClientConn { return p.grpcConns[cluster] }

func (p *Proxy) transport(cluster string) *http.Transport { return p.transports[cluster] }

// ServeHTTP handles one downstream request. A reset is delivered by
// panicking with http.ErrAbortHandler, so serve the proxy with an
// http.Server (httptest.NewServer is fine), not a ResponseRecorder.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	newExchange(p, w, r).run()
}

// Stats returns a snapshot of the counters.
func (p *Proxy) Stats() Stats {
	c := &p.stats
	return Stats{
		Requests:                c.requests.Load(),
		StreamsOpened:           c.streamsOpened.Load(),
		StreamsClosed:           c.streamsClosed.Load(),
		StreamsFailed:           c.streamsFailed.Load(),
		MessagesSent:            c.messagesSent.Load(),
		MessagesReceived:        c.messagesReceived.Load(),
		SpuriousMessages:        c.spuriousMessages.Load(),
		MessageTimeouts:         c.messageTimeouts.Load(),
		FailureModeAllowed:      c.failureModeAllowed.Load(),
		RejectedHeaderMutations: c.rejectedHeaderMutations.Load(),
		LocalReplies:            c.localReplies.Load(),
		JWTDenied:               c.jwtDenied.Load(),
		UpstreamRequests:        c.upstreamRequests.Load(),
		UpstreamRetries:         c.upstreamRetries.Load(),
		DownstreamResets:        c.downstreamResets.Load(),
	}
}

// Start listens on addr ("" means Config.Listener.Address) and serves in the
// background.
func (p *Proxy) Start(addr string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.server != nil {
		return errors.New("envoysim: already started")
	}
	if addr == "" {
		addr = p.rt.cfg.Listener.Address
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("failed to listen on %q: %w", addr, err)
	}
	p.listener = ln
	p.server = &http.Server{
		Handler:           p,
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          slog.NewLogLogger(p.logger.Handler(), slog.LevelDebug),
	}
	p.serveErr = make(chan error, 1)
	go func() { p.serveErr <- p.server.Serve(ln) }()
	return nil
}

// Addr is the listening address after Start ("" before).
func (p *Proxy) Addr() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.listener == nil {
		return ""
	}
	return p.listener.Addr().String()
}

// Close stops the listener (if started), waits briefly for requests in
// flight, and closes the pooled connections. Later calls return the first
// call's result.
func (p *Proxy) Close() error {
	p.closeOnce.Do(func() { p.closeErr = p.close() })
	return p.closeErr
}

func (p *Proxy) close() error {
	p.mu.Lock()
	srv := p.server
	p.mu.Unlock()
	var errs []error
	if srv != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		if err := srv.Shutdown(ctx); err != nil {
			errs = append(errs, srv.Close())
		}
		cancel()
		if err := <-p.serveErr; err != nil && !errors.Is(err, http.ErrServerClosed) {
			errs = append(errs, err)
		}
	}
	errs = append(errs, p.closeConns())
	return errors.Join(errs...)
}

func (p *Proxy) closeConns() error {
	var errs []error
	for _, c := range p.grpcConns {
		errs = append(errs, c.Close())
	}
	for _, t := range p.transports {
		t.CloseIdleConnections()
	}
	return errors.Join(errs...)
}
