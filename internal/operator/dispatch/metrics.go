package dispatch

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/ziptrail/ziptrail/internal/invocation/call"
)

var (
	latency = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "ziptrail_invocation_duration_seconds",
		Help:    "Time from dispatch to the function's response, retries included.",
		Buckets: prometheus.ExponentialBuckets(0.0005, 2, 20),
	}, []string{"code"})
	inflight = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "ziptrail_invocations_in_flight",
		Help: "Invocations being sent or awaiting a response.",
	})
	retries = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ziptrail_invocation_retries_total",
		Help: "Retries of invocations, by reason: not_sent, refused, dns, resolve (the request cannot have reached the function), " +
			"unavailable (Knative's 502/503/429 before the function), lost_response and gateway_timeout (the receiver honours the idempotency key).",
	}, []string{"reason"})
	queueFull = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "ziptrail_invocation_queue_full_total",
		Help: "Invocations refused because the dispatch queue was full.",
	})
	routes = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ziptrail_invocation_requests_total",
		Help: "Requests sent for invocations, by route: direct (straight to a ready pod's queue-proxy), fallback (straight to a pod that did not take it, " +
			"then sent by the route at once), url (through Knative's ingress and activator).",
	}, []string{"route"})
	queued = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "ziptrail_invocations_queued",
		Help: "Invocations waiting for a dispatch worker.",
	})
)

func init() {
	metrics.Registry.MustRegister(latency, inflight, retries, queueFull, queued, routes)
	for _, r := range []string{call.RetryNotSent, call.RetryRefused, call.RetryDNS, call.RetryResolve, call.RetryUnavailable,
		call.RetryLostResponse, call.RetryGateway} {
		retries.WithLabelValues(r) // exported from 0
	}
	for _, r := range []string{call.RouteDirect, call.RouteFallback, call.RouteURL} {
		routes.WithLabelValues(r)
	}
}

func observe(r Result) {
	code := strconv.Itoa(r.Status)
	if r.Status == 0 {
		code = "error"
	}
	latency.WithLabelValues(code).Observe(r.Latency.Seconds())
}
