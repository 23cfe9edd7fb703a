package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/ziptrail/ziptrail/internal/dataplane/sidecar"
)

// standalone runs only the ziptrail part, without Knative's queue-proxy
// (which binds fixed ports and needs a Knative environment): the data
// plane, the local API, and a plain reverse proxy to the user container
// wrapped like Knative's handler chain. Tests and SDK test suites start
// several of these on loopback; configuration is the same environment as
// in a pod. SIGTERM backs unread objects up, then exits.
func standalone(args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("queue-proxy-zl --standalone", flag.ContinueOnError)
	fs.SetOutput(stderr)
	listen := fs.String("listen", "127.0.0.1:8012", "address for invocations (Knative's queue-proxy port)")
	upstream := fs.String("upstream", "http://127.0.0.1:8080", "the user container's URL")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	target, err := url.Parse(*upstream)
	if err != nil || target.Scheme == "" || target.Host == "" {
		fmt.Fprintf(stderr, "queue-proxy-zl: --upstream %q is not an http(s) URL\n", *upstream)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	sc := sidecar.New(sidecar.FromEnv())
	if err := sc.Start(ctx); err != nil {
		fmt.Fprintf(stderr, "queue-proxy-zl: %v\n", err)
		return 1
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		fmt.Fprintf(stderr, "queue-proxy-zl: %v\n", err)
		return 1
	}
	srv := &http.Server{Handler: sc.Wrap(httputil.NewSingleHostReverseProxy(target)), ReadHeaderTimeout: time.Minute}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	fmt.Fprintf(stderr, "queue-proxy-zl: standalone, invocations on %s, data plane on port %d, upstream %s\n", ln.Addr(), sc.DataplanePort(), target)
	select {
	case err := <-served:
		fmt.Fprintf(stderr, "queue-proxy-zl: %v\n", err)
		return 1
	case <-ctx.Done():
	}
	// Like Knative's drain: stop taking requests only once unread
	// objects are safe in the slow tier.
	<-sc.BackedUp()
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		fmt.Fprintf(stderr, "queue-proxy-zl: shutdown: %v\n", err)
	}
	return 0
}
