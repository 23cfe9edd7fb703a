package localapi

import (
	"context"
	"path"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
)

var calls = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "ziptrail_localapi_calls_total",
	Help: "Local API calls from the function container, by method and error class (empty: success).",
}, []string{"method", "reason"})

var objFrames = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "ziptrail_localapi_object_socket_total",
	Help: "Object-socket requests, by outcome: put, put_refused, get_memfd, get_fallback, put_bytes, get_bytes, get_file, bad_frame.",
}, []string{"result"})

func init() { prometheus.MustRegister(calls, objFrames) }

// observe counts every call by its outcome's class.
func observe(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	resp, err := handler(ctx, req)
	countCall(path.Base(info.FullMethod), err)
	return resp, err
}

// countCall counts a call of method (a gRPC method's name; the object
// socket's ops count as the calls they stand for) by its outcome.
func countCall(method string, err error) {
	reason := ""
	if err != nil {
		if reason = Reason(err); reason == "" {
			reason = "OTHER"
		}
	}
	calls.WithLabelValues(method, reason).Inc()
}
