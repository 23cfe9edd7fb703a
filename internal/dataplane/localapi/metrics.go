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
	Help: "Object-socket requests (objects as descriptors), by outcome: put, put_refused, get_memfd, get_fallback, bad_frame.",
}, []string{"result"})

func init() { prometheus.MustRegister(calls, objFrames) }

// observe counts every call by its outcome's class.
func observe(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	resp, err := handler(ctx, req)
	reason := ""
	if err != nil {
		if reason = Reason(err); reason == "" {
			reason = "OTHER"
		}
	}
	calls.WithLabelValues(path.Base(info.FullMethod), reason).Inc()
	return resp, err
}
