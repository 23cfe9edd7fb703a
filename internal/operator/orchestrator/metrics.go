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
		Help: "Source functions re-executed because their output was late, or copied as stragglers (speculative copies are also counted in ziptrail_engine_speculative_copies_total).",
	})
	speculativeCopies = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "ziptrail_engine_speculative_copies_total",
		Help: "Speculative copies of stragglers: re-executions launched because most of their wave had finished (reexecution speculateAfter).",
	})
	checkpointBytes = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "ziptrail_engine_checkpoint_bytes",
		Help: "Size of the last engine checkpoint's snapshot (running sessions; ended ones are written once each, see ziptrail_engine_checkpoint_written_bytes_total).",
	})
	checkpointWritten = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "ziptrail_engine_checkpoint_written_bytes_total",
		Help: "Bytes the engine's checkpoints wrote to Redis: snapshots and ended sessions' records.",
	})
	checkpointFailures = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "ziptrail_engine_checkpoint_failures_total",
		Help: "Engine checkpoints that failed (the checkpoint store unreachable or too slow): while saves fail, starts are answered 503 and sidecars keep their events; the next tick retries.",
	})
	redispatched = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "ziptrail_engine_redispatched_total",
		Help: "Invocations a new owner sent again after a restore because nothing was heard of them (same id and idempotency key).",
	})
	unconfirmedRefusals = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "ziptrail_engine_unconfirmed_stale_refusals_total",
		Help: "Invocations a function's sidecar refused as from a stale owner while the checkpoint store held no newer owner's claim " +
			"(a forged owner fence, or one from before the store lost its data): sent again without a fence.",
	})
	checkpointSeconds = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "ziptrail_engine_checkpoint_seconds",
		Help:    "Time of the engine's periodic checkpoints that wrote something (encoding and the write to Redis); the next one waits at least this long divided by the operator's checkpoint share (default 0.05).",
		Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14), // 0.5 ms .. 4 s
	})
)

func init() {
	metrics.Registry.MustRegister(sessionsEnded, objectsReady, reexecutions, speculativeCopies, checkpointBytes, checkpointWritten, checkpointSeconds, checkpointFailures, redispatched,
		unconfirmedRefusals)
}
