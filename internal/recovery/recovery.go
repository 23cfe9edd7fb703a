// Package recovery ends panics on the goroutines that serve input from
// outside a process (a connection on a data port, a gRPC call, a request's
// headers). ziptrail's shared processes (the operator, activator-ext, every
// pod's queue-proxy-zl) serve many tenants: a panic a peer's bytes reach is
// a defect, but it must cost that peer its connection or call, never the
// process and everybody else's work. Each recovered panic is logged with
// its stack and counted in ziptrail_panics_recovered_total{component,where}.
package recovery

import (
	"context"
	"fmt"
	"log"
	"runtime/debug"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

var recovered = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "ziptrail_panics_recovered_total",
	Help: "Panics recovered on goroutines that serve outside input, by component and where (each is a defect; the process lived on).",
}, []string{"component", "where"})

func init() { prometheus.MustRegister(recovered) }

// Recover ends a panic in progress, logs and counts it. Defer it directly
// (recover only works there): `defer recovery.Recover("sidecar", "pull conn")`.
// The goroutine's other deferred calls run as usual.
func Recover(component, where string) {
	if v := recover(); v != nil {
		report(component, where, v)
	}
}

// Go runs fn on a new goroutine that recovers a panic (Recover).
func Go(component, where string, fn func()) {
	go func() {
		defer Recover(component, where)
		fn()
	}()
}

// Report logs and counts a panic the caller recovered itself (it has
// cleanup to do that only a panic needs).
func Report(component, where string, v any) { report(component, where, v) }

func report(component, where string, v any) {
	recovered.WithLabelValues(component, where).Inc()
	log.Printf("%s: recovered a panic in %s (a defect; only its connection or call ends): %v\n%s", component, where, v, debug.Stack())
}

// Collector is the counter of recovered panics, for a process that serves
// another registry than Prometheus's default (the operator serves
// controller-runtime's).
func Collector() prometheus.Collector { return recovered }

// Counter is the count of panics recovered for component and where
// (tests read it with prometheus/testutil).
func Counter(component, where string) prometheus.Counter {
	return recovered.WithLabelValues(component, where)
}

// AsError ends a panic in progress as the Internal error of a call that
// has no interceptor around it (a gRPC tap handle): defer it directly,
// with the address of the function's error result.
func AsError(component, where string, err *error) {
	if v := recover(); v != nil {
		report(component, where, v)
		*err = errInternal(where)
	}
}

// errInternal is what a caller whose call panicked gets: no stack, no
// detail of the defect.
func errInternal(method string) error {
	return status.Error(codes.Internal, fmt.Sprintf("%s failed on an internal error (logged on the server)", method))
}

// UnaryInterceptor recovers a panic in a unary gRPC handler: the call gets
// codes.Internal, the server goes on.
func UnaryInterceptor(component string) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (resp any, err error) {
		defer func() {
			if v := recover(); v != nil {
				report(component, info.FullMethod, v)
				resp, err = nil, errInternal(info.FullMethod)
			}
		}()
		return handler(ctx, req)
	}
}

// StreamInterceptor recovers a panic in a streaming gRPC handler.
func StreamInterceptor(component string) grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) (err error) {
		defer func() {
			if v := recover(); v != nil {
				report(component, info.FullMethod, v)
				err = errInternal(info.FullMethod)
			}
		}()
		return handler(srv, ss)
	}
}
