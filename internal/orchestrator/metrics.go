package orchestrator

import (
	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

var (
	sessionsEnded = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ziptrail_sessions_ended_total",
		Help: "Sessions that ended, by final state.",
	}, []string{"state"})
	objectsReady = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "ziptrail_engine_objects_total",
		Help: "Objects the trigger engine received.",
	})
	reexecutions = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "ziptrail_engine_reexecutions_total",
		Help: "Source functions re-executed because their output was late.",
	})
	checkpointBytes = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "ziptrail_engine_checkpoint_bytes",
		Help: "Size of the last engine checkpoint.",
	})
)

func init() {
	metrics.Registry.MustRegister(sessionsEnded, objectsReady, reexecutions, checkpointBytes)
}
