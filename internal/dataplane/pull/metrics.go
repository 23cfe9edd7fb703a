package pull

import "github.com/prometheus/client_golang/prometheus"

var fallbackReads = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "ziptrail_dataplane_fallback_reads_total",
	Help: "Objects read from a storage tier because their producer was gone.",
}, []string{"tier"})

func init() { prometheus.MustRegister(fallbackReads) }
