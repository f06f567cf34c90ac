package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os/signal"
	"syscall"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/jackc/pgx/v5/pgxpool"
	goredis "github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/idemgate/idemgate/e2e/loadgen/floor"
	"github.com/idemgate/idemgate/extproc"
)

// serveOptions are the hidden flags of the child mode (-serve).
type serveOptions struct {
	kind         string // noop | noop-bodyonly | answer | noop-edit | iofloor | upstream
	listen       string
	redisAddr    string
	redisPrefix  string // iofloor: prefix of its Redis keys
	pgDSN        string
	storeTimeout time.Duration // iofloor: bound of each store call (0: 250ms)
	// noop-edit: the fixed values its answers carry (floor.EditOptions).
	editToken, editMCPToken, editExpires, editMCPBlock string
	editBodyOnly                                       bool // floor.EditOptions.BodyOnly
	// answer: the ImmediateResponse it sends, in protojson (empty: its own
	// fixed one).
	answerReply string
}

// serve runs a floor server as this process's only job, prints "ready" on
// stderr once listening (as idemgate does) and stops on SIGTERM/SIGINT.
// The floors run on idemgate's own transport (extproc.TransportOptions:
// stream workers, the lean codec, keepalive, limits), so a ratio to them is
// idemgate's own cost and not a difference of gRPC settings; they answer
// grpc.health.v1 as idemgate does, for Envoy's health check.
func serve(o serveOptions, stderr io.Writer) error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()

	if o.kind == "upstream" {
		lis, err := net.Listen("tcp", o.listen)
		if err != nil {
			return fmt.Errorf("failed to listen on %s: %w", o.listen, err)
		}
		fmt.Fprintln(stderr, "ready")
		return serveUpstream(lis, ctx.Done())
	}

	var srv extprocv3.ExternalProcessorServer
	switch o.kind {
	case "noop":
		srv = floor.Noop{}
	case "noop-bodyonly":
		srv = floor.NoopBodyOnly{}
	case "answer":
		srv = floor.Answer{}
		if o.answerReply != "" {
			immediate := &extprocv3.ImmediateResponse{}
			if err := protojson.Unmarshal([]byte(o.answerReply), immediate); err != nil {
				return fmt.Errorf("-serve answer -answer-reply: %w", err)
			}
			srv = floor.NewAnswer(immediate)
		}
	case "noop-edit":
		edit, err := floor.NewEdit(floor.EditOptions{Token: o.editToken, MCPToken: o.editMCPToken, Expires: o.editExpires, MCPBlock: []byte(o.editMCPBlock), BodyOnly: o.editBodyOnly})
		if err != nil {
			return fmt.Errorf("-serve noop-edit: %w", err)
		}
		srv = edit
	case "iofloor":
		if o.redisAddr == "" || o.pgDSN == "" {
			return errors.New("-serve iofloor needs -redis-addr and -pg-dsn")
		}
		// go-redis and pgx pools with their default sizes.
		rdb := goredis.NewClient(&goredis.Options{Addr: o.redisAddr})
		defer rdb.Close()
		pool, err := pgxpool.New(ctx, o.pgDSN)
		if err != nil {
			return fmt.Errorf("failed to open the PostgreSQL pool: %w", err)
		}
		defer pool.Close()
		io, err := floor.NewIO(ctx, floor.IOOptions{Redis: rdb, Postgres: pool, KeyPrefix: o.redisPrefix, StoreTimeout: o.storeTimeout})
		if err != nil {
			return err
		}
		srv = io
	default:
		return fmt.Errorf("unknown -serve %q (noop|noop-bodyonly|answer|noop-edit|iofloor|upstream)", o.kind)
	}

	lis, err := net.Listen("tcp", o.listen)
	if err != nil {
		return fmt.Errorf("failed to listen on %s: %w", o.listen, err)
	}
	// keepMetadata false: the benchmark's idemgate takes the subject from a
	// header, so its codec skips metadata_context too.
	gs := grpc.NewServer(extproc.TransportOptions(false)...)
	extprocv3.RegisterExternalProcessorServer(gs, srv)
	hs := health.NewServer()
	extproc.SetServing(hs, true)
	healthpb.RegisterHealthServer(gs, hs)
	errc := make(chan error, 1)
	go func() { errc <- gs.Serve(lis) }()
	fmt.Fprintln(stderr, "ready")
	select {
	case <-ctx.Done():
		gs.Stop()
		return nil
	case err := <-errc:
		return fmt.Errorf("failed to serve: %w", err)
	}
}
