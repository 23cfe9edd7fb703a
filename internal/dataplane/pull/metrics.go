package pull

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ziptrail/ziptrail/internal/dataplane/ref"
	"github.com/ziptrail/ziptrail/internal/dataplane/store"
)

var (
	fallbackReads = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ziptrail_dataplane_fallback_reads_total",
		Help: "Objects read from a storage tier because their producer was gone.",
	}, []string{"tier"})
	fallbacks = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ziptrail_dataplane_pull_fallbacks_total",
		Help: "Pulls that went to the storage tiers because the producer could not be pulled from, by reason: " +
			"dial_timeout, dial_error (refused, no route), response_timeout (no answer's header in time), " +
			"body_stall (the body paused too long), connection_lost, client_closed.",
	}, []string{"reason"})
	pulls = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ziptrail_dataplane_pulls_total",
		Help: "Objects this consumer pulled, by result (ok or the error class).",
	}, []string{"result"})
	pulledBytes = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "ziptrail_dataplane_pulled_bytes_total",
		Help: "Bytes of objects this consumer pulled successfully.",
	})
	refusedConns = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "ziptrail_dataplane_refused_connections_total",
		Help: "Pull connections this producer closed at once: it already served its limit of them.",
	})
	servedBytes = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "ziptrail_dataplane_served_bytes_total",
		Help: "Object bytes this producer sent to consumers.",
	})
)

func init() {
	prometheus.MustRegister(fallbackReads, fallbacks, pulls, pulledBytes, servedBytes, refusedConns)
}

// errorClasses label failed pulls, in match order.
var errorClasses = []struct {
	err   error
	label string
}{
	{ref.ErrMalformed, "malformed"}, {ref.ErrTampered, "tampered"}, {ref.ErrUnknownKey, "unknown_key"},
	{ref.ErrForeign, "foreign"}, {ref.ErrExpired, "expired"}, {store.ErrExpired, "expired"},
	{store.ErrExhausted, "exhausted"}, {ErrProducerGone, "producer_gone"}, {store.ErrNotFound, "not_found"},
	{ErrExtendTooFar, "extend_too_far"}, {ErrRefused, "refused"},
}

func observePull(info Info, err error) {
	if err == nil {
		pulls.WithLabelValues("ok").Inc()
		pulledBytes.Add(float64(info.Size))
		return
	}
	for _, c := range errorClasses {
		if errors.Is(err, c.err) {
			pulls.WithLabelValues(c.label).Inc()
			return
		}
	}
	pulls.WithLabelValues("other").Inc()
}
