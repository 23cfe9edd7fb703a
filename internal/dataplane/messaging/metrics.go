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
)

// Collectors are the package's metrics, for the sidecar's registry.
func Collectors() []prometheus.Collector {
	return []prometheus.Collector{received, mailboxed, refusedForeign}
}
