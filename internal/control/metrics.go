package control

import (
	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

var (
	connectedSidecars = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "ziptrail_control_sidecars_connected",
		Help: "Sidecars connected to the operator's control stream.",
	})
	eventErrors = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "ziptrail_control_event_errors_total",
		Help: "Sidecar events the trigger engine rejected.",
	})
)

func init() {
	// The operator's /metrics endpoint serves controller-runtime's registry.
	metrics.Registry.MustRegister(connectedSidecars, eventErrors)
}
