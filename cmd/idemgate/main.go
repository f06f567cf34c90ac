// Command idemgate is the exactly-once gateway for money-moving API calls
// made by LLM agents: an Envoy ext_proc server. See mainlib for the commands.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/idemgate/idemgate/cmd/idemgate/mainlib"
)

func main() {
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
