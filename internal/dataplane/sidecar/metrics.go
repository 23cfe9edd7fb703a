package sidecar

import (
	"github.com/ziptrail/ziptrail/internal/dataplane/messaging"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

var (
	spills = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ziptrail_store_spills_total",
		Help: "Objects moved from pod memory to the fast tier under memory pressure, by result.",
	}, []string{"result"})
	spilledBytes = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "ziptrail_store_spilled_bytes_total",
		Help: "Bytes moved from pod memory to the fast tier.",
	})
	backups = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ziptrail_store_backups_total",
		Help: "Unread objects copied to the slow tier at pod shutdown, by result.",
	}, []string{"result"})
	delegatedRequests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ziptrail_delegated_requests_total",
		Help: "Requests this sidecar sent for the invocations it fired itself (delegated firing), by route: direct (straight to a ready pod " +
			"the operator pushed), fallback (straight to a pod that did not take it, then by the route at once), url (through Knative's " +
			"ingress and activator: the target had no ready pod pushed), and not_sent (not out within its time: left to the engine).",
	}, []string{"route"})
	functionCrashRetries = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "ziptrail_sidecar_function_crash_retries_total",
		Help: "Invocations sent to the function again, with the same idempotency key, because its process died (the connection failed) before it answered.",
	})
)

func init() {
	prometheus.MustRegister(spills, spilledBytes, backups, delegatedRequests, functionCrashRetries)
}

func result(err error) string {
	if err != nil {
		return "error"
	}
	return "ok"
}

// storeCollector reports this sidecar's store occupancy at scrape time.
type storeCollector struct{ s *Sidecar }

var (
	objectsDesc  = prometheus.NewDesc("ziptrail_store_objects", "Objects held in pod memory.", nil, nil)
	bytesDesc    = prometheus.NewDesc("ziptrail_store_bytes", "Object bytes held in pod memory.", nil, nil)
	capacityDesc = prometheus.NewDesc("ziptrail_store_capacity_bytes", "The pod's object memory cap.", nil, nil)
	unackedDesc  = prometheus.NewDesc("ziptrail_sidecar_events_unacknowledged", "Events reported to the operator and kept until it acknowledges them (once a saved checkpoint holds them).", nil, nil)
	keptDesc     = prometheus.NewDesc("ziptrail_sidecar_reports_kept", "Outcome reports of invocations the operator's dispatcher sent, kept unsent until the operator saves their answers (sent if it does not in time).", nil, nil)
)

func (c storeCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- objectsDesc
	ch <- bytesDesc
	ch <- capacityDesc
	ch <- unackedDesc
	ch <- keptDesc
	ch <- recordsDesc
	ch <- recordBytesDesc
}

func (c storeCollector) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.MustNewConstMetric(objectsDesc, prometheus.GaugeValue, float64(c.s.Store.Len()))
	ch <- prometheus.MustNewConstMetric(bytesDesc, prometheus.GaugeValue, float64(c.s.Store.Used()))
	ch <- prometheus.MustNewConstMetric(capacityDesc, prometheus.GaugeValue, float64(c.s.cfg.MemoryLimit))
	unacked, kept := 0, 0
	if c.s.ctl != nil {
		unacked, kept = c.s.ctl.Unacked(), c.s.ctl.Kept()
	}
	ch <- prometheus.MustNewConstMetric(unackedDesc, prometheus.GaugeValue, float64(unacked))
	ch <- prometheus.MustNewConstMetric(keptDesc, prometheus.GaugeValue, float64(kept))
	keys, bytes := c.s.records.usage()
	ch <- prometheus.MustNewConstMetric(recordsDesc, prometheus.GaugeValue, float64(keys))
	ch <- prometheus.MustNewConstMetric(recordBytesDesc, prometheus.GaugeValue, float64(bytes))
}

// MetricsHandler serves the data plane's metrics: this sidecar's store
// plus the process-wide counters (pulls, spills, backups, API calls).
func (s *Sidecar) MetricsHandler() http.Handler {
	reg := prometheus.NewRegistry()
	reg.MustRegister(storeCollector{s})
	reg.MustRegister(messaging.Collectors()...) // messages received, mailboxed, refused as foreign
	return promhttp.HandlerFor(prometheus.Gatherers{reg, prometheus.DefaultGatherer}, promhttp.HandlerOpts{})
}

// serveMetrics listens on the metrics port (Knative's queue-proxy serves
// its own on 9090/9091, so ziptrail's have a port of their own).
func (s *Sidecar) serveMetrics() (func(), error) {
	ln, err := net.Listen("tcp", net.JoinHostPort("", strconv.Itoa(s.cfg.MetricsPort)))
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", s.MetricsHandler())
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	return func() { _ = srv.Close() }, nil
}
