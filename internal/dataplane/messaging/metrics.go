package messaging

import "github.com/prometheus/client_golang/prometheus"

var (
	received = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "ziptrail_messages_received_total",
		Help: "Direct messages this sidecar queued for its group members.",
	})
	mailboxed = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "ziptrail_messages_mailbox_delivered_total",
		Help: "Direct messages taken from the fast tier's mailboxes for members that joined after they were sent.",
	})
	refusedForeign = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "ziptrail_messages_refused_foreign_total",
		Help: "Deliveries refused because their authenticator was not sealed with this namespace's key for the group.",
	})
	streamsOpen = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "ziptrail_messages_streams",
		Help: "Message streams from other sidecars served now.",
	})
	streamsRefused = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ziptrail_messages_streams_refused_total",
		Help: "Message streams from other sidecars closed unserved, by reason: limit (MaxStreams served already), handshake_timeout (no message header within the handshake timeout of the magic).",
	}, []string{"reason"})
	streamWaits = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "ziptrail_messages_stream_waits_total",
		Help: "Times a message stream's reader stopped reading until a member's full inbox had room (back-pressure on the sending sidecar).",
	})
	panics = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ziptrail_messages_panics_total",
		Help: "Panics recovered in goroutines reading another sidecar's bytes (the connection was closed), by where: stream (a message stream's reader), answers (the answers to this sidecar's deliveries).",
	}, []string{"where"})
)

// The stream limits' and recoveries' counters are in the default
// registry (the sidecar serves it on its metrics port).
func init() { prometheus.MustRegister(streamsOpen, streamsRefused, streamWaits, panics) }

// Collectors are the package's other metrics, for the sidecar's registry.
func Collectors() []prometheus.Collector {
	return []prometheus.Collector{received, mailboxed, refusedForeign}
}
