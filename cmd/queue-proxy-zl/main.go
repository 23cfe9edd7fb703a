// Command queue-proxy-zl is Knative Serving's queue-proxy with the ziptrail
// extension: the pod's in-memory object store, the data plane's pull stream,
// and resolution of object references on invocations. It replaces
// Knative's queue-sidecar-image cluster-wide; requests without ziptrail
// content behave exactly as with the stock queue-proxy.
//
// `queue-proxy-zl --standalone` runs the ziptrail part alone (see
// standalone.go), for tests and SDK test suites on one machine.
package main

import (
	"context"
	"fmt"
	"os"

	"knative.dev/serving/pkg/queue/sharedmain"

	"github.com/ziptrail/ziptrail/internal/dataplane/sidecar"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "--standalone" {
		os.Exit(standalone(os.Args[2:], os.Stderr))
	}
	cfg, err := sidecar.Load()
	if err != nil {
		// A malformed podinfo file: starting with default settings would
		// hide the cause of everything that goes wrong later.
		fmt.Fprintf(os.Stderr, "queue-proxy-zl: configuration: %v\n", err)
		os.Exit(1)
	}
	sc := sidecar.New(cfg)
	// The sidecar outlives SIGTERM (d.Ctx): queue-proxy keeps proxying
	// requests while Knative drains the pod, and their functions still
	// need the local API, the data plane and the control stream. It stops
	// when sharedmain.Main returns, once the drain is over
	// (internal/dataplane/sidecar/shutdown.go).
	life, stop := context.WithCancel(context.Background())
	started := false
	err = sharedmain.Main(func(d *sharedmain.Defaults) {
		if err := sc.Start(life); err != nil {
			// A misconfigured data plane must not serve: references it
			// cannot resolve would fail later and far from the cause.
			fmt.Fprintf(os.Stderr, "queue-proxy-zl: ziptrail extension: %v\n", err)
			os.Exit(1)
		}
		started = true
		go func() {
			<-d.Ctx.Done()
			sc.Terminating()
		}()
		// Innermost position: right before the proxy to the user container.
		d.ProxyHandler = sc.Wrap(d.ProxyHandler)
	})
	stop()
	if started {
		<-sc.Stopped()
	}
	if err != nil {
		os.Exit(1)
	}
}
