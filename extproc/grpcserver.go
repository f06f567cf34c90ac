package extproc

import (
	"fmt"
	"math"
	"runtime"
	"runtime/debug"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"
)

// Transport settings of the Envoy-facing gRPC server. Envoy multiplexes every
// HTTP request of a worker onto a few HTTP/2 connections, one stream per
// request, so the stream limit is effectively unbounded; MaxConnectionAge
// makes Envoy reconnect now and then so load spreads over new replicas.
const (
	keepaliveTime          = 30 * time.Second
	keepaliveTimeout       = 10 * time.Second
	keepaliveMinTime       = 10 * time.Second
	maxConnectionAge       = 5 * time.Minute
	maxConnectionAgeGrace  = 30 * time.Second
	maxConcurrentStreams   = math.MaxUint32
	maxReceiveMessageBytes = 64 << 20 // bodies up to limits.max_body_bytes travel in one message
)

// streamWorkers is how many long-lived goroutines serve streams (gRPC's
// NumStreamWorkers). A stream handler needs a deeper stack than a new
// goroutine starts with (protobuf decoding, JSON parsing, store clients), so
// a goroutine per stream pays for growing and copying its stack on every
// request — about a tenth of a preview's CPU in profiles. Workers keep their
// grown stacks (gRPC replaces each after 65536 streams, so one deep stream
// does not pin memory forever). Each worker holds one stream for its whole
// life, so there are enough for the streams a replica typically has open at
// once; streams beyond that get their own goroutine, as without workers.
func streamWorkers() uint32 { return uint32(64 * runtime.GOMAXPROCS(0)) }

// ServiceName is the ext_proc service name (also a gRPC health service name).
var ServiceName = extprocv3.ExternalProcessor_ServiceDesc.ServiceName

// NewGRPCServer returns a grpc.Server with keepalive, a high stream limit,
// connection ageing, a recovery interceptor and a codec that skips the
// request fields idemgate never reads (see requestCodec), serving srv and
// the standard health service hs (whose status the caller drives).
func NewGRPCServer(srv *Server, hs *health.Server, extra ...grpc.ServerOption) *grpc.Server {
	opts := append(transportOptions(srv.cfg.Subject.MetadataNamespace != "", srv.cfg.ReadsResponseCode()), grpc.ChainStreamInterceptor(srv.recoverStream))
	g := grpc.NewServer(append(opts, extra...)...)
	extprocv3.RegisterExternalProcessorServer(g, srv)
	healthpb.RegisterHealthServer(g, hs)
	return g
}

// TransportOptions are the Envoy-facing server's transport settings
// (keepalive, stream limit, message sizes, connection ageing, the lean codec
// and the stream workers), without anything of idemgate's own. They are
// exported so the load benchmark's no-op floor server runs on exactly the
// same transport, and the ratio to it is idemgate's own cost; keepMetadata
// is as for the codec.
func TransportOptions(keepMetadata bool) []grpc.ServerOption {
	return transportOptions(keepMetadata, false)
}

// transportOptions is TransportOptions, keepAttributes as for the codec.
func transportOptions(keepMetadata, keepAttributes bool) []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.KeepaliveParams(keepalive.ServerParameters{
			Time:                  keepaliveTime,
			Timeout:               keepaliveTimeout,
			MaxConnectionAge:      maxConnectionAge,
			MaxConnectionAgeGrace: maxConnectionAgeGrace,
		}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{
			MinTime:             keepaliveMinTime,
			PermitWithoutStream: true,
		}),
		grpc.MaxConcurrentStreams(maxConcurrentStreams),
		grpc.MaxRecvMsgSize(maxReceiveMessageBytes),
		grpc.MaxSendMsgSize(maxReceiveMessageBytes),
		grpc.ForceServerCodecV2(newRequestCodec(keepMetadata, keepAttributes)),
		grpc.NumStreamWorkers(streamWorkers()),
	}
}

// recoverStream is the safety net behind the per-message recovery in
// Process: a panic anywhere else in a stream is counted, logged and turned
// into an Internal status instead of a crashed process.
func (s *Server) recoverStream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) (err error) {
	defer func() {
		if r := recover(); r != nil {
			s.metrics.panics.Inc()
			s.log.Error("recovered panic in a gRPC stream", "method", info.FullMethod, "panic", fmt.Sprint(r), "stack", string(debug.Stack()))
			err = status.Error(codes.Internal, "internal error")
		}
	}()
	return handler(srv, ss)
}

// SetServing sets the health of the overall server ("") and of the ext_proc
// service: SERVING while streams are accepted (even with a store down —
// idemgate answers temporarily_unavailable itself), NOT_SERVING when draining.
func SetServing(hs *health.Server, serving bool) {
	st := healthpb.HealthCheckResponse_NOT_SERVING
	if serving {
		st = healthpb.HealthCheckResponse_SERVING
	}
	hs.SetServingStatus("", st)
	hs.SetServingStatus(ServiceName, st)
}
