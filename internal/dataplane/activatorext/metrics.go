package activatorext

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
)

// Keep-alive results (attribute "result" of ziptrail.activator.keepalive.extends).
const (
	ResultExtended = "extended"
	ResultGone     = "gone"
	ResultError    = "error"
)

// Locality decisions (attribute "decision" of ziptrail.activator.locality.decisions).
const (
	DecisionLocal          = "preferred-local"  // we replaced Knative's pod by one on the producer's node
	DecisionAlreadyLocal   = "already-local"    // Knative's pod is on the producer's node
	DecisionNoLocalPod     = "no-local-pod"     // no ready pod of the revision on that node
	DecisionLocalPodsBusy  = "local-pods-busy"  // local pods are at their container concurrency
	DecisionClusterIP      = "cluster-ip"       // Knative routes via the private ClusterIP (no pod choice)
	DecisionUnknownDest    = "unparsable-dest"  // Knative's destination is not host:port
	DecisionNoProducerNode = "no-producer-node" // request names no producer node
)

// Metrics are the ziptrail instruments of activator-ext, exported with
// the activator's own metrics (OpenTelemetry meter provider). A nil
// *Metrics records nothing.
type Metrics struct {
	keepAliveRequests metric.Int64Counter
	extends           metric.Int64Counter
	wait              metric.Float64Histogram
	decisions         metric.Int64Counter
	panics            metric.Int64Counter
}

// NewMetrics creates the instruments on mp (nil: a no-op provider).
func NewMetrics(mp metric.MeterProvider) (*Metrics, error) {
	if mp == nil {
		mp = noop.NewMeterProvider()
	}
	m := mp.Meter("github.com/ziptrail/ziptrail/internal/dataplane/activatorext")
	var ms Metrics
	var err error
	if ms.keepAliveRequests, err = m.Int64Counter("ziptrail.activator.keepalive.requests",
		metric.WithDescription("Requests with ziptrail references whose objects were kept alive while waiting for a destination")); err != nil {
		return nil, err
	}
	if ms.extends, err = m.Int64Counter("ziptrail.activator.keepalive.extends",
		metric.WithDescription("TTL extensions asked of producers, by result")); err != nil {
		return nil, err
	}
	if ms.wait, err = m.Float64Histogram("ziptrail.activator.keepalive.wait", metric.WithUnit("s"),
		metric.WithDescription("Time requests with ziptrail references waited in the activator for a destination"),
		metric.WithExplicitBucketBoundaries(0.005, 0.05, 0.25, 1, 2.5, 5, 10, 30, 60, 120)); err != nil {
		return nil, err
	}
	if ms.decisions, err = m.Int64Counter("ziptrail.activator.locality.decisions",
		metric.WithDescription("Destination choices for requests with ziptrail headers, by decision")); err != nil {
		return nil, err
	}
	if ms.panics, err = m.Int64Counter("ziptrail.activator.panics",
		metric.WithDescription("Panics recovered on goroutines that handle requests' ziptrail headers, by where (each is a defect; the process lives on)")); err != nil {
		return nil, err
	}
	return &ms, nil
}

func (m *Metrics) keepAliveStarted(ctx context.Context) {
	if m != nil {
		m.keepAliveRequests.Add(ctx, 1)
	}
}

func (m *Metrics) extend(ctx context.Context, result string) {
	if m != nil {
		m.extends.Add(context.WithoutCancel(ctx), 1, metric.WithAttributes(attribute.String("result", result)))
	}
}

func (m *Metrics) waited(ctx context.Context, d time.Duration) {
	if m != nil {
		m.wait.Record(context.WithoutCancel(ctx), d.Seconds())
	}
}

func (m *Metrics) decision(ctx context.Context, d string) {
	if m != nil {
		m.decisions.Add(context.WithoutCancel(ctx), 1, metric.WithAttributes(attribute.String("decision", d)))
	}
}

func (m *Metrics) panicked(ctx context.Context, where string) {
	if m != nil {
		m.panics.Add(context.WithoutCancel(ctx), 1, metric.WithAttributes(attribute.String("where", where)))
	}
}
