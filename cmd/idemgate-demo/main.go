// Command idemgate-demo runs the idemgate demo (`make demo`): the pinned Envoy
// as the front on 127.0.0.1:8080, configured from the shipped envoy/envoy.yaml,
// in front of `idemgate serve` on the memory store and the demo payments API,
// and prints a POSIX-sh script of curl commands that walks through preview,
// confirm, retries, the status tool and the refusals.
//
// It is not part of the product: the idemgate binary carries no demo upstream
// and no demo keys. This command runs that binary, unmodified, as a child
// process (the way it is deployed next to Envoy), and Envoy as another.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	// Children run in their own process groups, so a Ctrl-C in the terminal
	// reaches only this process, which then stops them in order.
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if err != nil {
		if !errors.Is(err, errUsage) {
			fmt.Fprintln(os.Stderr, "idemgate-demo:", err)
		}
		os.Exit(1)
	}
}
