// Command idemgatepprof is idemgate — cmd/idemgate/mainlib.Main, unchanged —
// plus net/http/pprof on a second loopback listener named by
// IDEMGATE_PPROF_LISTEN. The load benchmark (e2e/loadgen -cpuprofile /
// -memprofile) builds and runs it instead of ./cmd/idemgate so it can take
// CPU and allocation profiles of idemgate under load: idemgate's own admin
// server does not serve /debug/pprof.
package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/idemgate/idemgate/cmd/idemgate/mainlib"
)

func main() {
	if addr := os.Getenv("IDEMGATE_PPROF_LISTEN"); addr != "" {
		if err := servePprof(addr); err != nil {
			fmt.Fprintln(os.Stderr, "idemgatepprof:", err)
			os.Exit(1)
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	err := mainlib.Main(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if err != nil {
		if !errors.Is(err, mainlib.ErrUsage) {
			fmt.Fprintln(os.Stderr, "idemgate:", err)
		}
		os.Exit(1)
	}
}

// servePprof listens before idemgate starts, so the listener is up by the
// time idemgate prints its ready line.
func servePprof(addr string) error {
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("failed to listen on %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(lis) }()
	return nil
}
