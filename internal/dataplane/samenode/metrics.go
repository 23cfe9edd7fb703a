package samenode

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ziptrail/ziptrail/internal/dataplane/ref"
)

var (
	gets = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ziptrail_dataplane_samenode_gets_total",
		Help: "Objects this consumer asked a producer on its node for as a memfd, by result (ok: received without a TCP copy; not_applicable: producer on another node; otherwise why the TCP pull took over).",
	}, []string{"result"})
	receivedBytes = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "ziptrail_dataplane_samenode_received_bytes_total",
		Help: "Bytes of objects this consumer received as memfds from producers on its node.",
	})
	served = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ziptrail_dataplane_samenode_served_total",
		Help: "Same-node requests this producer answered, by result (ok, refused, not_found, bad_request, bad_peer, busy, internal).",
	}, []string{"result"})
	servedBytes = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "ziptrail_dataplane_samenode_served_bytes_total",
		Help: "Object bytes this producer handed to consumers on its node as memfds.",
	})
	cachedObjects = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "ziptrail_dataplane_samenode_memfds",
		Help: "Objects this producer holds as sealed memfds for consumers on its node.",
	})
)

func init() { prometheus.MustRegister(gets, receivedBytes, served, servedBytes, cachedObjects) }

func observeGet(err error) {
	label := "ok"
	switch {
	case err == nil:
	case errors.Is(err, ErrNotApplicable):
		label = "not_applicable"
	case errors.Is(err, ErrUnavailable):
		label = "unavailable"
	case errors.Is(err, ErrRefused):
		label = "refused"
	case errors.Is(err, ErrNotFound):
		label = "not_found"
	case errors.Is(err, ErrProtocol):
		label = "protocol"
	case errors.Is(err, ref.ErrMalformed), errors.Is(err, ref.ErrTampered), errors.Is(err, ref.ErrUnknownKey), errors.Is(err, ref.ErrForeign):
		label = "bad_reference"
	default:
		label = "error"
	}
	gets.WithLabelValues(label).Inc()
}
